"""DPM-Solver++(2M): the multistep second-order solver of Lu et al. (2022, "DPM-Solver++:
Fast Solver for Guided Sampling of Diffusion Probabilistic Models", Algorithm 2), as diffusers'
``DPMSolverMultistepScheduler`` runs it with its defaults (``algorithm_type="dpmsolver++"``,
``solver_order=2``, ``solver_type="midpoint"``, ``final_sigmas_type="zero"``).

It follows the probability-flow ODE in ``lambda = log(alpha / sigma)`` (half the log-SNR), with
``alpha = sqrt(abar)``, ``sigma = sqrt(1 - abar)``, using the model's *data* prediction x0
(from eps: ``(x - sigma eps) / alpha``; from v: ``alpha x - sigma v``). From visited step s to
the next lower one t, ``h = lambda_t - lambda_s``:

    first order (DDIM):   x_t = (sigma_t / sigma_s) x_s + alpha_t (1 - e^-h) x0_s
    second order:         x_t = (sigma_t / sigma_s) x_s + alpha_t (1 - e^-h) (x0_s + D / 2)
                          D = (x0_s - x0_prev) / r,  r = h_prev / h

where ``x0_prev`` and ``h_prev`` belong to the step before (the midpoint rule). The first step
has no previous prediction and the last goes to the data itself (``abar = 1``: ``sigma_t = 0``,
``h`` infinite), so both are first order, as diffusers' scheduler has them (its last step is
first order for ``final_sigmas_type="zero"`` whatever ``lower_order_final`` says, so that flag
changes nothing for order 2); the last step returns that step's x0 prediction. Every other step
is second order.

The coefficients are formed in float64 from the schedule's tables and cast once; the update
runs in float32 at least (a float16 or bfloat16 state is updated in float32 and cast back, as
diffusers does). Nothing is read back to the host per step.

Shapes legend: B batch, C channels, ``...`` further data dims; K visited steps.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor

from addnorm.diffusion.reverse import split_output
from addnorm.diffusion.sampling import EpsFn
from addnorm.diffusion.schedules import NoiseSchedule

__all__ = ["DPMSolverTables", "data_prediction", "dpm_solver_step", "run_dpm_solver"]


@dataclass(frozen=True, eq=False)
class DPMSolverTables:
    """The float64 coefficients of each step of a (respaced) chain, all (K,).

    Entry ``k`` is the step from visited position ``k`` to ``k - 1`` (to the data for
    ``k = 0``): ``keep_x = sigma_t / sigma_s``, ``add_x0 = alpha_t (1 - e^-h)``, and
    ``half_over_r = 1 / (2 r)`` with ``r = h_{k+1} / h_k`` the ratio of the previous step's
    ``h`` to this one's (0 where the step is first order: the first, ``k = K - 1``, and the
    last, ``k = 0``), held as Python floats so that a step reads no tensor back. ``alpha``,
    ``sigma`` are each position's, for the data prediction.
    """

    alpha: Tensor
    sigma: Tensor
    keep_x: Tensor
    add_x0: Tensor
    half_over_r: tuple[float, ...]

    @classmethod
    def from_schedule(cls, sched: NoiseSchedule) -> DPMSolverTables:
        abar, abar_next = sched.alphas_cumprod, sched.alphas_cumprod_prev  # (K,), float64
        alpha, sigma = abar.sqrt(), (1.0 - abar).sqrt()
        alpha_t, sigma_t = abar_next.sqrt(), (1.0 - abar_next).sqrt()
        lam = torch.log(alpha) - torch.log(sigma)  # (K,) finite: abar < 1 at every visited step
        h = torch.log(alpha_t[1:]) - torch.log(sigma_t[1:]) - lam[1:]  # (K - 1,), steps k >= 1
        keep_x = sigma_t / sigma
        add_x0 = torch.ones_like(abar)  # k = 0: alpha_t = 1, e^-h = 0
        add_x0[1:] = -alpha_t[1:] * torch.expm1(-h)
        half_over_r = torch.zeros_like(abar)
        if len(abar) > 2:  # second-order steps k = 1 .. K - 2
            half_over_r[1:-1] = 0.5 * h[:-1] / h[1:]
        return cls(alpha=alpha, sigma=sigma, keep_x=keep_x, add_x0=add_x0,
                   half_over_r=tuple(half_over_r.tolist()))


def data_prediction(
    tables: DPMSolverTables, prediction: Tensor, x: Tensor, k: int, kind: str
) -> Tensor:
    """x0 from a prediction of ``kind`` at position ``k``: ``(x - sigma eps) / alpha`` for
    ``"epsilon"``, ``alpha x - sigma v`` for ``"v"`` (diffusers' ``convert_model_output``).

    Shapes: prediction, x (B, C, ...) -> (B, C, ...)
    """
    alpha, sigma = tables.alpha[k].to(x.dtype), tables.sigma[k].to(x.dtype)
    if kind == "epsilon":
        return (x - sigma * prediction) / alpha
    return alpha * x - sigma * prediction


def dpm_solver_step(
    tables: DPMSolverTables, x: Tensor, x0: Tensor, x0_before: Tensor | None, k: int
) -> Tensor:
    """The state at position ``k - 1`` (the data for ``k = 0``) from ``x`` at ``k``, given
    this step's data prediction ``x0`` and the previous step's ``x0_before`` (None on the first
    step). Second order where ``half_over_r[k]`` is set and ``x0_before`` given, else first
    order. Computed in ``x``'s dtype.

    Shapes: x, x0, x0_before (B, C, ...) -> (B, C, ...)
    """
    keep_x, add_x0 = tables.keep_x[k].to(x.dtype), tables.add_x0[k].to(x.dtype)
    half_over_r = tables.half_over_r[k]
    if x0_before is None or half_over_r == 0.0:
        return keep_x * x + add_x0 * x0
    blended = (1.0 + half_over_r) * x0 - half_over_r * x0_before  # x0 + (x0 - x0_before) / 2r
    return keep_x * x + add_x0 * blended


@torch.no_grad()
def run_dpm_solver(
    sched: NoiseSchedule,
    eps_fn: EpsFn,
    noise: Tensor,
    *,
    prediction: str,
    clip_denoised: bool,
    progress: bool,
) -> Tensor:
    """Walk ``sched`` from its last visited step to the data, starting at x = ``noise``.

    ``eps_fn`` as :data:`addnorm.diffusion.EpsFn`: its variance channels, if any, are
    dropped (DiT's learned sigma; diffusers' DiT pipeline splits them off before its
    scheduler). Called by :meth:`addnorm.diffusion.Diffusion.sample`, which checks the
    arguments.

    Shapes: noise (B, C, ...) -> (B, C, ...) in ``noise``'s dtype
    """
    tables = DPMSolverTables.from_schedule(sched)
    work = torch.promote_types(noise.dtype, torch.float32)  # the update's dtype
    x = noise.to(work)
    steps = sched.timesteps.tolist()  # original step numbers, the model's t
    positions: Iterable[int] = reversed(range(len(steps)))
    if progress:
        from tqdm.auto import tqdm

        positions = tqdm(positions, total=len(steps), desc="dpm-solver++")
    x0_before = None
    for k in positions:
        t = torch.full((x.shape[0],), steps[k], dtype=torch.long, device=x.device)
        model_in = x.to(noise.dtype)
        output, _ = split_output(eps_fn(model_in, t), model_in, f"eps_fn output at t={steps[k]}")
        x0 = data_prediction(tables, output.to(work), x, k, prediction)
        if clip_denoised:
            x0 = x0.clamp(-1, 1)
        x = dpm_solver_step(tables, x, x0, x0_before, k)
        x = x.to(noise.dtype).to(work)  # the state is kept in noise's dtype between steps
        x0_before = x0
    return x.to(noise.dtype)
