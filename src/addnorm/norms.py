"""Normalization layers for (B, L, D) sequences and (B, D) vectors (SPEC section 3).

Every norm is called as ``norm(x, padding_mask=None)``:

- ``x``: (B, L, D) or (B, D), floating point.
- ``padding_mask``: bool (B, L), **True = padding token**, only for (B, L, D) input.
  ``BatchNorm`` and ``GroupNorm`` leave padding out of their statistics
  (:mod:`addnorm.masked_norms`, re-exported here); ``LayerNorm`` and ``RMSNorm`` normalize
  each token on its own, so they accept the mask and ignore it. ``NoNorm`` is a switched-off
  norm (the identity) with the same signature.

All of them compute ``y = gamma * (x - mu) / sqrt(sigma^2 + eps) + beta`` (RMSNorm drops
``mu`` and ``beta``) with the biased variance and ``eps`` inside the square root; they differ
only in which values the statistics ``mu, sigma^2`` are taken over:

- LayerNorm: each token, over its D features.
- BatchNorm: each feature, over the batch (and the real positions).
- GroupNorm: each sample and group of D / G features, over the group and the real positions.

LayerNorm and RMSNorm keep padding out of the real outputs and their input gradients (each
token is normalized alone) but not out of ``weight``'s gradient, a sum over every token of
``grad * x_hat`` (``0 * NaN``): keep padding finite for them, as for every position-wise Linear.

Dtypes: the output has x's dtype whatever the parameters' dtype, as in torch's norms.
BatchNorm, GroupNorm and LayerNorm take their statistics, and normalize, in
``torch.promote_types(x.dtype, torch.float32)`` (RMSNorm through ``F.rms_norm``, which widens
itself): a float16 variance overflows at 65504 (a feature with std 256), which would zero the
output, and a low-precision variance of values far from 0 is lost to cancellation.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from addnorm.masked_norms import BatchNorm, GroupNorm
from addnorm.utils.checks import (
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_norm_input,
    check_weight_dtype,
)

__all__ = [
    "BatchNorm",
    "GroupNorm",
    "LayerNorm",
    "NORM_KINDS",
    "N_GROUPS",
    "NoNorm",
    "RMSNorm",
    "make_norm",
]

NORM_KINDS = ("layer", "batch", "rms", "group")
N_GROUPS = 32  # GroupNorm's groups when a kind is built by name (the GroupNorm paper's default)


class LayerNorm(nn.Module):
    """Per-token normalization over the D features (Ba et al., 2016); equals ``nn.LayerNorm``.

    Biased variance, ``eps`` inside the square root, parameters ``weight`` (gamma, init 1) and
    ``bias`` (beta, init 0; ``None`` when ``bias=False``), so state dicts load both ways with
    ``nn.LayerNorm(d_model, eps=eps, bias=bias)``. Independent of batch, padding and length.
    ``elementwise_affine=False`` (torch.nn's name) drops both parameters: ``y = x_hat``, the
    norm inside DiT's adaLN blocks, whose scale and shift come from the conditioning.

    ``eps=0`` is accepted, as by ``nn.LayerNorm``: it evaluates the formula exactly (SPEC 3's
    worked example), so a token whose D features are all equal has variance 0 and normalizes
    to ``0 / 0 = NaN``, as in ``nn.LayerNorm``; keep ``eps > 0`` wherever such rows can occur.
    With D = 1 every token is such a row, so ``LayerNorm(1, eps=0)`` is refused.

    float16 / bfloat16 input: the mean and variance are taken in float32, the token centred
    before it is scaled, and the result rounded once to x's dtype. On CUDA torch's kernel does
    that itself; elsewhere it is computed here, since torch's CPU kernel loses tokens with a
    large offset to cancellation (measured: ``docs/measurements.md``).
    float32 and float64 input goes to ``F.layer_norm`` as it is (equal to ``nn.LayerNorm``).
    """

    weight: nn.Parameter | None
    bias: nn.Parameter | None

    def __init__(
        self,
        d_model: int,
        *,
        eps: float = 1e-5,
        bias: bool = True,
        elementwise_affine: bool = True,
    ) -> None:
        super().__init__()
        d_model = check_int("d_model", d_model, min_value=1)
        eps = check_float("eps", eps, min_value=0.0)
        if d_model == 1 and eps == 0.0:
            raise ValueError(
                "LayerNorm over d_model = 1 feature with eps = 0 gives NaN for every input (one "
                "feature has variance 0, normalized as 0 / 0); pass eps > 0"
            )
        check_bool("bias", bias)
        check_bool("elementwise_affine", elementwise_affine)
        self.d_model, self.eps, self.elementwise_affine = d_model, eps, elementwise_affine
        self.weight = nn.Parameter(torch.ones(d_model)) if elementwise_affine else None
        has_bias = bias and elementwise_affine
        self.bias = nn.Parameter(torch.zeros(d_model)) if has_bias else None

    def forward(self, x: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Normalize each token over its features; ``padding_mask`` is accepted and ignored.

        Shapes:
            x: (B, L, D) or (B, D); padding_mask: (B, L) bool, True = padding.
            returns: the shape of x.
        """
        x, _ = check_norm_input(x, padding_mask, self.d_model)
        check_weight_dtype("x", x, self.weight, allow_narrower=True)
        wide = torch.promote_types(x.dtype, torch.float32)
        if wide == x.dtype or x.device.type == "cuda":  # CUDA: float32 statistics in the kernel
            return F.layer_norm(x, (self.d_model,), self.weight, self.bias, self.eps)
        h = x.to(wide)
        var, mean = torch.var_mean(h, dim=-1, correction=0, keepdim=True)  # (..., 1) each
        y = (h - mean) * torch.rsqrt(var + self.eps)  # centred first: no cancellation
        if self.weight is not None:
            y = y * self.weight.to(wide)
        if self.bias is not None:
            y = y + self.bias.to(wide)
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        affine = "" if self.elementwise_affine else ", elementwise_affine=False"
        return f"{self.d_model}, eps={self.eps}, bias={self.bias is not None}{affine}"


class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang & Sennrich, 2019): ``x / sqrt(mean(x^2) + eps) * weight``.

    Equals ``nn.RMSNorm(d_model, eps=eps)``: no centring, no bias, one parameter ``weight``
    (init 1). ``eps=None`` means ``torch.finfo(x.dtype).eps``, as in ``nn.RMSNorm``.
    """

    def __init__(self, d_model: int, *, eps: float | None = None) -> None:
        super().__init__()
        d_model = check_int("d_model", d_model, min_value=1)
        self.d_model = d_model
        self.eps = None if eps is None else check_float("eps", eps, min_value=0.0)
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Scale each token by its root mean square; ``padding_mask`` is accepted and ignored.

        Shapes:
            x: (B, L, D) or (B, D); padding_mask: (B, L) bool, True = padding.
            returns: the shape of x.
        """
        x, _ = check_norm_input(x, padding_mask, self.d_model)
        return F.rms_norm(x, (self.d_model,), self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.d_model}, eps={self.eps}"


class NoNorm(nn.Identity):
    """A switched-off norm: returns ``x`` itself, with every norm's call signature.

    For places that may hold a norm or none (a stack without a final norm), so the caller
    calls ``norm(x, padding_mask=...)`` either way. An ``nn.Identity``, with no parameters.
    """

    def forward(self, x: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Return ``x`` unchanged; ``padding_mask`` is accepted and ignored.

        Shapes:
            x: any shape (a norm's (B, L, D) or (B, D)); padding_mask: (B, L) bool.
            returns: x.
        """
        return x


def make_norm(
    kind: str,
    d_model: int,
    *,
    eps: float | None = 1e-5,
    bias: bool = True,
    n_groups: int = N_GROUPS,
) -> nn.Module:
    """Build the norm named by ``kind``: ``"layer" | "batch" | "rms" | "group"``.

    ``eps`` applies to every kind, so swapping the kind in an ablation changes one thing only
    (note that ``nn.RMSNorm``'s own default is the dtype's machine epsilon, not 1e-5: pass
    ``eps=None`` with ``kind="rms"`` to get it; ``None`` is refused for the other kinds).
    ``bias=False`` is only available for ``"layer"`` (RMSNorm has no bias; BatchNorm and
    GroupNorm always have one). ``n_groups`` is used by ``"group"`` only; its default, 32, is
    the GroupNorm paper's.
    """
    check_choice("kind", kind, NORM_KINDS)
    check_bool("bias", bias)
    if eps is None and kind != "rms":
        raise ValueError(f"eps=None is only allowed for kind 'rms', got kind {kind!r}")
    if not bias and kind != "layer":
        raise ValueError(f"bias=False is only supported for kind 'layer', got kind {kind!r}")
    if kind == "rms":
        return RMSNorm(d_model, eps=eps)
    eps = cast(float, eps)  # not None: refused above for every kind but "rms"
    if kind == "layer":
        return LayerNorm(d_model, eps=eps, bias=bias)
    if kind == "batch":
        return BatchNorm(d_model, eps=eps)
    return GroupNorm(n_groups, d_model, eps=eps)
