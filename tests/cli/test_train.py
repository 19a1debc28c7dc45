"""``addnorm train``: writes the checkpoint, metrics and loss curve; needs --resume or
--overwrite for a folder with a run; refuses to resume the other task's run before training;
prints and stores an lm run's samples; passes the schedule and a --config file's fields
through to the run.

Provenance: the run's own files (metrics, checkpoint step and configs), and the values given.
"""

from __future__ import annotations

import json
import shutil

import pytest
from cli_runs import TINY_LM, TINY_TRANSLATE

from addnorm.cli.parser import main
from addnorm.tasks.trained import load_trained
from addnorm.training.metrics import read_metrics


def test_train_writes_checkpoint_metrics_and_loss_curve(translate_run):
    metrics = json.loads((translate_run / "metrics.json").read_text())
    assert metrics["step"] == 3 and metrics["task"] == "translate"
    assert 0.0 <= metrics["test_exact_match"] <= 1.0 and metrics["n_test"] == 4
    assert [r["step"] for r in read_metrics(translate_run / "metrics.jsonl")] == [1, 2, 3]
    assert (translate_run / "loss.png").read_bytes()[:4] == b"\x89PNG"
    assert (translate_run / "checkpoints" / "step-00000003" / "manifest.json").is_file()


def test_training_into_a_previous_run_needs_resume_or_overwrite(translate_run, tmp_path, capsys):
    copy = tmp_path / "run"
    shutil.copytree(translate_run, copy)
    argv = ["train", "translate", *TINY_TRANSLATE, "--max-steps", "2", "--out", str(copy)]
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "--resume" in err[0] and "--overwrite" in err[0]
    assert load_trained(copy)[2].step == 3
    assert main([*argv, "--overwrite"]) == 0
    assert load_trained(copy)[2].step == 2


def test_resuming_the_other_tasks_run_exits_2_before_training(lm_run, tmp_path, capsys):
    copy = tmp_path / "lm"
    shutil.copytree(lm_run, copy)
    argv = ["train", "translate", "--resume", "--out", str(copy), "--max-steps", "8", "--quiet"]
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "'lm'" in err[0]
    assert [p.name for p in (copy / "checkpoints").iterdir()] == ["step-00000002"]
    assert json.loads((copy / "metrics.json").read_text()) == json.loads(
        (lm_run / "metrics.json").read_text()
    )


def test_lm_training_prints_and_stores_samples(tmp_path, capsys):
    out = tmp_path / "lm"
    assert main(["train", "lm", *TINY_LM, "--max-steps", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    samples = json.loads((out / "metrics.json").read_text())["samples"]
    assert len(samples) == 3
    for sample in samples:
        assert f"sample (prompt {sample['prompt']!r}):\n{sample['text']}" in printed


def test_the_noam_schedule_reaches_training_with_lr_as_its_peak(tmp_path):
    out = tmp_path / "noam"
    argv = ["train", "translate", *TINY_TRANSLATE, "--schedule", "noam", "--lr", "0.01"]
    assert main([*argv, "--warmup", "2", "--max-steps", "3", "--out", str(out)]) == 0
    lrs = [r["lr"] for r in read_metrics(out / "metrics.jsonl")]
    # lr * sqrt(warmup) * min(step^-0.5, step * warmup^-1.5) for steps 1, 2, 3
    expected = [0.01 * 2**0.5 * min(s**-0.5, s * 2**-1.5) for s in (1, 2, 3)]
    # Python floats through JSON (repr round-trips): a few roundings, FLOAT64_EXACT's rel.
    assert lrs == pytest.approx(expected, rel=1e-12)
    assert lrs[1] == pytest.approx(0.01, rel=1e-12)


def test_a_config_file_sets_model_and_train_fields(tmp_path):
    config = tmp_path / "cfg.json"
    config.write_text(json.dumps({"model": {"d_ff": 48}, "train": {"warmup": 1}}))
    out = tmp_path / "run"
    argv = ["train", "translate", *TINY_TRANSLATE, "--max-steps", "1", "--out", str(out)]
    assert main([*argv, "--config", str(config)]) == 0
    report = load_trained(out)[2].state
    assert report["run"]["model_config"]["d_ff"] == 64  # the flag wins over the file
    assert report["train_config"]["warmup"] == 1
