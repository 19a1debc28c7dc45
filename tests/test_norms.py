"""Tests for addnorm.norms: each norm against SPEC section 3 and torch's built-in norms.

Provenance of expected values: SPEC worked examples (seed 003) to the printed digits, torch's
nn.LayerNorm / nn.BatchNorm1d / nn.RMSNorm / nn.GroupNorm given the same parameters, and
invariants (padding invariance, normalization of the real tokens gathered alone).
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from properties import examples
from tolerances import FLOAT64_EXACT, LOW_PRECISION
from torch import nn

from addnorm.norms import BatchNorm, GroupNorm, LayerNorm, NoNorm, RMSNorm, make_norm

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
F64 = torch.float64
# Comparisons in float64 use FLOAT64_EXACT: a norm is a few reductions over <= 64 unit-scale
# values, so two correct implementations agree to ~1e-14 on any machine.

# SPEC section 3, seed 003: 3 samples, 2 features.
SPEC_X = [[1.0, 2.0], [2.0, 4.0], [3.0, 6.0]]


def randomize_parameters(module: nn.Module, seed: int) -> nn.Module:
    """Give every parameter a non-trivial value (weights away from 1, biases away from 0)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.5 + 1.0)
    return module


def padded_batch(lengths: list[int], max_len: int, d_model: int, seed: int, fill: float):
    """Sentences of the given lengths, padded to ``max_len`` with ``fill``; True = padding."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(len(lengths), max_len, d_model, generator=gen, dtype=F64) * 2.0 + 0.5
    padding_mask = torch.arange(max_len)[None, :] >= torch.tensor(lengths)[:, None]
    x = x.masked_fill(padding_mask[..., None], fill)
    return x, padding_mask


def bn_reference(x: torch.Tensor, ref: nn.BatchNorm1d) -> torch.Tensor:
    """nn.BatchNorm1d on (B, D) or, transposed to its (B, D, L) layout, on (B, L, D)."""
    return ref(x) if x.ndim == 2 else ref(x.transpose(1, 2)).transpose(1, 2)


def gn_reference(x: torch.Tensor, ref: nn.GroupNorm) -> torch.Tensor:
    """nn.GroupNorm on (B, D) or, transposed to its (B, D, L) layout, on (B, L, D)."""
    return ref(x) if x.ndim == 2 else ref(x.transpose(1, 2)).transpose(1, 2)


# ---------------------------------------------------------------- SPEC worked examples


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


def test_layernorm_maps_every_spec_row_to_minus_one_one():
    """SPEC 3: every row of X becomes [-1, 1] (each row is (m - s, m + s))."""
    y = LayerNorm(2, eps=0.0).double()(torch.tensor(SPEC_X, dtype=F64))
    torch.testing.assert_close(y, torch.tensor([[-1.0, 1.0]] * 3, dtype=F64), **FLOAT64_EXACT)


# ---------------------------------------------------------------- LayerNorm and RMSNorm


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(3, 5, 8), (4, 8)])
def test_layernorm_equals_nn_layernorm_and_shares_its_state_dict(shape, bias, device):
    ours = randomize_parameters(LayerNorm(8, eps=1e-3, bias=bias), seed=1).double().to(device)
    ref = nn.LayerNorm(8, eps=1e-3, bias=bias).double().to(device)
    ref.load_state_dict(ours.state_dict(), strict=True)
    x = torch.randn(shape, dtype=F64, device=device) * 3 + 1
    torch.testing.assert_close(ours(x), ref(x), **FLOAT64_EXACT)
    assert (ours.bias is None) == (not bias)
    back = LayerNorm(8, eps=1e-3, bias=bias).double().to(device)
    back.load_state_dict(ref.state_dict(), strict=True)
    torch.testing.assert_close(back(x), ref(x), **FLOAT64_EXACT)


def test_layernorm_with_eps_zero_is_nan_on_constant_tokens_as_nn_layernorm():
    """Documented: eps=0 evaluates the formula exactly, so a token whose features are all equal
    is 0 / 0 = NaN, as in nn.LayerNorm (the oracle, same parameters); other tokens are finite."""
    ours = randomize_parameters(LayerNorm(4, eps=0.0), seed=3).double()
    ref = nn.LayerNorm(4, eps=0.0).double()
    ref.load_state_dict(ours.state_dict())
    x = torch.tensor([[2.0, 2.0, 2.0, 2.0], [1.0, 2.0, 3.0, 4.0]], dtype=F64)
    y = ours(x)
    torch.testing.assert_close(y, ref(x), equal_nan=True, **FLOAT64_EXACT)
    assert torch.isnan(y[0]).all() and torch.isfinite(y[1]).all()


def test_layernorm_over_one_feature_refuses_eps_zero_and_otherwise_returns_its_bias():
    """D = 1 with eps = 0 is NaN for every input, so it is refused (also through make_norm);
    with eps > 0 a single feature is its own mean: x - mean = 0 and y = bias (identity)."""
    for build in (lambda: LayerNorm(1, eps=0.0), lambda: make_norm("layer", 1, eps=0)):
        with pytest.raises(ValueError, match=r"d_model = 1 feature with eps = 0 .*eps > 0"):
            build()
    norm = randomize_parameters(LayerNorm(1), seed=4)
    y = norm(torch.randn(3, 5, 1) * 100)
    assert torch.equal(y, norm.bias.detach().expand(3, 5, 1))


@examples(20)
@given(
    dtype=st.sampled_from([torch.float16, torch.bfloat16]),
    offset=st.sampled_from([0.0, 1e2, 1e4, -3e4]),
    scale=st.sampled_from([1e-2, 1.0, 1e2]),
    d_model=st.sampled_from([2, 8, 64]),
    float32_module=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_low_precision_layernorm_takes_float32_statistics(
    dtype, offset, scale, d_model, float32_module, seed
):
    """Oracle: nn.LayerNorm in float64 on the same (rounded) input and parameters.

    Tolerance LOW_PRECISION (4u): the result is rounded once to dtype (u|y|), and float32
    statistics of a centred token add float32's rounding of the mean over the token's std,
    u32 * |offset| / std, largest for float16 at offset -3e4: its values are 16 apart, so a
    token of D <= 64 that is not constant has std >= 16 * sqrt(63) / 64 = 1.98, and
    6e-8 * 3e4 / 1.98 = 9.1e-4 < 4u = 2e-3 (offset 1e2: steps of 1/16, 7.7e-4). A token that
    rounds to one value has variance 0 in both and gives the bias.
    Low-precision statistics fail it: 1e4 + N(0, 1) in float16 came out 0.08 off."""
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(4, 6, d_model, generator=gen) * scale + offset).to(dtype)
    norm = randomize_parameters(LayerNorm(d_model), seed=seed)
    if not float32_module:
        norm = norm.to(dtype)
    ref = nn.LayerNorm(d_model).double()
    ref.load_state_dict(norm.state_dict())
    y = norm(x)
    assert y.dtype == dtype
    torch.testing.assert_close(y.double(), ref(x.double()), **LOW_PRECISION[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("eps", [None, 1e-3])
def test_rmsnorm_equals_nn_rmsnorm(eps, dtype, device):
    """eps=None means the dtype's machine epsilon in both; tiny inputs make eps matter."""
    ours = randomize_parameters(RMSNorm(8, eps=eps), seed=2).to(device, dtype)
    ref = nn.RMSNorm(8, eps=eps).to(device, dtype)
    ref.load_state_dict(ours.state_dict(), strict=True)
    x = torch.randn(3, 5, 8, dtype=dtype, device=device) * 1e-4
    # Defaults: a mean of 8 squares, an rsqrt and a product cost a few u relative, inside
    # rtol 1.3e-6 (22 float32 u) and far inside 1e-7 in float64; |y| ~ 1.
    torch.testing.assert_close(ours(x), ref(x))
    torch.testing.assert_close(ours(x[:, 0]), ref(x[:, 0]))


@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_per_token_norm_of_a_sentence_ignores_padding_and_batch(kind):
    """SPEC 3: LayerNorm (and RMSNorm) statistics are per token, so batch and padding vanish."""
    norm = randomize_parameters(make_norm(kind, 8), seed=3).double()
    x, padding_mask = padded_batch([4, 1, 6], max_len=9, d_model=8, seed=4, fill=7.0)
    alone = norm(x[1:2, :1])
    in_batch = norm(x, padding_mask=padding_mask)
    torch.testing.assert_close(in_batch[1:2, :1], alone, **FLOAT64_EXACT)


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

LOW = [torch.float16, torch.bfloat16]
# Ours and torch's kernels both compute in float32 and round once to the low dtype, so an
# output differs by at most one ulp (<= 2u|y|); a running statistic, rounded at each of two
# steps, by two (<= 4u|y|). LOW_PRECISION's 4u relative (and 4u absolute near 0) holds both.
LOW_TOL = LOW_PRECISION


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


@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")  # torch's rms_norm
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize(
    ("kind", "reference"),
    [
        ("layer", lambda: nn.LayerNorm(8)),
        ("batch", lambda: nn.BatchNorm1d(8)),
        ("rms", lambda: nn.RMSNorm(8)),
        ("group", lambda: nn.GroupNorm(2, 8)),
    ],
)
def test_a_float32_norm_returns_the_dtype_of_low_precision_input(kind, reference, dtype):
    """Oracle: torch's float32 norm given the same low-precision input returns that dtype."""
    ours = randomize_parameters(make_norm(kind, 8, n_groups=2), seed=45)
    ref = reference()
    ref.load_state_dict(ours.state_dict(), strict=True)
    x = (torch.randn(4, 5, 8) * 3 + 1).to(dtype)
    expected = ref(x) if kind in ("layer", "rms") else gn_reference(x, ref)
    y = ours(x)
    assert y.dtype == expected.dtype == dtype
    torch.testing.assert_close(y, expected, **LOW_TOL[dtype])


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


# ---------------------------------------------------------------- make_norm


@pytest.mark.parametrize(
    ("kind", "cls", "reference"),
    [
        ("layer", LayerNorm, lambda: nn.LayerNorm(64, eps=1e-3)),
        ("batch", BatchNorm, lambda: nn.BatchNorm1d(64, eps=1e-3)),
        ("rms", RMSNorm, lambda: nn.RMSNorm(64, eps=1e-3)),
        ("group", GroupNorm, lambda: nn.GroupNorm(32, 64, eps=1e-3)),
    ],
)
def test_make_norm_builds_each_kind_equal_to_its_torch_builtin(kind, cls, reference):
    norm = randomize_parameters(make_norm(kind, 64, eps=1e-3), seed=26).double()
    assert type(norm) is cls
    ref = reference().double()
    ref.load_state_dict(norm.state_dict(), strict=True)
    x = torch.randn(3, 5, 64, dtype=F64)
    expected = ref(x) if kind in ("layer", "rms") else gn_reference(x, ref)
    torch.testing.assert_close(norm(x), expected, **FLOAT64_EXACT)


def test_make_norm_passes_eps_none_to_rms_as_the_dtype_epsilon():
    """nn.RMSNorm's own default (eps=None) is torch.finfo(x.dtype).eps."""
    norm = make_norm("rms", 8, eps=None)
    x = torch.randn(2, 8) * 1e-4
    # float32 defaults: the same formula, a few u (6e-8) relative on |y| ~ 1 (rtol 1.3e-6).
    torch.testing.assert_close(norm(x), nn.RMSNorm(8)(x))


def test_make_norm_without_bias_builds_a_bias_free_layernorm():
    norm = make_norm("layer", 8, bias=False)
    assert norm.bias is None and set(norm.state_dict()) == {"weight"}


# ---------------------------------------------------------------- bad input

CONSTRUCTORS = {
    "LayerNorm": lambda d_model=8, **kw: LayerNorm(d_model, **kw),
    "BatchNorm": lambda d_model=8, **kw: BatchNorm(d_model, **kw),
    "RMSNorm": lambda d_model=8, **kw: RMSNorm(d_model, **kw),
    "GroupNorm": lambda d_model=8, **kw: GroupNorm(1, d_model, **kw),
    "make_norm": lambda d_model=8, **kw: make_norm("layer", d_model, **kw),
}


@pytest.mark.parametrize("name", list(CONSTRUCTORS))
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"d_model": 0}, ValueError, r"d_model must be >= 1, got 0"),
        ({"d_model": -3}, ValueError, r"d_model must be >= 1, got -3"),
        ({"d_model": 2.5}, TypeError, r"d_model must be an int, got float \(2.5\)"),
        ({"eps": -1e-5}, ValueError, r"eps must be >= 0.0, got -1e-05"),
        ({"eps": "small"}, TypeError, r"eps must be a number, got str"),
    ],
)
def test_norm_constructors_reject_bad_values_naming_them(name, kwargs, error, match):
    with pytest.raises(error, match=match):
        CONSTRUCTORS[name](**kwargs)


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (lambda: BatchNorm(8, momentum=-0.1), ValueError, r"momentum must be >= 0.0, got -0.1"),
        (lambda: BatchNorm(8, momentum=1.5), ValueError, r"momentum must be <= 1.0, got 1.5"),
        (lambda: GroupNorm(3, 8), ValueError, r"d_model \(8\) .* divisible by n_groups \(3\)"),
        (lambda: GroupNorm(0, 8), ValueError, r"n_groups must be >= 1, got 0"),
        (lambda: make_norm("group", 48), ValueError, r"d_model \(48\) .* n_groups \(32\)"),
        (lambda: make_norm("instance", 8), ValueError, r"kind .*'layer'.*'group'; got 'inst"),
        (lambda: make_norm("layer", 8, eps=None), ValueError, r"eps=None .* 'rms'.*'layer'"),
        (lambda: make_norm("batch", 8, bias=False), ValueError, r"bias=False.*'batch'"),
    ],
)
def test_norm_specific_bad_values_raise_naming_them(build, error, match):
    with pytest.raises(error, match=match):
        build()


NORMS = {
    "layer": lambda: LayerNorm(8),
    "batch": lambda: BatchNorm(8),
    "rms": lambda: RMSNorm(8),
    "group": lambda: GroupNorm(2, 8),
}
GOOD_MASK = torch.zeros(2, 3, dtype=torch.bool)


@pytest.mark.parametrize("kind", list(NORMS))
@pytest.mark.parametrize(
    ("x", "padding_mask", "error", "match"),
    [
        (torch.randn(2, 3, 7), None, ValueError, r"x last dim must be 8.*\(2, 3, 7\)"),
        (torch.randn(8), None, ValueError, r"x must have 2 or 3 dims, got shape \(8,\)"),
        (torch.randn(1, 2, 3, 8), None, ValueError, r"x must have 2 or 3 dims.*\(1, 2, 3, 8\)"),
        (torch.ones(2, 3, 8, dtype=torch.long), None, TypeError, r"floating.*torch.int64"),
        ([[0.0] * 8] * 2, None, TypeError, r"x must be a torch.Tensor, got list"),
        (torch.randn(2, 3, 8), torch.zeros(2, 4, dtype=torch.bool), ValueError, r"\(2, 3\).*"),
        (torch.randn(2, 3, 8), torch.zeros(2, 3), TypeError, r"padding_mask.*torch.float32"),
        (torch.randn(2, 8), GOOD_MASK, ValueError, r"padding_mask .* \(B, L, D\).*\(2, 8\)"),
    ],
)
def test_norm_forward_rejects_bad_input_naming_it(kind, x, padding_mask, error, match):
    with pytest.raises(error, match=match):
        NORMS[kind]()(x, padding_mask=padding_mask)


@pytest.mark.parametrize("shape", [(2, 3, 8), (4, 8)])
def test_no_norm_returns_its_input_itself_with_or_without_a_mask(shape):
    """Identity: a switched-off norm is nn.Identity with the norms' call signature."""
    norm = NoNorm()
    assert isinstance(norm, nn.Identity) and len(norm.state_dict()) == 0
    x = torch.randn(shape)
    assert norm(x) is x
    padding_mask = torch.zeros(shape[:2], dtype=torch.bool)
    assert norm(x, padding_mask=padding_mask) is x and norm(x, None) is x



@pytest.mark.parametrize("norm", ["layer", "batch", "rms", "group"])
def test_a_padding_mask_on_another_device_is_refused_naming_both(norm):
    # The meta device stands in for another accelerator on a CPU-only machine (structure only:
    # no value is read, so a meta mask reaches the check as a CUDA one would).
    x = torch.randn(2, 3, 8)
    mask = torch.zeros(2, 3, dtype=torch.bool, device="meta")
    with pytest.raises(ValueError, match=r"padding_mask \(True = padding\) is on meta but what "
                                         r"it masks is on cpu"):
        make_norm(norm, 8, n_groups=2)(x, padding_mask=mask)
