"""How the trainer scores its run on the validation split: :class:`BestRunner`, its probe runner
when it is given a :class:`~addnorm.training.best.Validation` (:func:`probe_runner` picks it).

Every ``eval_every`` steps and at the last one (``max_steps``, or the last the time cap let
run: told by :class:`~addnorm.training.stopping.StopRequests`), it scores a scratch copy of the
weights a finished run is scored with (the EMA's when the run keeps one;
:class:`~addnorm.training.probes.ScratchCopy`), its time set aside like a probe's, and hands
the figures to that step's record of ``metrics.jsonl``; a better score is written as the best
checkpoint (:mod:`addnorm.training.best_checkpoints`) before the record
(:class:`~addnorm.training.best.BestSoFar`) takes it. Every periodic checkpoint keeps the
record, so a resumed run goes on from it exactly, the same evaluations and the same best
checkpoint, bit for bit, as the uninterrupted run: the best checkpoints written after the
checkpoint it resumes from are deleted (it writes them again if it gets there), and an
evaluation an interrupt cut short is made up (without its ``metrics.jsonl`` line). With
``patience`` it stops training (``stopped_by`` "patience"). Single-process runs only (like the
probes).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from addnorm.training import distributed
from addnorm.training.best import BestKeeper, BestSoFar, Validation, eval_interval
from addnorm.training.best_checkpoints import (
    best_dir,
    check_best_on_disk,
    prune_best,
    save_best,
)
from addnorm.training.clock import TrainingClock
from addnorm.training.config import TrainConfig
from addnorm.training.probes import Probe, ProbeRunner
from addnorm.utils.files import CheckpointError

if TYPE_CHECKING:
    from addnorm.training.checkpoint_state import TrainingParts

__all__ = ["BestRunner", "probe_runner"]


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
        figures, with ``validation_s``: the seconds it took, the best's writing included
        (what ``eval_every`` and the task's ``eval_size`` cost; not training time)."""
        began = time.monotonic()
        parts = self.parts()
        scores = self.keeper.validation.score(self.scratch(parts.wrapped.model,
                                                           parts.wrapped.ema))
        record = self.keeper.scored(step, scores)
        if self.keeper.keep and record.step == step:
            save_best(parts, record, self.run_dir)
        self.keeper.record = record
        return {**scores, "validation_s": time.monotonic() - began}

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
