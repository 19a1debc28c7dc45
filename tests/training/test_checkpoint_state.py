"""addnorm.training.checkpoint_state: what a training checkpoint holds, and putting a trainer's
objects back from it.

Provenance: identities. A checkpoint of trained objects, loaded into fresh ones (other initial
weights, other random state), makes them equal to the saved ones bit for bit; the files and
``state.json`` entries are the module docstring's list; an entry an older checkpoint lacks
takes the documented fallback (the scheduler stepped to the checkpoint's step, the EMA's count
``step + 1``, an empty loss window); the probe runner's entries are kept and it is told of
each write and, last, of a resume. Resuming whole runs from checkpoints of this and earlier
versions is checked in test_trainer.py.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
import torch
from torch import nn
from toy_batches import SumBatches, mse_loss

from addnorm.training.checkpoint import load_checkpoint
from addnorm.training.checkpoint_state import (
    Progress,
    TrainingParts,
    checked_extra_config,
    load_training,
    save_training,
)
from addnorm.training.config import TrainConfig
from addnorm.training.optimizer import make_optimizer
from addnorm.training.probes import ProbeRunner
from addnorm.training.schedules import ScheduleConfig, make_scheduler
from addnorm.training.wrapping import wrap_model

CONFIG = TrainConfig(max_steps=10, lr=1e-2, warmup=3, ema_decay=0.9, checkpoint_every=0)
SCHEDULE = ScheduleConfig("cosine", CONFIG.lr, CONFIG.warmup, total_steps=CONFIG.max_steps)


def _parts(seed: int) -> TrainingParts:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    wrapped = wrap_model(model, CONFIG)
    optimizer = make_optimizer(model, CONFIG)
    return TrainingParts(wrapped, optimizer, make_scheduler(SCHEDULE, optimizer),
                         SumBatches(seed), CONFIG, SCHEDULE, {"task": "toy"}, {"extra": 1})


def _trained(steps: int) -> TrainingParts:
    parts = _parts(0)
    for _ in range(steps):
        parts.optimizer.zero_grad()
        batch = parts.batches.next_batch()  # (a SumBatches)
        mse_loss(parts.wrapped.model, batch)[0].backward()
        parts.optimizer.step()
        assert parts.wrapped.ema is not None
        parts.wrapped.ema.update_parameters(parts.wrapped.model)
        parts.scheduler.step()
    return parts


def _draws() -> tuple:
    return torch.rand(2).tolist(), random.random(), float(np.random.rand())


def test_a_checkpoint_holds_the_documented_files_and_entries(tmp_path):
    path = save_training(_trained(2), Progress(2, 1.5, (0.25, 1)), tmp_path)
    checkpoint = load_checkpoint(path)
    assert path.name == "step-00000002"
    assert set(checkpoint.tensors) == {"model", "optimizer", "rng", "ema"}
    state = checkpoint.state
    assert set(state) == {"step", "elapsed_s", "run", "train_config", "schedule", "scheduler",
                          "optimizer", "data", "rng", "loss_window", "ema"}
    assert (state["step"], state["elapsed_s"], state["run"]) == (2, 1.5, {"task": "toy"})
    assert state["train_config"] == {**CONFIG.to_dict(), "extra": 1}
    # (a schedule never re-planned leaves out the re-plan's fields, as earlier ones did)
    assert state["schedule"] == {
        k: v for k, v in dataclasses.asdict(SCHEDULE).items() if not k.startswith("replanned")}
    assert state["loss_window"] == {"sum": 0.25, "steps": 1}
    assert state["ema"] == {"n_averaged": 3}  # the initial weights and two updates


def test_loading_puts_fresh_objects_back_where_the_saved_ones_were(tmp_path):
    saved = _trained(3)
    torch.manual_seed(7)
    path = save_training(saved, Progress(3, 2.0, (0.5, 2)), tmp_path)
    after_save = _draws()
    fresh = _parts(1)
    progress, scheduler = load_training(fresh, load_checkpoint(path))
    assert _draws() == after_save  # the generators as they were when the checkpoint was made
    assert progress == Progress(3, 2.0, (0.5, 2))
    assert scheduler is fresh.scheduler
    assert scheduler.state_dict() == saved.scheduler.state_dict()
    assert fresh.batches.state_dict() == saved.batches.state_dict()
    assert fresh.wrapped.ema is not None and saved.wrapped.ema is not None
    for mine, theirs in ((fresh.wrapped.model, saved.wrapped.model),
                         (fresh.wrapped.ema, saved.wrapped.ema)):
        for name, value in theirs.state_dict().items():
            assert torch.equal(mine.state_dict()[name], value), name
    for mine, theirs in zip(fresh.optimizer.state.values(), saved.optimizer.state.values(),
                            strict=True):
        assert all(torch.equal(mine[k], v) for k, v in theirs.items())


def test_entries_older_checkpoints_lack_take_their_fallbacks(tmp_path):
    path = save_training(_trained(4), Progress(4, 0.0, (0.5, 2)), tmp_path)
    checkpoint = load_checkpoint(path)
    old = {k: v for k, v in checkpoint.state.items()
           if k not in ("scheduler", "ema", "loss_window")}
    fresh = _parts(1)
    progress, scheduler = load_training(fresh, dataclasses.replace(checkpoint, state=old))
    assert scheduler is not fresh.scheduler and scheduler.last_epoch == 4  # stepped to it
    assert scheduler.get_last_lr() == load_training(_parts(1), checkpoint)[1].get_last_lr()
    assert fresh.wrapped.ema is not None and int(fresh.wrapped.ema.n_averaged) == 5
    assert progress.loss_window == (0.0, 0)


class Recorder(ProbeRunner):
    """A probe runner that keeps an entry in every checkpoint and notes what it is told."""

    def __init__(self, parts_weights=None) -> None:
        super().__init__(None)
        self.told: list = []
        self.weights = parts_weights

    def state_entries(self):
        return {"probe_note": {"kept": 1}}

    def resume(self, state, step, where):
        # (called last: the weights are already the checkpoint's)
        self.told.append(("resume", state["probe_note"], step, where.name,
                          self.weights() if self.weights else None))

    def checkpoint_written(self):
        self.told.append(("written",))


def test_the_probe_runner_keeps_its_entries_and_is_told_of_writes_and_resumes(tmp_path):
    saved = dataclasses.replace(_trained(2), probe=Recorder())
    path = save_training(saved, Progress(2, 0.0, (0.0, 0)), tmp_path)
    assert load_checkpoint(path).state["probe_note"] == {"kept": 1}
    assert saved.probe.told == [("written",)]
    fresh = _parts(1)
    weight = fresh.wrapped.model[0].weight
    fresh = dataclasses.replace(fresh, probe=Recorder(lambda: weight.detach().clone()))
    load_training(fresh, load_checkpoint(path))
    ((what, note, step, name, seen),) = fresh.probe.told
    assert (what, note, step, name) == ("resume", {"kept": 1}, 2, "state.json")
    assert torch.equal(seen, saved.wrapped.model[0].weight)


def test_extra_settings_must_not_repeat_the_trainer_settings():
    assert checked_extra_config(CONFIG, {"task_option": 2}) == {"task_option": 2}
    with pytest.raises(ValueError, match=r"must not repeat TrainConfig fields, got \['lr'\]"):
        checked_extra_config(CONFIG, {"lr": 0.1, "other": 1})
