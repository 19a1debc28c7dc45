"""What the watch measures of one call of a part, as sums: float64 tensors on the part's
device, added over the calls of a step (micro-batches) and over the processes of a
``torchrun`` launch, and divided only at the end (:mod:`addnorm.inspection.watcher`).

Every statistic is taken in float32 or wider (float64 stays float64) from the values the
forward saw (bfloat16 under autocast included), over the real tokens only: ``real`` is bool
(B, L), True = a real token, or None when every token is real. Nothing here reads a value
back to the host.

- :func:`rms_sums`: the root mean square of a residual stream, ``sqrt(mean(x^2))``.
- :func:`scale_sums`: the per-token scale a LayerNorm (``sqrt(var + eps)``) or RMSNorm
  (``sqrt(mean(x^2) + eps)``) divides out, or a GroupNorm's per-sample-and-group one: its
  mean and its spread (coefficient of variation) over the tokens.
- :func:`batchnorm_sums`: how far a BatchNorm's batch statistics sit from its running
  estimates.
- :func:`batch_noise_sums`: the part of a norm's training-mode output that depends on the
  batch, ``||y - y_eval|| / ||y||``, with ``y_eval`` the same input through the norm in eval
  mode (BatchNorm: normalized with its running statistics; the per-token and per-sample norms
  compute the same thing in both modes, so theirs is 0).
- :func:`entropy_sums`: the entropy of each head's attention weights, ``-sum_j p_j ln p_j``
  (nats), per query row that sees a key.
- :func:`active_counts`: per FFN unit, the tokens on which its pre-activation is positive;
  a unit active on no token of the step is dead.
"""

from __future__ import annotations

import torch

__all__ = [
    "active_counts",
    "batch_noise_sums",
    "batchnorm_sums",
    "entropy_sums",
    "real_tokens",
    "rms_sums",
    "scale_sums",
]

Sums = dict[str, torch.Tensor]
WIDE = torch.float64  # what the sums are kept in


def _wide(x: torch.Tensor) -> torch.Tensor:
    """x in float32 at least (bfloat16 and float16 widened; float64 kept)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def real_tokens(x: torch.Tensor, padding_mask: torch.Tensor | None) -> torch.Tensor | None:
    """True = a real token of ``x`` (B, L, ...), from a padding mask (B, L) that fits it;
    None when no mask fits (then every token counts)."""
    if padding_mask is None or x.ndim < 3 or tuple(padding_mask.shape) != tuple(x.shape[:2]):
        return None
    return ~padding_mask


def _weights(x: torch.Tensor, real: torch.Tensor | None) -> torch.Tensor:
    """1.0 for a real token, 0.0 for padding, shaped as x's token dims (x.shape[:-1])."""
    if real is None:
        return torch.ones(x.shape[:-1], dtype=torch.float32, device=x.device)
    return real.to(torch.float32).reshape(x.shape[:-1])


def rms_sums(x: torch.Tensor, real: torch.Tensor | None) -> Sums:
    """``sq``: the sum of x^2 over the real tokens' features; ``n``: how many values.

    Shapes: x (B, L, D) or (B, D); real (B, L)."""
    w = _weights(x, real)
    squares = _wide(x).square().sum(-1)  # (B, L) or (B,)
    squares = torch.where(w > 0, squares, torch.zeros_like(squares))  # padding may hold NaN
    return {"sq": squares.sum().to(WIDE), "n": (w.sum() * x.shape[-1]).to(WIDE)}


def scale_sums(
    kind: str, x: torch.Tensor, real: torch.Tensor | None, eps: float, n_groups: int = 1
) -> Sums:
    """The scales ``s`` a norm divides out: ``s1`` = sum s, ``s2`` = sum s^2, ``n`` = count.

    ``kind``: ``"layer"`` (per token, ``sqrt(var + eps)``), ``"rms"`` (per token,
    ``sqrt(mean(x^2) + eps)``) or ``"group"`` (per sample and group of ``D / n_groups``
    features, over its real positions).

    Shapes: x (B, L, D) or (B, D); real (B, L)."""
    h = _wide(x)
    if kind == "group":
        scales, w = _group_scales(h, real, eps, n_groups)
    else:
        w = _weights(h, real)
        if kind == "layer":
            spread = h.var(-1, correction=0)
        else:
            spread = h.square().mean(-1)
        scales = torch.sqrt(spread + eps)
    scales = torch.where(w > 0, scales, torch.zeros_like(scales))
    return {
        "s1": scales.sum().to(WIDE),
        "s2": scales.to(WIDE).square().sum(),
        "n": w.sum().to(WIDE),
    }


def _group_scales(
    h: torch.Tensor, real: torch.Tensor | None, eps: float, n_groups: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """GroupNorm's ``sqrt(var + eps)`` per (sample, group) over the real positions, and 1.0
    where the sample has a real position (0.0 for a sample that is all padding).

    Shapes: h (B, L, D) or (B, D) -> scales (B, G), weights (B, G)."""
    seq = h if h.ndim == 3 else h.unsqueeze(1)  # (B, L, D)
    groups = seq.unflatten(-1, (n_groups, -1))  # (B, L, G, D/G)
    w = _weights(seq, real)[:, :, None, None]  # (B, L, 1, 1)
    count = w.sum(1, keepdim=True) * groups.shape[-1]  # (B, 1, 1, 1)
    safe = count.clamp(min=1.0)
    kept = torch.where(w > 0, groups, torch.zeros_like(groups))
    mean = kept.sum((1, 3), keepdim=True) / safe  # (B, 1, G, 1)
    centred = torch.where(w > 0, groups - mean, torch.zeros_like(groups))
    var = centred.square().sum((1, 3), keepdim=True) / safe  # (B, 1, G, 1)
    scales = torch.sqrt(var + eps)[:, 0, :, 0]  # (B, G)
    return scales, (count[:, 0, :, 0] > 0).to(torch.float32).expand_as(scales)


def batchnorm_sums(
    x: torch.Tensor,
    real: torch.Tensor | None,
    *,
    running_mean: torch.Tensor,
    running_var: torch.Tensor,
    eps: float,
) -> Sums:
    """A training-mode BatchNorm call against the running statistics it had before it.

    ``gap``: sum over features of ``(mean_b - mean_r)^2 / (var_r + eps)`` (the batch mean's
    shift in running standard deviations, squared); ``log_var``: sum over features of
    ``ln((var_b + eps) / (var_r + eps))^2``; ``features``: how many features.

    Shapes: x (B, L, D) or (B, D); real (B, L); the running statistics (D,)."""
    h = _wide(x)
    w = _weights(h, real)[..., None]  # (B, L, 1) or (B, 1)
    tokens = tuple(range(h.ndim - 1))
    n = w.sum().clamp(min=1.0)
    kept = torch.where(w > 0, h, torch.zeros_like(h))
    mean_b = kept.sum(tokens) / n  # (D,)
    centred = torch.where(w > 0, h - mean_b, torch.zeros_like(h))
    var_b = centred.square().sum(tokens) / n  # (D,), biased as BatchNorm normalizes
    mean_r, var_r = running_mean.to(h.dtype), running_var.to(h.dtype)
    return {
        "gap": ((mean_b - mean_r).square() / (var_r + eps)).sum().to(WIDE),
        "log_var": torch.log((var_b + eps) / (var_r + eps)).square().sum().to(WIDE),
        "features": torch.tensor(float(h.shape[-1]), dtype=WIDE, device=h.device),
    }


def batch_noise_sums(y: torch.Tensor, y_eval: torch.Tensor, real: torch.Tensor | None) -> Sums:
    """``noise_sq``: ``||y - y_eval||^2`` and ``signal_sq``: ``||y||^2`` over the real tokens, for
    a norm's training-mode output ``y`` and its eval-mode output ``y_eval`` of the same input.

    Shapes: y, y_eval (B, L, D) or (B, D); real (B, L)."""
    out = _wide(y)
    w = _weights(out, real)[..., None]
    diff = torch.where(w > 0, out - _wide(y_eval), torch.zeros_like(out))
    kept = torch.where(w > 0, out, torch.zeros_like(out))
    return {"noise_sq": diff.square().sum().to(WIDE), "signal_sq": kept.square().sum().to(WIDE)}


def entropy_sums(weights: torch.Tensor, real: torch.Tensor | None) -> Sums:
    """``entropy``: per head, the sum over real query rows that see a key of
    ``-sum_j p_j ln p_j``; ``rows``: per head, how many rows.

    Shapes: weights (B, H, L, S), rows summing to 1 or all zero; real (B, L) ->
    entropy (H,), rows (H,)."""
    p = _wide(weights)
    entropy = -torch.special.xlogy(p, p).sum(-1)  # (B, H, L)
    counted = p.sum(-1) > 0  # (B, H, L): rows that see a key
    if real is not None:
        counted = counted & real[:, None, :]
    entropy = torch.where(counted, entropy, torch.zeros_like(entropy))
    return {
        "entropy": entropy.sum((0, 2)).to(WIDE),
        "rows": counted.sum((0, 2)).to(WIDE),
    }


def active_counts(h: torch.Tensor, real: torch.Tensor | None) -> Sums:
    """``active``: per unit, the real tokens with a positive pre-activation; ``tokens``: how
    many real tokens.

    Shapes: h (B, L, F) or (..., F); real (B, L) -> active (F,)."""
    active = h > 0  # (..., F)
    w = _weights(h, real)
    if real is not None:
        active = active & real[..., None]
    return {
        "active": active.reshape(-1, h.shape[-1]).sum(0).to(WIDE),
        "tokens": w.sum().to(WIDE),
    }
