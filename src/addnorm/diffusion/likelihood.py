"""The two Gaussian terms of the variational bound (Ho et al. 2020; Nichol & Dhariwal 2021).

All results are elementwise and in nats; :meth:`addnorm.diffusion.Diffusion.vb_term` averages
them and converts to bits.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["discretized_gaussian_log_likelihood", "normal_kl"]


def normal_kl(mean1: Tensor, log_var1: Tensor, mean2: Tensor, log_var2: Tensor) -> Tensor:
    """KL(N(mean1, e^log_var1) || N(mean2, e^log_var2)), elementwise, broadcasting."""
    return 0.5 * (
        -1.0
        + log_var2
        - log_var1
        + torch.exp(log_var1 - log_var2)
        + (mean1 - mean2) ** 2 * torch.exp(-log_var2)
    )


def approx_standard_normal_cdf(x: Tensor) -> Tensor:
    """Phi(x) ~ (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) / 2 (the tanh approximation the
    reference uses, the same as GELU's; its error is below 2e-4)."""
    return 0.5 * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def discretized_gaussian_log_likelihood(x: Tensor, *, means: Tensor, log_scales: Tensor) -> Tensor:
    """log P(bin of x) under N(means, exp(log_scales)^2), for data in [-1, 1] in 256 bins.

    ``x`` is taken as uint8 data scaled to [-1, 1]: each value owns the bin ``x +- 1/255``;
    the two edge bins extend to -inf (x < -0.999) and +inf (x > 0.999). Probabilities are
    floored at 1e-12 before the log. All three tensors share one shape.
    """
    if not x.shape == means.shape == log_scales.shape:
        raise ValueError(
            f"x {tuple(x.shape)}, means {tuple(means.shape)} and log_scales "
            f"{tuple(log_scales.shape)} must have one shape"
        )
    inv_std = torch.exp(-log_scales)
    cdf_upper = approx_standard_normal_cdf(inv_std * (x - means + 1.0 / 255.0))
    cdf_lower = approx_standard_normal_cdf(inv_std * (x - means - 1.0 / 255.0))
    log_below_upper = torch.log(cdf_upper.clamp(min=1e-12))  # lowest bin: (-inf, x + 1/255]
    log_above_lower = torch.log((1.0 - cdf_lower).clamp(min=1e-12))  # highest: [x - 1/255, inf)
    log_in_bin = torch.log((cdf_upper - cdf_lower).clamp(min=1e-12))
    return torch.where(
        x < -0.999, log_below_upper, torch.where(x > 0.999, log_above_lower, log_in_bin)
    )
