"""The forward process, the regression targets and the training loss of ``Diffusion``.

Oracles: the closed form of q(x_t | x_0) at steps whose abar is known by hand; the identities
that define v; and DiT's ``training_losses`` / ``_vb_terms_bpd`` / ``normal_kl`` /
``discretized_gaussian_log_likelihood`` (``diffusion/gaussian_diffusion.py`` and
``diffusion_utils.py``), restated below in plain torch from numpy float64 tables.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from tolerances import FLOAT32_MODEL, FLOAT64_EXACT

from addnorm.diffusion import Diffusion

BETAS = np.linspace(1e-4, 0.02, 1000, dtype=np.float64)  # DiT's linear schedule


def data(dtype=torch.float64, shape=(5, 2, 3, 3), seed=0):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.rand(shape, generator=g, dtype=dtype) * 2 - 1
    x0.view(-1)[:3] = torch.tensor([-1.0, 1.0, 0.0], dtype=dtype)  # both edge bins of the NLL
    noise = torch.randn(shape, generator=g, dtype=dtype)
    return x0, noise, g


def test_q_sample_at_the_first_two_steps():
    # abar_0 = 1 - 1e-4; abar_1 = (1 - 1e-4)(1 - beta_1), beta_1 = 1e-4 + (0.02 - 1e-4) / 999.
    x0, noise, _ = data(shape=(2, 3))
    abar = [1 - 1e-4, (1 - 1e-4) * (1 - (1e-4 + 0.0199 / 999))]
    x_t = Diffusion().q_sample(x0, torch.tensor([0, 1]), noise)
    for row in (0, 1):
        expected = math.sqrt(abar[row]) * x0[row] + math.sqrt(1 - abar[row]) * noise[row]
        # No reduction: correctly rounded IEEE ops (NumPy's linspace and cumprod, sqrt, *, +)
        # on any machine; the by-hand abar agrees to the bit, so one ulp (1.1e-16) remains.
        torch.testing.assert_close(x_t[row], expected, rtol=0, atol=1e-15)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_q_sample_equals_dits_with_its_casting(dtype):
    x0, noise, _ = data(dtype)
    t = torch.tensor([0, 1, 10, 500, 999])
    abar = torch.from_numpy(np.cumprod(1 - BETAS))[t].view(-1, 1, 1, 1)
    # The reference takes the square roots in float64, then casts to float32 (for any data).
    expected = abar.sqrt().to(dtype) * x0 + (1 - abar).sqrt().to(dtype) * noise
    got = Diffusion().q_sample(x0, t, noise)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)  # the same elementwise ops


def test_epsilon_loss_is_zero_for_the_true_noise_and_the_mse_otherwise():
    x0, noise, g = data()
    t = torch.tensor([0, 3, 100, 600, 999])
    diffusion = Diffusion()
    assert diffusion.loss(noise, x0, t, noise).item() == 0.0
    guess = torch.randn(x0.shape, generator=g, dtype=x0.dtype)
    per_sample = ((guess - noise) ** 2).flatten(1).mean(1)
    per_row = diffusion.loss(guess, x0, t, noise, reduction="none")
    torch.testing.assert_close(per_row, per_sample, **FLOAT64_EXACT)  # float64 means
    torch.testing.assert_close(diffusion.loss(guess, x0, t, noise), per_sample.mean(),
                               **FLOAT64_EXACT)


def test_v_target_satisfies_the_identities_that_define_it():
    x0, noise, _ = data()
    t = torch.tensor([0, 3, 100, 600, 999])
    diffusion = Diffusion(prediction="v")
    v, x_t = diffusion.target(x0, t, noise), diffusion.q_sample(x0, t, noise)
    abar = torch.from_numpy(np.cumprod(1 - BETAS))[t].view(-1, 1, 1, 1)
    # float64, a few roundings of unit-scale values per element: FLOAT64_EXACT.
    torch.testing.assert_close(v, abar.sqrt() * noise - (1 - abar).sqrt() * x0, **FLOAT64_EXACT)
    torch.testing.assert_close(abar.sqrt() * x_t - (1 - abar).sqrt() * v, x0, **FLOAT64_EXACT)
    torch.testing.assert_close(abar.sqrt() * v + (1 - abar).sqrt() * x_t, noise,
                               **FLOAT64_EXACT)
    assert diffusion.loss(v, x0, t, noise).item() == 0.0
    assert torch.equal(Diffusion().target(x0, t, noise), noise)


# --------------------------------------------------- the variational bound, restated from DiT


def ref_extract(table, t, x):
    value = torch.from_numpy(table)[t]
    return (value.float() if x.dtype == torch.float32 else value).view(-1, *[1] * (x.ndim - 1))


def ref_normal_kl(mean1, logvar1, mean2, logvar2):
    return 0.5 * (
        -1.0
        + logvar2
        - logvar1
        + torch.exp(logvar1 - logvar2)
        + ((mean1 - mean2) ** 2) * torch.exp(-logvar2)
    )


def ref_discretized_log_likelihood(x, means, log_scales):
    def cdf(v):
        return 0.5 * (1.0 + torch.tanh(np.sqrt(2.0 / np.pi) * (v + 0.044715 * torch.pow(v, 3))))

    centered, inv_std = x - means, torch.exp(-log_scales)
    cdf_plus = cdf(inv_std * (centered + 1.0 / 255.0))
    cdf_min = cdf(inv_std * (centered - 1.0 / 255.0))
    log_cdf_plus = torch.log(cdf_plus.clamp(min=1e-12))
    log_one_minus_cdf_min = torch.log((1.0 - cdf_min).clamp(min=1e-12))
    log_delta = torch.log((cdf_plus - cdf_min).clamp(min=1e-12))
    return torch.where(
        x < -0.999, log_cdf_plus, torch.where(x > 0.999, log_one_minus_cdf_min, log_delta)
    )


def ref_vb_bits(output, x0, t, noise):
    """_vb_terms_bpd with the model output frozen, as training_losses calls it."""
    abar = np.cumprod(1 - BETAS)
    abar_prev = np.append(1.0, abar[:-1])
    post_var = BETAS * (1 - abar_prev) / (1 - abar)
    post_log_var = np.log(np.append(post_var[1], post_var[1:]))
    coef1 = BETAS * np.sqrt(abar_prev) / (1 - abar)
    coef2 = (1 - abar_prev) * np.sqrt(1 - BETAS) / (1 - abar)

    def ex(table):
        return ref_extract(table, t, x0)

    x_t = ex(np.sqrt(abar)) * x0 + ex(np.sqrt(1 - abar)) * noise
    eps, values = output.chunk(2, dim=1)
    true_mean = ex(coef1) * x0 + ex(coef2) * x_t
    frac = (values + 1) / 2
    log_var = frac * ex(np.log(BETAS)) + (1 - frac) * ex(post_log_var)
    x0_pred = ex(np.sqrt(1 / abar)) * x_t - ex(np.sqrt(1 / abar - 1)) * eps
    mean = ex(coef1) * x0_pred + ex(coef2) * x_t
    kl = ref_normal_kl(true_mean, ex(post_log_var), mean, log_var).flatten(1).mean(1) / np.log(2)
    nll = -ref_discretized_log_likelihood(x0, mean, 0.5 * log_var).flatten(1).mean(1) / np.log(2)
    return torch.where(t == 0, nll, kl)


def model_output(x0, g):
    eps = torch.randn(x0.shape, generator=g, dtype=x0.dtype)
    values = torch.rand(x0.shape, generator=g, dtype=x0.dtype) * 2 - 1
    return torch.cat([eps, values], dim=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_vb_term_equals_dits_vb_terms_bpd(dtype):
    x0, noise, g = data(dtype)
    output = model_output(x0, g)
    diffusion = Diffusion()
    for t in (torch.tensor([0, 0, 1, 500, 999]), torch.tensor([0, 2, 30, 0, 998])):
        expected = ref_vb_bits(output, x0, t, noise)
        # Each float32 evaluation is 1.8e-6 from float64 here (logs of CDF differences amplify
        # rounding); two in different op orders: FLOAT32_MODEL (ours and the reference happen
        # to run the same ops today, so they agree to the bit). float64: FLOAT64_EXACT.
        tol = FLOAT32_MODEL if dtype == torch.float32 else FLOAT64_EXACT
        torch.testing.assert_close(diffusion.vb_term(output, x0, t, noise), expected, **tol)
        assert (expected[t == 0] > 1).all()  # the decoder NLL, not a near-zero KL


def test_learned_variance_loss_is_mse_plus_vb_with_the_prediction_detached():
    x0, noise, g = data()
    t = torch.tensor([0, 3, 100, 600, 999])
    output = model_output(x0, g).requires_grad_()
    diffusion = Diffusion()
    per_sample = diffusion.loss(output, x0, t, noise, reduction="none")
    mse = ((output[:, :2] - noise) ** 2).flatten(1).mean(1)
    torch.testing.assert_close(per_sample, mse + ref_vb_bits(output, x0, t, noise),
                               **FLOAT64_EXACT)  # float64
    # Gradients: the prediction half learns from the mse only, the variance half from vb only.
    (grad,) = torch.autograd.grad(per_sample.sum(), output)
    (mse_grad,) = torch.autograd.grad(mse.sum(), output)
    (vb_grad,) = torch.autograd.grad(diffusion.vb_term(output, x0, t, noise).sum(), output)
    torch.testing.assert_close(grad[:, :2], mse_grad[:, :2], **FLOAT64_EXACT)
    torch.testing.assert_close(grad[:, 2:], vb_grad[:, 2:], **FLOAT64_EXACT)
    assert vb_grad[:, :2].abs().sum() > 0  # vb_term alone does reach the prediction


def test_v_prediction_vb_term_reads_the_noise_the_v_implies():
    x0, noise, g = data()
    t = torch.tensor([0, 3, 100, 600, 999])
    output = model_output(x0, g)
    eps, values = output.chunk(2, dim=1)
    abar = torch.from_numpy(np.cumprod(1 - BETAS))[t].view(-1, 1, 1, 1)
    x_t = Diffusion().q_sample(x0, t, noise)
    v = (eps - (1 - abar).sqrt() * x_t) / abar.sqrt()  # eps = sqrt(abar) v + sqrt(1-abar) x_t
    torch.testing.assert_close(
        Diffusion(prediction="v").vb_term(torch.cat([v, values], 1), x0, t, noise),
        Diffusion().vb_term(output, x0, t, noise),
        **FLOAT64_EXACT,  # float64; v -> eps costs a few roundings (measured: bitwise)
    )


@pytest.mark.parametrize(
    "call, error, message",
    [
        (
            lambda d, x, t, n: d.q_sample(x, t, n[:, :1]),
            ValueError,
            r"noise shape \(5, 1, 3, 3\) must equal x0 shape \(5, 2, 3, 3\)",
        ),
        (
            lambda d, x, t, n: d.q_sample(x, t + 995, n),
            ValueError,
            r"t must lie in \[0, 999\], got values in \[995, 1000\]",
        ),
        (lambda d, x, t, n: d.q_sample(x, t - 1, n), ValueError, r"got values in \[-1, 4\]"),
        (lambda d, x, t, n: d.q_sample(x, t.double(), n), TypeError, "t must be an integer"),
        (lambda d, x, t, n: d.q_sample(x, t[:3], n), ValueError, r"t must have shape \(5,\)"),
        (
            lambda d, x, t, n: d.q_sample(x[:, 0, 0, 0], t, n[:, 0, 0, 0]),
            ValueError,
            r"x0 must have shape \(B, C, ...\), got \(5,\)",
        ),
        (
            lambda d, x, t, n: d.loss(n[:, :, :2], x, t, n),
            ValueError,
            r"output must have shape \(5, 2, 3, 3\) .* or \(5, 4, 3, 3\) .* got \(5, 2, 2, 3\)",
        ),
        (
            lambda d, x, t, n: d.vb_term(n, x, t, n),
            ValueError,
            r"vb_term needs .* \(5, 4, 3, 3\), got \(5, 2, 3, 3\)",
        ),
        (
            lambda d, x, t, n: d.loss(n, x, t, n, reduction="sum"),
            ValueError,
            "reduction must be one of 'mean', 'none'; got 'sum'",
        ),
    ],
)
def test_bad_inputs_are_refused_naming_the_values(call, error, message):
    x0, noise, _ = data()
    with pytest.raises(error, match=message):
        call(Diffusion(), x0, torch.tensor([0, 1, 2, 5, 3]), noise)


@pytest.mark.parametrize(
    ("gamma", "error", "message"),
    [(0.0, ValueError, "min_snr_gamma must be > 0"), (-5, ValueError, "must be > 0"),
     (float("inf"), ValueError, "must be finite"), ("5", TypeError, "must be a number")],
)
def test_min_snr_gamma_must_be_a_positive_number(gamma, error, message):
    with pytest.raises(error, match=message):
        Diffusion(min_snr_gamma=gamma)


@pytest.mark.parametrize("prediction", ["epsilon", "v"])
def test_a_min_snr_weight_scales_each_samples_loss_and_a_huge_gamma_only_rescales_v(prediction):
    # Identity: the weighted per-sample loss is w(t) times the unweighted one. With gamma far
    # above every step's SNR, min(SNR, gamma) = SNR: w = 1 for eps, SNR / (SNR + 1) = abar for
    # v (both float64 products of the same numbers: FLOAT64_EXACT).
    x0, noise, _ = data()
    t = torch.tensor([0, 1, 2, 500, 999])
    output = torch.randn_like(x0, dtype=torch.float64)
    x0, noise = x0.double(), noise.double()
    plain = Diffusion(prediction=prediction).loss(output, x0, t, noise, reduction="none")
    huge = Diffusion(prediction=prediction, min_snr_gamma=1e30)
    weighted = huge.loss(output, x0, t, noise, reduction="none")
    abar = huge.noise_schedule.alphas_cumprod[t]
    expected = plain if prediction == "epsilon" else plain * abar
    torch.testing.assert_close(weighted, expected, **FLOAT64_EXACT)


@pytest.mark.parametrize("prediction", ["epsilon", "v"])
@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_a_gamma_whose_weights_underflow_float32_is_refused_naming_the_least_one(
    prediction, schedule
):
    # Oracle: the weights in float64 (the formula) against float32's smallest normal number.
    # At gamma 1e-300 every weight is below 1e-296: as float32, every loss would be 0. The
    # least weight is at step 0, the largest SNR (about 1e4 for linear, 2.4e4 for cosine).
    with pytest.raises(ValueError, match=r"min_snr_gamma \(1e-300\) weights the loss at step 0 "
                       r"by \d(\.\d+)?e-30\d, below float32's smallest normal number"):
        Diffusion(schedule=schedule, prediction=prediction, min_snr_gamma=1e-300)
    with pytest.raises(ValueError) as refused:
        Diffusion(schedule=schedule, prediction=prediction, min_snr_gamma=1e-36)
    least = float(str(refused.value).split("use min_snr_gamma >= ")[1].split()[0])
    accepted = Diffusion(schedule=schedule, prediction=prediction, min_snr_gamma=least)
    weights = accepted._loss_weight(torch.arange(accepted.n_steps)).float()
    assert weights.min() >= torch.finfo(torch.float32).tiny  # every weight a normal float32
    # and the named bound is tight to its 3 printed digits: 1% less is refused
    with pytest.raises(ValueError, match="below float32's smallest normal number"):
        Diffusion(schedule=schedule, prediction=prediction, min_snr_gamma=least * 0.99)


def test_a_tiny_but_representable_gamma_still_trains_every_step():
    # The loss of a (B,) batch at gamma 1e-30 is positive wherever the error is: no weight is 0.
    x0, noise, _ = data()
    t = torch.tensor([0, 1, 2, 500, 999])
    output = torch.randn_like(x0)
    loss = Diffusion(min_snr_gamma=1e-30).loss(output, x0, t, noise, reduction="none")
    assert (loss > 0).all()
