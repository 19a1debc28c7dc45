"""addnorm.inspection.statistics: each sum against a reference that computes the same quantity
another way.

Provenance: the scales a norm divides out are read off torch's own norms (``nn.LayerNorm``,
``nn.RMSNorm``, ``nn.GroupNorm``: ``(x - mean) / norm(x)`` is the divisor); BatchNorm's gap
from ``nn.BatchNorm1d`` (in eval mode it maps the batch mean to its shift in running
standard deviations; with momentum 1 it stores the batch's variance); the entropy is
``torch.distributions.Categorical``'s; the rest (RMS, active units) are float64 formulas on
the real tokens picked out by boolean indexing, where the module computes with masks. Float32
inputs against float64 references: ``FLOAT32_MODEL``.
"""

from __future__ import annotations

import math

import pytest
import torch
from tolerances import FLOAT32_MODEL
from torch import nn

from addnorm.inspection import statistics as stats


def _padded(batch=3, length=7, width=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, length, width, generator=gen) * 3 + 0.5  # (B, L, D)
    padding = torch.zeros(batch, length, dtype=torch.bool)
    padding[1, 4:] = True
    padding[2, 6:] = True
    x[padding] = float("nan")  # padding never enters a statistic
    return x, padding


def test_rms_is_taken_over_the_real_tokens_only():
    x, padding = _padded()
    sums = stats.rms_sums(x, stats.real_tokens(x, padding))
    real = x[~padding].double()  # (N, D)
    torch.testing.assert_close(sums["sq"] / sums["n"], real.square().mean(), **FLOAT32_MODEL)
    assert sums["n"].item() == real.numel()


def test_real_tokens_ignores_a_mask_that_does_not_fit():
    x, padding = _padded()
    assert stats.real_tokens(x, padding[:, :3]) is None
    assert stats.real_tokens(x[:, 0], padding) is None  # (B, D): every row is real


@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_per_token_scales_are_the_divisors_of_torchs_norms(kind):
    x, padding = _padded()
    eps = 1e-5
    sums = stats.scale_sums(kind, x, stats.real_tokens(x, padding), eps)
    real = x[~padding].double()  # (N, D)
    if kind == "layer":
        centred = real - real.mean(-1, keepdim=True)
        divisor = centred / nn.LayerNorm(16, eps=eps, elementwise_affine=False).double()(real)
    else:
        divisor = real / nn.RMSNorm(16, eps=eps, elementwise_affine=False).double()(real)
    scales = divisor[:, 0]  # (N,): every feature gives the same divisor
    torch.testing.assert_close(divisor, scales[:, None].expand_as(divisor))
    n = sums["n"]
    assert n.item() == len(scales)
    torch.testing.assert_close(sums["s1"] / n, scales.mean(), **FLOAT32_MODEL)
    torch.testing.assert_close(sums["s2"] / n, scales.square().mean(), **FLOAT32_MODEL)


def test_group_scales_are_nn_group_norms_divisors_and_ignore_padding():
    x, padding = _padded(width=8)
    groups, eps = 2, 1e-5
    sums = stats.scale_sums("group", x, stats.real_tokens(x, padding), eps, groups)
    scales = []
    for row, pad in zip(x.double(), padding, strict=True):
        real = row[~pad].T[None]  # (1, D, L_real): nn.GroupNorm's channels-first layout
        out = nn.GroupNorm(groups, 8, eps=eps, affine=False).double()(real)
        for g in range(groups):
            part = real[0, 4 * g : 4 * g + 4]  # (D/G, L_real)
            scales.append(((part - part.mean()) / out[0, 4 * g : 4 * g + 4])[0, 0])
    scales_t = torch.stack(scales)
    assert sums["n"].item() == len(scales)
    torch.testing.assert_close(sums["s1"] / sums["n"], scales_t.mean(), **FLOAT32_MODEL)
    torch.testing.assert_close(sums["s2"] / sums["n"], scales_t.square().mean(),
                               **FLOAT32_MODEL)


def test_batchnorm_gap_matches_nn_batchnorm():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(5, 6, 8, generator=gen) * 2 + 1  # (B, L, D)
    running_mean = torch.randn(8, generator=gen).double() * 0.3
    running_var = torch.rand(8, generator=gen).double() + 0.5
    sums = stats.batchnorm_sums(x, None, running_mean=running_mean.float(),
                                running_var=running_var.float(), eps=1e-5)
    tokens = x.double().reshape(-1, 8)  # (N, D)
    # eval mode, weight 1 and bias 0, maps the batch mean to its shift in running stds
    plain = nn.BatchNorm1d(8, eps=1e-5).double().eval()
    plain.running_mean.copy_(running_mean)
    plain.running_var.copy_(running_var)
    shift = plain(tokens.mean(0, keepdim=True))[0]  # (D,)
    torch.testing.assert_close(sums["gap"] / sums["features"], shift.square().mean(),
                               **FLOAT32_MODEL)
    # momentum 1 stores the batch's unbiased variance as the running one
    train = nn.BatchNorm1d(8, eps=1e-5, momentum=1.0).double().train()
    train(tokens)
    n = tokens.shape[0]
    batch_var = train.running_var * (n - 1) / n
    log_ratio = torch.log((batch_var + 1e-5) / (running_var + 1e-5))
    torch.testing.assert_close(sums["log_var"] / sums["features"], log_ratio.square().mean(),
                               **FLOAT32_MODEL)


def test_batchnorm_padding_is_left_out():
    x, padding = _padded(width=8)
    ones, zeros = torch.ones(8), torch.zeros(8)
    masked = stats.batchnorm_sums(x, stats.real_tokens(x, padding), running_mean=zeros,
                                  running_var=ones, eps=1e-5)
    alone = stats.batchnorm_sums(x[~padding][None], None, running_mean=zeros,
                                 running_var=ones, eps=1e-5)  # (1, N, D): the real tokens
    for key in masked:
        torch.testing.assert_close(masked[key], alone[key], **FLOAT32_MODEL)


def test_train_eval_gap_is_the_relative_distance_over_real_tokens():
    x, padding = _padded()
    y_eval = torch.where(torch.isnan(x), torch.zeros_like(x), x * 0.9)
    sums = stats.train_eval_sums(x, y_eval, stats.real_tokens(x, padding))
    real, real_eval = x[~padding].double(), y_eval[~padding].double()
    torch.testing.assert_close(sums["gap_sq"], (real - real_eval).square().sum(),
                               **FLOAT32_MODEL)
    torch.testing.assert_close(sums["signal_sq"], real.square().sum(), **FLOAT32_MODEL)


@pytest.mark.parametrize("shape", ["sequences", "vectors"])
def test_batch_effect_is_the_half_batches_output_difference_scaled_to_one_batch(shape):
    """The reference: each half's and the whole batch's real tokens picked out by boolean
    indexing, their means and biased variances from torch.var_mean in float64, the first-order
    move of every real token's output written out, and k^2 = n_A n_B / (n_A + n_B)^2."""
    if shape == "sequences":
        x, padding = _padded(batch=5, width=8)  # halves: samples 0-1 and 2-4
        real = ~padding
    else:
        x = torch.randn(7, 8, generator=torch.Generator().manual_seed(1)) * 2 + 1  # (B, D)
        real = torch.ones(7, dtype=torch.bool)
    weight = torch.linspace(0.5, 1.5, 8)
    train_eval = {"gap_sq": torch.tensor(3.0, dtype=torch.float64),
                  "signal_sq": torch.tensor(5.0, dtype=torch.float64)}
    sums = stats.batch_effect_sums(x, stats.real_tokens(x, padding) if shape == "sequences"
                                   else None, weight=weight, eps=1e-5, train_eval=train_eval)
    first = torch.arange(x.shape[0]) < x.shape[0] // 2
    halves = [(real & side.reshape(-1, *([1] * (real.ndim - 1)))) for side in (first, ~first)]
    tokens = x.double()[real]  # (N, D): every real token
    var, mean = torch.var_mean(tokens, dim=0, correction=0)
    sd = torch.sqrt(var + 1e-5)
    moments, counts = [], []
    for half in halves:
        var_h, mean_h = torch.var_mean(x.double()[half], dim=0, correction=0)
        moments.append((mean_h, torch.sqrt(var_h + 1e-5)))
        counts.append(half.sum().item())
    (mean_a, sd_a), (mean_b, sd_b) = moments
    move = weight.double() * ((mean_a - mean_b) + (tokens - mean) * (sd_a - sd_b) / sd) / sd
    k_sq = counts[0] * counts[1] / (counts[0] + counts[1]) ** 2
    expected = k_sq * move.square().sum()
    torch.testing.assert_close(sums["effect_sq"], expected, **FLOAT32_MODEL)
    assert sums["split_gap_sq"].item() == 3.0 and sums["split_signal_sq"].item() == 5.0


def test_batch_effect_is_zero_for_twin_halves_and_absent_without_two_samples():
    """Identities: a batch whose second half repeats its first has halves with the same
    statistics (effect 0 up to float32 rounding of the unit-size normalized values, ~1e-7
    each, so under 1e-8 summed in squares over these 224 values); one sample has no halves;
    a half that is all padding leaves the call out (all three sums 0)."""
    x = torch.randn(2, 7, 8, generator=torch.Generator().manual_seed(4))
    twins = torch.cat([x, x])  # (4, L, D)
    train_eval = {"gap_sq": torch.tensor(1.0, dtype=torch.float64),
                  "signal_sq": torch.tensor(2.0, dtype=torch.float64)}
    same = stats.batch_effect_sums(twins, None, weight=torch.ones(8), eps=1e-5,
                                   train_eval=train_eval)
    assert same["effect_sq"].item() < 1e-8 and same["split_signal_sq"].item() == 2.0
    assert stats.batch_effect_sums(x[:1], None, weight=torch.ones(8), eps=1e-5,
                                   train_eval=train_eval) == {}
    padding = torch.zeros(2, 7, dtype=torch.bool)
    padding[0] = True  # half A has no real token
    empty = stats.batch_effect_sums(x, stats.real_tokens(x, padding), weight=torch.ones(8),
                                    eps=1e-5, train_eval=train_eval)
    assert all(v.item() == 0.0 for v in empty.values())


def test_entropy_is_categoricals_over_real_rows_that_see_a_key():
    gen = torch.Generator().manual_seed(2)
    weights = torch.softmax(torch.randn(2, 3, 4, 5, generator=gen) * 2, -1)  # (B, H, L, S)
    weights[0, :, 1] = 0.0  # a row that sees no key
    weights[1, :, 2, 3:] = 0.0  # masked keys
    weights[1, :, 2] /= weights[1, :, 2].sum(-1, keepdim=True)
    real = torch.tensor([[True, True, True, True], [True, True, True, False]])  # (B, L)
    sums = stats.entropy_sums(weights, real)
    for head in range(3):
        rows = [(b, i) for b in range(2) for i in range(4) if real[b, i] and (b, i) != (0, 1)]
        entropies = [torch.distributions.Categorical(probs=weights[b, head, i].double())
                     .entropy() for b, i in rows]
        assert sums["rows"][head].item() == len(rows)
        torch.testing.assert_close(sums["entropy"][head] / sums["rows"][head],
                                   torch.stack(entropies).mean(), **FLOAT32_MODEL)
    uniform = stats.entropy_sums(torch.full((1, 1, 2, 8), 1 / 8), None)
    assert math.isclose(uniform["entropy"].item() / 2, math.log(8), rel_tol=1e-6)


def test_unit_outputs_are_each_units_largest_magnitude_over_real_tokens():
    x, padding = _padded()
    sums = stats.unit_output_sums(x, stats.real_tokens(x, padding))  # NaN padding left out
    real = x[~padding].double()  # (N, F)
    torch.testing.assert_close(sums["max_abs"], real.abs().amax(0))
    torch.testing.assert_close(sums["sq"], real.square().sum(), **FLOAT32_MODEL)
    assert sums["n"].item() == real.numel()


def test_active_counts_count_real_tokens_with_a_positive_preactivation():
    x, padding = _padded()
    h = torch.where(torch.isnan(x), torch.ones_like(x), x)  # padding would count as active
    sums = stats.active_counts(h, stats.real_tokens(h, padding))
    real = h[~padding]  # (N, F)
    torch.testing.assert_close(sums["active"], (real > 0).sum(0).double())
    assert sums["tokens"].item() == real.shape[0]
