"""Gaussian diffusion: schedules, the forward process, the loss, DDPM, DDIM and DPM-Solver++
sampling, classifier-free guidance.

The conventions are facebookresearch/DiT's (``diffusion/``); see :mod:`.gaussian`.
"""

from addnorm.diffusion.gaussian import Diffusion
from addnorm.diffusion.guidance import ChecksLabels, classifier_free_guidance, guided_eps_fn
from addnorm.diffusion.likelihood import discretized_gaussian_log_likelihood, normal_kl
from addnorm.diffusion.reverse import PREDICTIONS
from addnorm.diffusion.sampling import METHODS, EpsFn
from addnorm.diffusion.schedules import SCHEDULES, NoiseSchedule, beta_schedule
from addnorm.diffusion.spacing import SPACINGS, sampling_timesteps

__all__ = [
    "ChecksLabels",
    "METHODS",
    "PREDICTIONS",
    "SCHEDULES",
    "SPACINGS",
    "Diffusion",
    "EpsFn",
    "NoiseSchedule",
    "beta_schedule",
    "classifier_free_guidance",
    "guided_eps_fn",
    "discretized_gaussian_log_likelihood",
    "normal_kl",
    "sampling_timesteps",
]
