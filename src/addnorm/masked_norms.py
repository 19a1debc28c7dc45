"""The norms whose statistics span several tokens, and so read ``padding_mask``: BatchNorm
(each feature, over the batch and the real positions) and GroupNorm (each sample and group of
D / G features, over the group and the real positions). :mod:`addnorm.norms` states what every
norm shares and re-exports both.

Padding positions are *not* zeroed: they are normalized with the same statistics as the real
tokens, so each norm stays an elementwise affine map per (sample, feature) once its statistics
are known. The padding's values, NaN and inf included, reach neither the real outputs nor any
gradient of the real outputs: they are selected out with ``torch.where`` (never multiplied by
0), and a padding output is computed with the statistics and affine parameters held constant,
so its gradient flows to its own input only (padding outputs feed no real output downstream,
so no loss on real outputs loses a term).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from addnorm.utils.checks import check_float, check_int, check_norm_input

__all__ = ["BatchNorm", "GroupNorm"]


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


def _normalized(h: torch.Tensor, mean: torch.Tensor, var: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor, eps: float) -> torch.Tensor:
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

    Fewer than 2 real values per feature in training (one (B, D) vector, one real token, or
    empty input) have no variance to estimate: like ``nn.BatchNorm1d`` ("Expected more than 1
    value per channel when training") this raises ``ValueError`` naming the count (for empty
    input ``nn.BatchNorm1d`` instead returns an empty tensor and counts the batch); evaluation
    mode works. Counting the real tokens of a masked batch reads one number back (a sync).

    Statistics are taken in float32 for float16 / bfloat16 input, and ``running_mean`` and
    ``running_var`` stay float32 when the module is cast narrower (they follow device moves
    and wider casts; a float16 state dict loads into them, converted): the variance of finite
    float16 values reaches 65504**2, which a float16 buffer cannot hold (``nn.BatchNorm1d``
    cast to float16 overflows: ``docs/measurements.md``).
    """

    running_mean: torch.Tensor
    running_var: torch.Tensor
    num_batches_tracked: torch.Tensor

    def __init__(self, d_model: int, *, eps: float = 1e-5, momentum: float | None = 0.1) -> None:
        super().__init__()
        d_model = check_int("d_model", d_model, min_value=1)
        eps = check_float("eps", eps, min_value=0.0)
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
            wide = torch.promote_types(new.dtype, torch.float32) if new is not None else None
            if old is not None and new is not None and wide != new.dtype:
                self._buffers[name] = old.to(device=new.device, dtype=wide)
        return self

    def forward(self, x: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Normalize each feature with batch statistics (training) or running ones (eval).

        Shapes:
            x: (B, L, D) or (B, D); padding_mask: (B, L) bool, True = padding.
            returns: the shape of x.
        """
        x, padding_mask = check_norm_input(x, padding_mask, self.d_model)
        wide = torch.promote_types(x.dtype, torch.float32)  # float32 statistics for 16 bits
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

    Empty input (B = 0, or L = 0) returns an empty tensor of x's shape.
    """

    def __init__(self, n_groups: int, d_model: int, *, eps: float = 1e-5) -> None:
        super().__init__()
        n_groups = check_int("n_groups", n_groups, min_value=1)
        d_model = check_int("d_model", d_model, min_value=1)
        if d_model % n_groups != 0:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_groups ({n_groups})")
        eps = check_float("eps", eps, min_value=0.0)
        self.n_groups, self.d_model, self.eps = n_groups, d_model, eps
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))

    def forward(self, x: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Normalize each sample's feature groups over the group and its real positions.

        Shapes:
            x: (B, L, D) or (B, D); padding_mask: (B, L) bool, True = padding.
            returns: the shape of x.
        """
        x, padding_mask = check_norm_input(x, padding_mask, self.d_model)
        if x.numel() == 0:  # no positions: no statistics to take (torch.var_mean would warn)
            return torch.empty_like(x)
        h = x.to(torch.promote_types(x.dtype, torch.float32))  # float32 statistics for 16 bits
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
