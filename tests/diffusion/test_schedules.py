"""Beta schedules, the float64 tables and respacing (the step spacings: test_spacing.py).

Oracles: DiT's ``get_named_beta_schedule`` ("linear": numpy linspace scaled by 1000 / n;
"squaredcos_cap_v2": improved-diffusion's cosine alpha-bar, betas capped at 0.999) and its
``respace.py`` (the respaced betas), restated in numpy / plain Python; the defining
identities of the tables.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from addnorm.diffusion import Diffusion, NoiseSchedule, beta_schedule


@pytest.mark.parametrize("n_steps", [1000, 250, 50])
def test_linear_schedule_is_dits_scaled_linspace(n_steps):
    scale = 1000 / n_steps
    expected = np.linspace(scale * 1e-4, scale * 0.02, n_steps, dtype=np.float64)
    betas = beta_schedule("linear", n_steps)
    assert betas.dtype == torch.float64
    assert torch.equal(betas, torch.from_numpy(expected))


@pytest.mark.parametrize("n_steps", [1000, 100, 4])
def test_cosine_schedule_is_improved_diffusions_capped_alpha_bar_ratio(n_steps):
    def alpha_bar(s):
        return math.cos((s + 0.008) / 1.008 * math.pi / 2) ** 2

    expected = [
        min(1 - alpha_bar((i + 1) / n_steps) / alpha_bar(i / n_steps), 0.999)
        for i in range(n_steps)
    ]
    betas = beta_schedule("cosine", n_steps)
    assert torch.equal(betas, torch.tensor(expected, dtype=torch.float64))
    assert betas[-1] == 0.999  # alpha_bar(1) = 0: the cap binds at the last step


def test_tables_satisfy_their_definitions():
    sched = Diffusion(1000, "cosine").noise_schedule
    betas = sched.betas
    abar = torch.cumprod(1 - betas, 0)
    abar_prev = torch.cat([torch.ones(1, dtype=torch.float64), abar[:-1]])
    # float64 elementwise ops and cumprods (sequential on CPU, NumPy or torch) in one order:
    # each step correctly rounded, so equal up to a few u (2**-53); 1e-15 is ~9 u.
    torch.testing.assert_close(sched.alphas_cumprod, abar, rtol=1e-15, atol=0)
    torch.testing.assert_close(sched.alphas_cumprod_prev, abar_prev, rtol=1e-15, atol=0)
    post_var = betas * (1 - abar_prev) / (1 - abar)
    torch.testing.assert_close(sched.posterior_variance, post_var, rtol=1e-15, atol=0)
    assert sched.posterior_variance[0] == 0
    assert sched.posterior_log_variance[0] == sched.posterior_log_variance[1]
    assert sched.large_log_variance[0] == sched.posterior_log_variance[1]
    torch.testing.assert_close(sched.large_log_variance[1:], betas[1:].log(), rtol=0, atol=0)
    # The posterior mean's coefficients make E[x_{t-1} | x_t, x_0] exact for x_t with no noise:
    # x_t = sqrt(abar) x_0  ->  mean = sqrt(abar_prev) x_0.
    mean = sched.posterior_coef_x0 + sched.posterior_coef_xt * abar.sqrt()
    torch.testing.assert_close(mean, abar_prev.sqrt(), rtol=1e-12, atol=0)  # FLOAT64_EXACT's


def test_respaced_chain_keeps_alphas_cumprod_and_derives_betas_as_dit():
    full = Diffusion().noise_schedule
    kept = [0, 7, 20, 500, 999]
    sub = full.respaced(kept)
    # respaced keeps abar itself (measured: bitwise); FLOAT64_EXACT's rtol.
    torch.testing.assert_close(sub.alphas_cumprod, full.alphas_cumprod[kept], rtol=1e-12, atol=0)
    abar, last, betas = full.alphas_cumprod.numpy(), 1.0, []
    for i in kept:  # respace.py's SpacedDiffusion.__init__
        betas.append(1 - abar[i] / last)
        last = abar[i]
    assert torch.equal(sub.betas, torch.tensor(betas, dtype=torch.float64))
    assert sub.timesteps.tolist() == kept


def test_respacing_every_step_gives_the_full_chain():
    full = Diffusion().noise_schedule
    same = full.respaced(range(1000))
    for name in ("alphas_cumprod", "posterior_variance", "posterior_coef_x0", "log_betas"):
        # Betas recomputed as 1 - abar_t / abar_prev carry a few u / beta (beta >= 1e-4):
        # 3.9e-13 measured. Only correctly rounded elementwise ops and sequential cumprods,
        # no reduction a machine could reorder, so every machine gets these same bits.
        torch.testing.assert_close(getattr(same, name), getattr(full, name), rtol=1e-12, atol=0)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: Diffusion(1000, "quadratic"), "schedule must be one of 'linear', 'cosine'"),
        (lambda: Diffusion(20, "linear"), "n_steps > 20"),
        (lambda: Diffusion(1), "n_steps must be >= 2, got 1"),
        (lambda: Diffusion(1000, prediction="x0"), "prediction must be one of 'epsilon', 'v'"),
        (lambda: Diffusion().noise_schedule.respaced([5, 3]), r"strictly increasing, got \[5, 3\]"),
        (lambda: Diffusion().noise_schedule.respaced([0, 1000]), r"\[0, 999\]"),
        (lambda: NoiseSchedule.from_betas(torch.tensor([0.5, 1.0])), r"\(0, 1\)"),
    ],
)
def test_bad_schedules_are_refused_with_their_values(call, message):
    with pytest.raises(ValueError, match=message):
        call()
