"""One step of the reverse process p(x_{k-1} | x_k), from a model's output at step k.

Shapes legend: B batch, C channels (dim 1 of the data), ``...`` any further data dims.
``k`` indexes a :class:`NoiseSchedule`: a (B,) long tensor (one entry per sample, as in
training) or an int (one for the batch, as in sampling). For a respaced chain it is the
position among the kept steps, not the original step number the model sees.

A model's output is its prediction (the noise ``eps``, or ``v``), (B, C, ...), optionally
followed by C variance channels (B, 2C, ...) in [-1, 1] that interpolate the log-variance
between the posterior's (-1) and ``log beta`` (+1): DiT's ``learn_sigma`` (LEARNED_RANGE).
"""

from __future__ import annotations

import torch
from torch import Tensor

from addnorm.diffusion.schedules import NoiseSchedule, gather

__all__ = [
    "PREDICTIONS",
    "ddim_step",
    "ddpm_mean_log_variance",
    "predicted_eps",
    "predicted_x0",
    "split_output",
]

PREDICTIONS = ("epsilon", "v")


def split_output(
    output: Tensor, x: Tensor, name: str = "model output"
) -> tuple[Tensor, Tensor | None]:
    """(prediction (B, C, ...), variance values (B, C, ...) or None) from (B, C or 2C, ...)."""
    shape, learned = tuple(x.shape), (x.shape[0], 2 * x.shape[1], *x.shape[2:])
    if not isinstance(output, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(output).__name__}")
    if tuple(output.shape) == shape:
        return output, None
    if tuple(output.shape) == learned:
        prediction, variance_values = output.chunk(2, dim=1)  # 2 x (B, C, ...)
        return prediction, variance_values
    raise ValueError(
        f"{name} must have shape {shape} (the data's) or {learned} (with learned variance), "
        f"got {tuple(output.shape)}"
    )


def predicted_eps(
    sched: NoiseSchedule, prediction: Tensor, x_t: Tensor, k: Tensor | int, kind: str
) -> Tensor:
    """The noise a prediction of ``kind`` implies: itself, or sqrt(abar) v + sqrt(1-abar) x_t."""
    if kind == "epsilon":
        return prediction
    return (
        gather(sched.sqrt_alphas_cumprod, k, x_t) * prediction
        + gather(sched.sqrt_one_minus_alphas_cumprod, k, x_t) * x_t
    )


def predicted_x0(sched: NoiseSchedule, eps: Tensor, x_t: Tensor, k: Tensor | int) -> Tensor:
    """x_0 = (x_t - sqrt(1 - abar) eps) / sqrt(abar), as sqrt(1/abar) x_t - sqrt(1/abar - 1) eps."""
    return (
        gather(sched.sqrt_recip_alphas_cumprod, k, x_t) * x_t
        - gather(sched.sqrt_recipm1_alphas_cumprod, k, x_t) * eps
    )


def ddpm_mean_log_variance(
    sched: NoiseSchedule, x0: Tensor, x_t: Tensor, k: Tensor | int, variance_values: Tensor | None
) -> tuple[Tensor, Tensor]:
    """Mean and log-variance of p(x_{k-1} | x_k): the posterior mean at the predicted x_0, and
    the learned interpolation (or, without variance channels, DiT's FIXED_LARGE, then only
    broadcastable to x_t's shape)."""
    mean = (
        gather(sched.posterior_coef_x0, k, x_t) * x0 + gather(sched.posterior_coef_xt, k, x_t) * x_t
    )
    if variance_values is None:
        return mean, gather(sched.large_log_variance, k, x_t)  # () or (B, 1, ..., 1)
    frac = (variance_values + 1) / 2
    max_log = gather(sched.log_betas, k, x_t)
    min_log = gather(sched.posterior_log_variance, k, x_t)
    return mean, frac * max_log + (1 - frac) * min_log


def ddim_step(
    sched: NoiseSchedule, x0: Tensor, x_t: Tensor, k: int, *, eta: float, noise: Tensor | None
) -> Tensor:
    """x_{k-1} = sqrt(abar') x0 + sqrt(1 - abar' - sigma^2) eps + sigma noise (Song et al.
    eq. 12), abar' the previous kept step's, eps re-derived from the (maybe clipped) x0,
    sigma = eta sqrt((1 - abar') / (1 - abar)) sqrt(1 - abar / abar'). ``noise`` may be None
    when sigma is 0 (eta 0, or the last step). Coefficients are formed in float64."""
    ac, ac_prev = sched.alphas_cumprod[k], sched.alphas_cumprod_prev[k]  # () float64
    sigma = eta * torch.sqrt((1 - ac_prev) / (1 - ac)) * torch.sqrt(1 - ac / ac_prev)
    eps = (gather(sched.sqrt_recip_alphas_cumprod, k, x_t) * x_t - x0) / gather(
        sched.sqrt_recipm1_alphas_cumprod, k, x_t
    )
    x_prev = (
        torch.sqrt(ac_prev).to(x_t.dtype) * x0
        + torch.sqrt(1 - ac_prev - sigma**2).to(x_t.dtype) * eps
    )
    if noise is None:
        return x_prev
    return x_prev + sigma.to(x_t.dtype) * noise
