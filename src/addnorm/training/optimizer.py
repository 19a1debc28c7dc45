"""The trainer's optimizer: AdamW with weight decay on matrices only; the gradients' norm
before clipping, and the factor clipping scaled them by."""

from __future__ import annotations

import torch
from torch import nn

from addnorm.training.config import TrainConfig

__all__ = ["clip_factor", "gradient_norm", "make_optimizer"]


def make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on biases, norm gains or scalars).

    torch's fused AdamW (one kernel for every parameter) on CPU and CUDA, FSDP's sharded
    parameters included: the default loop launches several small kernels per parameter,
    whose overhead dominates the update of a small model's many small tensors. Other
    devices: the default.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    fused = all(p.device.type in ("cpu", "cuda") for p in params) or None  # None: default
    return torch.optim.AdamW(
        groups, lr=config.lr, betas=(config.beta1, config.beta2), fused=fused
    )


def gradient_norm(model: nn.Module, clip: float) -> torch.Tensor:
    """The global norm of ``model``'s gradients before clipping (clipped to ``clip`` when it
    is > 0), as a tensor: it is read only when a record is made."""
    if clip > 0:
        return nn.utils.clip_grad_norm_(model.parameters(), clip)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return nn.utils.get_total_norm(grads) if grads else torch.zeros(())


def clip_factor(total_norm: torch.Tensor, clip: float) -> torch.Tensor:
    """What clipping to ``clip`` multiplied every gradient by, given their norm before it
    (:func:`gradient_norm`'s): ``min(1, clip / (total_norm + 1e-6))``, computed as torch's
    ``clip_grads_with_norm_`` computes it (the same float); 1 when ``clip`` is not > 0. A
    gradient's norm before clipping is its norm after divided by this."""
    if clip > 0:
        return torch.clamp(clip / (total_norm + 1e-6), max=1.0)
    return torch.ones((), device=total_norm.device)
