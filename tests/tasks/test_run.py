"""A task's run (``addnorm.tasks.run``): scored and loaded with the weights it kept (its EMA
or its trained ones), storing its samples or held-out predictions, leaving the previous run in
place after a failed check, refusing another task's checkpoint, and resuming checkpoints that
record retired settings.

Provenance: the task's own ``evaluate_run`` on the weights loaded back (the run's figures are
that evaluation), and the uninterrupted run's configs for a resumed one.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest
import torch

import addnorm
from addnorm.data.dates import dates_in_split
from addnorm.tasks.lm import SAMPLE_PROMPTS, LMTask, LMTaskConfig
from addnorm.tasks.run import load_trained, resume_configs, train_run
from addnorm.tasks.translate import TranslateTask, TranslateTaskConfig
from addnorm.training.checkpoint import load_checkpoint
from addnorm.training.config import TrainConfig
from addnorm.training.metrics import read_metrics


def tiny_lm_run(tmp_path, *, seq_len=16, **train):
    task = LMTask()
    model_cfg = replace(task.default_model_config(), d_model=32, n_heads=2, n_layers=1, d_ff=64)
    settings = dict(max_steps=6, batch_size=4, lr=3e-3, warmup=2)
    settings.update(train)
    task_cfg = LMTaskConfig(seq_len=seq_len, eval_size=4)
    return train_run("lm", model_cfg, TrainConfig(**settings), tmp_path, task_cfg=task_cfg)


def test_with_an_ema_the_run_is_scored_and_loaded_with_the_ema_weights(tmp_path):
    summary = tiny_lm_run(tmp_path, ema_decay=0.5)
    assert summary.metrics["weights"] == "ema"
    task, model, checkpoint = load_trained(tmp_path)
    for name, value in model.state_dict().items():
        assert torch.equal(value, checkpoint.tensors["ema"][name])
    assert task.evaluate_run(model, LMTaskConfig(seq_len=16, eval_size=4)) == {
        k: summary.metrics[k] for k in ("val_bpc", "val_chars")
    }
    _, raw, _ = load_trained(tmp_path, weights="raw")
    for name, value in raw.state_dict().items():
        assert torch.equal(value, checkpoint.tensors["model"][name])
    assert any(
        not torch.equal(checkpoint.tensors["ema"][n], checkpoint.tensors["model"][n])
        for n in checkpoint.tensors["model"]
    )


def test_without_an_ema_the_run_is_scored_with_its_trained_weights(tmp_path):
    summary = tiny_lm_run(tmp_path)
    assert summary.metrics["weights"] == "raw"
    task, model, checkpoint = load_trained(tmp_path)
    assert "ema" not in checkpoint.tensors
    assert (
        task.evaluate_run(model, LMTaskConfig(seq_len=16, eval_size=4))["val_bpc"]
        == (summary.metrics["val_bpc"])
    )


def test_an_lm_run_stores_samples_that_continue_their_prompts(tmp_path):
    summary = tiny_lm_run(tmp_path)
    samples = json.loads((tmp_path / "metrics.json").read_text())["samples"]
    assert samples == summary.metrics["samples"]
    assert [s["prompt"] for s in samples] == list(SAMPLE_PROMPTS)
    task, model, _ = load_trained(tmp_path)
    # the run's samples and the loaded model's: within the run's windows of 16 characters
    assert model.context == 16 and addnorm.load(tmp_path).context == 16
    assert [(s["prompt"], s["text"]) for s in samples] == task.samples(model)


def test_a_translate_run_stores_held_out_predictions(tmp_path):
    task = TranslateTask()
    model_cfg = replace(task.default_model_config(), d_model=16, n_heads=2, d_ff=32)
    train_cfg = TrainConfig(max_steps=2, batch_size=4, warmup=1)
    summary = train_run(
        "translate", model_cfg, train_cfg, tmp_path, task_cfg=TranslateTaskConfig(eval_size=4)
    )
    samples = summary.metrics["samples"]
    loaded, model, _ = load_trained(tmp_path)
    assert [s["prediction"] for s in samples] == loaded.predict(
        model, [s["input"] for s in samples]
    )
    test_dates = {d.isoformat() for d in dates_in_split("test")}
    assert samples and all(s["answer"] in test_dates for s in samples)


def test_a_run_that_keeps_its_best_is_scored_with_the_best_checkpoints_weights(tmp_path):
    summary = tiny_lm_run(tmp_path, max_steps=12, keep_best=True, eval_every=3, ema_decay=0.5,
                          checkpoint_every=4)
    seen = {r["step"]: r["val_bpc"] for r in read_metrics(tmp_path / "metrics.jsonl")
            if "val_bpc" in r}
    assert sorted(seen) == [3, 6, 9, 12]
    record = summary.metrics["validation"]
    assert record["step"] == min(seen, key=seen.__getitem__) and record["evaluated"] == 12
    assert (record["metric"], record["every"], record["patience"]) == ("val_bpc", 3, None)
    assert summary.best == tmp_path / "checkpoints" / f"best-{record['step']:08d}"
    assert summary.metrics["checkpoint"] == "best"
    assert summary.metrics["checkpoint_step"] == record["step"]
    task, model, checkpoint = load_trained(summary.best)  # (its EMA weights, as scored)
    figures = task.evaluate_run(model, LMTaskConfig(seq_len=16, eval_size=4))
    assert figures == {k: summary.metrics[k] for k in ("val_bpc", "val_chars")}
    assert summary.metrics["val_bpc"] == record["value"]  # the same windows (no test split)
    assert checkpoint.state["train_config"]["keep_best"] is True


def test_the_bundled_data_keeps_no_best_unless_told(tmp_path):
    summary = tiny_lm_run(tmp_path)
    assert summary.best is None and summary.metrics["checkpoint"] == "last"
    assert "validation" not in summary.metrics
    assert load_checkpoint(tmp_path).state["train_config"]["keep_best"] is False  # decided
    assert not list((tmp_path / "checkpoints").glob("best-*"))


def test_patience_ends_the_run_and_says_so(tmp_path, monkeypatch):
    import addnorm.tasks.lm as lm_module

    scripted = iter([3.0, 2.0, 2.5, 2.5, 2.5, 2.5])  # the best at the second evaluation
    real = lm_module.LMTask.evaluate_run
    monkeypatch.setattr(lm_module.LMTask, "evaluate_run", lambda self, model, cfg: {
        **real(self, model, cfg), "val_bpc": next(scripted)})
    summary = tiny_lm_run(tmp_path, max_steps=12, eval_every=2, patience=2)
    assert (summary.stopped_by, summary.step) == ("patience", 8)
    assert summary.metrics["stopped_by"] == "patience"
    assert summary.metrics["validation"]["since"] == 2 and summary.best is None  # not kept


def test_a_failed_check_leaves_the_previous_run_in_place(tmp_path):
    tiny_lm_run(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(ValueError, match="validation split"):
        tiny_lm_run(tmp_path, seq_len=10**7)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert load_trained(tmp_path)[2].step == 6


def test_resuming_another_tasks_checkpoint_is_refused_before_training(tmp_path):
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


def test_a_checkpoint_recording_the_retired_schedule_d_model_resumes_like_one_without(tmp_path):
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
