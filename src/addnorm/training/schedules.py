"""Learning-rate schedules, as pure functions of the (1-based) optimizer step.

A schedule has no state beyond the step, so a checkpoint that stores the step (and the
schedule's constants, for the record) restores it exactly.

``LRSchedule``'s ``lr`` is the *peak* learning rate of every kind. Its "noam" keeps the paper's
shape, ``lr * sqrt(warmup) * min(step^-0.5, step * warmup^-1.5)``, which peaks at ``lr`` at
``step == warmup``; choosing ``lr = d_model^-0.5 * warmup^-0.5`` gives the paper's schedule
(``noam_lr`` with ``scale=1``) exactly.
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass
from typing import Literal

from addnorm.utils.checks import check_choice, check_float, check_int

__all__ = [
    "SCHEDULES",
    "LRSchedule",
    "ScheduleKind",
    "constant_lr",
    "noam_lr",
    "warmup_cosine_lr",
]

# The schedule kinds, defined once: ``TrainConfig.schedule`` and its ``--schedule`` flag
# (derived from this Literal) and ``LRSchedule.kind`` all take these names.
ScheduleKind = Literal["noam", "cosine", "constant"]
SCHEDULES: tuple[str, ...] = typing.get_args(ScheduleKind)


def noam_lr(step: int, *, d_model: int, warmup: int, scale: float = 1.0) -> float:
    """The paper's schedule: ``scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)``.

    It rises linearly for ``warmup`` steps, peaks at ``scale / sqrt(d_model * warmup)``, then
    decays as ``1 / sqrt(step)`` (Vaswani et al. 2017, section 5.3).
    """
    check_int("step", step, min_value=1)
    check_int("d_model", d_model, min_value=1)
    check_int("warmup", warmup, min_value=1)
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def warmup_cosine_lr(
    step: int, *, peak_lr: float, warmup: int, total_steps: int, final_lr: float = 0.0
) -> float:
    """Linear warm-up from 0 to ``peak_lr`` over ``warmup`` steps, then a half cosine from
    ``peak_lr`` down to ``final_lr`` at ``total_steps`` (held there after)."""
    check_int("step", step, min_value=1)
    check_int("warmup", warmup, min_value=0)
    check_int("total_steps", total_steps, min_value=1)
    if step <= warmup:
        return peak_lr * step / warmup
    span = max(total_steps - warmup, 1)
    progress = min((step - warmup) / span, 1.0)
    return final_lr + 0.5 * (peak_lr - final_lr) * (1.0 + math.cos(math.pi * progress))


def constant_lr(step: int, *, peak_lr: float, warmup: int) -> float:
    """Linear warm-up to ``peak_lr``, then constant."""
    check_int("step", step, min_value=1)
    check_int("warmup", warmup, min_value=0)
    return peak_lr * min(1.0, step / warmup) if warmup > 0 else peak_lr


@dataclass(frozen=True)
class LRSchedule:
    """A named schedule with its constants; ``schedule(step)`` is the lr of that step.

    Attributes:
        kind: one of ``SCHEDULES``: "noam", "cosine" or "constant" (``noam_lr``,
            ``warmup_cosine_lr``, ``constant_lr``).
        lr: the peak learning rate, for every kind (noam reaches it at ``step == warmup``).
        warmup: warm-up steps.
        total_steps: where the cosine reaches its end (ignored by the others).
        final_lr_fraction: the cosine's end value as a fraction of ``lr``.
    """

    kind: ScheduleKind
    lr: float
    warmup: int
    total_steps: int = 1
    final_lr_fraction: float = 0.0

    def __post_init__(self) -> None:
        check_choice("kind", self.kind, SCHEDULES)
        check_float("lr", self.lr, min_value=0.0, min_inclusive=False)
        check_int("warmup", self.warmup, min_value=1 if self.kind == "noam" else 0)
        check_int("total_steps", self.total_steps, min_value=1)
        check_float("final_lr_fraction", self.final_lr_fraction, min_value=0.0, max_value=1.0)

    def __call__(self, step: int) -> float:
        if self.kind == "noam":
            # The paper's shape with its peak (at step == warmup) moved to self.lr.
            return noam_lr(step, d_model=1, warmup=self.warmup, scale=self.lr * self.warmup**0.5)
        if self.kind == "cosine":
            return warmup_cosine_lr(
                step,
                peak_lr=self.lr,
                warmup=self.warmup,
                total_steps=self.total_steps,
                final_lr=self.final_lr_fraction * self.lr,
            )
        return constant_lr(step, peak_lr=self.lr, warmup=self.warmup)
