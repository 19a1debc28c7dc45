"""Tests for addnorm.norms: LayerNorm, RMSNorm, NoNorm and make_norm against SPEC section 3 and
torch's built-in norms, and what every norm shares (its call, its dtype, its refusals);
BatchNorm and GroupNorm alone: tests/test_masked_norms.py.

Provenance of expected values: SPEC worked examples (seed 003) to the printed digits, torch's
nn.LayerNorm / nn.BatchNorm1d / nn.RMSNorm / nn.GroupNorm given the same parameters, and
invariants (padding invariance).
"""

from __future__ import annotations

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
    gn_reference,
    padded_batch,
    randomize_parameters,
)
from properties import examples
from tolerances import FLOAT64_EXACT, LOW_PRECISION
from torch import nn

from addnorm.norms import BatchNorm, GroupNorm, LayerNorm, NoNorm, RMSNorm, make_norm

# ---------------------------------------------------------------- SPEC worked examples


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


# ---------------------------------------------------------------- low precision


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
