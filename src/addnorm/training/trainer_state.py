"""What a callback is handed at each hook of ``Trainer.fit``: :class:`TrainerState`, a
snapshot of where training stands and the objects it trains, rather than the trainer itself.

A callback reads the step, the learning rate, the settings and the model and optimizer
through it (under the names the trainer has for them: ``state.step`` is ``trainer.step``);
what it may change is the objects' own state (an optimizer's param groups, a forward run
eagerly through ``state.wrapped.eager``), never the trainer's counters. The trainer makes a
new snapshot for every call, so one kept past its hook goes stale.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel

from addnorm.training.config import TrainConfig
from addnorm.training.wrapping import WrappedModel

__all__ = ["TrainerState"]


@dataclass(frozen=True)
class TrainerState:
    """Where ``Trainer.fit`` stands at a hook (see :mod:`addnorm.training.callbacks` for when
    each hook is called).

    Attributes:
        step: optimizer steps done so far (the step in progress is ``step + 1``).
        step_lr: the learning rate of the step in progress, or of the last one after it
            (the scheduler's, read before its update).
        config: the trainer settings (``max_steps``, ...).
        run_dir: the run's folder.
        resumed_from: the step of the checkpoint ``fit`` continues, None for a fresh run.
        model: the module trained (its weights are the checkpoint's).
        optimizer: the optimizer.
        wrapped: the forms of the model training runs (:class:`WrappedModel`: ``ema``, the
            forward, ``eager``).
        grad_norm: the global norm of the last step's gradients before clipping, a scalar
            tensor (reading it waits for the device); the step in progress's from
            ``on_before_update`` on, zero before any.
        clip_factor: what clipping multiplied those gradients by, ``min(1, grad_clip /
            (grad_norm + 1e-6))`` (torch's ``clip_grad_norm_``), a scalar tensor; 1 without
            ``grad_clip``. ``grad_norm * clip_factor`` is the norm the optimizer got.
    """

    step: int
    step_lr: float
    config: TrainConfig
    run_dir: Path
    resumed_from: int | None
    model: nn.Module
    optimizer: torch.optim.Optimizer
    wrapped: WrappedModel
    grad_norm: torch.Tensor
    clip_factor: torch.Tensor

    @property
    def ema(self) -> AveragedModel | None:
        """The average of the weights, or None."""
        return self.wrapped.ema

    @property
    def forward_model(self) -> nn.Module:
        """What runs the forward now (compiled, parallel or the model itself)."""
        return self.wrapped.forward_model
