"""``addnorm sample --checkpoint PIPELINE`` end to end on a small pipeline folder written by
diffusers (random weights), in-process.

Provenance: the CLI's array is diffusers' DiTPipeline's images on the same folder, seed,
sampler, steps and guidance, as uint8 the way diffusers' ``numpy_to_pil`` rounds them
(``round(255 x)``); the images agree to FLOAT32_MODEL on [0, 1] (test_dit_pipeline.py), so
each uint8 value is diffusers' or, where 255 x sits within 1e-5 * 255 of a half, one off.
Every refusal is one line, exit 2, nothing written.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from small_pipeline import (
    autoencoder,
    diffusers_pipeline,
    one_thread,  # noqa: F401  (autouse: one thread)
    transformer,
    write_pipeline,
)

from addnorm.cli.parser import main
from addnorm.cli.sample_pipeline import PIPELINE_CHUNK

diffusers = pytest.importorskip("diffusers")
CPU = ["--device", "cpu", "--quiet"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_pipeline(tmp_path_factory.mktemp("pipe") / "dit-pipeline")


def sample(folder, out_dir, *flags):
    grid, array = out_dir / "grid.png", out_dir / "images.npy"
    code = main(["sample", "--checkpoint", str(folder), "--out", str(grid), "--save-array",
                 str(array), *CPU, *flags])
    return code, grid, array


def diffusers_uint8(folder, labels, *, scheduler, steps, guidance, seed):
    pipe = diffusers_pipeline(folder)
    pipe.scheduler = scheduler.from_config(pipe.scheduler.config)
    images = pipe(labels, guidance_scale=guidance, num_inference_steps=steps,
                  generator=torch.Generator().manual_seed(seed), output_type="np").images
    return (images * 255).round().astype("uint8")  # numpy_to_pil's rounding


@pytest.mark.parametrize(("flags", "scheduler"), [
    (["--sampler", "dpm-solver++", "--steps", "10"], "DPMSolverMultistepScheduler"),
    (["--steps", "10"], "DDIMScheduler"),  # the folder's own scheduler
])
def test_sample_writes_diffusers_images(folder, tmp_path, capsys, flags, scheduler):
    code, grid, array = sample(folder, tmp_path, "--class", "Carassius auratus", "--n", "3",
                               "--guidance", "4", "--seed", "7", *flags)
    assert code == 0
    saved = np.load(array)
    expected = diffusers_uint8(folder, [1, 1, 1], scheduler=getattr(diffusers, scheduler),
                               steps=10, guidance=4.0, seed=7)
    assert saved.shape == (3, 16, 16, 3) and saved.dtype == np.uint8
    assert np.abs(saved.astype(int) - expected.astype(int)).max() <= 1
    assert (saved == expected).mean() > 0.99  # one off only at a rounding boundary
    out = capsys.readouterr().out
    assert f"grid: {grid}" in out and "(3, 16, 16, 3) uint8" in out


def test_class_ids_and_every_class_in_turn(folder, tmp_path):
    by_id = sample(folder, tmp_path / "a", "--class", "1", "--n", "2", "--steps", "3")
    by_name = sample(folder, tmp_path / "b", "--class", "goldfish", "--n", "2", "--steps", "3")
    assert by_id[0] == by_name[0] == 0
    assert np.array_equal(np.load(by_id[2]), np.load(by_name[2]))
    code, _, array = sample(folder, tmp_path / "c", "--n", "3", "--steps", "3")
    expected = diffusers_uint8(folder, [0, 1, 2], scheduler=diffusers.DDIMScheduler, steps=3,
                               guidance=4.0, seed=0)  # defaults: seed 0, guidance 4
    assert code == 0 and np.abs(np.load(array).astype(int) - expected.astype(int)).max() <= 1


def test_more_images_than_a_chunk_are_drawn_chunk_by_chunk(folder, tmp_path):
    n = PIPELINE_CHUNK + 2
    code, _, array = sample(folder, tmp_path, "--class", "0", "--n", str(n), "--steps", "2")
    assert code == 0 and np.load(array).shape == (n, 16, 16, 3)


def refused(capsys, code, grid, array) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("addnorm sample: error: "), err
    assert not grid.exists() and not array.exists()
    return err[0]


@pytest.mark.parametrize(("flags", "message"), [
    (["--class", "goldfsh"], "--class 'goldfsh' is not one of the 9 class names (closest: "
                             "'goldfish'), nor an id 0 to 999"),
    (["--class", "1000"], "--class '1000' is not one of the model's ids 0 to 999"),
    (["--sampler", "ddpm"], "--sampler ddpm: a pipeline folder samples with ddim or "
                            "dpm-solver++"),
    (["--steps", "1001"], "--steps must be <= the diffusion's 1000 steps, got 1001"),
])
def test_bad_flags_exit_2_with_one_line_and_nothing_written(folder, tmp_path, capsys, flags,
                                                            message):
    line = refused(capsys, *sample(folder, tmp_path, *flags))
    assert message in line


def broken_copy(folder, tmp_path, part: str, **config):
    """A copy of the folder with ``part`` removed, or its config.json changed."""
    copy = shutil.copytree(folder, tmp_path / "broken")
    if not config:
        shutil.rmtree(copy / part)
        return copy
    path = copy / part / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    return copy


@pytest.mark.parametrize(("part", "config", "message"), [
    ("vae", {}, "misses its vae (vae/config.json)"),
    ("scheduler", {}, "misses its scheduler (scheduler/scheduler_config.json)"),
    ("vae", {"_class_name": "AutoencoderTiny"}, "names the class 'AutoencoderTiny', not an "
                                                "AutoencoderKL"),
])
def test_a_folder_that_is_no_whole_pipeline_exits_2(folder, tmp_path, capsys, part, config,
                                                    message):
    line = refused(capsys, *sample(broken_copy(folder, tmp_path, part, **config), tmp_path))
    assert message in line


def test_latent_channels_other_than_the_dits_exit_2(tmp_path, capsys):
    folder = write_pipeline(tmp_path / "p", vae=autoencoder(latent_channels=3),
                            dit=transformer(4))
    line = refused(capsys, *sample(folder, tmp_path))
    assert "the VAE's latents have 3 channels" in line and "the DiT takes 4" in line


def test_a_scheduler_addnorm_does_not_reproduce_exits_2_naming_it(tmp_path, capsys):
    folder = write_pipeline(tmp_path / "p", scheduler=diffusers.DDIMScheduler())  # clips x0
    line = refused(capsys, *sample(folder, tmp_path, "--steps", "3"))
    assert "clip_sample=True is not supported for DDIMScheduler" in line
    code, _, array = sample(folder, tmp_path, "--steps", "3", "--sampler", "dpm-solver++")
    assert code == 0 and array.exists()  # its schedule, with DPM-Solver++


def test_without_diffusers_exit_2_says_how_to_install_it(folder, tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "diffusers", None)
    line = refused(capsys, *sample(folder, tmp_path))
    assert "diffusers is not installed: pip install 'addnorm[interop]'" in line
