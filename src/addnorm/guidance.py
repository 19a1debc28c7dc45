"""Classifier-free guidance's formula (Ho & Salimans, 2022, eq. 6 in noise form), once.

    guided = uncond + s * (cond - uncond)        s = guidance scale; 1 gives cond, 0 uncond

Both ways of guiding compute it here: the DiT's ``forward_with_cfg`` (DiT's calling
convention, :mod:`addnorm.dit.guidance`) and :func:`addnorm.diffusion.guided_eps_fn` (any
conditional model as an ``eps_fn`` for sampling). It sits with the parts, below both families.
"""

from __future__ import annotations

import torch

__all__ = ["guided_prediction"]


def guided_prediction(
    cond: torch.Tensor, uncond: torch.Tensor, guidance_scale: float
) -> torch.Tensor:
    """``uncond + guidance_scale * (cond - uncond)``: the formula alone, on arguments its
    callers checked (a finite scale; two halves of one model output).

    Shapes:
        cond, uncond: (B, ...), the same shape
        returns: (B, ...)
    """
    return uncond + guidance_scale * (cond - uncond)
