"""DDIM and DDPM sampling against facebookresearch/DiT's loops and diffusers' DDIMScheduler.

Oracle 1: DiT's ``ddim_sample_loop`` / ``p_sample_loop`` over ``create_diffusion(...)``
(``diffusion/gaussian_diffusion.py``, ``respace.py``; DiT is not on PyPI), restated below in
plain numpy/torch: numpy float64 tables, the respaced betas ``1 - abar[t_k] / abar[t_{k-1}]``,
and its ``_extract_into_tensor``, which casts every coefficient to float32. For float32 data
that is what we do too (tables cast to the data's dtype), so the two agree to float32 rounding
(DDPM to the bit; DDIM within ~1e-6: we take its square roots and sigma in float64 before the
cast, the reference in float32 after it; with coefficients formed in float64 the two agree to
the bit). For
float64 data the reference still rounds its coefficients to float32; we do not, so the float64
restatement keeps them in float64 and agrees to 1e-12.

The reference draws noise at every step, including the last, where it is multiplied by 0; the
restatement (and the library) draw none there, which changes nothing before the end.

Oracle 2: diffusers' ``DDIMScheduler``. Its ``timestep_spacing="leading"`` with
``steps_offset=0`` and ``set_alpha_to_one=True`` visits DiT's ``ddim50`` steps and uses the same
update; out of the box it differs only by its float32 ``alphas_cumprod`` (agreement ~1e-5), and
given our float64 table it agrees to 1e-12, for ``leading`` and ``trailing`` spacings.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tolerances import FLOAT32_MODEL, FLOAT64_EXACT

from addnorm.diffusion import Diffusion

N_STEPS = 1000
DIT_LINEAR_BETAS = np.linspace(1e-4, 0.02, N_STEPS, dtype=np.float64)  # DiT's 1000-step linear


def reference_tables(kept: list[int]) -> dict[str, np.ndarray]:
    """SpacedDiffusion's tables (respace.py + GaussianDiffusion.__init__), in float64."""
    abar_full = np.cumprod(1.0 - DIT_LINEAR_BETAS)
    betas, last = [], 1.0
    for i in kept:
        betas.append(1.0 - abar_full[i] / last)
        last = abar_full[i]
    betas = np.array(betas)
    abar = np.cumprod(1.0 - betas)
    abar_prev = np.append(1.0, abar[:-1])
    post_var = betas * (1.0 - abar_prev) / (1.0 - abar)
    return {
        "betas": betas,
        "abar": abar,
        "abar_prev": abar_prev,
        "sqrt_recip": np.sqrt(1.0 / abar),
        "sqrt_recipm1": np.sqrt(1.0 / abar - 1),
        "post_log_var": np.log(np.append(post_var[1], post_var[1:])),
        "coef1": betas * np.sqrt(abar_prev) / (1.0 - abar),
        "coef2": (1.0 - abar_prev) * np.sqrt(1.0 - betas) / (1.0 - abar),
        "large_log_var": np.log(np.append(post_var[1], betas[1:])),
    }


def extract(table: np.ndarray, k: int, x: torch.Tensor) -> torch.Tensor:
    """_extract_into_tensor: float32 for float32 data; float64 kept for float64 data."""
    value = torch.from_numpy(table)[k]
    value = value.float() if x.dtype == torch.float32 else value
    return value + torch.zeros_like(x)


def reference_ddim(model, x, kept, *, eta=0.0, clip=False, generator=None):
    tab = reference_tables(kept)
    n_channels = x.shape[1]
    for k in reversed(range(len(kept))):
        out = model(x, torch.full((x.shape[0],), kept[k]))
        eps = out[:, :n_channels]
        x0 = extract(tab["sqrt_recip"], k, x) * x - extract(tab["sqrt_recipm1"], k, x) * eps
        if clip:
            x0 = x0.clamp(-1, 1)
        eps = (extract(tab["sqrt_recip"], k, x) * x - x0) / extract(tab["sqrt_recipm1"], k, x)
        abar, abar_prev = extract(tab["abar"], k, x), extract(tab["abar_prev"], k, x)
        sigma = eta * torch.sqrt((1 - abar_prev) / (1 - abar)) * torch.sqrt(1 - abar / abar_prev)
        x = x0 * torch.sqrt(abar_prev) + torch.sqrt(1 - abar_prev - sigma**2) * eps
        if k > 0 and eta > 0:
            x = x + sigma * torch.randn(x.shape, generator=generator, dtype=x.dtype)
    return x


def reference_ddpm(model, x, kept, *, clip=False, generator=None):
    tab = reference_tables(kept)
    n_channels = x.shape[1]
    for k in reversed(range(len(kept))):
        out = model(x, torch.full((x.shape[0],), kept[k]))
        eps = out[:, :n_channels]
        if out.shape[1] == 2 * n_channels:  # LEARNED_RANGE
            frac = (out[:, n_channels:] + 1) / 2
            max_log = extract(np.log(tab["betas"]), k, x)
            log_var = frac * max_log + (1 - frac) * extract(tab["post_log_var"], k, x)
        else:  # FIXED_LARGE
            log_var = extract(tab["large_log_var"], k, x)
        x0 = extract(tab["sqrt_recip"], k, x) * x - extract(tab["sqrt_recipm1"], k, x) * eps
        if clip:
            x0 = x0.clamp(-1, 1)
        mean = extract(tab["coef1"], k, x) * x0 + extract(tab["coef2"], k, x) * x
        if k > 0:
            mean = mean + torch.exp(0.5 * log_var) * torch.randn(
                x.shape, generator=generator, dtype=x.dtype
            )
        x = mean
    return x


def denoiser(learned_variance: bool):
    """The optimal predictor for N(0.3, 0.5^2) data, bent by a fixed nonlinearity so that
    channels and positions interact; variance values in (-1, 1) vary with x and t."""
    abar_table = torch.from_numpy(np.cumprod(1.0 - DIT_LINEAR_BETAS))

    def eps_fn(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        abar = abar_table[t].to(x.dtype).view(-1, 1, 1, 1)
        eps = (1 - abar).sqrt() * (x - abar.sqrt() * 0.3) / (abar * 0.25 + 1 - abar)
        eps = eps + 0.05 * torch.tanh(x.roll(1, dims=1) * x.roll(1, dims=-1))
        if not learned_variance:
            return eps
        return torch.cat([eps, torch.tanh(x.flip(1) + t.to(x.dtype).view(-1, 1, 1, 1) / 500)], 1)

    return eps_fn


def start_noise(dtype):
    return torch.randn(3, 2, 4, 4, generator=torch.Generator().manual_seed(0), dtype=dtype)


# float64: a few roundings per step, measured <= 7e-16 after 50 to 250 steps: FLOAT64_EXACT.
# float32: each run is ~1e-6 from its float64 twin (measured, 50 DDIM steps, |x| <= 2); two
# runs whose op orders differ (DDIM: ours and DiT's differ by 1.2e-6; DDPM: the same ops,
# bitwise) stay within FLOAT32_MODEL. The float64 cases pin the formulas.
TOL = {torch.float32: FLOAT32_MODEL, torch.float64: FLOAT64_EXACT}
DDIM50 = list(range(0, N_STEPS, 20))  # DiT's space_timesteps(1000, "ddim50")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("clip", [False, True])
def test_ddim_50_steps_equals_dit_ddim_sample_loop(dtype, clip):
    x_T = start_noise(dtype)
    ours = Diffusion().sample(denoiser(False), x_T, steps=50, method="ddim", clip_denoised=clip)
    expected = reference_ddim(denoiser(False), x_T, DDIM50, clip=clip)
    assert ours.dtype == dtype
    torch.testing.assert_close(ours, expected, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ddim_with_eta_and_learned_variance_equals_the_reference(dtype):
    # DDIM ignores the variance channels; eta = 1 draws the same noise in the same order.
    x_T = start_noise(dtype)
    ours = Diffusion().sample(
        denoiser(True),
        x_T,
        steps=50,
        method="ddim",
        eta=1.0,
        generator=torch.Generator().manual_seed(1),
    )
    expected = reference_ddim(
        denoiser(True), x_T, DDIM50, eta=1.0, generator=torch.Generator().manual_seed(1)
    )
    # In float32 the reference forms sigma from float32 abar: 1 - abar / abar_prev cancels
    # ~2 digits, so its sigma is off by ~1e-6 relative; ours comes from float64 tables
    # (measured 2.6e-6 apart, inside FLOAT32_MODEL).
    torch.testing.assert_close(ours, expected, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("learned_variance", [False, True])
def test_ddpm_250_steps_equals_dit_p_sample_loop(dtype, learned_variance):
    # DiT's sample.py: create_diffusion("250") (section spacing), p_sample_loop.
    x_T = start_noise(dtype)
    kept = [round(i * 999 / 249) for i in range(250)]  # one section of 1000 into 250
    ours = Diffusion().sample(
        denoiser(learned_variance), x_T, steps=250, generator=torch.Generator().manual_seed(2)
    )
    expected = reference_ddpm(
        denoiser(learned_variance), x_T, kept, generator=torch.Generator().manual_seed(2)
    )
    torch.testing.assert_close(ours, expected, **TOL[dtype])


def test_ddpm_all_steps_with_clipping_equals_the_reference():
    x_T = start_noise(torch.float32)
    ours = Diffusion().sample(
        denoiser(True), x_T, clip_denoised=True, generator=torch.Generator().manual_seed(3)
    )
    expected = reference_ddpm(
        denoiser(True),
        x_T,
        list(range(N_STEPS)),
        clip=True,
        generator=torch.Generator().manual_seed(3),
    )
    torch.testing.assert_close(ours, expected, **TOL[torch.float32])


def test_model_sees_original_step_numbers():
    seen: list[list[int]] = []

    def recording(x, t):
        seen.append(t.tolist())
        return torch.zeros_like(x)

    Diffusion().sample(recording, torch.zeros(2, 1), steps=50, method="ddim")
    assert seen == [[t, t] for t in reversed(DDIM50)]
    seen.clear()
    Diffusion().sample(recording, torch.zeros(2, 1), steps=4, method="ddpm")
    assert seen == [[t, t] for t in (999, 666, 333, 0)]  # sections: round(i * 999 / 3)


# ------------------------------------------------------------------------ diffusers


def diffusers_ddim(eps_fn, x, *, spacing, eta=0.0, generator=None, abar=None):
    from diffusers import DDIMScheduler

    scheduler = DDIMScheduler(
        num_train_timesteps=N_STEPS,
        beta_start=1e-4,
        beta_end=0.02,
        beta_schedule="linear",
        clip_sample=False,
        set_alpha_to_one=True,
        steps_offset=0,
        timestep_spacing=spacing,
        prediction_type="epsilon",
    )
    if abar is not None:
        scheduler.alphas_cumprod = abar  # float64, as DiT's tables
    scheduler.set_timesteps(50)
    for t in scheduler.timesteps:
        eps = eps_fn(x, torch.full((x.shape[0],), int(t)))
        x = scheduler.step(eps, int(t), x, eta=eta, generator=generator).prev_sample
    return x


@pytest.mark.parametrize("spacing", ["leading", "trailing"])
def test_ddim_equals_diffusers_ddim_scheduler_given_float64_alphas(spacing):
    x_T = start_noise(torch.float64)
    diffusion = Diffusion()
    ours = diffusion.sample(denoiser(False), x_T, steps=50, method="ddim", spacing=spacing)
    theirs = diffusers_ddim(
        denoiser(False), x_T, spacing=spacing, abar=diffusion.noise_schedule.alphas_cumprod
    )
    torch.testing.assert_close(ours, theirs, **FLOAT64_EXACT)  # float64


def test_ddim_default_equals_out_of_the_box_diffusers_to_its_float32_schedule():
    # diffusers computes alphas_cumprod in float32: a product of 1000 factors, off by ~sqrt(1000)
    # u = 2e-6 relative (1000 u = 6e-5 at worst); the outputs (|x| <= 2) move about as much:
    # measured 2e-6 apart; 3e-5 is 15 times that, a quarter of the worst case.
    x_T = start_noise(torch.float32)
    ours = Diffusion().sample(denoiser(False), x_T, steps=50, method="ddim")
    theirs = diffusers_ddim(denoiser(False), x_T, spacing="leading")
    torch.testing.assert_close(ours, theirs, rtol=0, atol=3e-5)
