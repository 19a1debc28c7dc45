"""addnorm's DiTPipeline against diffusers' DiTPipeline (the oracle): the same folder (small,
random weights, written by diffusers), the same seed, scheduler, steps and guidance give the
same images.

Tolerance: both run in float32. The DiT's outputs agree to FLOAT32_MODEL (test_diffusers.py),
the schedulers' coefficients to float32 rounding (diffusers' float32 alphas_cumprod against
addnorm's float64 table: ~1e-6 relative, test_sampling_reference.py and test_dpm_solver.py),
and the VAE is diffusers' own module on both sides; the images (on [0, 1]) measured at most
6e-7 apart over 10 and 25 steps, DDIM and DPM-Solver++, epsilon and v, with and without
learned sigma and guidance. FLOAT32_MODEL (1e-5) leaves a margin of 15; a change of the
guidance scale from 4 to 3.9 moves them by ~1e-3, 100 times more (checked below).
"""

from __future__ import annotations

import pytest
import torch
from small_pipeline import (
    diffusers_pipeline,
    one_thread,  # noqa: F401  (autouse: one thread)
    transformer,
    write_pipeline,
)
from tolerances import FLOAT32_MODEL

from addnorm.dit import DiT
from addnorm.interop.diffusers_pipeline import from_diffusers_pipeline
from addnorm.interop.dit_pipeline import DEFAULT_GUIDANCE, DEFAULT_STEPS, DiTPipeline

diffusers = pytest.importorskip("diffusers")

LABELS = [0, 1, 207, 999]


@pytest.fixture(scope="module", params=[True, False], ids=["learned-sigma", "fixed-sigma"])
def folder(request, tmp_path_factory):
    return write_pipeline(tmp_path_factory.mktemp("pipe"),
                          dit=transformer(learn_sigma=request.param))


SCHEDULERS = {
    "ddim": lambda: diffusers.DDIMScheduler(clip_sample=False),
    "dpm-solver++": lambda: diffusers.DPMSolverMultistepScheduler(),
    "dpm-solver++ v": lambda: diffusers.DPMSolverMultistepScheduler(
        prediction_type="v_prediction"),
}


def both(folder, scheduler):
    """diffusers' pipeline and addnorm's, both with ``scheduler``."""
    theirs = diffusers_pipeline(folder)
    theirs.scheduler = scheduler
    ours = from_diffusers_pipeline(folder)
    # what save_pretrained writes to scheduler_config.json: the config and its class's name
    ours.scheduler_config = {**scheduler.config, "_class_name": type(scheduler).__name__}
    return theirs, ours


@pytest.mark.parametrize("guidance", [4.0, 1.0])
@pytest.mark.parametrize("steps", [10, 25])
@pytest.mark.parametrize("scheduler", list(SCHEDULERS))
def test_images_equal_diffusers_dit_pipeline(folder, scheduler, steps, guidance):
    theirs, ours = both(folder, SCHEDULERS[scheduler]())
    expected = theirs(LABELS, guidance_scale=guidance, num_inference_steps=steps,
                      generator=torch.Generator().manual_seed(3), output_type="pt").images
    images = ours.sample(LABELS, steps=steps, guidance=guidance,
                         generator=torch.Generator().manual_seed(3))
    assert images.shape == (4, 3, 16, 16) and float(expected.std()) > 0.1  # not flat
    torch.testing.assert_close(images, expected, **FLOAT32_MODEL)


def test_the_tolerance_sees_a_small_change_of_guidance(folder):
    theirs, ours = both(folder, SCHEDULERS["dpm-solver++"]())
    expected = theirs(LABELS, guidance_scale=4.0, num_inference_steps=10,
                      generator=torch.Generator().manual_seed(3), output_type="pt").images
    images = ours.sample(LABELS, steps=10, guidance=3.9,
                         generator=torch.Generator().manual_seed(3))
    assert float((images - expected).abs().max()) > 100 * FLOAT32_MODEL["atol"]


def test_its_own_scheduler_is_the_default_sampler_and_the_defaults_are_diffusers(folder):
    # DDIMScheduler in the folder: method ddim, leading steps; 50 steps and guidance 4, as
    # DiTPipeline.__call__'s defaults.
    pipe = from_diffusers_pipeline(folder)
    settings = pipe.sampler()
    assert (settings.method, settings.spacing, settings.scheduler) == (
        "ddim", "leading", "DDIMScheduler")
    assert (DEFAULT_STEPS, DEFAULT_GUIDANCE) == (50, 4.0)
    theirs = diffusers_pipeline(folder)
    expected = theirs([207], generator=torch.Generator().manual_seed(0), output_type="pt").images
    images = pipe.sample([207], generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(images, expected, **FLOAT32_MODEL)


def test_labels_may_be_named(folder):
    pipe = from_diffusers_pipeline(folder)
    named = pipe.sample_latents(["goldfish", "207"], steps=2,
                                generator=torch.Generator().manual_seed(4))
    by_id = pipe.sample_latents(torch.tensor([1, 207]), steps=2,
                                generator=torch.Generator().manual_seed(4))
    assert torch.equal(named, by_id)
    with pytest.raises(ValueError, match=r"class 'goldfsh' is not one of the 9 class names"):
        pipe.sample(["goldfsh"], steps=2)


def test_given_noise_is_the_generators_draw(folder):
    pipe = from_diffusers_pipeline(folder)
    noise = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(5))
    drawn = pipe.sample_latents([1, 2], steps=3, generator=torch.Generator().manual_seed(5))
    given = pipe.sample_latents([1, 2], steps=3, noise=noise)
    assert torch.equal(drawn, given)  # the same draw, the same ops


def test_decode_is_the_vaes_decoding_of_latents_over_the_scaling_factor(folder):
    pipe = from_diffusers_pipeline(folder)
    latents = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(6))
    vae = pipe.vae.autoencoder
    with torch.no_grad():
        expected = (vae.decode(latents / vae.config.scaling_factor).sample / 2 + 0.5).clamp(0, 1)
        torch.testing.assert_close(pipe.decode(latents), expected, **FLOAT32_MODEL)
    assert pipe.image_size == 16


def test_a_dit_and_a_vae_of_other_channels_are_refused(folder):
    pipe = from_diffusers_pipeline(folder)
    cfg = pipe.transformer.cfg
    three = DiT(type(cfg)(**{**cfg.__dict__, "in_channels": 3}))
    with pytest.raises(ValueError, match=r"the VAE's latents have 4 channels \(latent_channels\) "
                       r"but the DiT takes 3 \(in_channels\)"):
        DiTPipeline(three, pipe.vae, pipe.scheduler_config)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"labels": []}, ValueError, r"labels must be a non-empty 1-D sequence"),
        ({"labels": [[1, 2]]}, ValueError, r"labels must be a non-empty 1-D sequence"),
        ({"labels": [0.5]}, ValueError, r"labels must be a non-empty 1-D sequence"),
        # the DiT's own check (1000 is its null row)
        ({"labels": [1001]}, ValueError, r"class id 1001 outside \[0, 1000\]"),
        ({"steps": 0}, ValueError, "steps must be >= 1, got 0"),
        ({"guidance": float("nan")}, ValueError, "guidance must be finite, got nan"),
        ({"method": "ddpm"}, ValueError, r"a pipeline samples with ddim or dpm-solver\+\+, "
                                         r"got 'ddpm'"),
    ],
)
def test_bad_sampling_arguments_are_refused_naming_them(folder, kwargs, error, message):
    pipe = from_diffusers_pipeline(folder)
    kwargs = {"labels": [1], "steps": 2, **kwargs}
    with pytest.raises(error, match=message):
        pipe.sample(kwargs.pop("labels"), **kwargs)
