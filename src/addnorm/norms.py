"""Normalization layers for (B, L, D) sequences and (B, D) vectors (SPEC section 3).

Every norm is called as ``norm(x, padding_mask=None)``:

- ``x``: (B, L, D) or (B, D), floating point.
- ``padding_mask``: bool (B, L), **True = padding token**, only for (B, L, D) input.
  ``BatchNorm`` and ``GroupNorm`` leave padding out of their statistics; ``LayerNorm`` and
  ``RMSNorm`` normalize each token on its own, so they accept the mask and ignore it.
  ``NoNorm`` is a switched-off norm (the identity) with the same signature.

All of them compute ``y = gamma * (x - mu) / sqrt(sigma^2 + eps) + beta`` (RMSNorm drops
``mu`` and ``beta``) with the biased variance and ``eps`` inside the square root; they differ
only in which values the statistics ``mu, sigma^2`` are taken over:

- LayerNorm: each token, over its D features.
- BatchNorm: each feature, over the batch (and the real positions).
- GroupNorm: each sample and group of D / G features, over the group and the real positions.

Padding positions are *not* zeroed: they are normalized with the same statistics as the real
tokens, so every norm stays an elementwise affine map per (sample, feature) once its
statistics are known. Downstream attention ignores padded keys anyway. In BatchNorm and
GroupNorm (the norms that read ``padding_mask``) the padding's values, NaN and inf included,
reach neither the real outputs nor any gradient of the real outputs: they are selected out
with ``torch.where`` (never multiplied by 0), and a padding output is computed with the
statistics and affine parameters held constant, so its gradient flows to its own input only
(padding outputs feed no real output downstream, so no loss on real outputs loses a term).
LayerNorm and RMSNorm, which ignore the mask, keep padding out of the real outputs and their
input gradients (each token is normalized alone) but not out of ``weight``'s gradient, a sum
over every token of ``grad * x_hat`` (``0 * NaN``): keep padding finite for them, as for every
position-wise Linear.

Dtypes: the output has x's dtype whatever the parameters' dtype (a float32 norm applied to
bfloat16 activations returns bfloat16), as in torch's norms. BatchNorm, GroupNorm and
LayerNorm take their statistics, and normalize, in ``torch.promote_types(x.dtype,
torch.float32)`` (RMSNorm through ``F.rms_norm``, which widens itself): a float16 variance
overflows at 65504 (a feature with std 256), which would zero the output, and a low-precision
variance of values far from 0 is lost to cancellation (see :class:`LayerNorm`).
For the same reason BatchNorm's running statistics stay float32 when the module is cast to
float16 or bfloat16 (see :class:`BatchNorm`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from addnorm.utils.checks import (
    check_bool,
    check_bool_mask,
    check_choice,
    check_float,
    check_int,
    check_tensor,
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


def _check_norm_input(
    x: object, padding_mask: object, d_model: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Validate ``norm(x, padding_mask)`` arguments: x (B, L, D) / (B, D), mask bool (B, L)."""
    x = check_tensor("x", x, ndim=(2, 3), last_dim=d_model, floating=True)
    if padding_mask is None:
        return x, None
    if x.ndim == 2:
        raise ValueError(
            "padding_mask is only meaningful for (B, L, D) input; "
            f"got x of shape {tuple(x.shape)} (B, D)"
        )
    padding_mask = check_bool_mask(
        "padding_mask (True = padding)", padding_mask, x.shape[:2], x.device
    )
    return x, padding_mask


def _check_eps(eps: object) -> float:
    return check_float("eps", eps, min_value=0.0)


def _check_groups(n_groups: int, d_model: int) -> None:
    if d_model % n_groups != 0:
        raise ValueError(f"d_model ({d_model}) must be divisible by n_groups ({n_groups})")


def _statistics_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for float16 / bfloat16 input (torch's accumulation type), else the input's."""
    return torch.promote_types(dtype, torch.float32)


def _masked_var_mean(
    values: torch.Tensor,
    real: torch.Tensor | None,
    *,
    dim: tuple[int, ...],
    count: int | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Biased variance and mean over ``dim`` (kept) of the entries where ``real`` is True.

    ``real`` broadcasts against ``values`` (None = every entry is real); ``count`` is the
    number of real entries per reduced slice. Masked entries are replaced by zeros with
    ``torch.where`` (never multiplied by 0), so padding holding inf or NaN cannot leak in.
    """
    if real is None:
        return torch.var_mean(values, dim=dim, correction=0, keepdim=True)
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    mean = torch.where(real, values, zero).sum(dim=dim, keepdim=True) / count
    centred = torch.where(real, values - mean, zero)
    return centred.square().sum(dim=dim, keepdim=True) / count, mean


def _normalized(
    h: torch.Tensor,
    mean: torch.Tensor,
    var: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """``weight * (h - mean) / sqrt(var + eps) + bias``, everything broadcasting against h.

    Centred first, so a feature whose mean is large next to its spread loses nothing to
    cancellation; the per-feature factor ``weight / sqrt(var + eps)`` is formed once.
    """
    return torch.addcmul(bias, h - mean, weight * torch.rsqrt(var + eps))


def _normalized_with_padding(
    h: torch.Tensor,
    padding: torch.Tensor | None,
    mean: torch.Tensor,
    var: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """:func:`_normalized`, with the padding's values kept out of every gradient but their own.

    Real positions are normalized from ``h`` with padding replaced by 0 (``torch.where``), so
    NaN or inf there never enters a product in the backward pass (``0 * NaN = NaN``); padding
    positions take the same formula with the statistics and parameters detached, so their
    gradient reaches their own input and nothing else. ``padding`` (True = padding)
    broadcasts against ``h``; None = no padding.
    """
    if padding is None:
        return _normalized(h, mean, var, weight, bias, eps)
    real_h = torch.where(padding, torch.zeros((), dtype=h.dtype, device=h.device), h)
    real = _normalized(real_h, mean, var, weight, bias, eps)
    held = _normalized(h, mean.detach(), var.detach(), weight.detach(), bias.detach(), eps)
    return torch.where(padding, held, real)


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
        eps = _check_eps(eps)
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
        x, _ = _check_norm_input(x, padding_mask, self.d_model)
        check_weight_dtype("x", x, self.weight, allow_narrower=True)
        wide = _statistics_dtype(x.dtype)
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
        self.d_model, self.eps = d_model, None if eps is None else _check_eps(eps)
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Scale each token by its root mean square; ``padding_mask`` is accepted and ignored.

        Shapes:
            x: (B, L, D) or (B, D); padding_mask: (B, L) bool, True = padding.
            returns: the shape of x.
        """
        x, _ = _check_norm_input(x, padding_mask, self.d_model)
        return F.rms_norm(x, (self.d_model,), self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.d_model}, eps={self.eps}"


class BatchNorm(nn.Module):
    """Per-feature normalization over the batch and the real positions (Ioffe & Szegedy, 2015).

    With no ``padding_mask`` this equals ``nn.BatchNorm1d(d_model)`` applied to (B, D) input or
    to ``x.transpose(1, 2)`` for (B, L, D) input. Parameters and buffers carry nn.BatchNorm1d's
    names (``weight``, ``bias``, ``running_mean``, ``running_var``, ``num_batches_tracked``), so
    state dicts load both ways.

    Training: the statistics are the mean and biased variance over the real tokens (padding
    positions, and sequences that are all padding, contribute nothing), and the running
    statistics move by ``momentum`` towards the mean and the *unbiased* variance
    (n / (n - 1)); ``momentum=None`` keeps a cumulative average (factor 1 / batches seen).
    Evaluation: the running statistics are used, so train and eval differ (SPEC section 3).

    Fewer than 2 real values per feature in training (one (B, D) vector, or one real token)
    have no variance to estimate: like ``nn.BatchNorm1d`` ("Expected more than 1 value per
    channel when training") this raises ``ValueError`` naming the count; evaluation mode works.
    A batch of one sequence with L > 1 real tokens is fine. Counting the real tokens of a
    masked batch reads one number back from the device (a sync on CUDA).

    Empty input (B = 0 or L = 0) in training raises the same ``ValueError`` ("got 0"): there
    are no statistics to normalize with or to fold into the running ones. (``nn.BatchNorm1d``
    instead returns an empty tensor and counts the batch in ``num_batches_tracked``.) In eval
    mode empty input returns an empty tensor.

    Statistics and running statistics are computed in float32 for float16 / bfloat16 input (the
    module docstring says why); the output has x's dtype. The buffers ``running_mean`` and
    ``running_var`` stay float32 when the module is cast to float16 or bfloat16 (``.half()``,
    ``.to(dtype)``; they follow device moves and wider casts): the variance of finite float16
    values reaches 65504**2, which a float16 buffer cannot hold (``nn.BatchNorm1d`` cast to
    float16 overflows: ``docs/measurements.md``). The rule: a running statistic is inf or NaN
    only if a batch statistic itself overflows float32 (or the input holds inf/NaN at real
    positions). A float16 state dict loads into them (converted).

    Padding positions in the output are normalized with the same statistics as real tokens.
    Their values never enter the statistics nor any gradient but their own (see the module
    docstring), so NaN or inf there stays in their own outputs.
    """

    running_mean: torch.Tensor
    running_var: torch.Tensor
    num_batches_tracked: torch.Tensor

    def __init__(self, d_model: int, *, eps: float = 1e-5, momentum: float | None = 0.1) -> None:
        super().__init__()
        d_model = check_int("d_model", d_model, min_value=1)
        eps = _check_eps(eps)
        if momentum is not None:
            momentum = check_float("momentum", momentum, min_value=0.0, max_value=1.0)
        self.d_model, self.eps, self.momentum = d_model, eps, momentum
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))
        self.register_buffer("running_mean", torch.zeros(d_model))
        self.register_buffer("running_var", torch.ones(d_model))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> BatchNorm:
        """``nn.Module._apply`` (``.to``, ``.half``, ``.cuda``, ...), with the running
        statistics kept at float32 or wider: they follow the device, not a narrower dtype."""
        before = {name: self._buffers[name] for name in ("running_mean", "running_var")}
        super()._apply(fn, recurse)
        for name, old in before.items():
            new = self._buffers[name]
            wide = _statistics_dtype(new.dtype) if new is not None else None
            if old is not None and new is not None and wide != new.dtype:
                self._buffers[name] = old.to(device=new.device, dtype=wide)
        return self

    def forward(self, x: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Normalize each feature with batch statistics (training) or running ones (eval).

        Shapes:
            x: (B, L, D) or (B, D); padding_mask: (B, L) bool, True = padding.
            returns: the shape of x.
        """
        x, padding_mask = _check_norm_input(x, padding_mask, self.d_model)
        wide = _statistics_dtype(x.dtype)
        h = x.to(wide)
        if self.training:
            mean, var = self._batch_statistics(h, padding_mask)
        else:
            mean, var = self.running_mean.to(wide), self.running_var.to(wide)
        padding = None if padding_mask is None else padding_mask[..., None]  # (B, L, 1)
        weight, bias = self.weight.to(wide), self.bias.to(wide)
        y = _normalized_with_padding(h, padding, mean, var, weight, bias, self.eps)
        return y.to(x.dtype)

    def _batch_statistics(
        self, x: torch.Tensor, padding_mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and biased variance per feature over the real tokens; update running stats."""
        tokens = x.reshape(-1, self.d_model)  # (B*L, D) or (B, D)
        real = None if padding_mask is None else ~padding_mask.reshape(-1, 1)  # (B*L, 1)
        n = tokens.shape[0] if real is None else int(real.sum())
        if n < 2:
            raise ValueError(
                "BatchNorm needs more than 1 real value per feature in training, got "
                f"{n} (x of shape {tuple(x.shape)}); use eval mode or a larger batch"
            )
        var, mean = _masked_var_mean(tokens, real, dim=(0,), count=n)  # (1, D) each
        self._update_running_statistics(mean[0], var[0] * (n / (n - 1)))
        return mean[0], var[0]

    @torch.no_grad()
    def _update_running_statistics(self, mean: torch.Tensor, unbiased_var: torch.Tensor) -> None:
        """Exponential (``momentum``) or cumulative (``momentum=None``) average, as BatchNorm1d.

        The average is taken in the statistics' dtype and rounded once into the buffers, so a
        float16 module keeps a finite running variance while the average itself fits float16.
        """
        self.num_batches_tracked.add_(1)
        if self.momentum is None:
            factor = 1.0 / float(self.num_batches_tracked)
        else:
            factor = self.momentum
        for running, batch in ((self.running_mean, mean), (self.running_var, unbiased_var)):
            running.copy_(running.to(batch.dtype).lerp(batch.detach(), factor))

    def extra_repr(self) -> str:
        return f"{self.d_model}, eps={self.eps}, momentum={self.momentum}"


class GroupNorm(nn.Module):
    """Per-sample normalization over groups of D / G features and every real position.

    Wu & He (2018). For (B, L, D) input with no mask this equals
    ``nn.GroupNorm(n_groups, d_model)(x.transpose(1, 2)).transpose(1, 2)``; for (B, D) input it
    equals ``nn.GroupNorm(n_groups, d_model)(x)``. Parameters ``weight`` and ``bias`` as there.

    With ``padding_mask`` only the real positions of each sample enter its statistics, so a
    sample's output does not depend on its padding; padding positions are normalized with the
    same statistics. A sample that is all padding has no statistics: it is normalized with
    mean 0 and variance 1 so that its output stays finite (never NaN).

    Statistics are computed in float32 for float16 / bfloat16 input; the output has x's dtype.
    Empty input (B = 0, or L = 0) returns an empty tensor of x's shape.
    """

    def __init__(self, n_groups: int, d_model: int, *, eps: float = 1e-5) -> None:
        super().__init__()
        n_groups = check_int("n_groups", n_groups, min_value=1)
        d_model = check_int("d_model", d_model, min_value=1)
        _check_groups(n_groups, d_model)
        self.n_groups, self.d_model, self.eps = n_groups, d_model, _check_eps(eps)
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))

    def forward(self, x: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Normalize each sample's feature groups over the group and its real positions.

        Shapes:
            x: (B, L, D) or (B, D); padding_mask: (B, L) bool, True = padding.
            returns: the shape of x.
        """
        x, padding_mask = _check_norm_input(x, padding_mask, self.d_model)
        if x.numel() == 0:  # no positions: no statistics to take (torch.var_mean would warn)
            return torch.empty_like(x)
        h = x.to(_statistics_dtype(x.dtype))
        seq = h if h.ndim == 3 else h.unsqueeze(1)  # (B, L, D), L = 1 for (B, D)
        groups = seq.unflatten(-1, (self.n_groups, -1))  # (B, L, G, D/G)
        mean, var = self._group_statistics(groups, padding_mask)
        padding = None if padding_mask is None else padding_mask[:, :, None, None]  # (B, L, 1, 1)
        weight = self.weight.to(h.dtype).view(self.n_groups, -1)  # (G, D/G)
        bias = self.bias.to(h.dtype).view(self.n_groups, -1)  # (G, D/G)
        y = _normalized_with_padding(groups, padding, mean, var, weight, bias, self.eps)
        return y.flatten(-2).reshape(x.shape).to(x.dtype)  # back to (B, L, D) or (B, D)

    def _group_statistics(
        self, groups: torch.Tensor, padding_mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and biased variance per (sample, group), over the real positions only."""
        if padding_mask is None:
            var, mean = torch.var_mean(groups, dim=(1, 3), correction=0, keepdim=True)
            return mean, var  # (B, 1, G, 1) each
        real = ~padding_mask[:, :, None, None]  # (B, L, 1, 1)
        n_real = real.sum(dim=1, keepdim=True) * groups.shape[-1]  # (B, 1, 1, 1)
        count = n_real.clamp(min=1).to(groups.dtype)
        var, mean = _masked_var_mean(groups, real, dim=(1, 3), count=count)  # (B, 1, G, 1)
        var = torch.where(n_real > 0, var, torch.ones((), dtype=var.dtype, device=var.device))
        return mean, var

    def extra_repr(self) -> str:
        return f"{self.n_groups}, {self.d_model}, eps={self.eps}"


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

