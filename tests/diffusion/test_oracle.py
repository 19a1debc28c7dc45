"""Sampling from the exact noise predictor of Gaussian data.

For x0 ~ N(mu, s^2), x_t = sqrt(abar) x0 + sqrt(1 - abar) eps is Gaussian too, and the
optimal (MMSE) noise predictor is linear:

    eps*(x_t, t) = sqrt(1 - abar) (x_t - sqrt(abar) mu) / (abar s^2 + 1 - abar).

Oracles: the sample mean and standard deviation, within 4 standard errors (s / sqrt(N) for
the mean, s / sqrt(2N) for the std) for 1000-step DDPM and DDIM; and for DDIM with 50 steps,
which is a deterministic affine map x_T -> A x_T + b for this predictor, the map itself,
restated as a scalar recursion in float64. That map is *not* the data distribution: with 50
steps DDIM's discretisation error leaves |A| below s (0.275 vs 0.3 here), shrinking as the
steps grow; the tests pin the map and the trend rather than a tolerance that would hide it.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from tolerances import FLOAT64_EXACT

from addnorm.diffusion import Diffusion

ABAR = np.cumprod(1.0 - np.linspace(1e-4, 0.02, 1000))  # DiT's linear schedule


def optimal_eps(mu: torch.Tensor, s: torch.Tensor):
    abar_table = torch.from_numpy(ABAR)

    def eps_fn(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        abar = abar_table[t[:1]].to(x.dtype).unsqueeze(1)  # (1, 1): samplers give one t
        return (1 - abar).sqrt() * (x - abar.sqrt() * mu) / (abar * s**2 + 1 - abar)

    return eps_fn


def assert_mean_and_std(samples: torch.Tensor, mu: torch.Tensor, s: torch.Tensor) -> None:
    # 4 standard errors of the mean and of the std (two-sided false alarm 6e-5 per check, the
    # seeds fixed); the 1000-step bias (DDIM: 0.5% of s, below) and float32 rounding are far
    # smaller than 4 * s / sqrt(2 n), >= 2% of s here.
    n = samples.shape[0]
    mean, std = samples.double().mean(0), samples.double().std(0)
    assert ((mean - mu).abs() < 4 * s / math.sqrt(n)).all(), (mean, mu)
    assert ((std - s).abs() < 4 * s / math.sqrt(2 * n)).all(), (std, s)


def test_ddpm_1000_steps_samples_the_data_distribution():
    mu, s = torch.tensor([0.5]), torch.tensor([0.3])
    x_T = torch.randn(20000, 1, generator=torch.Generator().manual_seed(0))
    samples = Diffusion().sample(
        optimal_eps(mu, s), x_T, generator=torch.Generator().manual_seed(1)
    )
    assert_mean_and_std(samples, mu, s)


def test_ddpm_samples_each_dimension_of_a_diagonal_gaussian():
    mu, s = torch.tensor([0.5, -1.0, 2.0, 0.0]), torch.tensor([0.3, 1.0, 0.5, 2.0])
    x_T = torch.randn(4000, 4, generator=torch.Generator().manual_seed(2))
    samples = Diffusion().sample(
        optimal_eps(mu, s), x_T, generator=torch.Generator().manual_seed(3)
    )
    assert_mean_and_std(samples, mu, s)


def test_ddim_1000_steps_samples_the_data_distribution():
    mu, s = torch.tensor([0.5, -1.0, 2.0, 0.0]), torch.tensor([0.3, 1.0, 0.5, 2.0])
    x_T = torch.randn(4000, 4, generator=torch.Generator().manual_seed(4))
    samples = Diffusion().sample(optimal_eps(mu, s), x_T, method="ddim")
    assert_mean_and_std(samples, mu, s)


def ddim_affine_map(mu: float, s: float, kept: list[int]) -> tuple[float, float]:
    """(A, b) with DDIM(x_T) = A x_T + b for the optimal predictor, in float64 scalars."""
    a_map, b_map = 1.0, 0.0
    for k in reversed(range(len(kept))):
        abar = ABAR[kept[k]]
        abar_prev = ABAR[kept[k - 1]] if k > 0 else 1.0
        c = math.sqrt(1 - abar) / (abar * s**2 + 1 - abar)  # eps = c x - c sqrt(abar) mu
        x0_a, x0_b = (1 - math.sqrt(1 - abar) * c) / math.sqrt(abar), math.sqrt(1 - abar) * c * mu
        eps_a, eps_b = c, -c * math.sqrt(abar) * mu
        step_a = math.sqrt(abar_prev) * x0_a + math.sqrt(1 - abar_prev) * eps_a
        step_b = math.sqrt(abar_prev) * x0_b + math.sqrt(1 - abar_prev) * eps_b
        a_map, b_map = step_a * a_map, step_a * b_map + step_b
    return a_map, b_map


def test_ddim_50_steps_is_the_exact_affine_map_of_its_start():
    mu, s = 0.5, 0.3
    x_T = torch.randn(5000, 1, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    samples = Diffusion().sample(
        optimal_eps(torch.tensor(mu, dtype=torch.float64), torch.tensor(s, dtype=torch.float64)),
        x_T,
        steps=50,
        method="ddim",
    )
    a_map, b_map = ddim_affine_map(mu, s, list(range(0, 1000, 20)))
    # float64, 50 steps of a few roundings each (~500 u on unit-scale values): FLOAT64_EXACT.
    torch.testing.assert_close(samples, a_map * x_T + b_map, **FLOAT64_EXACT)
    # So the samples' std is A times the start's, exactly: a 50-step deficit, not noise.
    assert math.isclose(samples.std().item(), a_map * x_T.std().item(), rel_tol=1e-12)


def test_ddim_spread_converges_to_the_data_spread_as_steps_grow():
    mu, s = 0.5, 0.3
    deficits = [
        s - ddim_affine_map(mu, s, list(range(0, 1000, 1000 // steps)))[0]
        for steps in (50, 250, 1000)
    ]
    assert deficits[0] > deficits[1] > deficits[2] > 0
    assert deficits[0] / s < 0.1 and deficits[2] / s < 0.01  # 8.3%, 1.8%, 0.5%
