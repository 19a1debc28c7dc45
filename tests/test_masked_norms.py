"""Tests for addnorm.masked_norms: BatchNorm and GroupNorm, the norms that leave padding out of
their statistics, against SPEC section 3 and torch's built-in norms.

Provenance of expected values: SPEC worked examples (seed 003) to the printed digits, torch's
nn.BatchNorm1d / nn.GroupNorm given the same parameters, and invariants (padding invariance,
normalization of the real tokens gathered alone).
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from norm_inputs import (
    DEVICES,
    F64,
    LOW,
    LOW_TOL,
    SPEC_X,
    bn_reference,
    gn_reference,
    padded_batch,
    randomize_parameters,
)
from properties import examples
from tolerances import FLOAT64_EXACT
from torch import nn

from addnorm.masked_norms import BatchNorm, GroupNorm

# ---------------------------------------------------------------- SPEC worked example


def test_batchnorm_reproduces_the_spec_worked_example():
    """SPEC 3: mu = [2, 4], sigma^2 = [2/3, 8/3], x_hat = +-1.2247 / 0 (eps ignored)."""
    bn = BatchNorm(2, eps=0.0, momentum=1.0).double()
    y = bn(torch.tensor(SPEC_X, dtype=F64))
    expected = torch.tensor([[-1.2247, -1.2247], [0.0, 0.0], [1.2247, 1.2247]], dtype=F64)
    torch.testing.assert_close(y, expected, atol=5e-5, rtol=0)  # half the 4th printed decimal
    # momentum=1 stores this batch's statistics: the mean, and the variance made unbiased
    # (sigma^2 * n / (n - 1) = [2/3, 8/3] * 3/2 = [1, 4]).
    torch.testing.assert_close(
        bn.running_mean, torch.tensor([2.0, 4.0], dtype=F64), **FLOAT64_EXACT
    )
    torch.testing.assert_close(
        bn.running_var, torch.tensor([2 / 3, 8 / 3], dtype=F64) * 1.5, **FLOAT64_EXACT
    )


# ---------------------------------------------------------------- BatchNorm


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("momentum", [0.1, None, 1.0])
@pytest.mark.parametrize("shape", [(6, 8), (3, 5, 8), (1, 5, 8)])
def test_batchnorm_equals_nn_batchnorm1d_over_training_steps_and_in_eval(shape, momentum, device):
    """Outputs, gradients, running stats and the step count match nn.BatchNorm1d."""
    ours = randomize_parameters(BatchNorm(8, eps=1e-3, momentum=momentum), 5).double().to(device)
    ref = nn.BatchNorm1d(8, eps=1e-3, momentum=momentum).double().to(device)
    ref.load_state_dict(ours.state_dict(), strict=True)
    gen = torch.Generator().manual_seed(6)
    for step in range(4):
        x = (torch.randn(shape, generator=gen, dtype=F64) * (step + 1) + step).to(device)
        x_ours, x_ref = x.clone().requires_grad_(), x.clone().requires_grad_()
        y_ours, y_ref = ours(x_ours), bn_reference(x_ref, ref)
        torch.testing.assert_close(y_ours, y_ref, **FLOAT64_EXACT)
        weights = torch.randn(shape, generator=gen, dtype=F64).to(device)
        (y_ours * weights).sum().backward()
        (y_ref * weights).sum().backward()
        torch.testing.assert_close(x_ours.grad, x_ref.grad, **FLOAT64_EXACT)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(ours, name), getattr(ref, name), **FLOAT64_EXACT)
    torch.testing.assert_close(ours.weight.grad, ref.weight.grad, **FLOAT64_EXACT)
    ours.eval(), ref.eval()
    x = torch.randn(shape, dtype=F64, device=device)
    torch.testing.assert_close(ours(x), bn_reference(x, ref), **FLOAT64_EXACT)


def test_batchnorm_state_dict_loads_both_ways_with_nn_batchnorm1d():
    trained = nn.BatchNorm1d(8).double()
    randomize_parameters(trained, seed=7)
    for _ in range(3):
        trained(torch.randn(10, 8, dtype=F64) * 2 + 1)
    ours = BatchNorm(8).double()
    ours.load_state_dict(trained.state_dict(), strict=True)
    back = nn.BatchNorm1d(8).double()
    back.load_state_dict(ours.state_dict(), strict=True)
    assert set(ours.state_dict()) == set(trained.state_dict())
    ours.eval(), trained.eval(), back.eval()
    x = torch.randn(4, 8, dtype=F64)
    torch.testing.assert_close(ours(x), trained(x), **FLOAT64_EXACT)
    torch.testing.assert_close(back(x), trained(x), **FLOAT64_EXACT)


def test_batchnorm_with_one_vector_refuses_training_like_torch_and_works_in_eval():
    """SPEC 3/claim 6, batch size 1: one value per feature has no variance to estimate."""
    x = torch.randn(1, 8, dtype=F64)
    ref = nn.BatchNorm1d(8).double()
    with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
        ref(x)
    ours = BatchNorm(8).double()
    with pytest.raises(ValueError, match=r"more than 1 real value per feature.*got 1"):
        ours(x)
    with pytest.raises(ValueError, match="got 1"):
        ours(x[:, None])  # (1, 1, D): one token is one value per feature too
    assert int(ours.num_batches_tracked) == 0, "a refused batch must not touch running stats"
    ours.eval(), ref.eval()
    torch.testing.assert_close(ours(x), ref(x), **FLOAT64_EXACT)


def test_batchnorm_train_eval_gap_comes_from_the_running_statistics():
    """SPEC claim 6: eval normalizes with running stats, training with the batch's."""
    bn = BatchNorm(4, momentum=0.1).double()
    x = torch.randn(16, 4, dtype=F64) * 3 + 2
    y_train = bn(x)
    bn.eval()
    y_eval = bn(x)
    assert not torch.allclose(y_train, y_eval)  # O(1) apart: batch vs running statistics
    # After one step from (mean 0, var 1), running = 0.9 * init + 0.1 * batch statistics.
    mean, var = x.mean(0), x.var(0, correction=1)
    expected = (x - 0.1 * mean) / torch.sqrt(0.9 + 0.1 * var + bn.eps)
    torch.testing.assert_close(y_eval, expected, **FLOAT64_EXACT)


# ---------------------------------------------------------------- masked BatchNorm


def test_unmasked_batchnorm_output_for_a_sentence_changes_with_padding():
    """SPEC claim 5 (seed 003): without a mask, padding enters the statistics."""
    bn = BatchNorm(8).double()
    short, _ = padded_batch([4, 1, 6], max_len=6, d_model=8, seed=8, fill=0.0)
    longer, _ = padded_batch([4, 1, 6], max_len=12, d_model=8, seed=8, fill=0.0)
    longer[:, :6] = short
    out_short, out_long = bn(short), bn(longer)
    # float64, deterministic (seeded): 1.13 measured; 6 extra zero rows shift each feature's
    # mean and variance by O(1), nowhere near rounding.
    assert (out_short[0, :4] - out_long[0, :4]).abs().max() > 0.1


def test_masked_batchnorm_output_for_a_sentence_ignores_padding():
    """SPEC claim 5 fixed: with padding_mask the statistics see real tokens only."""
    bn = randomize_parameters(BatchNorm(8), seed=9).double()
    short, mask_short = padded_batch([4, 1, 6], max_len=6, d_model=8, seed=10, fill=0.0)
    longer, mask_long = padded_batch([4, 1, 6, 0], max_len=12, d_model=8, seed=11, fill=1e6)
    longer[:3, :6] = torch.where(mask_short[..., None], longer[:3, :6], short)
    out_short = bn(short, padding_mask=mask_short)
    out_long = bn(longer, padding_mask=mask_long)
    real = ~mask_short
    torch.testing.assert_close(out_long[:3, :6][real], out_short[real], **FLOAT64_EXACT)


@pytest.mark.parametrize("momentum", [0.1, None])
def test_masked_batchnorm_equals_nn_batchnorm1d_on_the_real_tokens_alone(momentum):
    """Gathering the real tokens into (N, D) and using nn.BatchNorm1d is the reference.

    Padding holds 1e6: it must enter neither the output of real tokens, nor their gradient,
    nor the running statistics. Sentence 4 is all padding and contributes nothing.
    """
    ours = randomize_parameters(BatchNorm(8, momentum=momentum), seed=12).double()
    ref = nn.BatchNorm1d(8, momentum=momentum).double()
    ref.load_state_dict(ours.state_dict())
    for step, lengths in enumerate([[4, 1, 6, 0], [2, 5, 5, 3], [6, 6, 1, 0]]):
        x, padding_mask = padded_batch(lengths, 6, 8, seed=13 + step, fill=1e6)
        x.requires_grad_()
        real = ~padding_mask
        gathered = x.detach()[real].requires_grad_()  # (N, D)
        y_ours, y_ref = ours(x, padding_mask=padding_mask)[real], ref(gathered)
        torch.testing.assert_close(y_ours, y_ref, **FLOAT64_EXACT)
        upstream = torch.randn_like(y_ref)
        (y_ours * upstream).sum().backward()
        (y_ref * upstream).sum().backward()
        torch.testing.assert_close(x.grad[real], gathered.grad, **FLOAT64_EXACT)
        assert torch.all(x.grad[padding_mask] == 0)
    torch.testing.assert_close(ours.running_mean, ref.running_mean, **FLOAT64_EXACT)
    torch.testing.assert_close(ours.running_var, ref.running_var, **FLOAT64_EXACT)
    torch.testing.assert_close(ours.num_batches_tracked, ref.num_batches_tracked)


def test_masked_batchnorm_normalizes_padding_with_the_real_tokens_statistics():
    """Documented choice: padding gets the same per-feature affine map as real tokens."""
    bn = randomize_parameters(BatchNorm(8, eps=1e-3), seed=16).double()
    x, padding_mask = padded_batch([4, 1, 6], max_len=6, d_model=8, seed=17, fill=0.0)
    x = x + 3.0 * padding_mask[..., None]  # padding holds 3, far from the real mean
    y = bn(x, padding_mask=padding_mask)
    var, mean = torch.var_mean(x[~padding_mask], dim=0, correction=0)
    expected = bn.weight * (x - mean) / torch.sqrt(var + bn.eps) + bn.bias
    torch.testing.assert_close(y, expected, **FLOAT64_EXACT)


@pytest.mark.parametrize("lengths", [[1, 0, 0], [0, 0, 0]])
def test_masked_batchnorm_refuses_fewer_than_two_real_tokens_in_training(lengths):
    bn = BatchNorm(8).double()
    x, padding_mask = padded_batch(lengths, max_len=4, d_model=8, seed=18, fill=0.0)
    with pytest.raises(ValueError, match=f"got {sum(lengths)}"):
        bn(x, padding_mask=padding_mask)
    bn.eval()
    assert torch.isfinite(bn(x, padding_mask=padding_mask)).all()


@examples(30)
@given(
    lengths=st.lists(st.integers(0, 5), min_size=1, max_size=4).filter(lambda ls: sum(ls) >= 2),
    extra=st.integers(0, 4),
)
def test_masked_batchnorm_is_invariant_to_extra_padding(lengths, extra):
    """Appending padding columns never changes the output at real tokens (claim 5)."""
    bn = BatchNorm(4).double()
    x, mask = padded_batch(lengths, max_len=5, d_model=4, seed=19, fill=0.0)
    x_long, mask_long = padded_batch(lengths, max_len=5 + extra, d_model=4, seed=20, fill=-9.0)
    x_long[:, :5] = torch.where(mask[..., None], x_long[:, :5], x)
    y, y_long = bn(x, padding_mask=mask), bn(x_long, padding_mask=mask_long)
    torch.testing.assert_close(y_long[:, :5][~mask], y[~mask], **FLOAT64_EXACT)


# ---------------------------------------------------------------- GroupNorm


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n_groups", [1, 2, 8])
@pytest.mark.parametrize("shape", [(3, 5, 8), (4, 8)])
def test_groupnorm_equals_nn_groupnorm_and_shares_its_state_dict(shape, n_groups, device):
    ours = randomize_parameters(GroupNorm(n_groups, 8, eps=1e-3), seed=21).double().to(device)
    ref = nn.GroupNorm(n_groups, 8, eps=1e-3).double().to(device)
    ref.load_state_dict(ours.state_dict(), strict=True)
    x = torch.randn(shape, dtype=F64, device=device) * 2 + 1
    torch.testing.assert_close(ours(x), gn_reference(x, ref), **FLOAT64_EXACT)
    back = GroupNorm(n_groups, 8, eps=1e-3).double().to(device)
    back.load_state_dict(ref.state_dict(), strict=True)
    torch.testing.assert_close(back(x), gn_reference(x, ref), **FLOAT64_EXACT)


@pytest.mark.parametrize("n_groups", [1, 4])
def test_masked_groupnorm_equals_nn_groupnorm_on_each_samples_real_positions(n_groups):
    ours = randomize_parameters(GroupNorm(n_groups, 8), seed=22).double()
    ref = nn.GroupNorm(n_groups, 8).double()
    ref.load_state_dict(ours.state_dict())
    x, padding_mask = padded_batch([4, 1, 6], max_len=6, d_model=8, seed=23, fill=float("inf"))
    y = ours(x, padding_mask=padding_mask)
    for b in range(x.shape[0]):
        real = ~padding_mask[b]
        alone = gn_reference(x[b, real][None], ref)[0]  # nn.GroupNorm on (1, D, L_b)
        torch.testing.assert_close(y[b, real], alone, **FLOAT64_EXACT)


def test_masked_groupnorm_gives_an_all_padding_sample_finite_identity_statistics():
    """Documented choice: no real position -> mean 0, variance 1, never NaN."""
    gn = randomize_parameters(GroupNorm(2, 8), seed=24).double()
    x, padding_mask = padded_batch([3, 0], max_len=4, d_model=8, seed=25, fill=2.0)
    y = gn(x, padding_mask=padding_mask)
    expected = gn.weight * x[1] / math.sqrt(1.0 + gn.eps) + gn.bias
    torch.testing.assert_close(y[1], expected, **FLOAT64_EXACT)


# ---------------------------------------------------------------- low precision


def wide_features(dtype: torch.dtype, seed: int) -> torch.Tensor:
    """(16, 6, 8) activations with std ~300: a variance of ~9e4 overflows float16 (65504)."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(16, 6, 8, generator=gen) * 300 + 50).to(dtype)


@pytest.mark.parametrize("dtype", LOW)
def test_low_precision_batchnorm_with_large_variance_equals_nn_batchnorm1d(dtype):
    """Oracle: nn.BatchNorm1d in the same dtype, which keeps its statistics in float32.

    Our running statistics stay float32 (the BatchNorm docstring), nn's are rounded to dtype:
    compared after rounding ours once the same way."""
    ours, ref = BatchNorm(8).to(dtype), nn.BatchNorm1d(8).to(dtype)
    for step in range(2):
        x = wide_features(dtype, seed=40 + step)
        y = ours(x)
        assert y.dtype == dtype and torch.isfinite(y).all()
        torch.testing.assert_close(y, bn_reference(x, ref), **LOW_TOL[dtype])
    assert torch.isfinite(ours.running_var).all()
    torch.testing.assert_close(ours.running_mean.to(dtype), ref.running_mean, **LOW_TOL[dtype])
    torch.testing.assert_close(ours.running_var.to(dtype), ref.running_var, **LOW_TOL[dtype])
    ours.eval(), ref.eval()
    x = wide_features(dtype, seed=42)
    torch.testing.assert_close(ours(x), bn_reference(x, ref), **LOW_TOL[dtype])


@pytest.mark.parametrize("dtype", LOW)
def test_low_precision_masked_batchnorm_with_large_variance_equals_nn_batchnorm1d(dtype):
    """Oracle: nn.BatchNorm1d on the real tokens gathered into (N, D), same dtype."""
    ours, ref = BatchNorm(8).to(dtype), nn.BatchNorm1d(8).to(dtype)
    x = wide_features(dtype, seed=43)
    padding_mask = torch.arange(6)[None, :] >= torch.arange(16)[:, None] % 6 + 1
    y = ours(x, padding_mask=padding_mask)
    torch.testing.assert_close(y[~padding_mask], ref(x[~padding_mask]), **LOW_TOL[dtype])
    torch.testing.assert_close(ours.running_var.to(dtype), ref.running_var, **LOW_TOL[dtype])


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("n_groups", [1, 4])
def test_low_precision_groupnorm_with_large_variance_equals_nn_groupnorm(n_groups, dtype):
    """Oracle: nn.GroupNorm in the same dtype (float32 statistics there too)."""
    ours, ref = GroupNorm(n_groups, 8).to(dtype), nn.GroupNorm(n_groups, 8).to(dtype)
    x = wide_features(dtype, seed=44)
    y = ours(x)
    assert y.dtype == dtype and torch.isfinite(y).all()
    torch.testing.assert_close(y, gn_reference(x, ref), **LOW_TOL[dtype])
    torch.testing.assert_close(ours(x[:, 0]), gn_reference(x[:, 0], ref), **LOW_TOL[dtype])


# ---------------------------------------------------------------- empty input


def test_groupnorm_of_zero_positions_is_empty_and_silent():
    """Identity: no positions, nothing to normalize; torch's var_mean would warn here."""
    gn = GroupNorm(2, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = gn(torch.randn(3, 0, 8))
        y_masked = gn(torch.randn(3, 0, 8), padding_mask=torch.zeros(3, 0, dtype=torch.bool))
        y_batch = gn(torch.randn(0, 8))
    assert y.shape == y_masked.shape == (3, 0, 8) and y_batch.shape == (0, 8)


@pytest.mark.parametrize("shape", [(0, 8), (0, 5, 8), (3, 0, 8)])
def test_batchnorm_on_empty_input_refuses_training_and_is_empty_in_eval(shape):
    """Documented: no values, no statistics (got 0); eval is elementwise, so it is empty."""
    bn = BatchNorm(8)
    with pytest.raises(ValueError, match=r"more than 1 real value per feature .*got 0"):
        bn(torch.randn(shape))
    assert int(bn.num_batches_tracked) == 0
    assert bn.eval()(torch.randn(shape)).shape == shape
