"""Probes: a cheap look at quality while training runs, recorded in ``metrics.jsonl``.

A task hands the trainer a :class:`Probe`; every ``every`` steps (but the last, which the
run's own evaluation scores) :class:`ProbeRunner` scores a scratch copy of the weights a
finished run is scored with (the EMA's when the run keeps one), in eval mode and without
gradients, and its numbers go into that step's record as ``probe_<name>``, so a resumed run
keeps them. The trainer sets the probe's time aside: it counts neither as training time
(``elapsed_s``) nor in the throughput (``tokens_per_s``). Single-process runs only.

:class:`ScratchCopy` is that copy, built once and shared with the evaluations on the
validation split that keep a run's best (:mod:`addnorm.training.best`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

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
    """Runs ``probe`` on a scratch copy of the model (``scratch``: one to share, else its
    own)."""

    def __init__(self, probe: Probe, scratch: ScratchCopy | None = None) -> None:
        self.probe = probe
        self.scratch = ScratchCopy() if scratch is None else scratch

    def due(self, step: int, max_steps: int) -> bool:
        """Whether ``step`` (just finished) is probed: a multiple of ``every`` before the
        last step (the run's own evaluation scores that one)."""
        return step % self.probe.every == 0 and step < max_steps

    @torch.no_grad()
    def __call__(self, model: nn.Module, ema: AveragedModel | None) -> dict[str, float]:
        """The probe's numbers, as ``probe_<name>``, for ``model``'s weights or ``ema``'s."""
        scores = self.probe.score(self.scratch(model, ema))
        return {f"probe_{name}": float(value) for name, value in scores.items()}
