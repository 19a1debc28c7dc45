"""The residual connection with its norm: Add & Norm (SPEC section 5).

    Post-LN (the paper):  out = Norm(x + Dropout(Sublayer(x)))
    Pre-LN:               out = x + Dropout(Sublayer(Norm(x)))

Pre-LN keeps an identity path from input to output: d out / d x = 1 + d Sublayer / d x,
which is why deep Pre-LN stacks train stably where Post-LN ones need learning-rate warm-up.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import nn
from torch.nn.modules.batchnorm import _NormBase

from addnorm.norms import BatchNorm, GroupNorm, LayerNorm, NoNorm, RMSNorm, make_norm
from addnorm.utils.checks import check_choice, check_int, check_norm_input, check_probability

__all__ = ["NORM_POSITIONS", "AddNorm"]

NORM_POSITIONS = ("post", "pre")

# torch's own last-dim norms (and the identity), whose forward takes no padding_mask.
_MASKLESS_TORCH_NORMS = (nn.LayerNorm, nn.RMSNorm, nn.Identity)

# addnorm's norms whose forward begins with ``check_norm_input(x, padding_mask, d_model)``,
# the check AddNorm makes of its own input (exact types: a subclass may override forward).
_CHECKING_NORMS = (LayerNorm, RMSNorm, BatchNorm, GroupNorm)

Sublayer = Callable[[torch.Tensor], torch.Tensor]


class AddNorm(nn.Module):
    """A residual connection around any sublayer, with the norm after (post) or before (pre).

    Args:
        d_model: feature width D.
        norm_position: ``"post"`` (Vaswani et al., 2017) or ``"pre"`` (Pre-LN).
        norm: a kind for :func:`addnorm.norms.make_norm` (``"layer"``, ``"batch"``, ``"rms"``,
            ``"group"``, built with ``eps``), or an ``nn.Module`` used as is (``eps`` is then
            unused). Of torch's own norms only the last-dim ones, such as ``nn.LayerNorm`` and
            ``nn.RMSNorm``, can be injected (or ``nn.Identity()``): ``nn.BatchNorm1d`` /
            ``nn.GroupNorm`` / ``nn.InstanceNorm1d`` normalize dim 1, which is L, not D, for
            (B, L, D) input, so they raise a ``TypeError`` pointing to
            :class:`addnorm.norms.BatchNorm` / :class:`addnorm.norms.GroupNorm`. A width the
            module exposes (``normalized_shape``, ``num_features`` or ``d_model``) must be
            ``d_model``.
        dropout: dropout probability on the sublayer's output (the paper's P_drop).
        eps: the norm's epsilon when ``norm`` is a kind.

    Every norm shares the call ``norm(h, padding_mask=None)``: a given mask is passed to an
    injected module, which must accept it, unless the module is one of torch's mask-less
    ``nn.LayerNorm``, ``nn.RMSNorm`` or ``nn.Identity`` (``NoNorm`` apart), called as ``norm(h)``.
    The call form is decided once, by type, in ``__init__``, not by signature sniffing or a
    wrapper, so ``self.norm`` stays the module passed in and its state-dict keys are unchanged.

    Submodules: ``norm`` and ``dropout``.
    """

    def __init__(
        self,
        d_model: int,
        *,
        norm_position: str = "post",
        norm: str | nn.Module = "layer",
        dropout: float = 0.0,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        d_model = check_int("d_model", d_model, min_value=1)
        norm_position = check_choice("norm_position", norm_position, NORM_POSITIONS)
        if isinstance(norm, str):
            norm = make_norm(norm, d_model, eps=eps)
        else:
            _check_injected_norm(norm, d_model)
        dropout = check_probability("dropout", dropout)
        self.d_model, self.norm_position = d_model, norm_position
        self.norm = norm
        self.dropout = nn.Dropout(dropout)
        maskless = isinstance(norm, _MASKLESS_TORCH_NORMS) and not isinstance(norm, NoNorm)
        self._norm_takes_padding_mask = not maskless

    def forward(
        self,
        x: torch.Tensor,
        sublayer: Sublayer,
        padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Post: ``norm(x + dropout(f(x)))``; pre: ``x + dropout(f(norm(x)))``.

        Shapes:
            x: (B, L, D) or (B, D); sublayer: maps a tensor to one of the same shape;
            padding_mask: (B, L) bool, True = padding, passed on to the norm (see the class).
            returns: the shape of x.
        """
        if not callable(sublayer):
            raise TypeError(f"sublayer must be callable, got {type(sublayer).__name__}")
        norm: Sublayer = self.norm
        if self.norm_position == "post" or type(norm) not in _CHECKING_NORMS:
            x, padding_mask = check_norm_input(x, padding_mask, self.d_model)
        # else the norm, given x first, checks x and padding_mask as the line above would
        if padding_mask is not None and self._norm_takes_padding_mask:
            norm = partial(self.norm, padding_mask=padding_mask)
        h = x if self.norm_position == "post" else norm(x)
        out = sublayer(h)
        if not (isinstance(out, torch.Tensor) and out.shape == h.shape):
            raise _shape_error(out, h)
        if self.norm_position == "post":
            return norm(x + self.dropout(out))
        return x + self.dropout(out)

    def extra_repr(self) -> str:
        return f"{self.d_model}, norm_position={self.norm_position!r}"


def _check_injected_norm(norm: object, d_model: int) -> None:
    """Refuse a non-module, a channels-first torch norm, or one whose width is not d_model."""
    if not isinstance(norm, nn.Module):
        raise TypeError(
            f"norm must be a norm kind (str) or an nn.Module, got {type(norm).__name__}"
        )
    if isinstance(norm, _NormBase | nn.GroupNorm):
        raise TypeError(
            f"norm {type(norm).__name__} normalizes dim 1 (channels-first), which is L, not D, "
            "for (B, L, D) input; use addnorm.norms.BatchNorm / addnorm.norms.GroupNorm (or "
            "norm='batch' / norm='group'), which normalize the last dim and take padding_mask"
        )
    for attribute in ("normalized_shape", "num_features", "d_model"):
        width = getattr(norm, attribute, None)
        if isinstance(width, int) and not isinstance(width, bool):
            shape: tuple[object, ...] | None = (width,)
        elif isinstance(width, tuple | list):  # torch.Size is a tuple
            shape = tuple(width)
        else:
            shape = None  # not exposed: nothing to check
        if shape is not None and shape != (d_model,):
            raise ValueError(
                f"norm {type(norm).__name__} has {attribute} {width}, but AddNorm's d_model "
                f"is {d_model}: the norm must act on the last dim, of width d_model"
            )


def _shape_error(out: object, h: torch.Tensor) -> ValueError:
    """The error for a sublayer output ``out`` of ``h`` without h's shape."""
    got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
    return ValueError(
        f"sublayer must return the shape of its input {tuple(h.shape)} for the residual "
        f"sum, got {got}"
    )
