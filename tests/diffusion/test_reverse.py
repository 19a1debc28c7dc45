"""One reverse step p(x_{k-1} | x_k) from a model's output.

Oracles, all in float64 on DiT's linear 1000-step chain: x_t = sqrt(abar) x0 + sqrt(1 - abar)
eps and v = sqrt(abar) eps - sqrt(1 - abar) x0 define eps and x0 back from (x_t, v or eps);
the posterior q(x_{k-1} | x_k, x0) is the product of the Gaussians q(x_k | x_{k-1}) and
q(x_{k-1} | x0) (Bayes, derived here independently of the tables); DDIM with eta 0 re-noises
x0 with the same eps, and with eta 1 it is the DDPM posterior step (Song et al. 2021, sec. 4.1).
"""

from __future__ import annotations

import pytest
import torch
from tolerances import FLOAT64_EXACT

from addnorm.diffusion import NoiseSchedule, beta_schedule
from addnorm.diffusion.reverse import (
    ddim_step,
    ddpm_mean_log_variance,
    predicted_eps,
    predicted_x0,
    split_output,
)

SCHED = NoiseSchedule.from_betas(beta_schedule("linear", 1000))
STEPS = [1, 10, 500, 999]


def noised(k: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x0, eps = torch.randn(2, 3, 3, 4, 4, generator=g, dtype=torch.float64)
    abar = SCHED.alphas_cumprod[k]
    x_t = abar.sqrt() * x0 + (1 - abar).sqrt() * eps
    return x0, eps, x_t, abar


@pytest.mark.parametrize("k", STEPS)
def test_eps_and_x0_come_back_from_x_t_and_the_prediction(k):
    x0, eps, x_t, abar = noised(k)
    v = abar.sqrt() * eps - (1 - abar).sqrt() * x0
    assert predicted_eps(SCHED, eps, x_t, k, "epsilon") is eps
    torch.testing.assert_close(predicted_eps(SCHED, v, x_t, k, "v"), eps, **FLOAT64_EXACT)
    # 1 / sqrt(abar) reaches 200 at k = 999: x0 back within 1e-10 (a few roundings of that size)
    torch.testing.assert_close(predicted_x0(SCHED, eps, x_t, k), x0, rtol=1e-10, atol=1e-10)
    per_sample = torch.full((3,), k)  # a (B,) index gathers (B, 1, 1, 1)
    torch.testing.assert_close(predicted_x0(SCHED, eps, x_t, per_sample),
                               predicted_x0(SCHED, eps, x_t, k), rtol=0, atol=0)


@pytest.mark.parametrize("k", STEPS)
def test_the_ddpm_mean_is_the_bayes_posterior_mean_and_the_variance_channels_interpolate(k):
    x0, _, x_t, abar = noised(k)
    beta, abar_prev = SCHED.betas[k], SCHED.alphas_cumprod_prev[k]
    # q(x_k | x_{k-1}) = N(sqrt(1 - beta) x_{k-1}, beta), q(x_{k-1} | x0) = N(sqrt(abar') x0,
    # 1 - abar'): their product in x_{k-1} has precision (1 - beta) / beta + 1 / (1 - abar').
    precision = (1 - beta) / beta + 1 / (1 - abar_prev)
    want = ((1 - beta).sqrt() / beta * x_t + abar_prev.sqrt() / (1 - abar_prev) * x0) / precision
    mean, log_var = ddpm_mean_log_variance(SCHED, x0, x_t, k, None)
    torch.testing.assert_close(mean, want, **FLOAT64_EXACT)
    assert log_var.item() == SCHED.large_log_variance[k].item()  # no channels: FIXED_LARGE
    ones = torch.ones_like(x0)
    low = ddpm_mean_log_variance(SCHED, x0, x_t, k, -ones)[1]
    high = ddpm_mean_log_variance(SCHED, x0, x_t, k, ones)[1]
    torch.testing.assert_close(low, (1 / precision).log().expand_as(x0), **FLOAT64_EXACT)
    torch.testing.assert_close(high, beta.log().expand_as(x0), **FLOAT64_EXACT)
    middle = ddpm_mean_log_variance(SCHED, x0, x_t, k, 0 * ones)[1]
    torch.testing.assert_close(middle, (low + high) / 2, **FLOAT64_EXACT)


@pytest.mark.parametrize("k", STEPS)
def test_ddim_with_eta_0_renoises_x0_with_the_same_eps_and_with_eta_1_is_the_ddpm_step(k):
    x0, eps, x_t, _ = noised(k)
    abar_prev = SCHED.alphas_cumprod_prev[k]
    torch.testing.assert_close(ddim_step(SCHED, x0, x_t, k, eta=0.0, noise=None),
                               abar_prev.sqrt() * x0 + (1 - abar_prev).sqrt() * eps,
                               rtol=1e-10, atol=1e-10)  # eps re-derived: see above
    mean, _ = ddpm_mean_log_variance(SCHED, x0, x_t, k, None)
    torch.testing.assert_close(ddim_step(SCHED, x0, x_t, k, eta=1.0, noise=None), mean,
                               rtol=1e-10, atol=1e-10)
    z = torch.randn_like(x0)
    noisy = ddim_step(SCHED, x0, x_t, k, eta=1.0, noise=z)
    torch.testing.assert_close(noisy - mean, SCHED.posterior_variance[k].sqrt() * z,
                               rtol=1e-10, atol=1e-10)


def test_split_output_takes_the_datas_shape_or_twice_its_channels_and_refuses_the_rest():
    x = torch.zeros(2, 3, 4, 4)
    same = torch.randn(2, 3, 4, 4)
    assert split_output(same, x) == (same, None)
    learned = torch.randn(2, 6, 4, 4)
    prediction, values = split_output(learned, x)
    assert torch.equal(prediction, learned[:, :3]) and torch.equal(values, learned[:, 3:])
    with pytest.raises(ValueError, match=r"shape \(2, 3, 4, 4\) .* or \(2, 6, 4, 4\) .* got "
                                         r"\(2, 5, 4, 4\)"):
        split_output(torch.zeros(2, 5, 4, 4), x)
    with pytest.raises(TypeError, match="model output must be a torch.Tensor, got list"):
        split_output([1.0], x)
