"""A task's run (``addnorm.tasks.run``): stopped by patience, leaving the previous run in
place after a failed check, refusing another task's checkpoint, and resuming checkpoints that
record retired settings. (Its scores and samples: tests/tasks/test_run_finish.py; loading it
back: tests/tasks/test_trained.py.)

Provenance: a scripted validation score (patience), and the uninterrupted run's configs for a
resumed one.
"""

from __future__ import annotations

import shutil
from dataclasses import replace

import pytest

from addnorm.tasks.run import resume_configs, train_run
from addnorm.tasks.trained import load_trained
from addnorm.tasks.translate import TranslateTask, TranslateTaskConfig
from addnorm.training.checkpoint import load_checkpoint
from addnorm.training.config import TrainConfig
from addnorm.training.metrics import read_metrics


def test_patience_ends_the_run_and_says_so(tmp_path, monkeypatch, tiny_lm_run):
    import addnorm.tasks.lm as lm_module

    scripted = iter([3.0, 2.0, 2.5, 2.5, 2.5, 2.5])  # the best at the second evaluation
    real = lm_module.LMTask.evaluate_run
    monkeypatch.setattr(lm_module.LMTask, "evaluate_run", lambda self, model, cfg: {
        **real(self, model, cfg), "val_bpc": next(scripted)})
    summary = tiny_lm_run(tmp_path, max_steps=12, eval_every=2, patience=2)
    assert (summary.stopped_by, summary.step) == ("patience", 8)
    assert summary.metrics["stopped_by"] == "patience"
    assert summary.metrics["validation"]["since"] == 2 and summary.best is None  # not kept


def test_a_failed_check_leaves_the_previous_run_in_place(tmp_path, tiny_lm_run):
    tiny_lm_run(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(ValueError, match="validation split"):
        tiny_lm_run(tmp_path, seq_len=10**7)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert load_trained(tmp_path)[2].step == 6


def test_resuming_another_tasks_checkpoint_is_refused_before_training(tmp_path, tiny_lm_run):
    tiny_lm_run(tmp_path)
    checkpoint = load_checkpoint(tmp_path)
    with pytest.raises(ValueError, match="'lm' run"):
        resume_configs(checkpoint, {}, task_name="translate")
    task = TranslateTask()
    with pytest.raises(ValueError, match="'lm' run"):
        train_run(
            "translate",
            task.default_model_config(),
            TrainConfig(),
            tmp_path,
            resume=checkpoint,
        )
    assert load_checkpoint(tmp_path).step == 6


def test_a_checkpoint_recording_the_retired_schedule_d_model_resumes_like_one_without(
    tmp_path, tiny_lm_run
):
    # Checkpoints written before the schedule (then LRSchedule) dropped its unused d_model
    # field store it.
    tiny_lm_run(tmp_path / "new")
    shutil.copytree(tmp_path / "new", tmp_path / "old")
    for name in ("new", "old"):
        checkpoint = load_checkpoint(tmp_path / name)
        if name == "old":
            state = checkpoint.state | {"schedule": checkpoint.state["schedule"] | {"d_model": 32}}
            checkpoint = replace(checkpoint, state=state)
        model_cfg, train_cfg, task_cfg = resume_configs(
            checkpoint, {"max_steps": 8}, task_name="lm"
        )
        train_run(
            "lm", model_cfg, train_cfg, tmp_path / name, task_cfg=task_cfg, resume=checkpoint
        )
    new, old = (read_metrics(tmp_path / name / "metrics.jsonl") for name in ("new", "old"))
    assert old[-1]["step"] == 8
    assert [(r["step"], r["loss"], r["lr"]) for r in old] == [
        (r["step"], r["loss"], r["lr"]) for r in new
    ]


def test_a_checkpoint_holding_former_train_fields_resumes_like_one_without(tmp_path):
    # Checkpoints written while TrainConfig held every task's settings store seq_len in a
    # translate run's train_config, which that task never read.
    task = TranslateTask()
    model_cfg = replace(task.default_model_config(), d_model=16, n_heads=2, d_ff=32,
                        n_encoder_layers=1, n_decoder_layers=1)
    train_cfg = TrainConfig(max_steps=3, batch_size=4, warmup=1, schedule="constant",
                            log_every=1, checkpoint_every=0)
    train_run("translate", model_cfg, train_cfg, tmp_path / "new",
              task_cfg=TranslateTaskConfig(eval_size=4))
    shutil.copytree(tmp_path / "new", tmp_path / "old")
    for name in ("new", "old"):
        checkpoint = load_checkpoint(tmp_path / name)
        if name == "old":
            saved = checkpoint.state["train_config"] | {"seq_len": 128}
            checkpoint = replace(checkpoint, state=checkpoint.state | {"train_config": saved})
        model_cfg, train_cfg, task_cfg = resume_configs(
            checkpoint, {"max_steps": 5}, task_name="translate"
        )
        assert task_cfg == TranslateTaskConfig(eval_size=4)
        train_run("translate", model_cfg, train_cfg, tmp_path / name, resume=checkpoint)
    new, old = (read_metrics(tmp_path / name / "metrics.jsonl") for name in ("new", "old"))
    assert old[-1]["step"] == 5
    assert [(r["step"], r["loss"]) for r in old] == [(r["step"], r["loss"]) for r in new]
    assert "seq_len" not in load_checkpoint(tmp_path / "old").state["train_config"]
