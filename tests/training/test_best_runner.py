"""The trainer keeping its best (addnorm.training.best_runner): the best checkpoint a trainer
writes and loads back, pruning as the periodic checkpoints go, early stopping, the time cap's
last step, and a resumed run's best equal to the uninterrupted run's, bit for bit.

Provenance: the best checkpoint's step is the argmin of the validation scores the run
recorded in metrics.jsonl, and its weights scored again give the recorded score exactly (the
same function on the same weights, one process: an identity); the resumed runs are compared
with the uninterrupted run of the same settings (exact resume).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch
from torch import nn
from toy_batches import SumBatches, mse_loss

from addnorm.training import Callback
from addnorm.training.best import Validation
from addnorm.training.best_checkpoints import find_best, prune_best
from addnorm.training.checkpoint import list_checkpoints, load_checkpoint
from addnorm.training.config import TrainConfig
from addnorm.training.metrics import read_metrics
from addnorm.training.schedules import ScheduleConfig
from addnorm.training.stopping import StopRequests
from addnorm.training.trainer import Trainer
from addnorm.utils.files import CheckpointError

HELD_OUT = SumBatches(seed=99, batch_size=64).next_batch()  # the toy task's validation split


def val_mse(model: nn.Module) -> dict[str, float]:
    """The validation figure of the toy regression: its mean squared error on HELD_OUT."""
    with torch.no_grad():
        return {"val_mse": float(mse_loss(model, HELD_OUT)[0]), "n_val": 64}


VALIDATION = Validation("val_mse", higher_is_better=False, score=val_mse)


def midway(target: float) -> Validation:
    """``val_mse`` and ``val_gap``, its distance from ``target``, which ranks: the toy run's
    val_mse falls past 3.2 near step 8 and past 1.8 near step 16, so its best is there, in
    mid-run, not at the last step."""

    def score(model: nn.Module) -> dict[str, float]:
        figures = val_mse(model)
        return {**figures, "val_gap": abs(figures["val_mse"] - target)}

    return Validation("val_gap", higher_is_better=False, score=score)


def scripted(values: list[float]) -> Validation:
    """A validation whose n-th evaluation scores ``values[n]`` whatever the weights."""
    calls = iter(values)
    return Validation("val_mse", higher_is_better=False,
                      score=lambda model: {"val_mse": next(calls)})


def make_trainer(run_dir, *, validation: Validation | None = VALIDATION, callbacks=(),
                 **overrides) -> Trainer:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 32), nn.Dropout(0.1), nn.ReLU(), nn.Linear(32, 1))
    settings = dict(max_steps=30, lr=1e-2, warmup=5, log_every=10, checkpoint_every=10,
                    ema_decay=0.9, keep_best=True, eval_every=4)
    settings.update(overrides)
    config = TrainConfig(**settings)
    schedule = ScheduleConfig("cosine", config.lr, config.warmup, total_steps=30)
    return Trainer(model, mse_loss, SumBatches(), config, run_dir=run_dir, schedule=schedule,
                   validation=validation, callbacks=callbacks,
                   run_info={"task": "toy"})


def scores(run_dir) -> dict[int, float]:
    return {r["step"]: r["val_mse"] for r in read_metrics(run_dir / "metrics.jsonl")
            if "val_mse" in r}


def files(path: Path) -> dict[str, bytes]:
    return {child.name: child.read_bytes() for child in sorted(path.iterdir())}


def test_the_best_checkpoint_holds_the_weights_that_scored_best(tmp_path):
    trainer = make_trainer(tmp_path)
    result = trainer.fit()
    seen = scores(tmp_path)
    assert sorted(seen) == [4, 8, 12, 16, 20, 24, 28, 30]  # every 4 steps, and the last
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert all(r["validation_s"] > 0 for r in records if "val_mse" in r)
    best_step = min(seen, key=seen.__getitem__)
    best = find_best(tmp_path)
    assert best is not None and best.name == f"best-{best_step:08d}"
    loaded = load_checkpoint(best)
    assert loaded.state["best"]["step"] == best_step
    assert loaded.state["best"]["value"] == seen[best_step]
    assert loaded.state["run"] == {"task": "toy"}
    model = nn.Sequential(nn.Linear(4, 32), nn.Dropout(0.1), nn.ReLU(), nn.Linear(32, 1))
    model.load_state_dict(loaded.tensors["ema"])  # the weights it was scored with
    assert val_mse(model.eval())["val_mse"] == seen[best_step]
    assert set(loaded.tensors) == {"model", "ema"}  # the weights only: no optimizer
    assert result.stopped_by == "max_steps"
    assert load_checkpoint(tmp_path).state["best"]["evaluated"] == 30


def test_best_checkpoints_outlive_keep_checkpoints_until_no_checkpoint_records_them(tmp_path):
    # evaluations at 4, 8, ..., 28, 30; the best moves at 4, 8 and 24
    values = [5.0, 3.0, 4.0, 4.0, 4.0, 2.0, 2.5, 2.6]
    make_trainer(tmp_path, validation=scripted(values), keep_checkpoints=1).fit()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000030"]
    # step-30 records the best of step 24; best-8 went when step-10's checkpoint was pruned
    assert [p.name for p in list_checkpoints(tmp_path, kind="best")] == ["best-00000024"]


def test_a_periodic_checkpoint_keeps_the_best_it_records(tmp_path):
    make_trainer(tmp_path, validation=scripted([5.0, 3.0, 2.0]), max_steps=12,
                 checkpoint_every=10, keep_checkpoints=2).fit()
    # step-10 records best-8, step-12 records best-12: both stay
    assert [p.name for p in list_checkpoints(tmp_path, kind="best")] == [
        "best-00000008", "best-00000012"]
    prune_best(tmp_path, current=12)  # nothing changes: both are recorded
    assert len(list_checkpoints(tmp_path, kind="best")) == 2


def test_patience_stops_after_that_many_evaluations_without_a_better_score(tmp_path):
    trainer = make_trainer(tmp_path, validation=scripted([3.0, 1.0, 2.0, 1.0]), patience=2)
    result = trainer.fit()
    assert (result.stopped_by, result.step) == ("patience", 16)  # 12 and 16 found no better
    assert find_best(tmp_path).name == "best-00000008"
    state = load_checkpoint(tmp_path).state["best"]
    assert (state["step"], state["value"], state["since"]) == (8, 1.0, 2)


def test_the_time_cap_scores_the_last_step_it_let_run(tmp_path, monkeypatch):
    checks = iter(range(100))
    monkeypatch.setattr(StopRequests, "_out_of_time", lambda self: next(checks) >= 7)
    result = make_trainer(tmp_path).fit()
    assert (result.stopped_by, result.step) == ("max_minutes", 7)
    state = load_checkpoint(tmp_path).state["best"]
    assert state["evaluated"] == 7 and state["step"] in (4, 7)


class SigintAt(Callback):
    """Sends SIGINT (a first Ctrl-C: the step ends, a checkpoint is written) at ``step``."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, state, loss, tokens):
        if state.step == self.step:
            os.kill(os.getpid(), signal.SIGINT)


class InterruptAt(Callback):
    """Raises KeyboardInterrupt (a second Ctrl-C) in on_step_end at ``step``: the step is
    kept, its evaluation not made."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, state, loss, tokens):
        if state.step == self.step:
            raise KeyboardInterrupt


def interrupt_update_at(trainer: Trainer, step: int) -> None:
    """Make the optimizer update of ``step`` raise KeyboardInterrupt: the run keeps its last
    periodic checkpoint, as after a crash."""
    real_step = trainer.optimizer.step

    def step_or_interrupt(*args, **kwargs):
        if trainer.step + 1 == step:
            raise KeyboardInterrupt
        return real_step(*args, **kwargs)

    trainer.optimizer.step = step_or_interrupt  # type: ignore[method-assign]


@pytest.mark.parametrize(("target", "best_step"), [(3.2, 8), (1.8, 16)])
@pytest.mark.parametrize("how", ["sigint", "in_a_hook", "crash"])
def test_an_interrupted_and_resumed_run_keeps_the_uninterrupted_runs_best_bit_for_bit(
        tmp_path, how, target, best_step):
    validation = midway(target)
    make_trainer(tmp_path / "whole", validation=validation).fit()
    split = tmp_path / "split"
    if how == "sigint":  # at step 14, between evaluations
        first = make_trainer(split, validation=validation, callbacks=[SigintAt(14)])
        assert first.fit().step == 14
    elif how == "in_a_hook":  # step 16 is kept, its evaluation is not made: made up on resume
        first = make_trainer(split, validation=validation, callbacks=[InterruptAt(16)])
        assert first.fit().step == 16
        assert load_checkpoint(split).state["best"]["evaluated"] == 12
    else:  # in step 19's update: back to step 10, with any best of 12 and 16 written after it
        first = make_trainer(split, validation=validation)
        interrupt_update_at(first, 19)
        assert first.fit().checkpoint.name == "step-00000010"
    resumed = make_trainer(split, validation=validation)
    resumed.load(load_checkpoint(split))
    resumed.fit()
    expected, got = find_best(tmp_path / "whole"), find_best(split)
    assert expected is not None and expected.name == f"best-{best_step:08d}"
    assert got is not None and got.name == expected.name
    assert files(got) == files(expected)  # weights, state.json and manifest, byte for byte
    final = load_checkpoint(split).state["best"]
    assert final == load_checkpoint(tmp_path / "whole").state["best"]
    assert [p.name for p in list_checkpoints(split, kind="best")] == [
        p.name for p in list_checkpoints(tmp_path / "whole", kind="best")]
    uninterrupted = scores(tmp_path / "whole")
    made_up = 16 if how == "in_a_hook" else None  # (its record line was never written)
    assert scores(split) == {s: v for s, v in uninterrupted.items() if s != made_up}


def test_a_best_written_after_the_checkpoint_a_run_resumes_from_is_deleted(tmp_path):
    validation = midway(1.8)
    first = make_trainer(tmp_path, validation=validation)
    interrupt_update_at(first, 19)  # back to step 10; best-16 was written after it
    first.fit()
    assert find_best(tmp_path) == tmp_path / "checkpoints" / "best-00000016"
    resumed = make_trainer(tmp_path, validation=validation, max_steps=14)  # ends before 16
    resumed.load(load_checkpoint(tmp_path))
    assert find_best(tmp_path) == tmp_path / "checkpoints" / "best-00000008"  # step-10's
    resumed.fit()
    record = load_checkpoint(tmp_path).state["best"]
    assert record["step"] <= 14 and record["evaluated"] == 14
    assert find_best(tmp_path) == tmp_path / "checkpoints" / f"best-{record['step']:08d}"


def test_a_best_checkpoint_holds_no_training_state_to_resume(tmp_path):
    make_trainer(tmp_path, max_steps=8).fit()
    best = find_best(tmp_path)
    assert best is not None
    with pytest.raises(CheckpointError, match="best weights only"):
        make_trainer(tmp_path / "other").load(load_checkpoint(best))


def test_keep_best_or_patience_without_a_validation_is_refused(tmp_path):
    for setting in ({"keep_best": True}, {"patience": 2}):
        with pytest.raises(ValueError, match="need a validation"):
            make_trainer(tmp_path, validation=None, **setting)
