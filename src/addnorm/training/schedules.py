"""Learning-rate schedules as ``torch.optim.lr_scheduler`` objects.

:class:`ScheduleConfig` names a schedule and its constants (the JSON a checkpoint keeps, so a
resumed run rebuilds the same one); ``build(optimizer)`` returns torch's scheduler for it:

- ``"constant"``: ``LinearLR``, a linear warm-up from ``lr / warmup`` at step 1 to ``lr`` at
  step ``warmup``, then ``lr``.
- ``"cosine"``: ``SequentialLR`` of that warm-up, ``CosineAnnealingLR`` from ``lr`` at step
  ``warmup`` down to ``final_lr_fraction * lr`` at step ``total_steps``, and ``ConstantLR``
  holding that floor after it (a resumed run may train past ``total_steps``, where torch's
  cosine alone would rise again: it is periodic).
- ``"noam"``: ``LambdaLR`` of the paper's shape, which torch has no scheduler for:
  ``lr * sqrt(warmup) * min(step^-0.5, step * warmup^-1.5)`` peaks at ``lr`` at
  ``step == warmup``; ``lr = d_model^-0.5 * warmup^-0.5`` gives the paper's schedule
  (:func:`noam_lr`) exactly.

A schedule can be re-planned once, after ``replanned_at`` steps, when a time budget turns
out to hold fewer steps than planned (:mod:`addnorm.training.budget`): :meth:`ScheduleConfig.
replanned` keeps the first plan's learning rates for the steps already taken and fits the rest
to the new length. From the next step, a warm-up not yet finished rises linearly from where it
stands to the peak at step ``replanned_warmup`` (the first plan's warm-up scaled to the new
length), and the cosine decays from the peak (or, after the warm-up, from where it stands) to
its floor at ``replanned_total``. Its torch scheduler is a ``LambdaLR`` of that curve in
closed form, so a checkpoint's ``ScheduleConfig`` rebuilds it exactly. The noam shape has no
planned length and is left as it is; "constant" only fits its warm-up.

Steps count from 1, as the trainer's do: a scheduler's epoch ``e`` is step ``e + 1``, so
``build`` sets the first step's learning rate and the trainer calls ``scheduler.step()`` after
each optimizer step. A warm-up of 0 or 1 starts at the peak. A scheduler's ``state_dict`` is
plain numbers; a checkpoint keeps it as JSON (:func:`check_scheduler_state` checks a saved one
before it is loaded).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import typing
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch.optim.lr_scheduler import (
    ConstantLR,
    CosineAnnealingLR,
    LambdaLR,
    LinearLR,
    LRScheduler,
    SequentialLR,
)

from addnorm.utils.checks import check_choice, check_float, check_int

__all__ = [
    "SCHEDULES",
    "ScheduleConfig",
    "ScheduleKind",
    "SchedulerFactory",
    "make_scheduler",
    "check_scheduler_state",
    "noam_lr",
    "replay_schedule",
]

# The schedule kinds, defined once: ``TrainConfig.schedule`` and its ``--schedule`` flag
# (derived from this Literal) and ``ScheduleConfig.kind`` all take these names.
ScheduleKind = Literal["noam", "cosine", "constant"]
SCHEDULES: tuple[str, ...] = typing.get_args(ScheduleKind)
# What a trainer takes as its schedule besides a ScheduleConfig: any torch scheduler's maker.
SchedulerFactory = Callable[[torch.optim.Optimizer], LRScheduler]
# ConstantLR's "until" for a floor held for good (it restores the lr at that epoch).
_FOREVER = sys.maxsize


def noam_lr(step: int, *, d_model: int, warmup: int, scale: float = 1.0) -> float:
    """The paper's schedule: ``scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)``.

    It rises linearly for ``warmup`` steps, peaks at ``scale / sqrt(d_model * warmup)``, then
    decays as ``1 / sqrt(step)`` (Vaswani et al. 2017, section 5.3).
    """
    check_int("step", step, min_value=1)
    check_int("d_model", d_model, min_value=1)
    check_int("warmup", warmup, min_value=1)
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


@dataclass(frozen=True)
class ScheduleConfig:
    """A named schedule with its constants; ``build(optimizer)`` is its torch scheduler.

    Attributes:
        kind: one of ``SCHEDULES``: "noam", "cosine" or "constant" (see the module docstring).
        lr: the peak learning rate, for every kind (noam reaches it at ``step == warmup``);
            the optimizer's groups start at it.
        warmup: warm-up steps.
        total_steps: where the cosine reaches its end (ignored by the others).
        final_lr_fraction: the cosine's end value as a fraction of ``lr``.
        replanned_at: the steps taken under the plan above before it was re-planned; 0 for a
            schedule never re-planned (then the two fields below are unused).
        replanned_warmup: the step where the re-planned warm-up reaches the peak.
        replanned_total: where the re-planned cosine reaches its end.
    """

    kind: ScheduleKind
    lr: float
    warmup: int
    total_steps: int = 1
    final_lr_fraction: float = 0.0
    replanned_at: int = 0
    replanned_warmup: int = 0
    replanned_total: int = 0

    def __post_init__(self) -> None:
        check_choice("kind", self.kind, SCHEDULES)
        check_float("lr", self.lr, min_value=0.0, min_inclusive=False)
        check_int("warmup", self.warmup, min_value=1 if self.kind == "noam" else 0)
        check_int("total_steps", self.total_steps, min_value=1)
        check_float("final_lr_fraction", self.final_lr_fraction, min_value=0.0, max_value=1.0)
        check_int("replanned_at", self.replanned_at, min_value=0)
        if self.replanned_at:
            check_int("replanned_total", self.replanned_total, min_value=self.replanned_at + 1)
            check_int("replanned_warmup", self.replanned_warmup, min_value=0)

    @property
    def planned_total(self) -> int:
        """Where the cosine ends: ``replanned_total`` after a re-plan, else ``total_steps``."""
        return self.replanned_total if self.replanned_at else self.total_steps

    def to_dict(self) -> dict:
        """The fields as JSON (a checkpoint's ``schedule``); a schedule never re-planned
        leaves out the re-plan's fields, as checkpoints written before them did."""
        fields = dataclasses.asdict(self)
        if not self.replanned_at:
            for name in ("replanned_at", "replanned_warmup", "replanned_total"):
                del fields[name]
        return fields

    def replanned(self, *, at: int, total_steps: int) -> ScheduleConfig:
        """This schedule after ``at`` steps, fitted to end at ``total_steps`` (> ``at``)
        instead (see the module docstring): a warm-up not finished by then is scaled to the
        new length, ``round(warmup * total_steps / self.total_steps)``, but ends after step
        ``at`` and no later than before (noam's is kept: its shape has no planned length).
        Raises ValueError if it was re-planned before."""
        if self.replanned_at:
            raise ValueError(f"the schedule was re-planned already, at step {self.replanned_at}")
        check_int("at", at, min_value=1)
        check_int("total_steps", total_steps, min_value=at + 1)
        if self.warmup > at and self.kind != "noam":  # the new warm-up ends after this step
            scaled = round(self.warmup * total_steps / max(self.total_steps, 1))
            warmup = min(max(scaled, at + 1), self.warmup, total_steps)
        else:
            warmup = self.warmup
        return dataclasses.replace(self, replanned_at=at, replanned_warmup=warmup,
                                   replanned_total=total_steps)

    def factor(self, step: int) -> float:
        """The learning rate of ``step`` (from 1) as a fraction of ``lr``, in closed form (a
        re-planned schedule's scheduler follows it; the others' follow it up to rounding)."""
        if self.kind == "noam":
            return _noam_factor(self.warmup)(step - 1)
        first = _warmup_cosine(step, self.warmup, self.total_steps, self._floor)
        if not self.replanned_at or step <= self.replanned_at:
            return first
        at, warmup, total = self.replanned_at, self.replanned_warmup, self.replanned_total
        start = _warmup_cosine(at, self.warmup, self.total_steps, self._floor)
        if at < warmup:  # the rest of the warm-up, from where it stood to the peak
            if step <= warmup:
                return start + (1.0 - start) * (step - at) / (warmup - at)
            at, start = warmup, 1.0
        if self.kind == "constant":
            return start
        return _half_cosine(step, at, start, total, self._floor)

    @property
    def _floor(self) -> float:
        """The end of the decay, as a fraction of ``lr`` (the constant kind never decays)."""
        return 1.0 if self.kind == "constant" else self.final_lr_fraction

    def build(self, optimizer: torch.optim.Optimizer) -> LRScheduler:
        """Torch's scheduler of this schedule over ``optimizer``, whose groups' lr it sets to
        ``lr`` first (every group follows the same curve) and then to step 1's value."""
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"] = self.lr
        if self.replanned_at and self.kind != "noam":
            return LambdaLR(optimizer, lambda epoch: self.factor(epoch + 1))
        if self.kind == "noam":
            return LambdaLR(optimizer, _noam_factor(self.warmup))
        if self.kind == "constant":
            return _warmup(optimizer, self.warmup)
        return self._cosine(optimizer)

    def _cosine(self, optimizer: torch.optim.Optimizer) -> LRScheduler:
        """Warm-up, cosine, floor: the cosine's epoch 0 is step ``warmup`` (the peak), its
        ``T_max`` step ``total_steps``; the floor holds from the step after."""
        peak_step = max(self.warmup, 1)
        floor = self.final_lr_fraction * self.lr
        schedulers: list[LRScheduler] = []
        milestones: list[int] = []  # the epochs where the next scheduler takes over
        if peak_step > 1:
            schedulers.append(_warmup(optimizer, peak_step))
            milestones.append(peak_step - 1)
        if self.total_steps > peak_step:
            schedulers.append(
                CosineAnnealingLR(optimizer, T_max=self.total_steps - peak_step, eta_min=floor)
            )
            milestones.append(self.total_steps)
        else:  # no room for the cosine: the floor from the step after the peak
            if not schedulers:
                schedulers.append(_warmup(optimizer, 1))
            milestones[-1:] = [peak_step]
        schedulers.append(
            ConstantLR(optimizer, factor=self.final_lr_fraction, total_iters=_FOREVER)
        )
        return SequentialLR(optimizer, schedulers, milestones=milestones)


def _warmup_cosine(step: int, warmup: int, total: int, floor: float) -> float:
    """The first plan's curve as a fraction of the peak: ``step / warmup`` up to the peak at
    ``warmup`` (from step 1 for a warm-up of 0 or 1), then a half cosine to ``floor`` at
    ``total``, then ``floor``."""
    peak_step = max(warmup, 1)
    if step <= peak_step:
        return step / peak_step
    return _half_cosine(step, peak_step, 1.0, total, floor)


def _half_cosine(step: int, start: int, value: float, end: int, floor: float) -> float:
    """A half cosine from ``value`` at step ``start`` down to ``floor`` at step ``end``,
    ``floor`` after it."""
    if step >= end:
        return floor
    progress = (step - start) / (end - start)
    return floor + 0.5 * (value - floor) * (1.0 + math.cos(math.pi * progress))


def _warmup(optimizer: torch.optim.Optimizer, warmup: int) -> LinearLR:
    """Linear warm-up to the peak at step ``warmup`` (epoch ``warmup - 1``), then the peak."""
    steps = max(warmup, 1)
    return LinearLR(optimizer, start_factor=1.0 / steps, end_factor=1.0, total_iters=steps - 1)


def _noam_factor(warmup: int) -> Callable[[int], float]:
    """The noam shape as a multiple of its peak, by epoch (step - 1)."""

    def factor(epoch: int) -> float:
        return noam_lr(epoch + 1, d_model=1, warmup=warmup, scale=warmup**0.5)

    return factor


def replay_schedule(
    make: Callable[[], LRScheduler], optimizer: torch.optim.Optimizer, steps: int
) -> LRScheduler:
    """A new scheduler (``make()``) stepped ``steps`` times, as it would be after that many
    optimizer steps: a checkpoint that stored only its step (written before the schedules
    were torch's) continues on the same curve. ``make`` sets the groups' lr back to the
    schedule's start (a ``ScheduleConfig``'s ``build`` does)."""
    scheduler = make()
    with warnings.catch_warnings():  # no optimizer steps between: torch would warn of it
        warnings.simplefilter("ignore", UserWarning)
        for _ in range(steps):
            scheduler.step()
    return scheduler


def check_scheduler_state(scheduler: LRScheduler, saved: object, *, where: str = "scheduler"
                          ) -> None:
    """Raise ValueError naming the entry unless ``saved`` (a scheduler's ``state_dict`` read
    back from JSON) has the structure of ``scheduler``'s own: the same keys, each value of the
    same JSON type, lists of the same length, nested schedulers alike. Torch's
    ``load_state_dict`` sets whatever it is given as attributes, so a state of another
    schedule (or an edited one) would otherwise fail only inside a later step."""
    _check_like(scheduler.state_dict(), saved, where)


def _check_like(expected: object, got: object, where: str) -> None:
    if isinstance(expected, dict):
        if not isinstance(got, dict):
            raise ValueError(f"{where} must be an object, got {type(got).__name__}")
        missing, unexpected = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
        if missing or unexpected:
            raise ValueError(f"{where} differs: missing {missing}, unexpected {unexpected}")
        for key, value in expected.items():
            _check_like(value, got[key], f"{where}.{key}")
    elif isinstance(expected, (list, tuple)):
        if not isinstance(got, list) or len(got) != len(expected):
            raise ValueError(f"{where} must be a list of {len(expected)}, got {got!r}")
        for i, (value, item) in enumerate(zip(expected, got, strict=True)):
            _check_like(value, item, f"{where}[{i}]")
    elif isinstance(expected, bool) or expected is None:
        if got is not expected and not (isinstance(got, bool) and isinstance(expected, bool)):
            raise ValueError(f"{where} must be {type(expected).__name__}, got {got!r}")
    elif isinstance(expected, (int, float)):
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            raise ValueError(f"{where} must be a number, got {got!r}")
        if isinstance(expected, int) and not isinstance(got, int):
            raise ValueError(f"{where} must be an integer, got {got!r}")
    elif type(got) is not type(expected):
        raise ValueError(f"{where} must be {type(expected).__name__}, got {got!r}")


def make_scheduler(
    schedule: ScheduleConfig | SchedulerFactory, optimizer: torch.optim.Optimizer
) -> LRScheduler:
    """``schedule``'s scheduler over ``optimizer``; TypeError unless it is a torch scheduler
    whose state is JSON (a checkpoint keeps it so)."""
    scheduler = schedule.build(optimizer) if isinstance(schedule, ScheduleConfig) else (
        schedule(optimizer)
    )
    if not isinstance(scheduler, LRScheduler):
        raise TypeError(
            "schedule must be a ScheduleConfig or make a torch.optim.lr_scheduler.LRScheduler, "
            f"got {type(scheduler).__name__}"
        )
    try:
        json.dumps(scheduler.state_dict())
    except (TypeError, ValueError) as err:
        raise TypeError(
            f"{type(scheduler).__name__}'s state_dict must be JSON (numbers, lists, dicts) to "
            f"be checkpointed without pickle: {err}"
        ) from None
    return scheduler
