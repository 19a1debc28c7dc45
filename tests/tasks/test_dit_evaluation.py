"""How the ``dit`` task draws and scores samples (addnorm.tasks.dit_evaluation): a run probes
its quality into quality.png, the validation draws other noise than the final evaluation, the
sample settings run every sampler of the diffusion (provenance: the diffusion's own sampler on
the same noise and guided predictions), and the figures say when class agreement is not
judged."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from addnorm.dit import DIT_PRESETS
from addnorm.tasks.dit import DiTTask, DiTTaskConfig
from addnorm.tasks.dit_evaluation import SampleSettings
from addnorm.tasks.run import train_run


def test_a_run_probes_its_quality_into_quality_png(tmp_path, monkeypatch):
    import addnorm.tasks.dit_evaluation as dit_evaluation
    from addnorm.training.metrics import read_metrics

    monkeypatch.setattr(dit_evaluation, "PROBE_EVERY", 5)
    monkeypatch.setattr(dit_evaluation, "PROBE_PER_CLASS", 1)
    train_cfg = dataclasses.replace(
        DiTTask.default_train_config(), max_steps=10, max_minutes=None, batch_size=8,
        warmup=2, log_every=5, checkpoint_every=0,
    )
    summary = train_run(
        "dit", DIT_PRESETS["DiT-digits-tiny"], train_cfg, tmp_path,
        task_cfg=DiTTaskConfig(eval_size=20),
    )
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records if "probe_class_agreement" in r] == [5]  # 10: the end
    assert summary.metrics["quality_figure"] == "quality.png"
    assert (tmp_path / "quality.png").read_bytes()[:4] == b"\x89PNG"


def test_the_validation_draws_other_noise_than_the_final_evaluation(monkeypatch):
    import addnorm.tasks.dit_evaluation as dit_evaluation

    monkeypatch.setattr(dit_evaluation, "PROBE_PER_CLASS", 1)
    monkeypatch.setattr(dit_evaluation, "PROBE_MIN_SAMPLES", 10)
    task = DiTTask()
    seeds = []
    real = task.evaluate
    monkeypatch.setattr(task, "evaluate", lambda model, *, per_class, seed=0: (
        seeds.append((per_class, seed)) or real(model, per_class=per_class, seed=seed)))
    torch.manual_seed(0)
    model = task.build_model(task.prepare(DIT_PRESETS["DiT-digits-tiny"]))
    validation = task.validation(DiTTaskConfig())
    scores = validation.score(model)
    assert seeds == [(1, 1)]  # the probe's size, seed 1 (the final evaluation: seed 0)
    assert scores == {f"val_{k}": v for k, v in real(model, per_class=1, seed=1).items()}
    assert (validation.metric, validation.higher_is_better) == ("val_class_agreement", True)
    # the agreement saturates at 1.0: equal ones are ranked by the spread the judge measures
    assert validation.tie_break == "val_frechet_distance" and validation.tie_break in scores
    assert not validation.keep_by_default


@pytest.mark.parametrize("method", ["ddim", "ddpm", "dpm-solver++"])
def test_sample_settings_take_every_sampler_of_the_diffusion(method):
    """Provenance: the task's samples for ``method`` are the diffusion's own sampler run on the
    same noise and guided predictions (the same generator, drawn in the same order)."""
    from addnorm.data.digits import to_pixel_scale
    from addnorm.diffusion import guided_eps_fn

    torch.manual_seed(0)
    task = DiTTask()
    model = task.build_model(task.prepare(DIT_PRESETS["DiT-digits-tiny"])).eval()
    with torch.no_grad():  # a fresh DiT outputs zero: perturb it so the samplers differ
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    labels = torch.tensor([3, 7])
    pixels = task.sample(model, labels, SampleSettings(4, method, 2.0),
                         generator=torch.Generator().manual_seed(5))
    generator = torch.Generator().manual_seed(5)
    noise = torch.randn((2, 1, 8, 8), generator=generator)
    eps_fn = guided_eps_fn(model, labels, guidance_scale=2.0, null_class=10)
    x = task.diffusion.sample(eps_fn, noise, steps=4, method=method, generator=generator)
    torch.testing.assert_close(pixels, to_pixel_scale(x[:, 0]), rtol=0, atol=0)


def test_sample_settings_refuse_an_unknown_sampler():

    with pytest.raises(ValueError, match="method"):
        SampleSettings(method="euler")


def test_the_figures_say_when_class_agreement_is_not_judged():
    figures = {"frechet_distance": 9.0, "frechet_distance_real": 3.0, "precision": 0.5,
               "recall": 0.4, "precision_real": 0.9, "recall_real": 0.8,
               "nearest_train_distance": 2.0, "nearest_train_distance_real": 2.1,
               "judge_test_accuracy": 0.51}
    weak = DiTTask.figures_text({**figures, "judge_trusted": 0.0})
    assert "judge_test_accuracy: 0.5100" in weak
    assert "class_agreement: not judged (a judge must score 0.8 or more" in weak
    assert "not judged" not in DiTTask.figures_text({**figures, "judge_trusted": 1.0})
