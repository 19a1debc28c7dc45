"""The position-wise feed-forward network (SPEC section 4).

    FFN(x) = max(0, x W1 + b1) W2 + b2,    W1: (D, F),  W2: (F, D),  F = d_ff = 2048

The same weights act on every position of every sequence, so the FFN commutes with any
permutation of the positions. Other activations replace ``max(0, .)``; SwiGLU (Shazeer, 2020)
also gates the hidden layer with a third projection:

    FFN_SwiGLU(x) = (silu(x W1) * (x W3)) W2,    W3: (D, F)

Each variant is its own class whose forward is its formula: :class:`FeedForward` and
:class:`GatedFeedForward`. :func:`make_feedforward` picks the class from the activation name.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from addnorm.utils.checks import (
    check_bool,
    check_choice,
    check_int,
    check_probability,
    check_tensor,
)

__all__ = [
    "ACTIVATIONS",
    "GATED_ACTIVATIONS",
    "GELU",
    "FeedForward",
    "GatedFeedForward",
    "ReLU",
    "make_feedforward",
]


def _overwrites(inplace: bool, h: torch.Tensor) -> bool:
    """Whether an activation built ``inplace`` overwrites ``h``: only when no gradient is
    wanted (see :class:`ReLU`)."""
    return inplace and not (torch.is_grad_enabled() and h.requires_grad)


class ReLU(nn.ReLU):
    """``nn.ReLU`` whose ``inplace=True`` overwrites its input only when no gradient is wanted.

    In training, w1's output is a view of the matrix product's result, and an in-place op on a
    view makes autograd copy the whole base back in the backward pass (``CopySlices``): a
    second pass over the (B, L, F) hidden layer, which costs more than the allocation it
    saves. Without gradients (inference) it writes in place, as ``nn.ReLU(inplace=True)``
    does.
    """

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """``max(0, h)``. Shapes: h: any; returns: the same (h itself when overwritten)."""
        return F.relu_(h) if _overwrites(self.inplace, h) else F.relu(h)


class GELU(nn.GELU):
    """``nn.GELU`` with ``nn.ReLU``'s ``inplace`` option: with ``inplace=True`` it overwrites
    its input when no gradient is wanted (with gradients it stays ``F.gelu``, see
    :class:`ReLU`). The FFN builds it in place on w1's output, a tensor only the FFN holds, so
    inference allocates no second (B, L, F) tensor, the widest of a block.
    """

    def __init__(self, approximate: str = "none", *, inplace: bool = False) -> None:
        super().__init__(approximate=approximate)
        self.inplace = check_bool("inplace", inplace)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """``h * Phi(h)`` (exact erf) or its tanh approximation, per ``approximate``.

        Shapes: h: any; returns: the same (h itself when it was overwritten).
        """
        if _overwrites(self.inplace, h):
            return torch.ops.aten.gelu_(h, approximate=self.approximate)
        return F.gelu(h, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}, inplace={self.inplace}"


ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    # max(0, h), the paper's; in place without gradients: h is w1's output, a tensor only the
    # FFN holds, so no second (B, L, F) tensor, a layer's widest, is allocated (torch.nn's
    # fast path is in place too)
    "relu": lambda: ReLU(inplace=True),
    "gelu": lambda: GELU("none", inplace=True),  # h * Phi(h), exact erf
    "gelu_tanh": lambda: GELU("tanh", inplace=True),  # GPT-2 / BERT's tanh approximation
    "swiglu": nn.SiLU,  # silu(x W1) * (x W3): W1 is the gate, W3 the value
}
GATED_ACTIVATIONS = ("swiglu",)  # built as GatedFeedForward


class FeedForward(nn.Module):
    """``FFN(x) = w2(dropout(act(w1(x))))``, applied to each position independently.

    Submodules: ``w1`` (Linear D -> F), ``act``, ``dropout`` (between the activation and
    ``w2``, where ``nn.TransformerEncoderLayer`` puts it), ``w2`` (Linear F -> D).

    A gated activation (``"swiglu"``) needs the third projection of :class:`GatedFeedForward`
    and is refused here; :func:`make_feedforward` picks the class from the activation name.
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
        d_model = check_int("d_model", d_model, min_value=1)
        d_ff = check_int("d_ff", d_ff, min_value=1)
        check_choice("activation", activation, ACTIVATIONS)
        dropout = check_probability("dropout", dropout)
        check_bool("bias", bias)
        if activation in GATED_ACTIVATIONS and not isinstance(self, GatedFeedForward):
            raise ValueError(
                f"activation {activation!r} is gated and needs GatedFeedForward's value "
                f"projection w3; build it with make_feedforward(..., activation={activation!r}) "
                "or GatedFeedForward(...)"
            )
        self.d_model, self.d_ff, self.activation = d_model, d_ff, activation
        self.w1 = nn.Linear(d_model, d_ff, bias=bias)
        self.act = ACTIVATIONS[activation]()
        self.dropout = nn.Dropout(dropout)
        self.w2 = nn.Linear(d_ff, d_model, bias=bias)

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
    ``make_feedforward(..., activation="swiglu")`` builds this class.
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
        self.w3 = nn.Linear(d_model, d_ff, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``w2(dropout(act(w1(x)) * w3(x)))``, ``act`` = SiLU.

        Shapes:
            x: (..., D), any number of leading dims (typically (B, L, D)).
            returns: (..., D).
        """
        check_tensor("x", x, last_dim=self.d_model, floating=True)
        return self.w2(self.dropout(self.act(self.w1(x)) * self.w3(x)))


def make_feedforward(
    d_model: int,
    d_ff: int,
    *,
    activation: str = "relu",
    dropout: float = 0.0,
    bias: bool = True,
) -> FeedForward:
    """The feed-forward block for ``activation``: the one place the two classes are chosen.

    A gated activation (``"swiglu"``) gives a :class:`GatedFeedForward`, any other a plain
    :class:`FeedForward` (both are ``FeedForward`` instances); the class checks the arguments.
    """
    cls = GatedFeedForward if activation in GATED_ACTIVATIONS else FeedForward
    return cls(d_model, d_ff, activation=activation, dropout=dropout, bias=bias)
