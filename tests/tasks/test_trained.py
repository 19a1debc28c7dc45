"""A finished run read back (``addnorm.tasks.trained``): loaded with the weights it kept (its
EMA or its trained ones, as ``weights`` asks), a language model within the windows it trained on.

Provenance: the checkpoint's own tensors (the loaded weights equal them) and the task's own
``evaluate_run`` and ``samples`` on the weights loaded back (the run's figures and samples are
that evaluation).
"""

from __future__ import annotations

import json

import torch

import addnorm
from addnorm.tasks.lm import SAMPLE_PROMPTS, LMTaskConfig
from addnorm.tasks.trained import load_trained


def test_with_an_ema_the_run_is_scored_and_loaded_with_the_ema_weights(tmp_path, tiny_lm_run):
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


def test_without_an_ema_the_run_is_scored_with_its_trained_weights(tmp_path, tiny_lm_run):
    summary = tiny_lm_run(tmp_path)
    assert summary.metrics["weights"] == "raw"
    task, model, checkpoint = load_trained(tmp_path)
    assert "ema" not in checkpoint.tensors
    assert (
        task.evaluate_run(model, LMTaskConfig(seq_len=16, eval_size=4))["val_bpc"]
        == (summary.metrics["val_bpc"])
    )


def test_an_lm_run_stores_samples_that_continue_their_prompts(tmp_path, tiny_lm_run):
    summary = tiny_lm_run(tmp_path)
    samples = json.loads((tmp_path / "metrics.json").read_text())["samples"]
    assert samples == summary.metrics["samples"]
    assert [s["prompt"] for s in samples] == list(SAMPLE_PROMPTS)
    task, model, _ = load_trained(tmp_path)
    # the run's samples and the loaded model's: within the run's windows of 16 characters
    assert model.context == 16 and addnorm.load(tmp_path).context == 16
    assert [(s["prompt"], s["text"]) for s in samples] == task.samples(model)
