"""Probes: a cheap look at quality while training runs, recorded in ``metrics.jsonl``.

A task hands the trainer a :class:`Probe`; every ``every`` steps (but the last, which the
run's own evaluation scores) :class:`ProbeRunner` scores a scratch copy of the weights a
finished run is scored with (the EMA's when the run keeps one), in eval mode and without
gradients, and its numbers go into that step's record as ``probe_<name>``, so a resumed run
keeps them. The trainer sets the probe's time aside: it counts neither as training time
(``elapsed_s``) nor in the throughput (``tokens_per_s``). Single-process runs only.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel

__all__ = ["Probe", "ProbeRunner"]


@dataclass(frozen=True)
class Probe:
    """A cheap look at quality during training (see the module docstring): ``score`` is
    called every ``every`` steps with a scratch copy of the weights a finished run is scored
    with (the EMA's when the run keeps one), in eval mode and without gradients."""

    every: int
    score: Callable[[nn.Module], dict[str, float]]


class ProbeRunner:
    """Runs ``probe`` on a scratch copy of the model, built at the first probe and reused."""

    def __init__(self, probe: Probe) -> None:
        self.probe = probe
        self._scratch: nn.Module | None = None

    def due(self, step: int, max_steps: int) -> bool:
        """Whether ``step`` (just finished) is probed: a multiple of ``every`` before the
        last step (the run's own evaluation scores that one)."""
        return step % self.probe.every == 0 and step < max_steps

    @torch.no_grad()
    def __call__(self, model: nn.Module, ema: AveragedModel | None) -> dict[str, float]:
        """The probe's numbers, as ``probe_<name>``, for ``model``'s weights or ``ema``'s."""
        if self._scratch is None:
            self._scratch = copy.deepcopy(model)
        scratch = self._scratch
        scratch.load_state_dict((model if ema is None else ema.module).state_dict())
        scores = self.probe.score(scratch.eval())
        return {f"probe_{name}": float(value) for name, value in scores.items()}
