"""A run's length fitted to its time budget while it trains: a budget, not a guillotine.

With ``max_minutes``, a fresh run times its steps on the training clock
(:class:`~addnorm.training.clock.TrainingClock`: probes set aside) and checks whether its
``max_steps`` fit the budget at that pace (:func:`check_steps`): first after step
:func:`pace_step` (inside the warm-up when it is long enough to hold a few timed steps; by
half the plan in a short one), and,
in a plan long enough, a last time after ``LAST_CHECK_SHARE`` of its steps (at least
``PACE_STEPS`` steps after the first check, at most half the plan), on the median of the steps
timed since the first. At each check, until the run has been re-planned (once at most: its
schedule holds one re-plan):

- if the projection passes ``REPLAN_SHARE`` of the budget, the run is re-planned down
  (:class:`Replan`): ``max_steps`` becomes the steps that fill ``FIT_SHARE`` of the budget at
  the measured pace (the median of the timed steps' seconds, which one step slowed by a
  passing load does not move);
- at the last check, a run whose steps were planned to fill the budget
  (``TrainConfig.fill_budget``: not a caller's ``max_steps`` or ``epochs``, nor a task's own
  steps) whose projection falls below ``RAISE_SHARE`` of the budget is re-planned up, to the
  same ``FIT_SHARE``, at the slower of that median and the mean of every step after the
  first (a passing load counts when lengthening): a warm-up timed during a load burst then no
  longer leaves most of the budget idle. Up waits for the last check (more steps measured)
  because the time cap, not a later check, is what stops a run lengthened on a pace that does
  not last;
- otherwise nothing changes: the run is the one it would be without a budget, bit for bit.

A re-planned run's learning-rate schedule is fitted to its new steps
(:meth:`~addnorm.training.schedules.ScheduleConfig.replanned`: the learning rates of the steps
already taken kept, a warm-up not finished by then ending no later than planned, the decay
ending at the new last step), so the run ends with its schedule complete instead of cut at a
high learning rate or left idle.

The re-plan is recorded in every later checkpoint (``max_steps`` in its ``train_config``, the
fitted schedule in its ``schedule``), so ``--resume`` continues the plan exactly; a resumed
run is never re-planned (one resumed before its last check keeps its plan). The time cap
(:mod:`~addnorm.training.stopping`) stays the last resort, for a machine that slows down after
the last check.

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
from addnorm.utils.checks import check_bool, check_float, check_int

__all__ = [
    "FIT_SHARE",
    "LAST_CHECK_SHARE",
    "MIN_PACE_STEPS",
    "PACE_STEPS",
    "RAISE_SHARE",
    "REPLAN_SHARE",
    "Replan",
    "StepBudget",
    "check_steps",
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
# A run planned to fill its budget whose projection at its last check falls below this share
# is re-planned up: only at a pace at least FIT_SHARE / RAISE_SHARE = 1.2 times its plan's.
# The band below FIT_SHARE is the pace's noise on a shared machine (docs/run-plans.md): a run
# projected within it keeps its plan rather than being lengthened on a lull that the time cap
# would then cut, as one projected up to REPLAN_SHARE keeps it on the slow side.
RAISE_SHARE = 0.75
# The last check comes after this share of the planned steps: a median over many more steps
# than the first check's, while most of the schedule is still to run.
LAST_CHECK_SHARE = 0.25
# Steps timed after the first (whose time includes allocation and compiling) before the check,
# and the fewest a warm-up must hold for the check to move inside it.
PACE_STEPS = 10
MIN_PACE_STEPS = 3


def pace_step(warmup: int, max_steps: int) -> int | None:
    """The step after which a run first checks its pace: ``1 + PACE_STEPS``, or the step
    before the warm-up's peak when that comes sooner but still after ``MIN_PACE_STEPS`` timed
    steps, or half the plan when that comes sooner still (at least ``1 + MIN_PACE_STEPS``: a
    short plan, fitted at a pace it does not keep, is checked while most of it is to run);
    None for a run too short to check (it ends by then)."""
    step = 1 + PACE_STEPS
    if warmup - 1 >= 1 + MIN_PACE_STEPS:
        step = min(step, warmup - 1)
    step = min(step, max(1 + MIN_PACE_STEPS, max_steps // 2))
    return step if step < max_steps else None


def check_steps(warmup: int, max_steps: int) -> tuple[int, ...]:
    """The steps after which a run of ``max_steps`` checks its pace: :func:`pace_step`, then
    the last check, ``max(LAST_CHECK_SHARE * max_steps, first + PACE_STEPS)`` (rounded
    down), when that comes by half the plan (a later one would lengthen a schedule already
    decayed); none for a run too short to check."""
    first = pace_step(warmup, max_steps)
    if first is None:
        return ()
    last = max(int(LAST_CHECK_SHARE * max_steps), first + PACE_STEPS)
    return (first, last) if 2 * last <= max_steps else (first,)


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
        step_s: the measured training seconds a step the run was fitted at (see
            :meth:`StepBudget.refit`).
        elapsed_s: training seconds up to ``at_step``.
        budget_s: the budget (``max_minutes``), in seconds.
        planned_steps: ``max_steps`` before; ``steps``: after (more: re-planned up).
        warmup: the step where the fitted warm-up reaches its peak.
    """

    at_step: int
    step_s: float
    elapsed_s: float
    budget_s: float
    planned_steps: int
    steps: int
    warmup: int

    @property
    def direction(self) -> str:
        """"up" (the run lengthened: faster than planned) or "down" (shortened)."""
        return "up" if self.steps > self.planned_steps else "down"

    def to_dict(self) -> dict:
        """The fields as JSON, and the direction."""
        return {"at_step": self.at_step, "step_s": self.step_s, "elapsed_s": self.elapsed_s,
                "budget_s": self.budget_s, "planned_steps": self.planned_steps,
                "steps": self.steps, "warmup": self.warmup, "direction": self.direction}


class StepBudget:
    """The pace checks of one fresh run (see the module docstring).

    Args:
        max_minutes: the budget.
        warmup: the schedule's warm-up steps (where the first check goes).
        max_steps: the planned steps.
        fill: the steps were planned to fill the budget (``TrainConfig.fill_budget``): the
            last check may re-plan them up as well as down.
    """

    def __init__(self, max_minutes: float, *, warmup: int, max_steps: int,
                 fill: bool = False) -> None:
        check_float("max_minutes", max_minutes, min_value=0.0, min_inclusive=False)
        check_int("max_steps", max_steps, min_value=1)
        self.budget_s = 60.0 * max_minutes
        self.checks = check_steps(warmup, max_steps)
        self.fill = check_bool("fill", fill)
        self.replan: Replan | None = None
        self._last: float | None = None  # the seconds after the last step fed, from step 1
        self._first = 0.0  # the seconds after step 1
        self._timed: list[float] = []  # the seconds of each step since the last check

    @property
    def check_at(self) -> int | None:
        """The first check's step (None: the run is too short to check)."""
        return self.checks[0] if self.checks else None

    @classmethod
    def for_run(cls, config: TrainConfig, schedule: ScheduleConfig | SchedulerFactory, *,
                fresh: bool) -> StepBudget | None:
        """The checks of a run trained with ``config`` and ``schedule``: None for a run that
        is not ``fresh`` (a resumed one keeps the plan its checkpoint recorded), without
        ``max_minutes``, or with a caller's scheduler factory (which cannot be fitted: such a
        run has the time cap alone)."""
        if not fresh or config.max_minutes is None or not isinstance(schedule, ScheduleConfig):
            return None
        return cls(config.max_minutes, warmup=schedule.warmup, max_steps=config.max_steps,
                   fill=bool(config.fill_budget))

    def after_step(
        self, step: int, seconds: float, config: TrainConfig, schedule: ScheduleConfig |
        SchedulerFactory, optimizer: torch.optim.Optimizer,
    ) -> tuple[TrainConfig, ScheduleConfig, LRScheduler] | None:
        """After ``step`` at ``seconds`` of training: at a check step, when the run's
        ``config.max_steps`` call for it (see the module docstring), the run re-planned
        (``self.replan``) as the config, the schedule and the scheduler (over ``optimizer``,
        set for the next step) to go on with; None otherwise. With several processes every
        rank calls it, and the ranks agree on their mean pace."""
        if self.replan is not None:  # (one re-plan a run: its schedule holds one)
            return None
        measured = self.pace(step, seconds)
        if measured is None or not isinstance(schedule, ScheduleConfig):
            return None
        step_s, elapsed, mean_s = (value / distributed.world_size()
                                   for value in distributed.all_reduce_sum(list(measured)))
        steps = self.refit(step=step, step_s=step_s, elapsed_s=elapsed,
                           max_steps=config.max_steps,
                           upward=self.fill and step == self.checks[-1], mean_s=mean_s)
        if steps is None:
            return None
        fitted = schedule.replanned(at=step, total_steps=steps)
        scheduler = replay_schedule(lambda: make_scheduler(fitted, optimizer), optimizer, step)
        pace_s = max(step_s, mean_s) if steps > config.max_steps else step_s  # (as fitted)
        self.replan = Replan(step, pace_s, elapsed, self.budget_s, config.max_steps, steps,
                             fitted.replanned_warmup)
        config = dataclasses.replace(config, max_steps=steps, warmup=fitted.replanned_warmup)
        return config, fitted, scheduler

    def pace(self, step: int, seconds: float) -> tuple[float, float, float] | None:
        """Fed the training seconds after each ``step``: at a check step, ``(the median
        seconds of the steps timed since the last check (the first check: the steps after
        the first), seconds so far, the mean seconds of every step after the first)``; None
        at the others."""
        if self._last is not None and step > 1:
            self._timed.append(seconds - self._last)
        else:
            self._first = seconds
        self._last = seconds
        if step not in self.checks or not self._timed:
            return None
        median, self._timed = statistics.median(self._timed), []
        return median, seconds, (seconds - self._first) / (step - 1)

    def refit(self, *, step: int, step_s: float, elapsed_s: float, max_steps: int,
              upward: bool = False, mean_s: float | None = None) -> int | None:
        """``max_steps`` fitted to ``FIT_SHARE`` of the budget after ``step`` steps in
        ``elapsed_s`` seconds at ``step_s`` a step, or None when the planned ones stay: fewer
        when their projection passes ``REPLAN_SHARE`` of the budget (at least ``step + 1``);
        more when ``upward`` and their projection at the slower of ``step_s`` and ``mean_s``
        (the mean step so far: a passing load counts when lengthening, since the steps it
        adds are what the time cap would cut) falls below ``RAISE_SHARE`` (a measured pace:
        above 0)."""
        projected = elapsed_s + (max_steps - step) * step_s
        if projected > REPLAN_SHARE * self.budget_s:
            steps = fitting_steps(self.budget_s, step_s, elapsed_s=elapsed_s, done=step)
            return min(steps, max_steps - 1) if max_steps > step + 1 else None
        slow_s = max(step_s, mean_s or 0.0)
        if upward and slow_s > 0 and (elapsed_s + (max_steps - step) * slow_s
                                      < RAISE_SHARE * self.budget_s):
            steps = fitting_steps(self.budget_s, slow_s, elapsed_s=elapsed_s, done=step)
            return steps if steps > max_steps else None
        return None
