"""The position-wise feed-forward network (SPEC section 4).

    FFN(x) = max(0, x W1 + b1) W2 + b2,    W1: (D, F),  W2: (F, D),  F = d_ff = 2048

The same weights act on every position of every sequence, so the FFN commutes with any
permutation of the positions. Other activations replace ``max(0, .)``; SwiGLU (Shazeer, 2020)
also gates the hidden layer with a third projection:

    FFN_SwiGLU(x) = (silu(x W1) * (x W3)) W2,    W3: (D, F)
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from addnorm._checks import (
    check_bool,
    check_choice,
    check_int,
    check_probability,
    check_tensor,
)

__all__ = ["ACTIVATIONS", "GATED_ACTIVATIONS", "FeedForward", "GatedFeedForward"]

ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU,  # max(0, h), the paper's
    "gelu": lambda: nn.GELU(approximate="none"),  # h * Phi(h), exact erf
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),  # GPT-2 / BERT's tanh approximation
    "swiglu": nn.SiLU,  # silu(x W1) * (x W3): W1 is the gate, W3 the value
}
GATED_ACTIVATIONS = ("swiglu",)  # built as GatedFeedForward


class FeedForward(nn.Module):
    """``FFN(x) = w2(dropout(act(w1(x))))``, applied to each position independently.

    Submodules: ``w1`` (Linear D -> F), ``act``, ``dropout`` (between the activation and
    ``w2``, where ``nn.TransformerEncoderLayer`` puts it), ``w2`` (Linear F -> D).

    ``FeedForward(..., activation="swiglu")`` builds a :class:`GatedFeedForward`, the subclass
    whose forward multiplies in the value projection ``w3``. Each class's forward is then its
    formula with no branch, while layers and configs keep choosing the variant by the one
    string ``activation`` (and ``isinstance(ffn, FeedForward)`` holds for both). The choice is
    made in ``__new__``, the only place where the two variants are told apart.
    """

    def __new__(cls, *args: object, activation: str = "relu", **kwargs: object) -> FeedForward:
        # Only the class is chosen here; the arguments are checked by __init__.
        if cls is FeedForward and activation in GATED_ACTIVATIONS:
            cls = GatedFeedForward
        return super().__new__(cls)

    def __init__(
        self,
        d_model: int,
        d_ff: int = 2048,
        *,
        activation: str = "relu",
        dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.d_model = check_int("d_model", d_model, min_value=1)
        self.d_ff = check_int("d_ff", d_ff, min_value=1)
        self.activation = check_choice("activation", activation, ACTIVATIONS)
        check_bool("bias", bias)
        self.w1 = nn.Linear(self.d_model, self.d_ff, bias=bias)
        self.act = ACTIVATIONS[activation]()
        self.dropout = nn.Dropout(check_probability("dropout", dropout))
        self.w2 = nn.Linear(self.d_ff, self.d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``w2(dropout(act(w1(x))))``.

        Shapes:
            x: (..., D), any number of leading dims (typically (B, L, D)).
            returns: (..., D).
        """
        check_tensor("x", x, last_dim=self.d_model, floating=True)
        return self.w2(self.dropout(self.act(self.w1(x))))

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"


class GatedFeedForward(FeedForward):
    """SwiGLU: ``w2(dropout(silu(w1(x)) * w3(x)))`` (Shazeer, 2020).

    Adds ``w3`` (Linear D -> F), the *value* projection; ``act(w1(x))`` is the gate, as in
    every variant. The names match LLaMA and torchtune (``w1`` gate, ``w3`` value / "up",
    ``w2`` "down"), so their weights load without a swap. ``d_ff`` is used as given (LLaMA
    shrinks it to about 2/3 of 4 D to keep the parameter count; choose it yourself).
    ``FeedForward(..., activation="swiglu")`` builds this class.
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int = 2048,
        *,
        activation: str = "swiglu",
        dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        check_choice("activation", activation, GATED_ACTIVATIONS)
        super().__init__(d_model, d_ff, activation=activation, dropout=dropout, bias=bias)
        self.w3 = nn.Linear(self.d_model, self.d_ff, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``w2(dropout(act(w1(x)) * w3(x)))``, ``act`` = SiLU.

        Shapes:
            x: (..., D), any number of leading dims (typically (B, L, D)).
            returns: (..., D).
        """
        check_tensor("x", x, last_dim=self.d_model, floating=True)
        return self.w2(self.dropout(self.act(self.w1(x)) * self.w3(x)))
