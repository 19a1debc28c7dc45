"""A diffusers scheduler config as addnorm's sampler settings. Oracles: diffusers' scheduler
classes (their __init__ defaults, ``from_config``, the steps ``set_timesteps`` visits) and the
configs ``save_config`` writes; the samples themselves are held to diffusers' in
test_dit_pipeline.py and tests/diffusion/test_dpm_solver.py."""

from __future__ import annotations

import inspect
import json
import math

import pytest

from addnorm.diffusion.spacing import sampling_timesteps
from addnorm.interop.diffusers_scheduler import (
    DEFAULTS,
    METHOD_SCHEDULERS,
    SchedulerSettings,
    scheduler_settings,
)

diffusers = pytest.importorskip("diffusers")


def saved(scheduler, tmp_path) -> dict:
    """The scheduler_config.json that save_pretrained writes for ``scheduler``."""
    scheduler.save_config(tmp_path)
    return json.loads((tmp_path / "scheduler_config.json").read_text())


@pytest.mark.parametrize("name", list(DEFAULTS))
def test_the_defaults_are_the_classes_own(name):
    parameters = inspect.signature(getattr(diffusers, name).__init__).parameters
    assert DEFAULTS[name] == {k: p.default for k, p in parameters.items() if k != "self"}


@pytest.mark.parametrize(("scheduler", "expected"), [
    ("DDIMScheduler", ("ddim", "leading")),
    ("DPMSolverMultistepScheduler", ("dpm-solver++", "dpm-linspace")),
])
def test_a_saved_default_config_is_its_classes_sampler(scheduler, expected, tmp_path):
    config = saved(getattr(diffusers, scheduler)(clip_sample=False)
                   if scheduler == "DDIMScheduler" else getattr(diffusers, scheduler)(), tmp_path)
    settings = scheduler_settings(config)
    assert settings == SchedulerSettings(scheduler, 1000, "linear", "epsilon", *expected)
    assert settings.diffusion().n_steps == 1000


@pytest.mark.parametrize("spacing", ["linspace", "leading", "trailing"])
@pytest.mark.parametrize("steps", [1, 7, 25, 50])
def test_the_steps_visited_are_the_schedulers(spacing, steps, tmp_path):
    scheduler = diffusers.DPMSolverMultistepScheduler(timestep_spacing=spacing)
    settings = scheduler_settings(saved(scheduler, tmp_path))
    scheduler.set_timesteps(steps)
    visited = sampling_timesteps(settings.n_steps, steps, settings.spacing)
    assert visited == sorted(scheduler.timesteps.tolist())


def test_another_sampler_takes_the_config_as_from_config_does(tmp_path):
    # A DDIM config saved by diffusers 0.42 names timestep_spacing "leading": DPM-Solver made
    # from it visits the "leading" steps (dpm-leading), not its own default "linspace".
    ddim = diffusers.DDIMScheduler(clip_sample=False, prediction_type="v_prediction")
    config = saved(ddim, tmp_path)
    theirs = diffusers.DPMSolverMultistepScheduler.from_config(config)
    settings = scheduler_settings(config, method="dpm-solver++")
    assert (settings.scheduler, settings.spacing, settings.prediction) == (
        "DPMSolverMultistepScheduler", "dpm-leading", "v")
    assert theirs.config.timestep_spacing == "leading"
    # An older config without timestep_spacing gets the class's default.
    old = {k: v for k, v in config.items() if k != "timestep_spacing"}
    assert scheduler_settings(old, method="dpm-solver++").spacing == "dpm-linspace"
    assert diffusers.DPMSolverMultistepScheduler.from_config(old).config.timestep_spacing == (
        "linspace")


def test_the_cosine_schedule_and_other_lengths(tmp_path):
    cosine = saved(diffusers.DPMSolverMultistepScheduler(beta_schedule="squaredcos_cap_v2"),
                   tmp_path)
    assert scheduler_settings(cosine).schedule == "cosine"
    short = {**cosine, "beta_schedule": "linear", "num_train_timesteps": 500,
             "beta_start": 0.1 / 500, "beta_end": 20 / 500}
    settings = scheduler_settings(short)
    assert (settings.n_steps, settings.schedule) == (500, "linear")
    assert math.isclose(float(settings.diffusion().noise_schedule.betas[0]), 0.1 / 500)


@pytest.mark.parametrize(
    ("changes", "method", "message"),
    [
        ({"clip_sample": True}, "ddim", r"clip_sample=True is not supported for DDIMScheduler "
                                        r"\(diffusers' DDIM clamps x0 but steps with the model's"),
        ({"set_alpha_to_one": False}, "ddim", r"set_alpha_to_one=False is not supported"),
        ({"timestep_spacing": "linspace"}, "ddim",
         r"timestep_spacing='linspace' is not supported for DDIMScheduler \('leading', "
         r"'trailing' are\)"),
        ({"steps_offset": 1}, "ddim", r"steps_offset=1 is not supported .*steps_offset=0"),
        ({"thresholding": True}, "dpm-solver++", r"thresholding=True is not supported"),
        ({"solver_order": 3}, "dpm-solver++", r"solver_order=3 is not supported"),
        ({"algorithm_type": "sde-dpmsolver++"}, "dpm-solver++", r"algorithm_type="),
        ({"solver_type": "heun"}, "dpm-solver++", r"solver_type='heun' is not supported"),
        ({"use_karras_sigmas": True}, "dpm-solver++", r"use_karras_sigmas=True"),
        ({"final_sigmas_type": "sigma_min"}, "dpm-solver++", r"final_sigmas_type='sigma_min'"),
        ({"lambda_min_clipped": -5.1}, "dpm-solver++", r"lambda_min_clipped=-5.1"),
        ({"variance_type": "learned_range"}, "dpm-solver++",
         r"variance_type='learned_range' is not supported .*splits the variance channels off"),
        ({"prediction_type": "sample"}, "dpm-solver++", r"prediction_type='sample' is not "
                                                        r"supported"),
        ({"beta_schedule": "scaled_linear"}, "dpm-solver++", r"beta_schedule='scaled_linear'"),
        ({"beta_end": 0.012}, "dpm-solver++", r"a linear schedule from beta_start=0.0001 to "
                                              r"beta_end=0.012 is not addnorm's"),
        ({"trained_betas": [0.1, 0.2]}, "dpm-solver++", r"trained_betas=\[0.1, 0.2\]"),
        ({"_class_name": "EulerDiscreteScheduler"}, None,
         r"the scheduler 'EulerDiscreteScheduler' is not one addnorm samples with .*choose a "
         r"sampler \(ddim or dpm-solver\+\+\)"),
    ],
)
def test_what_addnorm_does_not_reproduce_is_refused_naming_the_field(
    changes, method, message, tmp_path
):
    base = (diffusers.DDIMScheduler(clip_sample=False) if method == "ddim"
            else diffusers.DPMSolverMultistepScheduler())
    config = {**saved(base, tmp_path), **changes}
    with pytest.raises(ValueError, match=message):
        scheduler_settings(config)


def test_fields_that_change_nothing_are_taken_whatever_their_value(tmp_path):
    # A DDPM config's variance_type "fixed_small" (from_config carries it over) is no variance
    # channel; lower_order_final and euler_at_final only make the last step first order.
    config = {**saved(diffusers.DPMSolverMultistepScheduler(), tmp_path),
              "variance_type": "fixed_small", "lower_order_final": False,
              "euler_at_final": True}
    assert scheduler_settings(config).method == "dpm-solver++"
    ddpm = saved(diffusers.DDPMScheduler(), tmp_path)
    assert scheduler_settings(ddpm, method="dpm-solver++").spacing == "dpm-leading"
    assert set(METHOD_SCHEDULERS) == {"ddim", "dpm-solver++"}


def test_ddim_trailing_is_refused_where_diffusers_steps_elsewhere(tmp_path):
    config = saved(diffusers.DDIMScheduler(clip_sample=False, timestep_spacing="trailing"),
                   tmp_path)
    settings = scheduler_settings(config)
    settings.check_steps(50)  # 50 divides 1000: the same steps and updates
    with pytest.raises(ValueError, match=r"samples 30 steps of 1000 otherwise than addnorm"):
        settings.check_steps(30)
