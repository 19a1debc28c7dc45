"""The ``dit`` task: its loss is the MSE to the prediction target at q_sample (restated
here, for v and for eps), a tiny run lowers the loss, resuming is exact, runs saved before
``prediction`` existed load as eps, the data recipe picks a user's images' patch size and
weighting, and (slow) the default run's samples are labelled as their requested class at least
95% of the time. Sampling and scoring: tests/tasks/test_dit_evaluation.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from tolerances import FLOAT32_MODEL

from addnorm.data.batches import DigitBatches
from addnorm.dit import DIT_PRESETS
from addnorm.tasks.dit import DiTTask, DiTTaskConfig
from addnorm.tasks.run import train_run
from addnorm.training.config import TrainConfig


@pytest.mark.parametrize("gamma", [5.0, None, 0.5])
@pytest.mark.parametrize("prediction", ["v", "epsilon"])
def test_the_loss_is_the_weighted_mse_to_the_target_at_q_sample(prediction, gamma):
    """Restated: x_t = sqrt(abar) x0 + sqrt(1 - abar) eps; loss = mean over the batch of
    w(t) * mean (model(x_t) - target)^2 with target eps, or v = sqrt(abar) eps - sqrt(1 - abar)
    x0 (Salimans & Ho, 2022), and the Min-SNR weight w = min(SNR, gamma) / SNR (eps) or
    / (SNR + 1) (v), SNR = abar / (1 - abar) (Hang et al., 2023); w = 1 without gamma."""
    torch.manual_seed(0)
    task = DiTTask(prediction=prediction, min_snr_gamma=gamma)
    model = task.build_model(task.prepare(DIT_PRESETS["DiT-digits-tiny"]))
    with torch.no_grad():  # a fresh DiT outputs zero: perturb it so the loss is not trivial
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.eval()  # no label dropout, so both calls see the same classes
    batch = DigitBatches(batch_size=6, n_steps=1000, seed=1).next_batch()
    abar = task.diffusion.noise_schedule.alphas_cumprod[batch["t"]].float()[:, None, None, None]
    x_t = abar.sqrt() * batch["images"] + (1 - abar).sqrt() * batch["noise"]
    target = batch["noise"]
    if prediction == "v":
        target = abar.sqrt() * batch["noise"] - (1 - abar).sqrt() * batch["images"]
    snr = abar.flatten() / (1 - abar.flatten())
    weight = torch.ones_like(snr) if gamma is None else snr.clamp(max=gamma) / (
        snr if prediction == "epsilon" else snr + 1)
    per_sample = (model(x_t, batch["t"], batch["labels"]) - target).square().mean(dim=(1, 2, 3))
    expected = (weight * per_sample).mean()
    loss, n = task.loss_fn(DiTTaskConfig())(model, batch)
    # float32; the task may round x_t's coefficients otherwise (a few u apart), and two float32
    # evaluations of one small model then differ within FLOAT32_MODEL.
    torch.testing.assert_close(loss, expected, **FLOAT32_MODEL)
    assert n == 6


def test_a_tiny_run_lowers_the_loss_and_resumes_exactly(tmp_path):
    task = DiTTask()
    cfg = DIT_PRESETS["DiT-digits-tiny"]
    train_cfg = dataclasses.replace(
        task.default_train_config(), max_steps=40, max_minutes=None, batch_size=16,
        warmup=5, log_every=5, checkpoint_every=20, ema_decay=0.0,
        schedule="constant",  # a resumed run keeps its saved schedule; this one has no end
    )
    task_cfg = DiTTaskConfig(eval_size=10)
    whole = train_run("dit", cfg, train_cfg, tmp_path / "whole", task_cfg=task_cfg)
    from addnorm.training.metrics import read_metrics

    losses = [r["loss"] for r in read_metrics(tmp_path / "whole" / "metrics.jsonl")]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3  # measured 0.29 < 0.81
    half = dataclasses.replace(train_cfg, max_steps=20)
    train_run("dit", cfg, half, tmp_path / "resumed", task_cfg=task_cfg)
    from addnorm.training.checkpoint import load_checkpoint

    resumed = train_run(
        "dit", cfg, train_cfg, tmp_path / "resumed",
        resume=load_checkpoint(tmp_path / "resumed"),
    )
    assert resumed.metrics["train_loss"] == whole.metrics["train_loss"]  # bit for bit


def test_a_run_saved_before_the_prediction_settings_loads_as_dits_unweighted_epsilon():
    # DiT's own target, which every run before the setting was trained on.
    old = DiTTask.from_dict({"n_steps": 1000, "schedule": "linear"})
    assert old.prediction == "epsilon" and old.diffusion.min_snr_gamma is None
    assert DiTTask().to_dict() == {"n_steps": 1000, "schedule": "linear", "prediction": "v",
                                   "min_snr_gamma": 5.0}
    new = DiTTask.from_dict(DiTTask().to_dict()).diffusion
    assert (new.prediction, new.min_snr_gamma) == ("v", 5.0)


def test_the_task_refuses_a_model_without_a_trained_null_class():
    task = DiTTask()
    cfg = dataclasses.replace(task.prepare(DIT_PRESETS["DiT-digits"]), class_dropout=0.0)
    with pytest.raises(ValueError, match=r"class_dropout \(0.0\) must be > 0"):
        task.check(cfg, TrainConfig(), DiTTaskConfig())


@pytest.mark.slow
def test_the_default_dit_run_reaches_95_percent_class_agreement(tmp_path):
    # What the default run promises (task defaults, 2 CPU cores, within its 5-minute cap).
    task = DiTTask()
    summary = train_run(
        "dit", task.default_model_config(), task.default_train_config(), tmp_path
    )
    assert summary.metrics["class_agreement"] >= 0.95


@pytest.mark.parametrize(("side", "image_size", "patch"), [
    (8, None, 2), (16, None, 4), (12, None, 4), (32, None, 8), (64, None, 8),
    (32, 24, 8), (32, 10, 2),
])
def test_the_data_recipe_patch_is_the_smallest_that_keeps_four_patches_a_side(
        tmp_path, side, image_size, patch):
    """Restated: of the patch sizes 2, 4 and 8, the smallest at which the side the images
    train at (``image_size``, else theirs, capped at 8 patches of that patch size and rounded
    down to a multiple of it) is at most 4 patches a side; none: the largest that divides it.
    8x8: 2 (4 a side); 16x16 and 12x12: 4; 32x32: 8 (4 a side); 64x64 capped at 8 patches of
    8: 64, 8 a side, none fits: 8; image_size 24: 8 (3 a side); 10: only 2 divides it."""
    from image_folders import write_folder

    from addnorm.tasks.plan import plan_fresh_run

    write_folder(tmp_path / "pics", {"a": 2, "b": 2}, size=side, mode="L")
    values = {"data": str(tmp_path / "pics"), "image_size": image_size, "max_minutes": None,
              "batch_size": 2}
    plan = plan_fresh_run("dit", train_values=values)
    assert plan.model_cfg.patch_size == patch
    given = plan_fresh_run("dit", train_values=values, model_values={"patch_size": 1})
    assert given.model_cfg.patch_size == 1  # asked for: kept
    preset = plan_fresh_run("dit", preset="DiT-digits-tiny", train_values=values)
    assert preset.model_cfg.patch_size == DIT_PRESETS["DiT-digits-tiny"].patch_size
    assert plan_fresh_run("dit").model_cfg.patch_size == 2  # the digits: as before


def test_the_data_recipe_weighs_every_step_alike_unless_asked(tmp_path):
    """Restated: on a user's images min_snr_gamma is none (v-prediction alone, the faster
    learner in docs/dit-min-snr.json) unless given; the digits keep Min-SNR-5."""
    from image_folders import write_folder

    from addnorm.tasks.plan import plan_fresh_run

    write_folder(tmp_path / "pics", {"a": 2, "b": 2}, size=8, mode="L")
    values = {"data": str(tmp_path / "pics"), "max_minutes": None, "batch_size": 2}
    plan = plan_fresh_run("dit", train_values=values)
    assert plan.task_cfg.min_snr_gamma is None and plan.task.min_snr_gamma is None
    asked = plan_fresh_run("dit", train_values={**values, "min_snr_gamma": 5.0})
    assert asked.task_cfg.min_snr_gamma == 5.0 and asked.task.min_snr_gamma == 5.0
    digits = plan_fresh_run("dit")
    assert digits.task_cfg.min_snr_gamma == 5.0 == digits.task.min_snr_gamma


def test_flips_are_a_setting_off_by_default(tmp_path):
    """``DiTTaskConfig.flip`` adds addnorm.data.flips' coins to the batches; off, the batches
    have none (and are the same draws as before the setting existed)."""
    task = DiTTask()
    cfg = task.prepare(DIT_PRESETS["DiT-digits-tiny"])
    train_cfg = dataclasses.replace(DiTTask.default_train_config(), batch_size=8)
    assert DiTTaskConfig().flip is False
    plain = task.batches(cfg, train_cfg, DiTTaskConfig()).next_batch()
    flipped = task.batches(cfg, train_cfg, DiTTaskConfig(flip=True)).next_batch()
    assert "flipped" not in plain and flipped["flipped"].dtype == torch.bool
    coins = flipped["flipped"]
    assert torch.equal(flipped["images"][coins], plain["images"][coins].flip(-1))
    assert torch.equal(flipped["images"][~coins], plain["images"][~coins])
