"""Keeping the best: the weights scored on the validation split while training runs, the best
of them kept as a checkpoint of their own, and training stopped when they stop improving.

A task says how its weights are scored on its validation split (:class:`Validation`: the
figure that ranks them, ``metric``, and its direction, ``higher_is_better``); the trainer
scores a scratch copy of the weights a finished run is scored with (the EMA's when the run
keeps one; :class:`~addnorm.training.probes.ScratchCopy`) every ``eval_every`` steps and at
the end of the run (``max_steps``, or the last step the time cap let run), its time set aside
like a probe's, and writes the figures into that step's record of ``metrics.jsonl``
(:class:`BestRunner`, the trainer's probe runner when it is given a validation:
:func:`probe_runner`). :class:`BestKeeper` keeps the best so far (:class:`BestSoFar`): a
better score (strictly:
a tie keeps the earlier step; NaN is never better) is written, with ``keep_best``, as the
checkpoint ``checkpoints/best-NNNNNNNN`` (the weights and their EMA, ``state.json`` with the
run's record, its settings and ``"best"``: the metric, step and score; the manifest says
``"kind": "best"``; atomic, like every checkpoint, and never pruned by ``keep_checkpoints``).
With ``patience``, training stops after that many evaluations in a row without a better score
(``stopped_by`` "patience").

Every periodic checkpoint records the best so far (its ``state.json``'s ``"best"``), so a
resumed run goes on from it exactly: the same evaluations, the same best checkpoint, bit for
bit, as the uninterrupted run. A best checkpoint is deleted only when no periodic checkpoint
on disk records it and it is not the best so far (:func:`prune_best`), so resuming any
periodic checkpoint finds its best; a best written after the checkpoint a run resumes from
is deleted when it resumes (the run writes it again if it gets there). An evaluation an
interrupt cut short is made up when the run resumes (without its ``metrics.jsonl`` line).

The newest ``best-*`` directory of a run is its best (:func:`find_best`);
:func:`pick_checkpoint` is what loading a run uses: its best unless asked for its last
(``which="last"``), and the newest periodic checkpoint of a run without a best, as before.
Single-process runs only (like the probes).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from addnorm.training import distributed
from addnorm.training.checkpoint import (
    MANIFEST,
    delete_checkpoint,
    find_checkpoint,
    list_checkpoints,
    read_checkpoint_state,
    save_checkpoint,
)
from addnorm.training.clock import TrainingClock
from addnorm.training.config import TrainConfig
from addnorm.training.probes import Probe, ProbeRunner
from addnorm.utils.files import CheckpointError

if TYPE_CHECKING:
    from addnorm.training.checkpoint_state import TrainingParts

__all__ = [
    "WHICH",
    "BestKeeper",
    "BestRunner",
    "BestSoFar",
    "Validation",
    "best_dir",
    "check_best_on_disk",
    "eval_interval",
    "find_best",
    "keeps_best",
    "pick_checkpoint",
    "probe_runner",
    "prune_best",
    "save_best",
    "validates",
]

# Which checkpoint of a run loading takes: its best (when it kept one) or its newest.
WHICH = ("best", "last")
# Evaluations per run when ``eval_every`` is not given.
DEFAULT_EVALUATIONS = 10
_log = logging.getLogger(__name__)


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
    """

    metric: str
    higher_is_better: bool
    score: Callable[[nn.Module], dict[str, float]]
    keep_by_default: bool = False
    unavailable: str | None = None


@dataclass(frozen=True)
class BestSoFar:
    """The evaluations of a run so far, as its checkpoints record them (``"best"``).

    Attributes:
        metric, higher_is_better: what ranks them (:class:`Validation`'s).
        step, value: the best one's step and score; None before any finite score.
        evaluated: the step of the last evaluation; None before any.
        last: the last evaluation's score (None if it was not finite, or before any).
        since: evaluations since the best (all of them before it): what ``patience`` counts.
    """

    metric: str
    higher_is_better: bool
    step: int | None = None
    value: float | None = None
    evaluated: int | None = None
    last: float | None = None
    since: int = 0

    def better(self, value: float) -> bool:
        """Whether ``value`` beats the best so far (strictly; NaN and inf never do)."""
        if not math.isfinite(value):
            return False
        if self.value is None:
            return True
        return value > self.value if self.higher_is_better else value < self.value

    def after(self, step: int, value: float) -> BestSoFar:
        """The record once ``step`` scored ``value``."""
        finite = value if math.isfinite(value) else None
        if self.better(value):
            return replace(self, step=step, value=value, evaluated=step, last=finite, since=0)
        return replace(self, evaluated=step, last=finite, since=self.since + 1)

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON."""
        return {"metric": self.metric, "higher_is_better": self.higher_is_better,
                "step": self.step, "value": self.value, "evaluated": self.evaluated,
                "last": self.last, "since": self.since}

    @classmethod
    def from_dict(cls, data: object) -> BestSoFar:
        """The record ``to_dict`` wrote; ValueError naming the entry that is not one."""
        if not isinstance(data, dict):
            raise ValueError(f"'best' must be an object, got {type(data).__name__}")
        unknown = sorted(set(data) - {"metric", "higher_is_better", "step", "value",
                                      "evaluated", "last", "since"})
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
        for name in ("value", "last"):
            value = data.get(name)
            if value is not None and not (_is_number(value) and math.isfinite(value)):
                raise ValueError(f"best.{name} must be a finite number or null, got {value!r}")
        if (data.get("step") is None) != (data.get("value") is None):
            raise ValueError("best.step and best.value must both be null or both be set")
        return cls(
            data["metric"], data["higher_is_better"], data.get("step"),
            None if data.get("value") is None else float(data["value"]), data.get("evaluated"),
            None if data.get("last") is None else float(data["last"]), data.get("since", 0),
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
        return self.record.after(step, float(scores[metric]))

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


def best_dir(run_dir: str | os.PathLike, step: int) -> Path:
    """Where the best checkpoint of ``step`` is written."""
    return Path(run_dir) / "checkpoints" / f"best-{step:08d}"


def find_best(run_dir: str | os.PathLike) -> Path | None:
    """The best checkpoint of the run in ``run_dir``: its newest ``best-*`` directory with a
    manifest, or None if it kept none."""
    found = list_checkpoints(run_dir, kind="best")
    return found[-1] if found else None


def pick_checkpoint(path: str | os.PathLike, which: str = "best") -> tuple[Path, str]:
    """The checkpoint loading ``path`` takes, and which it is (``"best"``, ``"last"`` or
    ``"given"``): a checkpoint directory is itself ("given"); a run's is its best with
    ``which="best"`` when it kept one, else its newest periodic checkpoint ("last").
    ``CheckpointError`` as :func:`~addnorm.training.checkpoint.find_checkpoint`'s."""
    if which not in WHICH:
        raise ValueError(f"which must be one of {WHICH}, got {which!r}")
    path = Path(path)
    if path.is_dir() and (path / MANIFEST).exists():
        return path, "given"
    if which == "best" and path.is_dir() and (best := find_best(path)) is not None:
        return best, "best"
    return find_checkpoint(path), "last"


def prune_best(run_dir: str | os.PathLike, current: int | None) -> None:
    """Delete the best checkpoints of ``run_dir`` that neither are the best so far (step
    ``current``) nor are recorded by a periodic checkpoint on disk (only directories addnorm
    wrote: :func:`~addnorm.training.checkpoint.delete_checkpoint`). Nothing is deleted while
    a periodic checkpoint's record cannot be read (it may name any of them)."""
    found = list_checkpoints(run_dir, kind="best")
    if not found:
        return
    kept = {current}
    for path in list_checkpoints(run_dir):
        try:
            saved = read_checkpoint_state(path).get("best")
        except CheckpointError:
            return
        if isinstance(saved, dict):
            kept.add(saved.get("step"))
    for path in found:
        if int(path.name.removeprefix("best-")) not in kept:
            delete_checkpoint(path)


def check_best_on_disk(run_dir: str | os.PathLike, record: BestSoFar) -> None:
    """Log a warning if the best checkpoint ``record`` names is not in ``run_dir`` (deleted
    by hand: the run goes on, and writes its next best)."""
    if record.step is not None and not (best_dir(run_dir, record.step) / MANIFEST).is_file():
        _log.warning(
            "addnorm: the best checkpoint of step %d (%s %s) is missing from %s; the run "
            "writes the next better one", record.step, record.metric, record.value,
            Path(run_dir) / "checkpoints",
        )


def save_best(parts: TrainingParts, best: BestSoFar, run_dir: str | os.PathLike) -> Path:
    """Write the weights of ``parts`` (and their EMA's) as the best checkpoint of step
    ``best.step``, then delete the best checkpoints nothing needs any more
    (:func:`prune_best`). Its ``state.json``: the step, the run's record, the settings and
    ``best`` (nothing that differs between an uninterrupted run and a resumed one, so both
    write the same bytes). Single-process runs."""
    if best.step is None:
        raise ValueError("save_best needs a best step, got a record without one")
    model, ema = parts.wrapped.model, parts.wrapped.ema
    tensors = {"model": distributed.model_state(model, whole=True)}
    if ema is not None:
        tensors["ema"] = distributed.model_state(ema.module, whole=True)
    state = {
        "step": best.step,
        "run": parts.run_info,
        "train_config": {**parts.config.to_dict(), **parts.extra_config},
        "best": best.to_dict(),
    }
    path = save_checkpoint(run_dir, best.step, tensors, state, kind="best")
    prune_best(run_dir, best.step)
    return path


class BestRunner(ProbeRunner):
    """The trainer's probe runner when it scores its weights on the validation split: the
    task's probe (if any) as :class:`~addnorm.training.probes.ProbeRunner` runs it, and the
    evaluations, the best checkpoint and early stopping of the module docstring at the
    points the trainer asks about (its records, its checkpoints, its stops).

    Args:
        validation: how the weights are scored.
        probe: the task's probe, or None.
        config: the trainer settings (``eval_every``, ``keep_best``: None is off here,
            ``patience``).
        run_dir: the run's folder.
        clock: the trainer's clock (an evaluation outside a record sets its time aside).
        parts: what the trainer's checkpoints keep, when asked (the weights to score and to
            write).
    """

    def __init__(self, validation: Validation, probe: Probe | None, config: TrainConfig,
                 run_dir: str | os.PathLike, *, clock: TrainingClock,
                 parts: Callable[[], TrainingParts]) -> None:
        super().__init__(probe)
        self.keeper = BestKeeper(validation, every=eval_interval(config),
                                 keep=bool(config.keep_best), patience=config.patience)
        self.run_dir, self.clock, self.parts = Path(run_dir), clock, parts

    @property
    def record(self) -> BestSoFar:
        """The evaluations so far."""
        return self.keeper.record

    @property
    def best_checkpoint(self) -> Path | None:
        """The best checkpoint so far (with ``keep_best``), None before one is written."""
        if not self.keeper.keep or self.record.step is None:
            return None
        return best_dir(self.run_dir, self.record.step)

    def due(self, step: int, max_steps: int) -> bool:
        """Whether the probe or an evaluation is due after ``step``."""
        return super().due(step, max_steps) or self.keeper.due(step, max_steps)

    def __call__(self, model: nn.Module, ema: Any, step: int | None = None,
                 max_steps: int | None = None) -> dict[str, float]:
        """The probe's numbers (when due) and, given ``step``, the evaluation's figures when
        it is due then (or whatever ``max_steps``, when that is None)."""
        scores = super().__call__(model, ema, step, max_steps)
        if step is not None and (max_steps is None or self.keeper.due(step, max_steps)):
            scores.update(self.validate(step))
        return scores

    @torch.no_grad()
    def validate(self, step: int) -> dict[str, float]:
        """Score the weights of ``step`` on the validation split, write them as the best
        checkpoint if they beat the best so far (with ``keep_best``) and only then take the
        new record (an interrupt in between leaves the evaluation to make up). Returns the
        figures."""
        parts = self.parts()
        scores = self.keeper.validation.score(self.scratch(parts.wrapped.model,
                                                           parts.wrapped.ema))
        record = self.keeper.scored(step, scores)
        if self.keeper.keep and record.step == step:
            save_best(parts, record, self.run_dir)
        self.keeper.record = record
        return scores

    def state_entries(self) -> dict[str, Any]:
        """``{"best": ...}``: the evaluations so far (:class:`BestSoFar`)."""
        return {"best": self.record.to_dict()}

    def resume(self, state: dict, step: int, where: Path) -> None:
        """Go on from the checkpoint of ``step`` (its weights loaded): its ``best`` (none: the
        evaluations start here; ``CheckpointError`` naming ``where`` if it is not a record
        of this validation), the best checkpoints no periodic one records deleted (the run
        writes again what it gets to), and an evaluation due at ``step`` made up if an
        interrupt cut it short (no record of it is written)."""
        saved = state.get("best")
        try:
            record = None if saved is None else BestSoFar.from_dict(saved)
        except ValueError as err:
            raise CheckpointError(f"{where} does not fit this run: {err}") from None
        self.keeper.resume(record, where)
        if self.keeper.keep:
            prune_best(self.run_dir, self.record.step)
            check_best_on_disk(self.run_dir, self.record)
        if self.keeper.due(step, self.parts().config.max_steps) and self.keeper.pending(step):
            with self.clock.set_aside():
                self.validate(step)

    def checkpoint_written(self) -> None:
        """A periodic checkpoint was written (and older ones pruned): the best checkpoints
        no periodic one records any more are deleted."""
        if self.keeper.keep:
            prune_best(self.run_dir, self.record.step)

    def stop_reason(self) -> str | None:
        """"patience" once ``patience`` evaluations in a row found no better score."""
        return "patience" if self.keeper.exhausted else None

    def stopping(self, reason: str, step: int) -> None:
        """Training stops after ``step`` between evaluations (the time cap): the last
        weights are scored too."""
        if self.keeper.pending(step):
            with self.clock.set_aside():
                self.validate(step)


def probe_runner(probe: Probe | None, validation: Validation | None, config: TrainConfig,
                 run_dir: str | os.PathLike, *, clock: TrainingClock,
                 parts: Callable[[], TrainingParts]) -> ProbeRunner | None:
    """What the trainer scores its run with along the way: a :class:`BestRunner` given a
    ``validation``, else a plain :class:`~addnorm.training.probes.ProbeRunner` of ``probe``
    (None for none). With several processes the probe is left out and a validation refused;
    ``keep_best`` or ``patience`` without a validation raise ValueError."""
    if validation is None and (config.keep_best or config.patience is not None):
        raise ValueError("keep_best and patience need a validation (Trainer(validation=))")
    if distributed.is_distributed():
        if validation is not None:
            raise ValueError("the validation (keep_best, patience) runs in one process only")
        return None
    if validation is not None:
        return BestRunner(validation, probe, config, run_dir, clock=clock, parts=parts)
    return None if probe is None else ProbeRunner(probe)
