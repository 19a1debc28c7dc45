"""Probes: a cheap look at quality while training runs, recorded in ``metrics.jsonl``.

A task hands the trainer a :class:`Probe`; every ``every`` steps (but the last, which the
run's own evaluation scores) :class:`ProbeRunner` scores a scratch copy of the weights a
finished run is scored with (the EMA's when the run keeps one), in eval mode and without
gradients, and its numbers go into that step's record as ``probe_<name>``, so a resumed run
keeps them. The trainer sets the probe's time aside: it counts neither as training time
(``elapsed_s``) nor in the throughput (``tokens_per_s``). Single-process runs only.

:class:`ScratchCopy` is that copy, built once. :class:`ProbeRunner` is also what the trainer
asks at the other points of a run (what its checkpoints keep, whether to stop early), where a
probe does nothing; :class:`~addnorm.training.best_runner.BestRunner`, which also scores the weights
on the validation split and keeps the best, answers them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel

__all__ = ["Probe", "ProbeRunner", "ScratchCopy"]


@dataclass(frozen=True)
class Probe:
    """A cheap look at quality during training (see the module docstring): ``score`` is
    called every ``every`` steps with a scratch copy of the weights a finished run is scored
    with (the EMA's when the run keeps one), in eval mode and without gradients."""

    every: int
    score: Callable[[nn.Module], dict[str, float]]


class ScratchCopy:
    """A copy of the model, made at the first call and reused, holding the weights a finished
    run is scored with: ``scratch(model, ema)`` loads ``ema``'s (or, without one, ``model``'s)
    weights into it and returns it in eval mode. What scores it cannot touch training."""

    def __init__(self) -> None:
        self._copy: nn.Module | None = None

    @torch.no_grad()
    def __call__(self, model: nn.Module, ema: AveragedModel | None) -> nn.Module:
        if self._copy is None:
            self._copy = copy.deepcopy(model)
        self._copy.load_state_dict((model if ema is None else ema.module).state_dict())
        return self._copy.eval()


class ProbeRunner:
    """Runs ``probe`` (None: none) on a scratch copy of the model, and answers the trainer's
    other questions with nothing (see the module docstring)."""

    def __init__(self, probe: Probe | None) -> None:
        self.probe = probe
        self.scratch = ScratchCopy()

    def due(self, step: int, max_steps: int) -> bool:
        """Whether ``step`` (just finished) is probed: a multiple of ``every`` before the
        last step (the run's own evaluation scores that one)."""
        return self.probe is not None and step % self.probe.every == 0 and step < max_steps

    @torch.no_grad()
    def __call__(self, model: nn.Module, ema: AveragedModel | None, step: int | None = None,
                 max_steps: int | None = None) -> dict[str, float]:
        """The probe's numbers, as ``probe_<name>``, for ``model``'s weights or ``ema``'s
        (given ``step`` and ``max_steps``: only if the probe is due then)."""
        if self.probe is None or (step is not None and max_steps is not None
                                  and not ProbeRunner.due(self, step, max_steps)):
            return {}
        scores = self.probe.score(self.scratch(model, ema))
        return {f"probe_{name}": float(value) for name, value in scores.items()}

    def state_entries(self) -> dict[str, Any]:
        """What a checkpoint's ``state.json`` keeps of the runs so far: nothing of a
        probe's."""
        return {}

    def resume(self, state: dict, step: int, where: Path) -> None:
        """Go on from a checkpoint of ``step`` whose ``state.json`` (at ``where``) holds
        ``state``; a probe keeps nothing."""

    def checkpoint_written(self) -> None:
        """A periodic checkpoint was written."""

    def stop_reason(self) -> str | None:
        """Why training stops early now: a probe never stops it."""
        return None

    def stopping(self, reason: str, step: int) -> None:
        """Training stops after ``step`` for ``reason`` (the time cap)."""
