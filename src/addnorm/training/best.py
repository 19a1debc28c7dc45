"""Keeping the best: what ranks a run's evaluations on its validation split, and what decides
when they happen, which is best and when training stops.

A task says how its weights are scored on its validation split (:class:`Validation`: the
figure that ranks them, ``metric``, its direction, ``higher_is_better``, and whether a run keeps
its best by default); a run keeps its best with ``keep_best`` (None: the task's choice,
:func:`keeps_best`) and evaluates every ``eval_every`` steps (:func:`eval_interval`) and at
its last step. :class:`BestKeeper` holds the record of the evaluations so far
(:class:`BestSoFar`, which every periodic checkpoint keeps as its ``"best"``): a better score is
strictly better (a tie keeps the earlier step, unless the validation names a ``tie_break``
figure and the later one's is strictly lower; NaN and inf never are), and with ``patience``
training stops after that many evaluations in a row without one (``stopped_by``
"patience").

Where the best is written and found: :mod:`addnorm.training.best_checkpoints`; how the
trainer runs the evaluations: :mod:`addnorm.training.best_runner`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from torch import nn

from addnorm.training.config import TrainConfig
from addnorm.utils.files import CheckpointError

__all__ = [
    "DEFAULT_EVALUATIONS",
    "BestKeeper",
    "BestSoFar",
    "Validation",
    "eval_interval",
    "keeps_best",
    "validates",
]

# Evaluations per run when ``eval_every`` is not given.
DEFAULT_EVALUATIONS = 10



@dataclass(frozen=True)
class Validation:
    """How a task scores weights on its validation split while training runs.

    Attributes:
        metric: the key of ``score``'s figures that ranks the weights (``"val_bpc"``).
        higher_is_better: the direction of ``metric`` (False for a loss or bits per
            character, True for an accuracy).
        score: the figures of a model (a scratch copy of the scored weights, in eval mode,
            called without gradients) on the validation split; never the split a finished
            run reports as its test figures.
        keep_by_default: whether a run keeps its best when ``keep_best`` is None (a run on a
            user's data).
        unavailable: why this data has nothing to validate on (then a run keeps no best by
            default, and asking for it raises ValueError saying this); None: it has.
        tie_break: a figure of ``score``'s, lower is better, that ranks weights whose
            ``metric`` is equal (one that saturates: a DiT's class agreement reaches 1.0 long
            before its samples have the data's spread); None: a tie keeps the earlier step.
    """

    metric: str
    higher_is_better: bool
    score: Callable[[nn.Module], dict[str, float]]
    keep_by_default: bool = False
    unavailable: str | None = None
    tie_break: str | None = None


@dataclass(frozen=True)
class BestSoFar:
    """The evaluations of a run so far, as its checkpoints record them (``"best"``).

    Attributes:
        metric, higher_is_better: what ranks them (:class:`Validation`'s).
        step, value: the best one's step and score; None before any finite score.
        evaluated: the step of the last evaluation; None before any.
        last: the last evaluation's score (None if it was not finite, or before any).
        since: evaluations since the best (all of them before it): what ``patience`` counts.
        tie: the best one's ``tie_break`` figure (:class:`Validation`); None without one.
    """

    metric: str
    higher_is_better: bool
    step: int | None = None
    value: float | None = None
    evaluated: int | None = None
    last: float | None = None
    since: int = 0
    tie: float | None = None

    def better(self, value: float, tie: float | None = None) -> bool:
        """Whether ``value`` beats the best so far: strictly, or equal with a finite ``tie``
        strictly below the best's (or the best has none); NaN and inf never do."""
        if not math.isfinite(value):
            return False
        if self.value is None:
            return True
        if value == self.value:
            return tie is not None and math.isfinite(tie) and (self.tie is None
                                                               or tie < self.tie)
        return value > self.value if self.higher_is_better else value < self.value

    def after(self, step: int, value: float, tie: float | None = None) -> BestSoFar:
        """The record once ``step`` scored ``value`` (and ``tie``, its tie-break figure)."""
        finite = value if math.isfinite(value) else None
        if self.better(value, tie):
            kept = tie if tie is not None and math.isfinite(tie) else None
            return replace(self, step=step, value=value, evaluated=step, last=finite, since=0,
                           tie=kept)
        return replace(self, evaluated=step, last=finite, since=self.since + 1)

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON (``tie`` only where there is one: a record without is the
        earlier versions')."""
        data = {"metric": self.metric, "higher_is_better": self.higher_is_better,
                "step": self.step, "value": self.value, "evaluated": self.evaluated,
                "last": self.last, "since": self.since}
        return data if self.tie is None else {**data, "tie": self.tie}

    @classmethod
    def from_dict(cls, data: object) -> BestSoFar:
        """The record ``to_dict`` wrote; ValueError naming the entry that is not one."""
        if not isinstance(data, dict):
            raise ValueError(f"'best' must be an object, got {type(data).__name__}")
        unknown = sorted(set(data) - {"metric", "higher_is_better", "step", "value",
                                      "evaluated", "last", "since", "tie"})
        if unknown:
            raise ValueError(f"'best' has unknown entries {unknown}")
        if not isinstance(data.get("metric"), str):
            raise ValueError(f"best.metric must be a string, got {data.get('metric')!r}")
        if not isinstance(data.get("higher_is_better"), bool):
            raise ValueError("best.higher_is_better must be true or false, got "
                             f"{data.get('higher_is_better')!r}")
        for name in ("step", "evaluated"):
            if data.get(name) is not None and not _is_count(data[name]):
                raise ValueError(f"best.{name} must be an int >= 0 or null, got {data[name]!r}")
        if not _is_count(data.get("since", 0)):
            raise ValueError(f"best.since must be an int >= 0, got {data.get('since')!r}")
        for name in ("value", "last", "tie"):
            value = data.get(name)
            if value is not None and not (_is_number(value) and math.isfinite(value)):
                raise ValueError(f"best.{name} must be a finite number or null, got {value!r}")
        if (data.get("step") is None) != (data.get("value") is None):
            raise ValueError("best.step and best.value must both be null or both be set")
        return cls(
            data["metric"], data["higher_is_better"], data.get("step"),
            None if data.get("value") is None else float(data["value"]), data.get("evaluated"),
            None if data.get("last") is None else float(data["last"]), data.get("since", 0),
            None if data.get("tie") is None else float(data["tie"]),
        )


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def keeps_best(config: TrainConfig, validation: Validation | None) -> bool:
    """Whether a run with ``config`` keeps its best: ``config.keep_best``, or when it is None
    the task's choice (``validation.keep_by_default``: a run on a user's data, which has
    something to validate on). ValueError naming ``keep_best`` or ``patience`` if either asks
    for evaluations without a validation to rank by."""
    for name, asked in (("keep_best", config.keep_best), ("patience", config.patience)):
        if asked is None or asked is False:
            continue
        if validation is None:
            raise ValueError(f"{name} needs a validation split to score on; this task has none")
        if validation.unavailable is not None:
            raise ValueError(f"{name} needs a validation split to score on: "
                             f"{validation.unavailable}")
    if config.keep_best is None:
        return (validation is not None and validation.keep_by_default
                and validation.unavailable is None)
    return config.keep_best


def validates(config: TrainConfig, validation: Validation | None) -> bool:
    """Whether a run with ``config`` scores its weights on the validation split while it
    trains: it keeps its best (:func:`keeps_best`, whose errors it raises) or stops on
    ``patience``."""
    return keeps_best(config, validation) or config.patience is not None


def eval_interval(config: TrainConfig) -> int:
    """Steps between evaluations: ``config.eval_every``, or a tenth of ``max_steps`` (at
    least 1) when it is None."""
    if config.eval_every is not None:
        return config.eval_every
    return max(config.max_steps // DEFAULT_EVALUATIONS, 1)


class BestKeeper:
    """The evaluations of one run (see the module docstring): when they are due, the best so
    far (``record``) and whether patience ran out. The trainer scores and writes; this
    decides.

    Args:
        validation: how weights are scored.
        every: steps between evaluations.
        keep: write the best as a checkpoint (``keep_best``).
        patience: evaluations without a better score before training stops; None: never.
    """

    def __init__(self, validation: Validation, *, every: int, keep: bool,
                 patience: int | None) -> None:
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        if patience is not None and patience < 1:
            raise ValueError(f"patience must be >= 1 or None, got {patience}")
        self.validation, self.every, self.keep, self.patience = validation, every, keep, patience
        self.record = BestSoFar(validation.metric, validation.higher_is_better)

    def due(self, step: int, max_steps: int) -> bool:
        """Whether ``step`` (just finished) is evaluated: a multiple of ``every``, or the
        last step."""
        return step % self.every == 0 or step == max_steps

    def pending(self, step: int) -> bool:
        """Whether ``step`` has not been evaluated (the last evaluation was another step's)."""
        return step > 0 and self.record.evaluated != step

    @property
    def exhausted(self) -> bool:
        """Whether patience ran out: ``patience`` evaluations in a row without a better
        score since the best (or, with no finite score yet, since the start)."""
        return self.patience is not None and self.record.since >= self.patience

    def scored(self, step: int, scores: dict[str, float]) -> BestSoFar:
        """The record once ``step`` scored ``scores`` (not yet taken: the trainer writes the
        best checkpoint first, then sets ``record``); ValueError if ``scores`` lacks the
        metric."""
        metric = self.validation.metric
        if metric not in scores:
            raise ValueError(
                f"the validation's scores {sorted(scores)} lack its metric {metric!r}"
            )
        tie_break = self.validation.tie_break
        tie = None if tie_break is None or tie_break not in scores else float(scores[tie_break])
        return self.record.after(step, float(scores[metric]), tie)

    def resume(self, saved: BestSoFar | None, where: Path) -> None:
        """Go on from the record a checkpoint kept (None: it kept none, so the evaluations
        start here). ``CheckpointError`` naming ``where`` if it ranks by another metric or
        direction."""
        if saved is None:
            return
        mine = (self.validation.metric, self.validation.higher_is_better)
        if (saved.metric, saved.higher_is_better) != mine:
            raise CheckpointError(
                f"{where}: its best so far ranks by {saved.metric!r} "
                f"({'higher' if saved.higher_is_better else 'lower'} is better); this run "
                f"ranks by {mine[0]!r} ({'higher' if mine[1] else 'lower'} is better)"
            )
        self.record = saved
