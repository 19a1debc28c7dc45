"""What a ``Trainer`` is given and what it returns: the loss function (``LossFn``), the source
of training batches (``BatchSource``, whose JSON state is the data order a checkpoint keeps),
and how ``Trainer.fit`` ended (``TrainResult``). Tasks build the first two
(:mod:`addnorm.tasks.task`) without importing the trainer itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from addnorm.training.budget import Replan

__all__ = ["BatchSource", "LossFn", "TrainResult"]

LossFn = Callable[[nn.Module, dict[str, torch.Tensor]], tuple[torch.Tensor, int]]


class BatchSource(Protocol):
    """Where training batches come from; its JSON state is the data order."""

    def next_batch(self) -> dict[str, torch.Tensor]:
        """The next training batch (CPU tensors)."""
        ...

    def state_dict(self) -> dict:
        """The data order as JSON."""
        ...

    def load_state_dict(self, state: dict) -> None:
        """Continue the data order saved by ``state_dict``."""
        ...


@dataclass(frozen=True)
class TrainResult:
    """How ``Trainer.fit`` ended.

    Attributes:
        step: optimizer steps done in total.
        loss: the last step's training loss (None if no step ran).
        checkpoint: the checkpoint written at the end.
        stopped_by: "max_steps", "max_minutes", "patience" (``config.patience``
            evaluations without a better score), "interrupt" (SIGINT, Ctrl-C) or "terminate"
            (SIGTERM).
        elapsed_s: training time of all invocations together, in seconds.
        compile_s: with ``config.compile``, the first step's time in this invocation (it
            includes compiling the forward and backward); else None.
        replan: how the run was fitted to its time budget in this invocation
            (:mod:`~addnorm.training.budget`), None if it was not.
    """

    step: int
    loss: float | None
    checkpoint: Path
    stopped_by: str
    elapsed_s: float
    compile_s: float | None = None
    replan: Replan | None = None
