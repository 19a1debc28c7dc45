"""A run's length fitted to its time budget while it trains: a budget, not a guillotine.

With ``max_minutes``, a fresh run times its first steps on the training clock
(:class:`~addnorm.training.clock.TrainingClock`: probes set aside) and after step
:func:`pace_step` (inside the warm-up when it is long enough to hold a few timed steps)
checks, once, whether its ``max_steps`` fit in the budget at that pace:

- if the projection stays within ``REPLAN_SHARE`` of the budget nothing changes: the run is
  the one it would be without a budget, bit for bit;
- otherwise the run is re-planned (:class:`Replan`): ``max_steps`` becomes the steps that fill
  ``FIT_SHARE`` of the budget at the measured pace (the median of the timed steps' seconds,
  which one step slowed by a passing load does not move), and its learning-rate schedule is
  fitted
  to them (:meth:`~addnorm.training.schedules.ScheduleConfig.replanned`: the learning rates
  of the steps already taken kept, the warm-up scaled, the decay ending at the new last step),
  so the run ends with its schedule complete instead of cut at a high learning rate.

The re-plan is recorded in every later checkpoint (``max_steps`` in its ``train_config``, the
fitted schedule in its ``schedule``), so ``--resume`` continues the plan exactly; a resumed
run is never re-planned. The time cap (:mod:`~addnorm.training.stopping`) stays the last
resort, for a machine that slows down further after the check.

A plan made before training (:mod:`addnorm.tasks.budget`, from a short measured warm-up) fits
``FIT_SHARE`` of the budget too, so a machine as fast as its warm-up is not re-planned here.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass

import torch
from torch.optim.lr_scheduler import LRScheduler

from addnorm.training import distributed
from addnorm.training.config import TrainConfig
from addnorm.training.schedules import (
    ScheduleConfig,
    SchedulerFactory,
    make_scheduler,
    replay_schedule,
)
from addnorm.utils.checks import check_float, check_int

__all__ = [
    "FIT_SHARE",
    "MIN_PACE_STEPS",
    "PACE_STEPS",
    "REPLAN_SHARE",
    "Replan",
    "StepBudget",
    "fitting_steps",
    "pace_step",
]

# A plan fills at most this share of its budget: the rest absorbs the pace's noise on a
# shared machine and the checkpoints' writes.
FIT_SHARE = 0.9
# A run whose projected training time passes this share of its budget is re-planned: one that
# the time cap would stop (between the two shares, the run keeps its plan: no re-plan for a
# pace a few percent off the warm-up's).
REPLAN_SHARE = 1.0
# Steps timed after the first (whose time includes allocation and compiling) before the check,
# and the fewest a warm-up must hold for the check to move inside it.
PACE_STEPS = 10
MIN_PACE_STEPS = 3


def pace_step(warmup: int, max_steps: int) -> int | None:
    """The step after which a run checks its pace: ``1 + PACE_STEPS``, or the step before the
    warm-up's peak when that comes sooner but still after ``MIN_PACE_STEPS`` timed steps; None
    for a run too short to check (it ends by then)."""
    step = 1 + PACE_STEPS
    if warmup - 1 >= 1 + MIN_PACE_STEPS:
        step = min(step, warmup - 1)
    return step if step < max_steps else None


def fitting_steps(budget_s: float, step_s: float, *, elapsed_s: float = 0.0, done: int = 0
                  ) -> int:
    """The steps a run that has trained ``done`` steps in ``elapsed_s`` seconds can take in
    all within ``FIT_SHARE`` of ``budget_s`` seconds at ``step_s`` seconds a step; at least
    ``done + 1``."""
    check_float("budget_s", budget_s, min_value=0.0, min_inclusive=False)
    check_float("step_s", step_s, min_value=0.0)
    room = FIT_SHARE * budget_s - elapsed_s
    more = math.inf if step_s == 0 else room / step_s
    return done + max(1, int(min(more, 2**62)))


@dataclass(frozen=True)
class Replan:
    """A run re-planned to its budget once its pace was measured.

    Attributes:
        at_step: the step after which the pace was checked (and the plan changed).
        step_s: the measured training seconds a step (the steps after the first).
        elapsed_s: training seconds up to ``at_step``.
        budget_s: the budget (``max_minutes``), in seconds.
        planned_steps: ``max_steps`` before; ``steps``: after.
        warmup: the step where the fitted warm-up reaches its peak.
    """

    at_step: int
    step_s: float
    elapsed_s: float
    budget_s: float
    planned_steps: int
    steps: int
    warmup: int

    def to_dict(self) -> dict:
        """The fields as JSON."""
        return {"at_step": self.at_step, "step_s": self.step_s, "elapsed_s": self.elapsed_s,
                "budget_s": self.budget_s, "planned_steps": self.planned_steps,
                "steps": self.steps, "warmup": self.warmup}


class StepBudget:
    """The pace check of one fresh run (see the module docstring).

    Args:
        max_minutes: the budget.
        warmup: the schedule's warm-up steps (where the check goes).
        max_steps: the planned steps.
    """

    def __init__(self, max_minutes: float, *, warmup: int, max_steps: int) -> None:
        check_float("max_minutes", max_minutes, min_value=0.0, min_inclusive=False)
        check_int("max_steps", max_steps, min_value=1)
        self.budget_s = 60.0 * max_minutes
        self.check_at = pace_step(warmup, max_steps)
        self.replan: Replan | None = None
        self._last: float | None = None  # the seconds after the last step fed, from step 1
        self._timed: list[float] = []  # the seconds of each step after the first

    @classmethod
    def for_run(cls, config: TrainConfig, schedule: ScheduleConfig | SchedulerFactory, *,
                fresh: bool) -> StepBudget | None:
        """The check of a run trained with ``config`` and ``schedule``: None for a run that is
        not ``fresh`` (a resumed one keeps the plan its checkpoint recorded), without
        ``max_minutes``, or with a caller's scheduler factory (which cannot be fitted: such a
        run has the time cap alone)."""
        if not fresh or config.max_minutes is None or not isinstance(schedule, ScheduleConfig):
            return None
        return cls(config.max_minutes, warmup=schedule.warmup, max_steps=config.max_steps)

    def after_step(
        self, step: int, seconds: float, config: TrainConfig, schedule: ScheduleConfig |
        SchedulerFactory, optimizer: torch.optim.Optimizer,
    ) -> tuple[TrainConfig, ScheduleConfig, LRScheduler] | None:
        """After ``step`` at ``seconds`` of training: at the check step, when the run's
        ``config.max_steps`` do not fit, the run re-planned (``self.replan``) as the config,
        the schedule and the scheduler (over ``optimizer``, set for the next step) to go on
        with; None otherwise. With several processes every rank calls it, and the ranks
        agree on their mean pace."""
        measured = self.pace(step, seconds)
        if measured is None or not isinstance(schedule, ScheduleConfig):
            return None
        step_s, elapsed = (value / distributed.world_size()
                           for value in distributed.all_reduce_sum(list(measured)))
        steps = self.refit(step=step, step_s=step_s, elapsed_s=elapsed,
                           max_steps=config.max_steps)
        if steps is None:
            return None
        fitted = schedule.replanned(at=step, total_steps=steps)
        scheduler = replay_schedule(lambda: make_scheduler(fitted, optimizer), optimizer, step)
        self.replan = Replan(step, step_s, elapsed, self.budget_s, config.max_steps, steps,
                             fitted.replanned_warmup)
        config = dataclasses.replace(config, max_steps=steps, warmup=fitted.replanned_warmup)
        return config, fitted, scheduler

    def pace(self, step: int, seconds: float) -> tuple[float, float] | None:
        """Fed the training seconds after each ``step``: at the check step, ``(the median
        seconds of the steps after the first, seconds so far)``; None at the others."""
        if self._last is not None and step > 1:
            self._timed.append(seconds - self._last)
        self._last = seconds
        if step != self.check_at or not self._timed:
            return None
        return statistics.median(self._timed), seconds

    def refit(self, *, step: int, step_s: float, elapsed_s: float, max_steps: int
              ) -> int | None:
        """``max_steps`` fitted to the budget after ``step`` steps in ``elapsed_s`` seconds at
        ``step_s`` a step, or None when the planned ones fit (their projection within
        ``REPLAN_SHARE`` of the budget); fewer than ``max_steps``, at least ``step + 1``."""
        projected = elapsed_s + (max_steps - step) * step_s
        if projected <= REPLAN_SHARE * self.budget_s:
            return None
        steps = fitting_steps(self.budget_s, step_s, elapsed_s=elapsed_s, done=step)
        return min(steps, max_steps - 1) if max_steps > step + 1 else None
