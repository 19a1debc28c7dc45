"""addnorm.training.callbacks: the hooks ``Trainer.fit`` calls, when, and with what.

Provenance: the hooks are recorded on a tiny regression run and checked against the loop's
own definition (the module docstring): one ``on_step_start`` / ``on_before_update`` /
``on_step_end`` per step in that order, the gradients complete and the weights not yet moved
at ``on_before_update``, each ``on_log`` record equal to the line ``metrics.jsonl`` got; an
interrupt inside a hook keeps or undoes the step as the step's phase says, checked against
the uninterrupted run bit for bit.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from toy_batches import SumBatches, mse_loss

from addnorm.training import Callback
from addnorm.training.checkpoint import load_checkpoint
from addnorm.training.config import TrainConfig
from addnorm.training.metrics import read_metrics
from addnorm.training.schedules import ScheduleConfig
from addnorm.training.trainer import Trainer


def make_trainer(run_dir, callbacks=(), **overrides) -> Trainer:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Dropout(0.1), nn.ReLU(), nn.Linear(16, 1))
    settings = dict(max_steps=6, lr=1e-2, warmup=2, log_every=2, checkpoint_every=0,
                    grad_accum=2, ema_decay=0.9)
    config = TrainConfig(**{**settings, **overrides})
    schedule = ScheduleConfig("constant", config.lr, config.warmup, total_steps=config.max_steps)
    return Trainer(model, mse_loss, SumBatches(), config, run_dir=run_dir, schedule=schedule,
                   callbacks=callbacks)


class Recorder(Callback):
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def on_fit_start(self, trainer):
        self.calls.append(("fit_start", trainer.step))

    def on_step_start(self, trainer):
        self.calls.append(("step_start", trainer.step))

    def on_before_update(self, trainer):
        grads = [p.grad for p in trainer.model.parameters()]
        assert all(g is not None for g in grads)  # the step's gradients are there
        self.weights = [p.detach().clone() for p in trainer.model.parameters()]
        self.calls.append(("before_update", trainer.step))

    def on_step_end(self, trainer, loss, tokens):
        moved = any(not torch.equal(w, p) for w, p in zip(
            self.weights, trainer.model.parameters(), strict=True))
        self.calls.append(("step_end", trainer.step, moved, tokens))

    def on_log(self, trainer, record):
        self.calls.append(("log", dict(record)))

    def on_fit_end(self, trainer):
        self.calls.append(("fit_end", trainer.step))


def test_each_hook_is_called_at_its_point_of_the_loop(tmp_path):
    recorder = Recorder()
    make_trainer(tmp_path, callbacks=[recorder]).fit()
    calls = [c for c in recorder.calls if c[0] != "log"]
    per_step = [[("step_start", s), ("before_update", s), ("step_end", s + 1, True, 16)]
                for s in range(6)]  # 2 micro-batches of 8 examples per step
    assert calls == [("fit_start", 0), *sum(per_step, []), ("fit_end", 6)]
    logged = [c[1] for c in recorder.calls if c[0] == "log"]
    assert logged == read_metrics(tmp_path / "metrics.jsonl")  # what the file got, in order
    assert [r["step"] for r in logged] == [2, 4, 6]


class InterruptAt(Callback):
    """Raises KeyboardInterrupt from ``hook`` when the trainer's step is ``step``."""

    def __init__(self, hook: str, step: int) -> None:
        self.hook, self.step = hook, step

    def __getattribute__(self, name):
        if name.startswith("on_") and name == object.__getattribute__(self, "hook"):
            def interrupt(trainer, *args):
                if trainer.step == object.__getattribute__(self, "step"):
                    raise KeyboardInterrupt
            return interrupt
        return object.__getattribute__(self, name)


@pytest.mark.parametrize(
    ("hook", "at", "kept"),
    [
        ("on_step_start", 3, 3),  # inside step 4's forward phase: step 4 is undone
        ("on_before_update", 3, 3),  # the weights are not touched yet: undone as well
        ("on_step_end", 4, 4),  # step 4 is complete: kept
        ("on_log", 4, 4),
    ],
)
def test_an_interrupt_in_a_hook_keeps_or_undoes_the_step_by_its_phase(tmp_path, hook, at, kept):
    result = make_trainer(tmp_path / "split", callbacks=[InterruptAt(hook, at)]).fit()
    assert (result.stopped_by, result.step) == ("interrupt", kept)
    resumed = make_trainer(tmp_path / "split")
    resumed.load(load_checkpoint(result.checkpoint))
    resumed.fit()
    whole = make_trainer(tmp_path / "whole")
    whole.fit()
    for name, value in whole.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[name], value)

    def losses(name: str) -> dict[int, float]:
        return {r["step"]: r["loss"] for r in read_metrics(tmp_path / name / "metrics.jsonl")}

    # (an interrupt in on_step_end comes before that step's record: the file lacks it)
    split, uninterrupted = losses("split"), losses("whole")
    assert split == {step: uninterrupted[step] for step in split} and 6 in split
