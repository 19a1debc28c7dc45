"""The position-wise feed-forward network (SPEC section 4).

    FFN(x) = max(0, x W1 + b1) W2 + b2,    W1: (D, F),  W2: (F, D),  F = d_ff = 2048

The same weights act on every position of every sequence, so the FFN commutes with any
permutation of the positions. Other activations replace ``max(0, .)``; SwiGLU (Shazeer, 2020)
also gates the hidden layer with a third projection.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from addnorm._checks import check_choice, check_int, check_probability, check_tensor

__all__ = ["ACTIVATIONS", "FeedForward"]

ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU,  # max(0, h), the paper's
    "gelu": lambda: nn.GELU(approximate="none"),  # h * Phi(h), exact erf
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),  # GPT-2 / BERT's tanh approximation
    "swiglu": nn.SiLU,  # silu(x W1) * (x W3): W1 is the gate, W3 the value
}


class FeedForward(nn.Module):
    """``FFN(x) = w2(dropout(act(w1(x))))``, applied to each position independently.

    Submodules: ``w1`` (Linear D -> F), ``act``, ``dropout`` (between the activation and
    ``w2``, where ``nn.TransformerEncoderLayer`` puts it), ``w2`` (Linear F -> D).

    ``activation="swiglu"`` adds ``w3`` (Linear D -> F), the *value* projection, and the hidden
    layer becomes ``silu(w1(x)) * w3(x)``: ``act(w1(x))`` is the same in every variant, and
    the names match LLaMA and torchtune (``w1`` gate, ``w3`` value / "up", ``w2`` "down"), so
    their weights load without a swap. ``d_ff`` is used as given (LLaMA shrinks it to about 2/3
    of 4 D to keep the parameter count; choose it yourself).
    """

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
        self.w1 = nn.Linear(d_model, d_ff, bias=bias)
        self.act = ACTIVATIONS[activation]()
        self.dropout = nn.Dropout(check_probability("dropout", dropout))
        self.w2 = nn.Linear(d_ff, d_model, bias=bias)
        if activation == "swiglu":
            self.w3 = nn.Linear(d_model, d_ff, bias=bias)
            self._hidden = self._gated_hidden
        else:
            self._hidden = self._plain_hidden

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``w2(dropout(act(w1(x))))``; for SwiGLU ``w2(dropout(silu(w1(x)) * w3(x)))``.

        Shapes:
            x: (..., D), any number of leading dims (typically (B, L, D)).
            returns: (..., D).
        """
        check_tensor("x", x, last_dim=self.d_model, floating=True)
        return self.w2(self.dropout(self._hidden(x)))

    def _plain_hidden(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.w1(x))  # (..., F)

    def _gated_hidden(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.w1(x)) * self.w3(x)  # (..., F)

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"
