"""A run's best checkpoints on disk (addnorm.training.best_checkpoints): which one loading
opens, and which ones pruning deletes.

Provenance: the module's rules restated on checkpoints written here: a run's best is its
newest ``best-*``; a best is kept while a periodic checkpoint records it or it is the current
one; only directories addnorm wrote are deleted.
"""

from __future__ import annotations

import pytest
import torch

from addnorm.training.best_checkpoints import find_best, pick_checkpoint, prune_best
from addnorm.training.checkpoint import list_checkpoints, save_checkpoint

TENSORS = {"model": {"w": torch.zeros(2)}}


def periodic(run_dir, step: int, best: int | None, keep: int = 2) -> None:
    """A periodic checkpoint of ``step`` recording the best of step ``best``."""
    state = {} if best is None else {"best": {"step": best}}
    save_checkpoint(run_dir, step, TENSORS, state, keep=keep)


def best(run_dir, step: int) -> None:
    save_checkpoint(run_dir, step, TENSORS, {"best": {"step": step}}, kind="best")


def names(run_dir, kind: str = "best") -> list[str]:
    return [p.name for p in list_checkpoints(run_dir, kind=kind)]


def test_a_best_is_kept_while_a_periodic_checkpoint_records_it_or_it_is_the_current_one(
        tmp_path):
    for step in (4, 8, 12):
        best(tmp_path, step)
    periodic(tmp_path, 10, best=8)
    prune_best(tmp_path, current=12)
    assert names(tmp_path) == ["best-00000008", "best-00000012"]
    periodic(tmp_path, 20, best=12, keep=1)  # step-10, the last to record best-8, goes
    prune_best(tmp_path, current=12)
    assert names(tmp_path) == ["best-00000012"] and names(tmp_path, "step") == ["step-00000020"]


def test_nothing_is_pruned_while_a_periodic_checkpoints_record_cannot_be_read(tmp_path):
    best(tmp_path, 4)
    periodic(tmp_path, 10, best=None)
    (tmp_path / "checkpoints" / "step-00000010" / "state.json").write_text("not json")
    prune_best(tmp_path, current=None)
    assert names(tmp_path) == ["best-00000004"]


def test_loading_a_run_takes_its_best_unless_told_and_a_run_without_one_its_newest(tmp_path):
    run = tmp_path / "kept"
    for step in (10, 20, 30):
        periodic(run, step, best=8)
    best(run, 8)
    assert find_best(run) == run / "checkpoints" / "best-00000008"
    assert pick_checkpoint(run) == (run / "checkpoints" / "best-00000008", "best")
    assert pick_checkpoint(run, "last") == (run, "last")  # (whose newest the loader opens)
    step = run / "checkpoints" / "step-00000020"
    assert pick_checkpoint(step) == (step, "given")
    plain = tmp_path / "plain"
    periodic(plain, 10, best=None)
    assert find_best(plain) is None and pick_checkpoint(plain) == (plain, "last")
    assert pick_checkpoint(tmp_path / "missing") == (tmp_path / "missing", "last")
    with pytest.raises(ValueError, match="which must be one of"):
        pick_checkpoint(plain, "newest")


def test_pruning_deletes_only_best_checkpoints_addnorm_wrote(tmp_path):
    best(tmp_path, 5)
    foreign = tmp_path / "checkpoints" / "best-00000007"
    foreign.mkdir()
    (foreign / "manifest.json").write_text("{}")  # a folder of that name addnorm did not write
    prune_best(tmp_path, current=None)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["best-00000007"]
