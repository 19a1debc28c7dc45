"""What an interrupt inside a training step can keep: the step's phase, and the data order and
random state at its start.

A ``KeyboardInterrupt`` raised inside ``Trainer.fit`` by other means than a first stop signal
(a second signal, Ctrl-C in a debugger, a test) is handled by where it lands:

- ``"forward"`` (drawing batches, forward, backward): the weights are untouched, so the data
  order and random state go back to the step's start (:meth:`StepBoundary.rewind`) and a
  checkpoint of the previous step is written;
- ``"update"`` (the optimizer step and the EMA update): the weights may be half-updated, so no
  checkpoint is written (it would break exact resume); ``fit`` returns the newest periodic
  checkpoint (or re-raises the interrupt if there is none);
- ``"idle"`` (between steps, logging, saving): the step is complete, so a checkpoint of it is
  written with the current data and random state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Protocol

import torch

from addnorm.training.checkpoint import list_checkpoints
from addnorm.training.state import capture_rng, restore_rng

__all__ = ["Phase", "StepBoundary"]

Phase = Literal["idle", "forward", "update"]


class _DataOrder(Protocol):
    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


class StepBoundary:
    """The phase of the step in progress and the state at its start.

    ``enter(batches)`` at each step's start takes the snapshot and sets "forward"; the trainer
    sets ``phase`` to "update" around the optimizer and EMA update and back to "idle" after it.
    """

    def __init__(self) -> None:
        self.phase: Phase = "idle"
        self._data: dict = {}
        self._rng: tuple[dict[str, torch.Tensor], dict] = ({}, {})

    def enter(self, batches: _DataOrder) -> None:
        """A step begins: keep the data order of ``batches`` and every generator's state."""
        self._data, self._rng = batches.state_dict(), capture_rng()
        self.phase = "forward"

    def rewind(self, batches: _DataOrder) -> None:
        """After an interrupt in the "forward" phase, put the data order and the generators
        back to the step's start (in another phase there is nothing to undo)."""
        if self.phase == "forward":
            batches.load_state_dict(self._data)
            restore_rng(*self._rng)

    def kept_checkpoint(self, run_dir: Path) -> tuple[int, Path]:
        """After an interrupt in the "update" phase: the newest checkpoint in ``run_dir``,
        kept as it is (writing the half-updated weights would break exact resume), and its
        step; re-raises the interrupt when there is none."""
        saved = list_checkpoints(run_dir)
        if not saved:
            raise KeyboardInterrupt(
                "interrupted inside an optimizer update before any checkpoint was written"
            )
        return int(saved[-1].name.removeprefix("step-")), saved[-1]
