"""The DiT recipe's two main choices, ``prediction`` and ``min_snr_gamma``, as task settings:
``addnorm train dit --prediction/--min-snr-gamma`` and a ``--config`` file's ``"train"``
object set them, a checkpoint records them, a resume keeps them (a run saved before they were
settings keeps what its task saved), and a value the diffusion refuses is refused as a flag.

Provenance: the task a run trains is read back from its checkpoint (``task_of_checkpoint``:
its saved data), and the loss a setting gives is the diffusion's own with that setting.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

from addnorm.cli.parser import main
from addnorm.diffusion import Diffusion
from addnorm.tasks.dit import DiTTask, DiTTaskConfig
from addnorm.tasks.plan import plan_fresh_run, plan_resumed_run
from addnorm.tasks.trained import task_of_checkpoint
from addnorm.training.checkpoint import load_checkpoint, save_checkpoint

TINY_DIT = ["--preset", "DiT-digits-tiny", "--batch-size", "8", "--eval-size", "10",
            "--quiet", "--threads", "1", "--device", "cpu"]


@pytest.fixture
def no_evaluation(monkeypatch):
    """Skip the samples scored at the end (seconds of sampling; not what is tested)."""
    monkeypatch.setattr(DiTTask, "evaluate_run", lambda self, model, cfg: {"class_agreement": 0})
    monkeypatch.setattr(DiTTask, "run_samples", lambda self, model: [])


@pytest.mark.parametrize(("prediction", "gamma"), [("epsilon", None), ("v", 2.0)])
def test_the_flags_choose_the_diffusion_a_run_trains_and_records(
    prediction, gamma, tmp_path, no_evaluation
):
    out = tmp_path / "dit"
    flags = ["--prediction", prediction, "--min-snr-gamma", "none" if gamma is None else "2"]
    assert main(["train", "dit", *TINY_DIT, *flags, "--max-steps", "1", "--out", str(out)]) == 0
    checkpoint = load_checkpoint(out)
    task, _ = task_of_checkpoint(checkpoint)
    assert (task.prediction, task.min_snr_gamma) == (prediction, gamma)
    saved = checkpoint.state["train_config"]
    assert (saved["prediction"], saved["min_snr_gamma"]) == (prediction, gamma)


def test_a_config_file_sets_them_as_train_keys(tmp_path):
    config = tmp_path / "dit.json"
    config.write_text(json.dumps({"train": {"prediction": "epsilon", "min_snr_gamma": 3.0}}))
    plan = plan_fresh_run("dit", train_values=json.loads(config.read_text())["train"],
                          source=str(config))
    assert plan.task_cfg == DiTTaskConfig(prediction="epsilon", min_snr_gamma=3.0)
    task = plan.task_cls.from_config(plan.task_cfg)
    # The task's loss is the diffusion's with these settings (same draws, same tensors).
    reference = Diffusion(1000, "linear", prediction="epsilon", min_snr_gamma=3.0)
    gen = torch.Generator().manual_seed(0)
    x0, noise = torch.randn(4, 1, 8, 8, generator=gen), torch.randn(4, 1, 8, 8, generator=gen)
    t, out = torch.tensor([0, 10, 500, 999]), torch.randn(4, 1, 8, 8, generator=gen)
    assert torch.equal(task.diffusion.loss(out, x0, t, noise), reference.loss(out, x0, t, noise))


@pytest.mark.parametrize(("flags", "match"), [
    (["--min-snr-gamma", "1e-300"], r"--min-snr-gamma \(1e-300\) weights the loss at step 0"),
    (["--min-snr-gamma", "-1"], r"--min-snr-gamma must be > 0.0, got -1.0"),
    (["--prediction", "x0"], r"--prediction: invalid choice: 'x0'"),
])
def test_values_the_diffusion_refuses_exit_2_naming_the_flag(flags, match, tmp_path, capsys):
    code = main(["train", "dit", *TINY_DIT, *flags, "--out", str(tmp_path / "dit")])
    assert code == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and re.search(match, err[0]), err
    assert not (tmp_path / "dit").exists()


def test_a_resume_keeps_them_and_refuses_a_change(tmp_path, no_evaluation):
    out = tmp_path / "dit"
    flags = ["--prediction", "epsilon", "--min-snr-gamma", "none", "--max-steps", "1"]
    assert main(["train", "dit", *TINY_DIT, *flags, "--out", str(out)]) == 0
    plan = plan_resumed_run("dit", out, train_overrides={"prediction": "epsilon"})
    assert (plan.task_cfg.prediction, plan.task_cfg.min_snr_gamma) == ("epsilon", None)
    with pytest.raises(ValueError, match=r"prediction cannot change when resuming \(the "
                                         r"checkpoint has 'epsilon', got 'v'\)"):
        plan_resumed_run("dit", out, train_overrides={"prediction": "v"})


def test_a_run_saved_before_they_were_settings_resumes_with_what_its_task_saved(
    tmp_path, no_evaluation
):
    """Its train_config lacks them; its task data (DiT's epsilon and unweighted loss, from
    before these existed at all) decides, so a resumed run records what it trains."""
    out = tmp_path / "dit"
    assert main(["train", "dit", *TINY_DIT, "--max-steps", "1", "--out", str(out)]) == 0
    checkpoint = load_checkpoint(out)
    state = json.loads(json.dumps(checkpoint.state))
    for key in ("prediction", "min_snr_gamma"):
        del state["train_config"][key]
        del state["run"]["task_data"][key]
    old = tmp_path / "old"
    save_checkpoint(old, checkpoint.step, checkpoint.tensors, state)
    plan = plan_resumed_run("dit", old)
    assert (plan.task_cfg.prediction, plan.task_cfg.min_snr_gamma) == ("epsilon", None)
