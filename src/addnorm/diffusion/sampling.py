"""The sampling loops: ancestral DDPM and DDIM over a (possibly respaced) chain (DPM-Solver++'s
is :mod:`.dpm_solver`).

Called through :meth:`addnorm.diffusion.Diffusion.sample`, which checks the arguments; this
module trusts them. Shapes legend: B batch, C channels, ``...`` further data dims.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor

from addnorm.diffusion.reverse import (
    ddim_step,
    ddpm_mean_log_variance,
    predicted_eps,
    predicted_x0,
    split_output,
)
from addnorm.diffusion.schedules import NoiseSchedule

__all__ = ["DEFAULT_SPACINGS", "METHODS", "EpsFn", "run_sampler"]

METHODS = ("ddpm", "ddim", "dpm-solver++")
# Each method's spacing when none is given: DiT's for DDPM ("K") and DDIM ("ddimK"), diffusers'
# DPMSolverMultistepScheduler's default for DPM-Solver++ (its timestep_spacing="linspace").
DEFAULT_SPACINGS = {"ddpm": "sections", "ddim": "strided", "dpm-solver++": "dpm-linspace"}

EpsFn = Callable[[Tensor, Tensor], Tensor]
"""``eps_fn(x_t (B, C, ...), t (B,) long) -> (B, C, ...)``: the predicted noise (or v, for a
``Diffusion(prediction="v")``), or (B, 2C, ...) followed by learned-variance channels; ``t``
holds original step numbers."""


@torch.no_grad()
def run_sampler(
    sched: NoiseSchedule,
    eps_fn: EpsFn,
    noise: Tensor,
    *,
    method: str,
    prediction: str,
    eta: float,
    generator: torch.Generator | None,
    clip_denoised: bool,
    progress: bool,
) -> Tensor:
    """Walk ``sched`` from its last entry to its first, starting at x = ``noise``."""
    x = noise
    steps = sched.timesteps.tolist()  # original step numbers, the model's t
    positions: Iterable[int] = reversed(range(len(steps)))
    if progress:
        from tqdm.auto import tqdm

        positions = tqdm(positions, total=len(steps), desc=method)
    for position in positions:
        t = torch.full((x.shape[0],), steps[position], dtype=torch.long, device=x.device)
        output, variance_values = split_output(
            eps_fn(x, t), x, f"eps_fn output at t={steps[position]}"
        )
        eps = predicted_eps(sched, output.to(x.dtype), x, position, prediction)
        x0 = predicted_x0(sched, eps, x, position)
        if clip_denoised:
            x0 = x0.clamp(-1, 1)
        last = position == 0
        if method == "ddim":
            fresh = None if last or eta == 0 else _randn(x, generator)
            x = ddim_step(sched, x0, x, position, eta=eta, noise=fresh)
            continue
        if variance_values is not None:
            variance_values = variance_values.to(x.dtype)
        mean, log_var = ddpm_mean_log_variance(sched, x0, x, position, variance_values)
        x = mean if last else mean + torch.exp(0.5 * log_var) * _randn(x, generator)
    return x


def _randn(x: Tensor, generator: torch.Generator | None) -> Tensor:
    return torch.randn(x.shape, generator=generator, dtype=x.dtype, device=x.device)
