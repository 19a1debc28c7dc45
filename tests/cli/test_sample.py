"""``addnorm train dit`` and ``addnorm sample`` end to end with a tiny DiT, in-process.

Provenance: the CLI's array equals the task's own ``sample`` on the same checkpoint, seed and
settings; the PNG's size follows from the grid layout (10 tiles of 0.9 inch per row at 100
dpi); the run's metrics.json holds the figures the task's judge computes.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from addnorm.cli.parser import main
from addnorm.data.digits import to_pixel_scale
from addnorm.diffusion import guided_eps_fn
from addnorm.tasks.dit_evaluation import SampleSettings
from addnorm.tasks.trained import load_trained

TINY_DIT = [
    "--preset", "DiT-digits-tiny", "--batch-size", "8", "--eval-size", "20",
    "--log-every", "1", "--quiet",
]


@pytest.fixture(scope="module")
def dit_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "dit"
    assert main(["train", "dit", *TINY_DIT, "--max-steps", "3", "--out", str(out)]) == 0
    return out


def test_a_dit_run_scores_its_samples_into_metrics_json(dit_run):
    metrics = json.loads((dit_run / "metrics.json").read_text())
    assert metrics["task"] == "dit" and metrics["step"] == 3
    for key in ("class_agreement", "frechet_distance", "nearest_train_distance"):
        assert np.isfinite(metrics[key]), key
    assert metrics["judge_test_accuracy"] >= 0.95  # a fixed judge: measured 0.989
    assert [s["class"] for s in metrics["samples"]] == list(range(10))
    assert (dit_run / "loss.png").exists()


def test_sample_writes_the_grid_and_the_array_the_task_draws(dit_run, tmp_path, capsys):
    grid, array = tmp_path / "grid.png", tmp_path / "s.npy"
    args = ["sample", "--checkpoint", str(dit_run), "--class", "3", "--n", "12", "--steps",
            "5", "--guidance", "1.5", "--seed", "4", "--out", str(grid), "--save-array",
            str(array), "--quiet", "--device", "cpu"]  # auto would take a GPU's generator
    assert main(args) == 0
    saved = np.load(array)
    assert saved.shape == (12, 8, 8) and saved.min() >= 0 and saved.max() <= 16
    task, model, _ = load_trained(dit_run)
    expected = task.sample(model, torch.full((12,), 3), SampleSettings(5, "ddim", 1.5),
                           generator=torch.Generator().manual_seed(4))
    # The same sampler, seed, batch and device in this process: the same ops, so bitwise.
    np.testing.assert_allclose(saved, expected.numpy(), rtol=0, atol=0)
    from matplotlib.image import imread

    height, width = imread(grid).shape[:2]
    assert width == round((0.9 * 10 + 0.4) * 100)  # 10 tiles per row
    assert height == round((1.0 * 2 + 0.6) * 100)  # 12 samples: 2 rows
    assert str(grid) in capsys.readouterr().out


def test_sample_with_dpm_solver_is_the_task_recipe_with_that_sampler(dit_run, tmp_path):
    # The task's recipe restated (DiTTask.sample for the digits): the starting noise from the
    # seed, guidance towards the class, the sampler, the digits' pixel scale; only the sampler
    # is DPM-Solver++. --method, the flag's former name, still names it.
    array = tmp_path / "s.npy"
    assert main(["sample", "--checkpoint", str(dit_run), "--class", "7", "--n", "4",
                 "--steps", "6", "--guidance", "2", "--seed", "1", "--method", "dpm-solver++",
                 "--out", str(tmp_path / "g.png"), "--save-array", str(array), "--quiet",
                 "--device", "cpu"]) == 0
    task, model, _ = load_trained(dit_run)
    model.eval()
    generator = torch.Generator().manual_seed(1)
    cfg = model.cfg
    noise = torch.randn((4, cfg.in_channels, cfg.input_size, cfg.input_size), generator=generator)
    eps_fn = guided_eps_fn(model, torch.full((4,), 7), guidance_scale=2.0,
                           null_class=cfg.n_classes)
    x = task.diffusion.sample(eps_fn, noise, steps=6, method="dpm-solver++")
    expected = to_pixel_scale(x[:, 0].float())
    np.testing.assert_allclose(np.load(array), expected.numpy(), rtol=0, atol=0)  # same ops
    ddim = task.sample(model, torch.full((4,), 7), SampleSettings(6, "ddim", 2.0),
                       generator=torch.Generator().manual_seed(1))
    assert not np.allclose(np.load(array), ddim.numpy())  # another sampler indeed


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--class", "10"],
         "--class must be one of the run's 10 classes (0, 1, 2, 3, 4, 5, 6, 7, 8, 9), got '10'"),
        (["--class", "-1"],  # a class is a name of the run's: checked once the run is read
         "--class must be one of the run's 10 classes (0, 1, 2, 3, 4, 5, 6, 7, 8, 9), got '-1'"),
        (["--n", "0"], "--n must be from 1 to 10000, got 0"),
        (["--steps", "0"], "--steps must be >= 1"),
        (["--steps", "2000"], "--steps must be <= the diffusion's 1000 steps, got 2000"),
        (["--guidance", "-1"], "--guidance must be >= 0.0"),
        (["--method", "euler"], "invalid choice: 'euler'"),
        (["--sampler", "euler"], "invalid choice: 'euler'"),
    ],
)
def test_bad_sample_arguments_exit_2_with_one_line(dit_run, tmp_path, capsys, flags, message):
    code = main(["sample", "--checkpoint", str(dit_run), "--out", str(tmp_path / "g.png"),
                 *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and message in err[-1]


def test_sample_refuses_a_checkpoint_of_another_task(tmp_path, capsys):
    out = tmp_path / "lm"
    tiny_lm = ["--preset", "lm-tiny", "--d-model", "16", "--n-heads", "2", "--d-ff", "32",
               "--n-layers", "1", "--batch-size", "2", "--seq-len", "8", "--eval-size", "1",
               "--quiet"]
    assert main(["train", "lm", *tiny_lm, "--max-steps", "1", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["sample", "--checkpoint", str(out), "--out", str(tmp_path / "g.png")]) == 2
    assert "holds a 'lm' model; this command needs a 'dit' one" in capsys.readouterr().err
