"""Classifier-free guidance (Ho & Salimans, 2022) on a batch of conditional and null halves.

    guided = uncond + s * (cond - uncond)        s = guidance scale; s = 1 gives cond

(the formula: :func:`addnorm.guidance.guided_prediction`, shared with
:func:`addnorm.diffusion.guided_eps_fn`). DiT's calling convention: the batch holds 2B rows,
the first B conditioned on their classes, the last B on the null class (the same noise
images in both halves), and the guided result is returned for both halves, so a sampler can
treat the doubled batch as one.

Shapes legend: B batch (of each half), C_out output channels, H x W image.
"""

from __future__ import annotations

import torch

from addnorm.guidance import guided_prediction
from addnorm.utils.checks import check_float

__all__ = ["classifier_free_guidance"]


def classifier_free_guidance(
    out: torch.Tensor, guidance_scale: float, *, n_guided: int
) -> torch.Tensor:
    """Guide the first ``n_guided`` channels; pass the others through from each half.

    ``guidance_scale`` may be any finite number (NaN and infinities are refused); whether the
    samples a sampler builds on it stay finite depends on the model, see
    :func:`addnorm.diffusion.guided_eps_fn`.

    Shapes:
        out: (2B, C_out, H, W), rows [conditional; unconditional]
        returns: (2B, C_out, H, W), guided channels equal in both halves
    """
    guidance_scale = check_float("guidance_scale", guidance_scale)
    guided, rest = out[:, :n_guided], out[:, n_guided:]  # (2B, n, H, W), (2B, C_out - n, H, W)
    cond, uncond = guided.chunk(2, dim=0)  # (B, n, H, W) each
    half = guided_prediction(cond, uncond, guidance_scale)  # (B, n, H, W)
    return torch.cat([torch.cat([half, half], dim=0), rest], dim=1)  # (2B, C_out, H, W)
