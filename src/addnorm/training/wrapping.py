"""The forms of a model that training runs and keeps: its EMA copy, its data-parallel or
sharded (FSDP2) form with activation checkpointing, and its compiled forward
(:func:`wrap_model`, :class:`WrappedModel`).

The order is fixed by what each step needs from the one before: the EMA copy is made first (an
FSDP2 module cannot be copied) and sharded the same way as the model after it; activation
checkpointing wraps the layers in place before they are sharded or handed to DDP
(:func:`addnorm.training.distributed.prepare_model`); ``torch.compile`` comes last, over the
parallel form. The model object and its state dict keys stay the same throughout, so a
checkpoint's keys are the plain model's. Build the optimizer after this: FSDP2 replaces the
parameters.

A compiled forward runs no module hooks inside its graph; a step that needs them (the watch's)
sets :attr:`WrappedModel.eager` and runs the uncompiled parallel form, the same parameters.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import cast

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel

from addnorm.training import distributed
from addnorm.training.config import TrainConfig
from addnorm.training.ema import make_ema

__all__ = ["WrappedModel", "wrap_model"]


@dataclass(eq=False)
class WrappedModel:
    """A model ready to train (see the module docstring).

    Attributes:
        model: the module trained, whose state dict a checkpoint keeps (sharded in place
            with FSDP2).
        parallel: what runs its forward uncompiled: ``model`` itself, alone or sharded, or a
            ``DistributedDataParallel`` wrapper of it with several processes.
        ema: the average of the weights (:func:`~addnorm.training.ema.make_ema`), sharded like
            ``model``; None without one.
        compiled: ``torch.compile`` of ``parallel``, or None.
        eager: run ``parallel`` even when there is a ``compiled`` (set for a step whose
            forward must run module hooks, and cleared after it).
    """

    model: nn.Module
    parallel: nn.Module
    ema: AveragedModel | None = None
    compiled: nn.Module | None = None
    eager: bool = False

    @property
    def forward_model(self) -> nn.Module:
        """What runs the forward now: the compiled form unless ``eager`` (or none)."""
        return self.parallel if self.eager or self.compiled is None else self.compiled

    @property
    def scored(self) -> nn.Module:
        """The module a finished run is scored with: the EMA's when there is one."""
        return self.model if self.ema is None else self.ema.module

    def sync_gradients(self, last_micro_batch: bool) -> AbstractContextManager[object]:
        """DDP all-reduces gradients only on the last micro-batch of an accumulated step
        (``no_sync`` on the others); without DDP nothing is held back."""
        no_sync = getattr(self.forward_model, "no_sync", None)
        if last_micro_batch or no_sync is None:
            return contextlib.nullcontext()
        return no_sync()


def wrap_model(model: nn.Module, config: TrainConfig) -> WrappedModel:
    """``model`` with what ``config`` asks for (``ema_decay``, ``activation_checkpointing``,
    ``fsdp``, ``compile``) and what a process group needs (DDP), in place, in the order of
    the module docstring."""
    ema = (  # before sharding (a sharded module cannot be copied), then sharded alike
        make_ema(model, config.ema_decay, warmup=config.ema_warmup) if config.ema_decay > 0
        else None
    )
    parallel = distributed.prepare_model(
        model, activation_checkpointing=config.activation_checkpointing, fsdp=config.fsdp
    )
    if ema is not None and config.fsdp:
        distributed.shard(ema.module)
    compiled = cast(nn.Module, torch.compile(parallel)) if config.compile else None
    return WrappedModel(model, parallel, ema, compiled)
