"""The variational bound's two Gaussian terms.

Oracles: torch.distributions' closed-form KL between two Normals; torch.special.ndtr for the
standard normal CDF (the tanh approximation's documented error, below 2e-4); and the identity
that the 256 bins partition the real line, so their probabilities add to one.
"""

from __future__ import annotations

import pytest
import torch
from tolerances import FLOAT64_EXACT

from addnorm.diffusion.likelihood import (
    approx_standard_normal_cdf,
    discretized_gaussian_log_likelihood,
    normal_kl,
)


def test_normal_kl_is_torch_distributions_kl_and_zero_between_equal_gaussians():
    g = torch.Generator().manual_seed(0)
    mean1, mean2 = torch.randn(2, 5, 7, generator=g, dtype=torch.float64)
    log_var1, log_var2 = torch.randn(2, 5, 7, generator=g, dtype=torch.float64)
    want = torch.distributions.kl_divergence(
        torch.distributions.Normal(mean1, (0.5 * log_var1).exp()),
        torch.distributions.Normal(mean2, (0.5 * log_var2).exp()),
    )
    torch.testing.assert_close(normal_kl(mean1, log_var1, mean2, log_var2), want, **FLOAT64_EXACT)
    assert normal_kl(mean1, log_var1, mean1, log_var1).abs().max() < 1e-15  # a few roundings
    # broadcasting: a (5, 1) second Gaussian against (5, 7)
    torch.testing.assert_close(
        normal_kl(mean1, log_var1, mean2[:, :1], log_var2[:, :1]),
        normal_kl(mean1, log_var1, mean2[:, :1].expand(5, 7), log_var2[:, :1].expand(5, 7)),
        rtol=0, atol=0)


def test_the_cdf_approximation_is_within_its_documented_error_of_the_exact_cdf():
    x = torch.linspace(-8, 8, 4001, dtype=torch.float64)
    error = (approx_standard_normal_cdf(x) - torch.special.ndtr(x)).abs().max().item()
    assert error < 2e-4
    assert approx_standard_normal_cdf(torch.zeros((), dtype=torch.float64)).item() == 0.5


@pytest.mark.parametrize("mean, log_scale", [(0.0, -1.0), (0.37, -4.0), (-0.9, 0.5)])
def test_the_256_bins_probabilities_add_to_one(mean, log_scale):
    # Bin i owns [x_i - 1/255, x_i + 1/255] with x_i = 2 i / 255 - 1, the edge bins extended
    # to -inf and +inf: neighbouring bins share their edges, so the sum telescopes to 1.
    # Each bin's probability is floored at 1e-12 (at most 256e-12 added), plus float64
    # rounding of 256 terms of size <= 1 (under 1e-12, as FLOAT64_EXACT).
    x = torch.arange(256, dtype=torch.float64) * 2 / 255 - 1
    means = torch.full_like(x, mean)
    log_scales = torch.full_like(x, log_scale)
    log_p = discretized_gaussian_log_likelihood(x, means=means, log_scales=log_scales)
    assert log_p.shape == (256,) and bool((log_p <= 0).all())
    assert log_p.exp().sum().item() == pytest.approx(1.0, abs=257e-12)


def test_a_narrow_gaussian_on_a_bin_puts_all_its_mass_there():
    x = torch.tensor([-1.0, 1 / 255, 1.0], dtype=torch.float64)  # the two edge bins, one inside
    log_p = discretized_gaussian_log_likelihood(x, means=x, log_scales=torch.full_like(x, -12.0))
    # std e^-12 ~ 6e-6 against a half-bin of 3.9e-3: P(bin) = 1 - tiny, log within 1e-12 of 0
    torch.testing.assert_close(log_p, torch.zeros_like(x), **FLOAT64_EXACT)
    far = discretized_gaussian_log_likelihood(x, means=-x, log_scales=torch.full_like(x, -12.0))
    assert bool((far[[0, 2]] == torch.log(torch.tensor(1e-12, dtype=torch.float64))).all())


def test_tensors_of_different_shapes_are_refused_naming_them():
    with pytest.raises(ValueError, match=r"x \(2, 3\), means \(2, 1\) and log_scales \(2, 3\)"):
        discretized_gaussian_log_likelihood(torch.zeros(2, 3), means=torch.zeros(2, 1),
                                            log_scales=torch.zeros(2, 3))
