"""``addnorm sample``'s accepted range: every value in it works, every value outside exits 2.

Accepted: ``--steps`` 1 .. the run's diffusion steps with either method, ``--guidance``
finite and >= 0. Provenance: the CLI's array equals the task's own ``sample`` at the same
checkpoint, seed and settings (as tests/cli/test_sample.py); refusals that need no checkpoint
come before it is read (a missing checkpoint would exit 1, not 2); a guidance scale whose
samples overflow exits 1 with one line and writes nothing, while the same model at DiT's
scale samples finite digits.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from cli.test_sample import dit_run  # noqa: F401  (the module's tiny trained DiT run)

import addnorm.tasks.trained as trained_module
from addnorm.cli.parser import main
from addnorm.tasks.dit_evaluation import SampleSettings


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny DiT forwards run many times slower when threads oversubscribe the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def sample(checkpoint, out_dir, *flags):
    grid, array = out_dir / "g.png", out_dir / "s.npy"
    code = main(["sample", "--checkpoint", str(checkpoint), "--out", str(grid), "--save-array",
                 str(array), "--quiet", *flags])
    return code, grid, array


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--steps", "0"], "--steps must be >= 1, got 0"),
        (["--steps", "-5"], "--steps must be >= 1, got -5"),
        (["--guidance", "nan"], "--guidance must be finite, got nan"),
        (["--guidance", "inf"], "--guidance must be finite, got inf"),
        (["--guidance=-inf"], "--guidance must be finite, got -inf"),  # "-inf" alone: a flag
        (["--guidance", "-0.5"], "--guidance must be >= 0.0, got -0.5"),
        (["--n", "10001"], "--n must be from 1 to 10000, got 10001"),
    ],
)
def test_out_of_range_values_exit_2_with_one_line_before_the_checkpoint_is_read(
    tmp_path, capsys, flags, message
):
    code, grid, array = sample(tmp_path / "no-such-run", tmp_path, *flags)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [f"addnorm sample: error: {message}"]
    assert not grid.exists() and not array.exists()


@pytest.mark.parametrize("flags", [["--steps", "1.5"], ["--steps", "1e3"], ["--guidance", "x"]])
def test_values_that_are_not_numbers_exit_2_from_argparse(tmp_path, capsys, flags):
    code, _, _ = sample(tmp_path / "no-such-run", tmp_path, *flags)
    err = capsys.readouterr().err.strip().splitlines()
    kind = "int" if flags[0] == "--steps" else "float"
    assert code == 2 and len(err) == 1 and f"invalid {kind} value: {flags[1]!r}" in err[0]


@pytest.mark.parametrize("steps", [1001, 2**70])
def test_more_steps_than_the_run_diffuses_exit_2_with_one_line(dit_run, tmp_path, capsys, steps):  # noqa: F811
    code, grid, _ = sample(dit_run, tmp_path, "--steps", str(steps))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err == [f"addnorm sample: error: --steps must be <= the diffusion's 1000 steps, got "
                   f"{steps}"]
    assert not grid.exists()


@pytest.mark.parametrize(
    ("method", "steps", "guidance"),
    [("ddim", 1, 3.0), ("ddim", 37, 0.0), ("ddpm", 1, 3.0), ("ddpm", 41, 1e6)],
)
def test_counts_that_crashed_sample_what_the_task_samples(
    dit_run, tmp_path, method, steps, guidance  # noqa: F811
):
    # DDIM's default spacing (DiT's strided) has no stride for 1 or 37 of 1000 steps; 1e6 is
    # finite for this barely trained run, whose conditional and null outputs nearly agree.
    code, _, array = sample(dit_run, tmp_path, "--n", "2", "--steps", str(steps), "--method",
                            method, "--guidance", repr(guidance), "--seed", "3")
    assert code == 0
    task, model, _ = trained_module.load_trained(dit_run)
    expected = task.sample(model, torch.arange(2), SampleSettings(steps, method, guidance),
                           generator=torch.Generator().manual_seed(3))
    saved = np.load(array)
    assert np.isfinite(saved).all() and saved.min() >= 0 and saved.max() <= 16
    # The same float32 computation in the same process: equal up to the save's float32 cast.
    np.testing.assert_array_equal(saved, expected.numpy())


def with_unit_scale_weights(monkeypatch):
    """The CLI loads a run whose every weight matrix is redrawn: unit-scale outputs whose
    conditional and null halves differ, which a huge guidance scale amplifies to overflow."""
    real = trained_module.load_trained

    def load_trained(*args, **kwargs):
        task, model, checkpoint = real(*args, **kwargs)
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in model.parameters():
                if p.ndim >= 2:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.5 / math.sqrt(p.shape[-1]))
        return task, model, checkpoint

    monkeypatch.setattr(trained_module, "load_trained", load_trained)


def test_a_guidance_scale_whose_samples_overflow_exits_1_and_writes_nothing(
    dit_run, tmp_path, capsys, monkeypatch  # noqa: F811
):
    with_unit_scale_weights(monkeypatch)
    code, grid, array = sample(dit_run, tmp_path, "--n", "2", "--steps", "5", "--guidance", "1e30")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1
    assert err[0] == (
        "addnorm sample: error: --guidance 1e+30 (--sampler ddim, --steps 5) gave non-finite "
        "samples, nothing written: the model's guided predictions overflowed or were not "
        "finite; use a smaller --guidance (DiT uses 1.5 to 4)"
    )
    assert not grid.exists() and not array.exists()
    # The same weights at DiT's own scale: finite digits (so the scale, not the model, failed).
    code, _, array = sample(dit_run, tmp_path, "--n", "2", "--steps", "5", "--guidance", "4")
    assert code == 0 and np.isfinite(np.load(array)).all()
