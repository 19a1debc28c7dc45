"""Classifier-free guidance (Ho & Salimans, 2022) as a wrapper around a conditional model.

Shapes legend: B batch, C channels, ``...`` further data dims.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from addnorm.diffusion.sampling import EpsFn
from addnorm.guidance import guided_prediction
from addnorm.utils.checks import check_float, check_int, check_tensor

__all__ = ["guided_eps_fn"]


def guided_eps_fn(
    model: Callable[[Tensor, Tensor, Tensor], Tensor],
    y: Tensor,
    *,
    guidance_scale: float,
    null_class: int,
) -> EpsFn:
    """``model(x, t, y)`` guided towards labels ``y``, as an ``eps_fn(x, t)`` for sampling.

    Each call runs the model once on the batch doubled: rows ``0 .. B-1`` with labels ``y``
    (conditional), rows ``B .. 2B-1`` with ``null_class`` (unconditional), and returns
    ``uncond + guidance_scale * (cond - uncond)`` on every prediction channel (1: the
    conditional model; 0: the unconditional one). With learned variance (2C output channels)
    the variance channels are the conditional half's, unguided. DiT's ``forward_with_cfg``
    guides only the first 3 channels "for exact reproducibility"; this guides all C.

    Args:
        model: called as ``model(x (2B, C, ...), t (2B,), y (2B,))``.
        y: (B,) integer class labels.
        guidance_scale: DiT's ``cfg_scale`` (4.0 in its sample.py, 1.5 for its FID runs);
            any finite number (NaN and infinities are refused).
        null_class: the label of "no class" (for DiT, ``n_classes``: its extra embedding row).

    Which scales keep a sample finite is the model's property, not the scale's: the guided
    output grows as ``s * |cond - uncond|``, the sampler feeds it back as x_t, and a network
    overflows once its inputs do (a DiT's LayerNorm squares them, and float32 squares
    overflow past about 1.8e19). Measured on float32 tiny DiTs, 5 to 50 DDIM or DDPM steps,
    by the largest ``|cond - uncond|``: 60 went non-finite from s = 1e17 to 4e17, 0.05 between
    1e20 and 1e22, 1e-12 (a barely trained model) at 1e31: about where ``s * |cond - uncond|``
    passes 1e19. A scale that is fine for one model overflows another, so no bound on ``s``
    alone is both safe and honest; :meth:`.Diffusion.sample` checks its result instead and
    raises FloatingPointError rather than return NaN.

    Shapes: the returned function maps x (B, C, ...), t (B,) to (B, C or 2C, ...).
    """
    if not callable(model):
        raise TypeError(f"model must be callable, got {type(model).__name__}")
    check_tensor("y", y, ndim=1)
    if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
        raise TypeError(f"y must be an integer tensor of labels, got dtype {y.dtype}")
    guidance_scale = check_float("guidance_scale", guidance_scale)
    null_class = check_int("null_class", null_class, min_value=0)
    labels = torch.cat([y, torch.full_like(y, null_class)])  # (2B,)

    def guided(x: Tensor, t: Tensor) -> Tensor:
        if x.shape[0] != y.shape[0] or t.shape != (x.shape[0],):
            raise ValueError(
                f"x {tuple(x.shape)} and t {tuple(t.shape)} must have the batch of y ({y.shape[0]})"
            )
        both = model(torch.cat([x, x]), torch.cat([t, t]), labels.to(x.device))  # (2B, C', ...)
        if not isinstance(both, Tensor) or both.shape[0] != 2 * x.shape[0]:
            got = tuple(both.shape) if isinstance(both, Tensor) else type(both).__name__
            raise ValueError(f"model must return a batch of {2 * x.shape[0]} rows, got {got}")
        cond, uncond = both.chunk(2)  # 2 x (B, C', ...), C' = C or 2C
        n_channels = x.shape[1]
        pred_cond, pred_uncond = cond[:, :n_channels], uncond[:, :n_channels]
        guided_pred = guided_prediction(pred_cond, pred_uncond, guidance_scale)  # (B, C, ...)
        if cond.shape[1] == n_channels:
            return guided_pred
        return torch.cat([guided_pred, cond[:, n_channels:]], dim=1)  # (B, 2C, ...)

    return guided
