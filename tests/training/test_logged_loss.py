"""What a run logs of its loss: each metrics record's ``loss`` is the mean of the steps'
losses since the record before (not the last batch's), a resumed run logs the same means (the
sum so far travels in the checkpoint), and output that is no terminal gets plain progress
lines (:class:`~addnorm.training.callbacks.ProgressLines`).

Provenance: the per-step losses the trainer hands its callbacks (``on_step_end``), averaged
here in the same order (so bitwise equal), and the uninterrupted run for the resumed one.
"""

from __future__ import annotations

import dataclasses
import io
import json
import re
import shutil

import pytest
import torch
from scheduled import scheduled_lrs
from torch import nn
from toy_batches import SumBatches, mse_loss

from addnorm.cli.parser import main
from addnorm.tasks.lm import LMTask
from addnorm.training.callbacks import Callback, ProgressLines
from addnorm.training.checkpoint import load_checkpoint
from addnorm.training.config import TrainConfig
from addnorm.training.metrics import read_metrics
from addnorm.training.schedules import ScheduleConfig
from addnorm.training.trainer import Trainer
from addnorm.utils.files import CheckpointError


class StepLosses(Callback):
    def __init__(self) -> None:
        self.losses: dict[int, float] = {}

    def on_step_end(self, trainer, loss, tokens):
        self.losses[trainer.step] = loss


def trainer(run_dir, *, callbacks=(), loss_fn=mse_loss, **settings) -> Trainer:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
    config = TrainConfig(**{"max_steps": 12, "lr": 1e-2, "warmup": 2, "log_every": 4,
                            "checkpoint_every": 3, **settings})
    schedule = ScheduleConfig("cosine", config.lr, config.warmup, total_steps=config.max_steps)
    return Trainer(model, loss_fn, SumBatches(), config, run_dir=run_dir, schedule=schedule,
                   callbacks=list(callbacks))


def records(run_dir) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in read_metrics(run_dir / "metrics.jsonl")]


def mean(values: list[float]) -> float:
    total = 0.0
    for v in values:
        total += v
    return total / len(values)


def test_each_record_holds_the_mean_loss_since_the_record_before(tmp_path):
    steps = StepLosses()
    trainer(tmp_path, callbacks=[steps], max_steps=10).fit()
    losses = steps.losses
    expected = [(4, mean([losses[s] for s in range(1, 5)])),
                (8, mean([losses[s] for s in range(5, 9)])),
                (10, mean([losses[9], losses[10]]))]
    assert records(tmp_path) == expected
    assert records(tmp_path)[0][1] != losses[4]  # not the last batch's


def test_a_run_resumed_between_records_logs_the_same_means(tmp_path):
    """From the periodic checkpoint of step 6 (two steps into the window of the record at
    step 8) and from an interrupt at step 7: the records equal the uninterrupted run's."""
    trainer(tmp_path / "whole", keep_checkpoints=10).fit()
    whole = records(tmp_path / "whole")
    resumed = trainer(tmp_path / "from6")
    resumed.load(load_checkpoint(tmp_path / "whole" / "checkpoints" / "step-00000006"))
    resumed.fit()
    assert records(tmp_path / "from6") == [r for r in whole if r[0] > 6]

    calls = []

    def interrupted(model, batch):
        calls.append(1)
        if len(calls) == 8:  # step 8's batch: the run stops with step 7 checkpointed
            raise KeyboardInterrupt
        return mse_loss(model, batch)

    result = trainer(tmp_path / "split", loss_fn=interrupted).fit()
    assert (result.stopped_by, result.step) == ("interrupt", 7)
    state = load_checkpoint(result.checkpoint).state
    assert state["loss_window"]["steps"] == 3  # steps 5, 6, 7
    again = trainer(tmp_path / "split")
    again.load(load_checkpoint(result.checkpoint))
    again.fit()
    assert records(tmp_path / "split") == whole


@pytest.mark.parametrize(("window", "match"), [
    ({"sum": "x", "steps": 2}, r"loss_window sum must be a finite number, got 'x'"),
    ({"sum": 1.0, "steps": -1}, r"loss_window steps must be an int >= 0, got -1"),
    ([1.0, 2], r"loss_window must be"),
])
def test_a_damaged_loss_window_is_refused_naming_the_file(tmp_path, window, match):
    trainer(tmp_path / "run", max_steps=3).fit()
    checkpoint = load_checkpoint(tmp_path / "run")
    bad = dataclasses.replace(checkpoint, state={**checkpoint.state, "loss_window": window})
    with pytest.raises(CheckpointError, match=rf"state.json does not fit this run: {match}"):
        trainer(tmp_path / "other").load(bad)


def test_a_checkpoint_from_before_the_window_resumes_with_a_new_one(tmp_path):
    """Its first record after the resume averages the steps since the resume only."""
    steps = StepLosses()
    trainer(tmp_path / "run", max_steps=6).fit()
    path = tmp_path / "run" / "checkpoints" / "step-00000006"
    state = json.loads((path / "state.json").read_text())
    del state["loss_window"]
    old = tmp_path / "old"
    shutil.copytree(tmp_path / "run", old)
    checkpoint = load_checkpoint(path)
    resumed = trainer(old, callbacks=[steps])
    resumed.load(dataclasses.replace(checkpoint, state=state))
    resumed.fit()
    assert [r for r in records(old) if r[0] > 6] == [
        (8, mean([steps.losses[7], steps.losses[8]])),
        (12, mean([steps.losses[s] for s in range(9, 13)])),
    ]


LINE = re.compile(r"^step (\d+)/(\d+)  loss (\d+\.\d{4})  lr (\S+)  (\d+) tok/s  (\d+) s$")


def test_progress_lines_come_every_n_steps_with_the_mean_loss_since_the_line_before(tmp_path):
    stream, steps = io.StringIO(), StepLosses()
    run = trainer(tmp_path, callbacks=[steps, ProgressLines(every_steps=5, every_s=1e9,
                                                            stream=stream)], max_steps=12)
    run.fit()
    lines = stream.getvalue().splitlines()
    found = [LINE.match(line) for line in lines]
    assert all(found), lines
    assert [int(m.group(1)) for m in found] == [5, 10, 12]  # and the last step
    spans = [range(1, 6), range(6, 11), range(11, 13)]
    for match, span in zip(found, spans, strict=True):
        assert match.group(2) == "12"
        assert match.group(3) == f"{mean([steps.losses[s] for s in span]):.4f}"
        taken_with = scheduled_lrs(run.schedule, 12)[int(match.group(1)) - 1]
        assert float(match.group(4)) == pytest.approx(taken_with, rel=1e-2)  # 3 digits shown


def test_progress_lines_also_come_every_so_many_seconds(tmp_path):
    stream = io.StringIO()
    trainer(tmp_path, callbacks=[ProgressLines(every_steps=1000, every_s=0.0, stream=stream)],
            max_steps=4).fit()
    assert [line.split()[1] for line in stream.getvalue().splitlines()] == [
        "1/4", "2/4", "3/4", "4/4"
    ]


LM = ["--preset", "lm-tiny", "--d-model", "32", "--n-heads", "2", "--d-ff", "64",
      "--n-layers", "1", "--batch-size", "2", "--seq-len", "16", "--eval-size", "2",
      "--max-steps", "6", "--log-every", "3", "--threads", "1", "--device", "cpu"]


@pytest.mark.parametrize("quiet", [False, True])
def test_train_writes_progress_lines_to_stdout_that_is_no_terminal(
    tmp_path, capsys, monkeypatch, quiet
):
    monkeypatch.setattr(LMTask, "evaluate_run", lambda self, model, cfg: {"val_bpc": 0.0})
    monkeypatch.setattr(LMTask, "run_samples", lambda self, model: [])
    flags = ["--quiet"] if quiet else []
    assert main(["train", "lm", *LM, *flags, "--out", str(tmp_path / "lm")]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if LINE.match(line)]
    assert [line.split()[1] for line in lines] == ([] if quiet else ["3/6", "6/6"])
    if not quiet:  # the same means as the records (no line came between them by time)
        logged = [f"{loss:.4f}" for _, loss in records(tmp_path / "lm")]
        assert [LINE.match(line).group(3) for line in lines] == logged
