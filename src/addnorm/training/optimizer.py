"""The trainer's optimizer: AdamW with weight decay on matrices only."""

from __future__ import annotations

import torch
from torch import nn

from addnorm.training.config import TrainConfig

__all__ = ["make_optimizer"]


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
