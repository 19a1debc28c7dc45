"""A diffusers scheduler config (``scheduler/scheduler_config.json``) as addnorm's sampler.

A pipeline folder names its scheduler class and settings; addnorm samples the two that DiT is
run with, by the same steps and updates (held to them in the tests):

| diffusers class                | addnorm ``method`` | ``timestep_spacing`` -> ``spacing``       |
|--------------------------------|--------------------|-------------------------------------------|
| ``DDIMScheduler``              | ``"ddim"``         | leading -> leading; trailing -> trailing, |
|                                |                    | where the step count divides n            |
| ``DPMSolverMultistepScheduler``| ``"dpm-solver++"`` | linspace -> dpm-linspace; leading ->      |
|                                |                    | dpm-leading; trailing -> trailing         |

Asking for the other sampler is what ``OtherScheduler.from_config(pipe.scheduler.config)``
does in diffusers: the config's fields that the other class has keep their values, the rest
take that class's defaults (:data:`DEFAULTS`, diffusers 0.42.1's).

Supported, besides: ``num_train_timesteps`` n with ``beta_schedule="linear"`` from
``beta_start = 0.1 / n`` to ``beta_end = 20 / n`` (1e-4 to 0.02 for n = 1000, DiT's) or
``"squaredcos_cap_v2"`` (addnorm's ``"cosine"``); ``prediction_type`` ``"epsilon"`` or
``"v_prediction"``. Refused, naming the field: every other value of a field in
:data:`REQUIRED` (no trained betas, no zero-SNR rescaling, no thresholding, no
``steps_offset``; DDIM without ``clip_sample`` (diffusers' DDIM clamps x0 but keeps the
model's noise for its step, DiT's re-derives the noise from the clamped x0) and stepping to
``abar = 1`` at the end, ``set_alpha_to_one=True``; DPM-Solver++ of order 2 with the midpoint
rule, no Karras/exponential/beta/Lu/flow sigmas, final sigma zero, no lambda clipping), the
values in :data:`REFUSED` (variance channels fed to the scheduler), DDIM's ``"linspace"``
(diffusers then steps back ``n // K`` from each visited step, onto steps it never visits;
addnorm steps to the next visited one), and the
scheduler classes addnorm does not run (DDPM, Euler, ...: ask for a sampler to run their
schedule). Fields that change nothing here (DPM-Solver's ``lower_order_final`` and
``euler_at_final``, which only make its last step first order, as it is with a final sigma of
zero) are accepted whatever their value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from addnorm.diffusion import Diffusion

__all__ = ["DEFAULTS", "METHOD_SCHEDULERS", "REFUSED", "REQUIRED", "SchedulerSettings",
           "scheduler_settings"]

METHOD_SCHEDULERS = {"ddim": "DDIMScheduler", "dpm-solver++": "DPMSolverMultistepScheduler"}
_COMMON = {
    "num_train_timesteps": 1000, "beta_start": 0.0001, "beta_end": 0.02,
    "beta_schedule": "linear", "trained_betas": None, "prediction_type": "epsilon",
    "thresholding": False, "dynamic_thresholding_ratio": 0.995, "sample_max_value": 1.0,
    "steps_offset": 0, "rescale_betas_zero_snr": False,
}
# Each class's __init__ defaults (diffusers 0.42.1): what from_config gives a field the config
# leaves out.
DEFAULTS: dict[str, dict[str, Any]] = {
    "DDIMScheduler": {
        **_COMMON, "clip_sample": True, "set_alpha_to_one": True, "clip_sample_range": 1.0,
        "timestep_spacing": "leading",
    },
    "DPMSolverMultistepScheduler": {
        **_COMMON, "solver_order": 2, "algorithm_type": "dpmsolver++",
        "solver_type": "midpoint", "lower_order_final": True, "euler_at_final": False,
        "use_karras_sigmas": False, "use_exponential_sigmas": False, "use_beta_sigmas": False,
        "use_lu_lambdas": False, "use_flow_sigmas": False, "flow_shift": 1.0,
        "final_sigmas_type": "zero", "lambda_min_clipped": -math.inf, "variance_type": None,
        "timestep_spacing": "linspace", "use_dynamic_shifting": False,
        "time_shift_type": "exponential",
    },
}
# The one value of each of these fields that addnorm's samplers run (where the class has it).
REQUIRED: dict[str, Any] = {
    "trained_betas": None, "thresholding": False, "steps_offset": 0,
    "rescale_betas_zero_snr": False, "set_alpha_to_one": True, "solver_order": 2,
    "algorithm_type": "dpmsolver++", "solver_type": "midpoint", "use_karras_sigmas": False,
    "use_exponential_sigmas": False, "use_beta_sigmas": False, "use_lu_lambdas": False,
    "use_flow_sigmas": False, "final_sigmas_type": "zero", "lambda_min_clipped": -math.inf,
    "use_dynamic_shifting": False, "clip_sample": False,
}
# Values of these fields that addnorm does not run (the others change nothing here): variance
# channels in the scheduler's input (diffusers would keep 3 channels of them; its DiT pipeline
# splits them off itself, as addnorm does). DDPMScheduler's "fixed_small", which from_config
# carries over, is read as no variance channels, as diffusers reads it.
REFUSED: dict[str, tuple[Any, ...]] = {"variance_type": ("learned", "learned_range")}
_WHY = {
    "clip_sample": "diffusers' DDIM clamps x0 but steps with the model's noise; addnorm's, "
    "as DiT's, steps with the noise of the clamped x0; DPM-Solver++ has no clip_sample",
    "variance_type": "its DiT pipeline splits the variance channels off before the scheduler",
}
_PREDICTIONS = {"epsilon": "epsilon", "v_prediction": "v"}
_SPACINGS = {
    "DDIMScheduler": {"leading": "leading", "trailing": "trailing"},
    "DPMSolverMultistepScheduler": {
        "linspace": "dpm-linspace", "leading": "dpm-leading", "trailing": "trailing",
    },
}


@dataclass(frozen=True)
class SchedulerSettings:
    """How addnorm samples as a diffusers scheduler does: the diffusion (``n_steps``,
    ``schedule``, ``prediction``) and ``Diffusion.sample``'s ``method`` and ``spacing``;
    ``scheduler`` names the diffusers class they reproduce."""

    scheduler: str
    n_steps: int
    schedule: str
    prediction: str
    method: str
    spacing: str

    def diffusion(self) -> Diffusion:
        return Diffusion(self.n_steps, self.schedule, prediction=self.prediction)

    def check_steps(self, steps: int) -> None:
        """ValueError for a step count whose samples diffusers' scheduler makes otherwise:
        DDIM's ``trailing`` steps back ``n // K``, the next visited step only where K
        divides n (:mod:`addnorm.diffusion.spacing`)."""
        if self.method == "ddim" and self.spacing == "trailing" and self.n_steps % steps:
            raise ValueError(
                f"DDIMScheduler with timestep_spacing='trailing' samples {steps} steps of "
                f"{self.n_steps} otherwise than addnorm (it steps back {self.n_steps} // "
                f"{steps} from each); use a step count that divides {self.n_steps}"
            )


def scheduler_settings(
    config: Mapping[str, Any], *, method: str | None = None,
    where: str = "scheduler_config.json",
) -> SchedulerSettings:
    """The :class:`SchedulerSettings` of a scheduler ``config`` (its JSON object; ``where``
    names it in messages), for its own class or, given ``method``, for that sampler's class
    as ``from_config`` makes it (module docstring).

    Raises:
        ValueError: the class or a field's value is one addnorm does not reproduce (named),
            or ``method`` is not ``"ddim"`` or ``"dpm-solver++"``.
    """
    own = config.get("_class_name")
    if method is None:
        by_class = {name: m for m, name in METHOD_SCHEDULERS.items()}
        if own not in by_class:
            raise ValueError(
                f"{where}: the scheduler {own!r} is not one addnorm samples with "
                f"({', '.join(METHOD_SCHEDULERS.values())}); choose a sampler "
                f"({' or '.join(METHOD_SCHEDULERS)}) to sample its schedule"
            )
        method = by_class[own]
    if method not in METHOD_SCHEDULERS:
        raise ValueError(f"a pipeline samples with {' or '.join(METHOD_SCHEDULERS)}, "
                         f"got {method!r}")
    name = METHOD_SCHEDULERS[method]
    fields = {key: config.get(key, default) for key, default in DEFAULTS[name].items()}
    for key, value in fields.items():
        if key in REQUIRED and value != REQUIRED[key] or value in REFUSED.get(key, ()):
            raise ValueError(f"{where}: {key}={value!r} is not supported for {name} "
                             f"({_WHY.get(key, f'addnorm runs {key}={REQUIRED.get(key)!r}')})")
    n_steps, schedule = _schedule(fields, where)
    prediction = _PREDICTIONS.get(fields["prediction_type"])
    if prediction is None:
        raise ValueError(f"{where}: prediction_type={fields['prediction_type']!r} is not "
                         f"supported (addnorm's models predict {' or '.join(_PREDICTIONS)})")
    spacing = _SPACINGS[name].get(fields["timestep_spacing"])
    if spacing is None:
        raise ValueError(
            f"{where}: timestep_spacing={fields['timestep_spacing']!r} is not supported for "
            f"{name} ({', '.join(map(repr, _SPACINGS[name]))} are)"
        )
    return SchedulerSettings(scheduler=name, n_steps=n_steps, schedule=schedule,
                             prediction=prediction, method=method, spacing=spacing)


def _schedule(fields: Mapping[str, Any], where: str) -> tuple[int, str]:
    """(n_steps, addnorm's schedule name) of the config's betas, or ValueError."""
    n = fields["num_train_timesteps"]
    if not isinstance(n, int) or isinstance(n, bool) or n < 2:
        raise ValueError(f"{where}: num_train_timesteps must be an int >= 2, got {n!r}")
    kind = fields["beta_schedule"]
    if kind == "squaredcos_cap_v2":
        return n, "cosine"
    start, end = fields["beta_start"], fields["beta_end"]
    if kind == "linear" and n > 20 and all(isinstance(v, (int, float)) for v in (start, end)):
        if math.isclose(start, 0.1 / n, rel_tol=1e-9) and math.isclose(end, 20 / n,
                                                                        rel_tol=1e-9):
            return n, "linear"
        raise ValueError(
            f"{where}: a linear schedule from beta_start={start!r} to beta_end={end!r} is not "
            f"addnorm's (DiT's: 0.1 / n to 20 / n, {0.1 / n:g} to {20 / n:g} for n = {n})"
        )
    raise ValueError(f"{where}: beta_schedule={kind!r} with num_train_timesteps={n} is not "
                     "supported ('linear' with n > 20, or 'squaredcos_cap_v2')")
