"""DPM-Solver++(2M) against diffusers' ``DPMSolverMultistepScheduler`` (the oracle), step by
step and whole, and against the identities it must keep.

The scheduler runs every update in float32 (its sigmas are cast to float32 in
``set_timesteps`` and ``step`` casts the sample to float32), so the whole-step comparisons are
float32 ones; its formulas are also driven in float64 through its own update functions
(``convert_model_output``, ``dpm_solver_first_order_update``,
``multistep_dpm_solver_second_order_update``), where they must agree with ours to
FLOAT64_EXACT. Identities: two steps are both first order, which is DDIM (eta 0); one step
returns the model's x0 prediction; a v-model samples as the eps-model it implies.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tolerances import FLOAT32_MODEL, FLOAT64_EXACT

from addnorm.diffusion import Diffusion
from addnorm.diffusion.dpm_solver import DPMSolverTables, data_prediction, dpm_solver_step
from addnorm.diffusion.spacing import sampling_timesteps

diffusers = pytest.importorskip("diffusers")

N_STEPS = 1000
SPACING_NAMES = {"linspace": "dpm-linspace", "leading": "dpm-leading", "trailing": "trailing"}
DIFFUSERS_PREDICTION = {"epsilon": "epsilon", "v": "v_prediction"}
SHAPE = (2, 4, 8, 8)


def scheduler(steps: int, *, prediction: str = "epsilon", spacing: str = "linspace",
              abar: torch.Tensor | None = None, **options):
    """diffusers' scheduler with its defaults (DPM-Solver++, order 2, midpoint, final sigma 0)
    and DiT's 1000 linear betas; ``abar`` replaces its float32 ``alphas_cumprod``."""
    sched = diffusers.DPMSolverMultistepScheduler(
        num_train_timesteps=N_STEPS, beta_start=1e-4, beta_end=0.02, beta_schedule="linear",
        prediction_type=DIFFUSERS_PREDICTION[prediction], timestep_spacing=spacing, **options,
    )
    if abar is not None:
        sched.alphas_cumprod = abar
    sched.set_timesteps(steps)
    return sched


def tables_for(diffusion: Diffusion, steps: int, spacing: str) -> DPMSolverTables:
    visited = sampling_timesteps(N_STEPS, steps, spacing)
    return DPMSolverTables.from_schedule(diffusion.noise_schedule.respaced(visited))


# diffusers forms lambda = log(alpha) - log(sigma) in float32 from float32 sigmas: |log sigma|
# reaches 5 on this schedule, so each lambda is off by ~1e-6 absolute, and h, a difference of
# two lambdas (0.04 apart at 250 steps), by ~1e-5 relative; the step's x0 term (about h |x0|)
# moves by that share. Measured over K = 1 .. 250, both predictions and spacings: at most
# 2.7e-6 of the state's scale max(1, |x|). 1e-5 leaves a margin of 4; taking one second-order
# step as first order moves the state by far more (test below), so the bound still sees it.
STEP_TOL = 1e-5


def run_both(steps, prediction, spacing, *, order_of_ours=None, **options):
    """The states after each step of diffusers' scheduler and of ours, fed the same model
    outputs (drawn once per step, independent of the state)."""
    diffusion = Diffusion(prediction=prediction)
    theirs_sched = scheduler(steps, prediction=prediction, spacing=spacing,
                             abar=diffusion.noise_schedule.alphas_cumprod, **options)
    ours_spacing = SPACING_NAMES[spacing]
    visited = sampling_timesteps(N_STEPS, steps, ours_spacing)
    assert theirs_sched.timesteps.tolist() == visited[::-1]  # the same steps, walked down
    tables = tables_for(diffusion, steps, ours_spacing)
    gen = torch.Generator().manual_seed(steps)
    theirs = ours = torch.randn(SHAPE, generator=gen)
    x0_before, pairs = None, []
    for i, k in enumerate(reversed(range(steps))):
        output = torch.randn(SHAPE, generator=gen)
        theirs = theirs_sched.step(output, theirs_sched.timesteps[i], theirs).prev_sample
        x0 = data_prediction(tables, output, ours, k, prediction)
        before = None if order_of_ours == 1 else x0_before
        ours, x0_before = dpm_solver_step(tables, ours, x0, before, k), x0
        pairs.append((theirs, ours))
    return pairs


def scale_of(x: torch.Tensor) -> float:
    return max(1.0, float(x.abs().max()))


@pytest.mark.parametrize("spacing", ["linspace", "leading", "trailing"])
@pytest.mark.parametrize("prediction", ["epsilon", "v"])
@pytest.mark.parametrize("steps", [1, 2, 3, 10, 25, 250])
def test_every_step_equals_diffusers_scheduler_given_the_same_model_outputs(
    steps, prediction, spacing
):
    for i, (theirs, ours) in enumerate(run_both(steps, prediction, spacing)):
        error = float((theirs - ours).abs().max())
        assert error <= STEP_TOL * scale_of(theirs), (i, error)


@pytest.mark.parametrize("options", [{"lower_order_final": False}, {"euler_at_final": True}])
def test_lower_order_final_changes_nothing_for_order_two_with_a_final_sigma_of_zero(options):
    # Both flags only ever make the last step first order, which it is already (the step to
    # sigma 0), so diffusers' states with them are ours without them, at 10 and 25 steps.
    for steps in (10, 25):
        for theirs, ours in run_both(steps, "epsilon", "linspace", **options):
            assert float((theirs - ours).abs().max()) <= STEP_TOL * scale_of(theirs)


def test_the_tolerance_sees_a_first_order_step_in_place_of_a_second():
    # The bound above is no blanket: ours run first order throughout (DDIM) leaves diffusers'
    # second-order states after the first second-order step by over 100 times STEP_TOL
    # (measured 16,500 times).
    pairs = run_both(25, "epsilon", "linspace", order_of_ours=1)
    theirs, ours = pairs[1]
    assert float((theirs - ours).abs().max()) > 100 * STEP_TOL * scale_of(theirs)


@pytest.mark.parametrize("prediction", ["epsilon", "v"])
@pytest.mark.parametrize("steps", [2, 7, 50])
def test_the_formulas_equal_diffusers_update_functions_in_float64(steps, prediction):
    # The scheduler's own conversion and update functions, given float64 sigmas and states
    # (its step() would cast them to float32); which order each step takes is the rule its
    # step() applies by default (first order first and last), held to step() above.
    diffusion = Diffusion(prediction=prediction)
    abar = diffusion.noise_schedule.alphas_cumprod
    sched = scheduler(steps, prediction=prediction, abar=abar)
    visited = sched.timesteps.tolist()
    sigmas = ((1 - abar[visited]) / abar[visited]).sqrt()  # diffusers' sigma, in float64
    sched.sigmas = torch.cat([sigmas, sigmas.new_zeros(1)])
    tables = tables_for(diffusion, steps, "dpm-linspace")
    gen = torch.Generator().manual_seed(0)
    theirs = ours = torch.randn(SHAPE, generator=gen, dtype=torch.float64)
    x0_before = None
    for i, k in enumerate(reversed(range(steps))):
        output = torch.randn(SHAPE, generator=gen, dtype=torch.float64)
        sched._step_index = i
        m0 = sched.convert_model_output(output, sample=theirs)
        if i in (0, steps - 1):
            theirs_next = sched.dpm_solver_first_order_update(m0, sample=theirs)
        else:
            sched.model_outputs = [sched.model_outputs[-1], m0]
            theirs_next = sched.multistep_dpm_solver_second_order_update(
                sched.model_outputs, sample=theirs)
        sched.model_outputs = [sched.model_outputs[-1], m0]
        x0 = data_prediction(tables, output, ours, k, prediction)
        torch.testing.assert_close(x0, m0, **FLOAT64_EXACT)
        ours, x0_before = dpm_solver_step(tables, ours, x0, x0_before, k), x0
        theirs = theirs_next
        scale = scale_of(theirs)
        torch.testing.assert_close(ours / scale, theirs / scale, **FLOAT64_EXACT)


def denoiser(learned_sigma: bool):
    """A smooth stand-in for a model: the optimal noise prediction for N(0.3, 0.5^2) data,
    bent so that channels and positions interact; with learned sigma, C more channels that the
    solver must ignore."""
    abar_table = torch.from_numpy(np.cumprod(1.0 - np.linspace(1e-4, 0.02, N_STEPS)))

    def eps_fn(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        abar = abar_table[t].to(x.dtype).view(-1, 1, 1, 1)
        eps = (1 - abar).sqrt() * (x - abar.sqrt() * 0.3) / (abar * 0.25 + 1 - abar)
        eps = eps + 0.05 * torch.tanh(x.roll(1, dims=1) * x.roll(1, dims=-1))
        return torch.cat([eps, torch.tanh(x) * 7.0], dim=1) if learned_sigma else eps

    return eps_fn


def diffusers_loop(eps_fn, x, steps, *, abar=None):
    """diffusers' sampling loop as its DiT pipeline runs it: learned-sigma channels split off
    before the scheduler."""
    sched = scheduler(steps, abar=abar)
    for t in sched.timesteps:
        output = eps_fn(x, torch.full((x.shape[0],), int(t)))[:, : x.shape[1]]
        x = sched.step(output, t, x).prev_sample
    return x


@pytest.mark.parametrize("learned_sigma", [False, True])
@pytest.mark.parametrize("steps", [5, 25])
def test_sampling_equals_diffusers_loop(steps, learned_sigma):
    noise = torch.randn(SHAPE, generator=torch.Generator().manual_seed(1))
    diffusion = Diffusion()
    ours = diffusion.sample(denoiser(learned_sigma), noise, steps=steps, method="dpm-solver++")
    given = diffusers_loop(denoiser(learned_sigma), noise, steps,
                           abar=diffusion.noise_schedule.alphas_cumprod)
    # float32 both, the same abar table: the per-step difference above (<= 3e-6 of |x| <= 2),
    # through a smooth model of slope < 2, a few steps: measured 7e-7, within FLOAT32_MODEL.
    torch.testing.assert_close(ours, given, **FLOAT32_MODEL)
    # Out of the box diffusers uses its float32 alphas_cumprod (a product of 1000 float32
    # factors, ~2e-6 relative off, as for DDIM in test_sampling_reference.py): measured 6e-7
    # apart here, within FLOAT32_MODEL too.
    torch.testing.assert_close(ours, diffusers_loop(denoiser(learned_sigma), noise, steps),
                               **FLOAT32_MODEL)


def test_two_steps_are_ddim_on_the_same_steps():
    # Both steps of a 2-step run are first order, and first-order DPM-Solver++ is DDIM with
    # eta 0 (sigma_t / sigma_s x + alpha_t (1 - e^-h) x0 is DDIM's update written in lambda).
    noise = torch.randn(SHAPE, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    diffusion, eps_fn = Diffusion(), denoiser(False)
    for spacing in ("dpm-linspace", "strided", "trailing"):
        dpm = diffusion.sample(eps_fn, noise, steps=2, method="dpm-solver++", spacing=spacing)
        ddim = diffusion.sample(eps_fn, noise, steps=2, method="ddim", spacing=spacing)
        torch.testing.assert_close(dpm, ddim, **FLOAT64_EXACT)


@pytest.mark.parametrize("prediction", ["epsilon", "v"])
def test_one_step_returns_the_models_x0_prediction(prediction):
    # One step goes from the visited step straight to the data: x0 = (x - sigma eps) / alpha,
    # or alpha x - sigma v, at that step (999 for dpm-linspace).
    noise = torch.randn(SHAPE, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    output = torch.randn(SHAPE, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    diffusion = Diffusion(prediction=prediction)
    abar = diffusion.noise_schedule.alphas_cumprod[999]
    seen = []

    def constant(x, t):
        seen.append(t.tolist())
        return output

    out = diffusion.sample(constant, noise, steps=1, method="dpm-solver++")
    alpha, sigma = abar.sqrt(), (1 - abar).sqrt()
    expected = (noise - sigma * output) / alpha if prediction == "epsilon" else (
        alpha * noise - sigma * output)
    assert seen == [[999, 999]]
    torch.testing.assert_close(out, expected, **FLOAT64_EXACT)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_low_precision_state_is_updated_in_float32_and_kept_in_its_dtype(dtype):
    # As diffusers' step(): the update in float32, the state rounded to its dtype after each
    # step, so the result is the float32 run's to the dtype's rounding over a few steps.
    noise = torch.randn(SHAPE, generator=torch.Generator().manual_seed(5))
    eps_fn = denoiser(False)
    low = Diffusion().sample(eps_fn, noise.to(dtype), steps=10, method="dpm-solver++")
    full = Diffusion().sample(eps_fn, noise.to(dtype).float(), steps=10, method="dpm-solver++")
    assert low.dtype == dtype
    unit = torch.finfo(dtype).eps / 2
    # ten roundings of the state (one per step) and the model's low-precision inputs, in a
    # contracting update: measured 2.9 u relative to |x| + 1; 30 u is ten times that.
    torch.testing.assert_close(low.float(), full, rtol=30 * unit, atol=30 * unit)
