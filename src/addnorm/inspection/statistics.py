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
- :func:`train_eval_sums`: how far a norm's training-mode output ``y`` sits from its eval-mode
  output ``y_eval`` of the same input, ``||y - y_eval|| / ||y||`` (BatchNorm: ``y_eval`` is
  normalized with its running statistics; the per-token and per-sample norms compute the same
  thing in both modes, so theirs is 0). For BatchNorm this gap holds two effects: the batch's
  own (its statistics are a sample's, not the full data's) and the running statistics' lag
  (they trail the weights that make the data they average).
- :func:`batch_effect_sums`: the first of the two alone, estimated from two halves of the
  batch: ``||y - y_full||``, ``y_full`` the output under the full data's statistics. What is
  left of the train/eval gap once it is taken out is the running statistics' lag.
- :func:`entropy_sums`: the entropy of each head's attention weights, ``-sum_j p_j ln p_j``
  (nats), per query row that sees a key.
- :func:`active_counts`: per ReLU unit, the tokens on which its pre-activation is positive;
  a unit active on no token of the step is *dead*: output and gradient 0.
- :func:`unit_output_sums`: per FFN unit (any activation, SwiGLU's gated product included),
  its largest ``|output|``, and the RMS of every unit's output: a unit whose output stays within
  a small band of zero on every token (``NEAR_ZERO`` of that RMS) is *near zero*. GELU and SiLU
  units are never dead in ReLU's sense (a negative input still passes a small output and
  gradient), so this is the measure for them.
"""

from __future__ import annotations

import torch

__all__ = [
    "NEAR_ZERO",
    "active_counts",
    "batch_effect_sums",
    "batchnorm_sums",
    "entropy_sums",
    "real_tokens",
    "rms_sums",
    "scale_sums",
    "train_eval_sums",
    "unit_output_sums",
]

Sums = dict[str, torch.Tensor]
WIDE = torch.float64  # what the sums are kept in
# An FFN unit is near zero when its |output| stays within this share of the RMS of all units'
# outputs on every real token of the step: it then adds at most 1e-4 of the FFN's output power
# per token, what no downstream weight of ordinary size can tell from nothing.
NEAR_ZERO = 0.01


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


def train_eval_sums(y: torch.Tensor, y_eval: torch.Tensor, real: torch.Tensor | None) -> Sums:
    """``gap_sq``: ``||y - y_eval||^2`` and ``signal_sq``: ``||y||^2`` over the real tokens, for
    a norm's training-mode output ``y`` and its eval-mode output ``y_eval`` of the same input.

    Shapes: y, y_eval (B, L, D) or (B, D); real (B, L)."""
    out = _wide(y)
    w = _weights(out, real)[..., None]
    diff = torch.where(w > 0, out - _wide(y_eval), torch.zeros_like(out))
    kept = torch.where(w > 0, out, torch.zeros_like(out))
    return {"gap_sq": diff.square().sum().to(WIDE), "signal_sq": kept.square().sum().to(WIDE)}


def batch_effect_sums(
    x: torch.Tensor,
    real: torch.Tensor | None,
    *,
    weight: torch.Tensor,
    eps: float,
    train_eval: Sums,
) -> Sums:
    """A training-mode BatchNorm call's own batch effect, from two halves of its batch.

    The samples (dim 0) split into the first ``B // 2`` (A) and the rest (B), each with its
    mean ``m_A`` and biased standard deviation ``s_A = sqrt(var_A + eps)`` over its real
    tokens. Normalizing a token with A's statistics instead of B's moves the output by, to
    first order around the whole batch's ``m`` and ``s``,
    ``weight * ((m_A - m_B) + (x - m) (s_A - s_B) / s) / s``. Over samples drawn
    independently, ``m_A - m_B`` has ``1 / k^2`` times the variance of the whole batch's mean
    around the full data's, ``k^2 = n_A n_B / (n_A + n_B)^2`` (1/4 for equal halves; ``n``
    the real tokens), and so has ``s_A - s_B`` to first order; ``effect_sq``, ``k^2`` times
    that move squared and summed over the real tokens, estimates ``||y - y_full||^2``: the
    distance of the output from what the full data's statistics would give. (First order,
    so that a half's noisy ``1 / s_A`` does not inflate it: with 16 tokens a half the exact
    difference reads about 12% high.)

    The estimate assumes the batch's samples independent. A BatchNorm after another one sees
    samples the earlier one has coupled (it centres the whole batch, so the halves' deviations
    oppose each other), and there the estimate reads high against statistics pooled over many
    batches (``batch_effect_check`` in docs/watch-lm.json, the README's numbers), and the lag
    taken as the rest reads low.

    ``train_eval`` (:func:`train_eval_sums` of the same call) is passed on as ``split_gap_sq``
    and ``split_signal_sq``, so that the running statistics' lag, ``split_gap_sq - effect_sq``
    in expectation, is taken over the same calls. All three are 0 for a call that cannot
    split (a half with fewer than 2 real tokens); empty for B < 2.

    Shapes: x (B, L, D) or (B, D); real (B, L); weight (D,)."""
    batch = x.shape[0]
    if batch < 2:
        return {}
    h = _wide(x)
    w = _weights(h, real)  # (B, L) or (B,)
    first = (torch.arange(batch, device=h.device) < batch // 2).reshape(
        batch, *([1] * (w.ndim - 1)))  # (B, 1) or (B,)
    kept = torch.where(w[..., None] > 0, h, torch.zeros_like(h))
    tokens = tuple(range(h.ndim - 1))
    moments = []
    for side in (first, ~first, torch.ones_like(first)):
        ws = (w * side)[..., None]  # (B, L, 1) or (B, 1)
        n = ws.sum()
        safe = n.clamp(min=1.0)
        mean = (kept * ws).sum(tokens) / safe  # (D,)
        var = ((kept - mean).square() * ws).sum(tokens) / safe  # (D,), biased
        moments.append((n, mean, torch.sqrt(var + eps)))
    (n_a, mean_a, sd_a), (n_b, mean_b, sd_b), (_, mean, sd) = moments
    split = ((n_a >= 2) & (n_b >= 2)).to(WIDE)
    k_sq = (n_a * n_b / (n_a + n_b).clamp(min=1.0).square()).to(WIDE)
    move = weight.to(h.dtype) * ((mean_a - mean_b) + (kept - mean) * (sd_a - sd_b) / sd) / sd
    move = torch.where(w[..., None] > 0, move, torch.zeros_like(move))
    return {
        "effect_sq": move.square().sum().to(WIDE) * k_sq * split,
        "split_gap_sq": train_eval["gap_sq"] * split,
        "split_signal_sq": train_eval["signal_sq"] * split,
    }


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


def unit_output_sums(out: torch.Tensor, real: torch.Tensor | None) -> Sums:
    """``max_abs``: per unit, its largest ``|output|`` over the real tokens (0 without any);
    ``sq`` and ``n``: the sum of squares and the count of every unit's outputs there, for their
    RMS. ``max_abs`` is combined over calls and processes by its maximum, not its sum (the
    watch does so for every statistic named ``max_...``).

    Shapes: out (B, L, F) or (..., F); real (B, L) -> max_abs (F,)."""
    magnitude = _wide(out).abs()
    w = _weights(magnitude, real)[..., None]  # (..., 1)
    magnitude = torch.where(w > 0, magnitude, torch.zeros_like(magnitude))  # NaN padding too
    flat = magnitude.reshape(-1, out.shape[-1])  # (N, F)
    top = flat.amax(0) if flat.shape[0] else torch.zeros(out.shape[-1], device=out.device)
    return {
        "max_abs": top.to(WIDE),
        "sq": flat.square().sum().to(WIDE),
        "n": (w.sum() * out.shape[-1]).to(WIDE),
    }
