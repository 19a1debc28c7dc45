"""A run's best checkpoints on disk: ``checkpoints/best-NNNNNNNN`` beside the periodic ones.

:func:`save_best` writes the weights and their EMA's (``state.json``: the step, the run's
record, its settings and ``"best"``, the :class:`~addnorm.training.best.BestSoFar` record;
nothing that differs between an uninterrupted run and a resumed one, so both write the same
bytes; atomic, like every checkpoint: :func:`~addnorm.training.checkpoint.save_checkpoint`
with ``kind="best"``, never pruned by ``keep_checkpoints``). A best checkpoint is deleted only
when no periodic checkpoint on disk records it and it is not the best so far
(:func:`prune_best`), so resuming any periodic checkpoint finds its best, and only if addnorm
wrote it.

The newest ``best-*`` directory of a run is its best (:func:`find_best`); :func:`pick_checkpoint`
is what loading a run opens: its best unless asked for its last (``which="last"``), and a run
without a best as before.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from addnorm.training import distributed
from addnorm.training.best import BestSoFar
from addnorm.training.checkpoint import (
    MANIFEST,
    delete_checkpoint,
    list_checkpoints,
    read_checkpoint_state,
    save_checkpoint,
)
from addnorm.utils.files import CheckpointError

if TYPE_CHECKING:
    from addnorm.training.checkpoint_state import TrainingParts

__all__ = [
    "WHICH",
    "best_dir",
    "check_best_on_disk",
    "find_best",
    "pick_checkpoint",
    "prune_best",
    "save_best",
]

# Which checkpoint of a run loading takes: its best (when it kept one) or its newest.
WHICH = ("best", "last")
_log = logging.getLogger(__name__)


def best_dir(run_dir: str | os.PathLike, step: int) -> Path:
    """Where the best checkpoint of ``step`` is written."""
    return Path(run_dir) / "checkpoints" / f"best-{step:08d}"


def find_best(run_dir: str | os.PathLike) -> Path | None:
    """The best checkpoint of the run in ``run_dir``: its newest ``best-*`` directory with a
    manifest, or None if it kept none."""
    found = list_checkpoints(run_dir, kind="best")
    return found[-1] if found else None


def pick_checkpoint(path: str | os.PathLike, which: str = "best") -> tuple[Path, str]:
    """What loading ``path`` opens, and which checkpoint that is (``"best"``, ``"last"`` or
    ``"given"``): a checkpoint directory is itself ("given"); a run's is its best with
    ``which="best"`` when it kept one, else the run itself, whose newest periodic checkpoint
    :func:`~addnorm.training.checkpoint.load_checkpoint` opens ("last"). Nothing else is
    checked here: a path that holds no checkpoint is the loader's to refuse."""
    if which not in WHICH:
        raise ValueError(f"which must be one of {WHICH}, got {which!r}")
    path = Path(path)
    if path.is_dir() and (path / MANIFEST).exists():
        return path, "given"
    if which == "best" and path.is_dir() and (best := find_best(path)) is not None:
        return best, "best"
    return path, "last"


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
