"""Tests for addnorm.feedforward.FeedForward (SPEC section 4).

Provenance of expected values: the FFN formula written out by hand with the module's own
weights (x @ W1.T + b1 ...), each activation from its defining formula (ReLU max(0, h); GELU
h * Phi(h) with the erf; its tanh approximation, Hendrycks & Gimpel 2016; SwiGLU
silu(x W1) * (x W3), Shazeer 2020), and invariants (position-wise weights commute with
permutations of the positions).
"""

from __future__ import annotations

import copy
import math
import pickle

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from properties import examples
from tolerances import FLOAT64_EXACT

from addnorm.feedforward import GELU, FeedForward, GatedFeedForward, ReLU, make_feedforward

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
F64 = torch.float64
# float64 comparisons use FLOAT64_EXACT: two matmuls of <= 64-term unit-scale dot products,
# ~1e-15 apart in any order (measured <= 4.4e-16 on AVX2 and AVX-512).


def by_hand(ffn: FeedForward, x: torch.Tensor, dropout=lambda h: h) -> torch.Tensor:
    """The FFN formula with explicit matrix products and the activation's own formula."""

    def linear(layer, v):
        out = v @ layer.weight.T
        return out if layer.bias is None else out + layer.bias

    h = linear(ffn.w1, x)
    if ffn.activation == "relu":
        hidden = torch.clamp(h, min=0.0)  # max(0, x W1 + b1)
    elif ffn.activation == "gelu":
        hidden = 0.5 * h * (1.0 + torch.erf(h / math.sqrt(2.0)))
    elif ffn.activation == "gelu_tanh":
        inner = math.sqrt(2.0 / math.pi) * (h + 0.044715 * h**3)
        hidden = 0.5 * h * (1.0 + torch.tanh(inner))
    else:  # swiglu (LLaMA's naming): silu(gate) * value, gate = x W1, value = x W3
        value = linear(ffn.w3, x)
        hidden = h * torch.sigmoid(h) * value
    return linear(ffn.w2, dropout(hidden))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "swiglu"])
def test_ffn_equals_its_formula_computed_by_hand(activation, bias, device):
    torch.manual_seed(0)
    ffn = make_feedforward(8, 16, activation=activation, bias=bias).double().to(device)
    x = torch.randn(3, 5, 8, dtype=F64, device=device)
    torch.testing.assert_close(ffn(x), by_hand(ffn, x), **FLOAT64_EXACT)
    assert (ffn.w1.bias is None) == (not bias)
    assert hasattr(ffn, "w3") == (activation == "swiglu")


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "swiglu"])
def test_make_feedforward_picks_the_plain_or_the_gated_class(activation):
    """swiglu builds GatedFeedForward (still a FeedForward); the state dict names w1, w2, w3."""
    ffn = make_feedforward(8, 16, activation=activation)
    gated = activation == "swiglu"
    assert type(ffn) is (GatedFeedForward if gated else FeedForward)
    assert isinstance(ffn, FeedForward) and ffn.activation == activation
    names = ["w1", "w2", "w3"] if gated else ["w1", "w2"]
    assert sorted(ffn.state_dict()) == [f"{w}.{p}" for w in names for p in ("bias", "weight")]
    for copied in (copy.deepcopy(ffn), pickle.loads(pickle.dumps(ffn))):
        assert type(copied) is type(ffn)


def test_gated_feedforward_built_directly_equals_make_feedforward_swiglu():
    """Identity: the same seed gives the same weights and outputs either way."""
    x = torch.randn(2, 3, 8, dtype=F64)
    torch.manual_seed(6)
    direct = GatedFeedForward(8, 16, bias=False).double()
    torch.manual_seed(6)
    by_name = make_feedforward(8, 16, activation="swiglu", bias=False).double()
    assert torch.equal(direct(x), by_name(x))
    torch.testing.assert_close(direct(x), by_hand(direct, x), **FLOAT64_EXACT)
    with pytest.raises(ValueError, match=r"activation must be one of 'swiglu'; got 'relu'"):
        GatedFeedForward(8, 16, activation="relu")


def test_make_feedforward_passes_every_argument_to_the_class():
    """The factory adds no defaults of its own: same seed, same weights, same dropout."""
    for activation in ("gelu", "swiglu"):
        torch.manual_seed(7)
        made = make_feedforward(8, 24, activation=activation, dropout=0.25, bias=False)
        cls = GatedFeedForward if activation == "swiglu" else FeedForward
        torch.manual_seed(7)
        direct = cls(8, 24, activation=activation, dropout=0.25, bias=False)
        assert type(made) is cls and made.dropout.p == 0.25 and made.w1.bias is None
        for (name, p), (_, q) in zip(
            made.state_dict().items(), direct.state_dict().items(), strict=True
        ):
            assert torch.equal(p, q), name


def test_plain_feedforward_refuses_a_gated_activation_pointing_to_the_factory():
    """FeedForward has no value projection w3: "swiglu" is refused, naming the two ways."""
    with pytest.raises(ValueError, match=r"'swiglu' is gated.*make_feedforward.*GatedFeedForward"):
        FeedForward(8, 16, activation="swiglu")


def test_default_ffn_is_the_papers_relu_with_d_ff_2048():
    """SPEC 4: FFN(x) = max(0, x W1 + b1) W2 + b2 with d_ff = 2048."""
    torch.manual_seed(1)
    ffn = FeedForward(4).double()
    assert ffn.w1.out_features == 2048 and ffn.w2.in_features == 2048
    x = torch.randn(2, 3, 4, dtype=F64)
    expected = torch.clamp(x @ ffn.w1.weight.T + ffn.w1.bias, min=0) @ ffn.w2.weight.T
    torch.testing.assert_close(ffn(x), expected + ffn.w2.bias, **FLOAT64_EXACT)


def test_ffn_acts_on_any_leading_dims_as_on_the_flattened_tokens():
    """Position-wise: (..., D) gives the same as the (N, D) rows one by one."""
    torch.manual_seed(2)
    ffn = GatedFeedForward(8, 16).double()
    x = torch.randn(2, 3, 4, 8, dtype=F64)
    flat = ffn(x.reshape(-1, 8)).reshape(2, 3, 4, 8)
    torch.testing.assert_close(ffn(x), flat, **FLOAT64_EXACT)
    torch.testing.assert_close(ffn(x[1, 2, 3]), flat[1, 2, 3], **FLOAT64_EXACT)  # one (D,) vector


@examples(40)
@given(
    activation=st.sampled_from(["relu", "gelu", "gelu_tanh", "swiglu"]),
    perm=st.integers(1, 7).flatmap(lambda n: st.permutations(list(range(n)))),
    seed=st.integers(0, 2**16),
)
def test_ffn_commutes_with_permuting_positions(activation, perm, seed):
    """SPEC 4: the same weights apply at every position, so FFN(x[:, p]) = FFN(x)[:, p]."""
    torch.manual_seed(seed)
    ffn = make_feedforward(6, 12, activation=activation).double()
    x = torch.randn(2, len(perm), 6, dtype=F64)
    torch.testing.assert_close(ffn(x[:, perm]), ffn(x)[:, perm], **FLOAT64_EXACT)


@pytest.mark.parametrize("activation", ["relu", "swiglu"])
def test_dropout_acts_between_activation_and_w2_only_in_training(activation):
    """Placement as in nn.TransformerEncoderLayer: linear2(dropout(activation(linear1(x))))."""
    torch.manual_seed(3)
    ffn = make_feedforward(8, 32, activation=activation, dropout=0.5).double()
    x = torch.randn(4, 6, 8, dtype=F64)
    torch.manual_seed(4)
    y_train = ffn(x)
    torch.manual_seed(4)  # replay the same dropout draw by hand
    expected = by_hand(ffn, x, dropout=lambda h: torch.nn.functional.dropout(h, 0.5))
    torch.testing.assert_close(y_train, expected, **FLOAT64_EXACT)
    assert not torch.allclose(y_train, by_hand(ffn, x))  # dropout 0.5: O(1) apart
    ffn.eval()
    torch.testing.assert_close(ffn(x), by_hand(ffn, x), **FLOAT64_EXACT)


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (lambda: FeedForward(0), ValueError, r"d_model must be >= 1, got 0"),
        (lambda: FeedForward(-3), ValueError, r"d_model must be >= 1, got -3"),
        (lambda: FeedForward(2.5), TypeError, r"d_model must be an int, got float \(2.5\)"),
        (lambda: FeedForward(8, 0), ValueError, r"d_ff must be >= 1, got 0"),
        (lambda: FeedForward(8, 16.0), TypeError, r"d_ff must be an int, got float"),
        (lambda: FeedForward(8, activation="tanh"), ValueError, r"activation .*'swiglu'.*'tanh'"),
        (lambda: FeedForward(8, dropout=-0.1), ValueError, r"dropout must be >= 0.0, got -0.1"),
        (lambda: FeedForward(8, dropout=1.0), ValueError, r"dropout must be in \[0, 1\), got 1"),
        (lambda: make_feedforward(8, 16, activation="tanh"), ValueError, r"activation .*'tanh'"),
        (lambda: make_feedforward(8, 0, activation="swiglu"), ValueError, r"d_ff must be >= 1"),
    ],
)
def test_ffn_constructor_rejects_bad_values_naming_them(build, error, match):
    with pytest.raises(error, match=match):
        build()


@pytest.mark.parametrize(
    ("x", "error", "match"),
    [
        (torch.randn(2, 3, 7), ValueError, r"x last dim must be 8 .*\(2, 3, 7\)"),
        (torch.tensor(1.0), ValueError, r"x last dim must be 8 .*\(\)"),
        (torch.ones(2, 8, dtype=torch.int64), TypeError, r"x must be .*floating.*torch.int64"),
        ([0.0] * 8, TypeError, r"x must be a torch.Tensor, got list"),
    ],
)
def test_ffn_forward_rejects_bad_input_naming_it(x, error, match):
    with pytest.raises(error, match=match):
        FeedForward(8, 16)(x)


@pytest.mark.parametrize("activation", ["relu", "swiglu"])
def test_a_deep_copy_computes_with_its_own_weights(activation):
    """EMA copies a model with copy.deepcopy: the copy must not reach the original's weights."""
    torch.manual_seed(5)
    ffn = make_feedforward(8, 16, activation=activation).double()
    twin = copy.deepcopy(ffn)
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(2.0)
    x = torch.randn(3, 8, dtype=F64)
    torch.testing.assert_close(twin(x), by_hand(twin, x), **FLOAT64_EXACT)
    torch.testing.assert_close(ffn(x), by_hand(ffn, x), **FLOAT64_EXACT)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_without_gradients_overwrites_its_input_with_torch_gelu(approximate):
    torch.manual_seed(0)
    h = torch.randn(4, 7, 16)
    want = torch.nn.functional.gelu(h, approximate=approximate)  # torch's own, out of place
    with torch.no_grad():
        out = GELU(approximate, inplace=True)(h)
    assert torch.equal(out, want) and out.data_ptr() == h.data_ptr()


def test_gelu_is_out_of_place_by_default_like_nn_gelu():
    h = torch.randn(5, 3)
    before = h.clone()
    with torch.no_grad():
        out = GELU("tanh")(h)
    assert torch.equal(h, before)
    assert torch.equal(out, torch.nn.functional.gelu(h, approximate="tanh"))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_with_gradients_keeps_its_input_and_torch_gradients(approximate):
    torch.manual_seed(0)
    h = torch.randn(4, 7, 16, requires_grad=True)
    before = h.detach().clone()
    out = GELU(approximate, inplace=True)(h)
    want = torch.nn.functional.gelu(h, approximate=approximate)
    assert torch.equal(out, want) and torch.equal(h.detach(), before)
    assert torch.equal(*(torch.autograd.grad(y.sum(), h)[0] for y in (out, want)))


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh"])
def test_in_place_activations_leave_the_ffn_input_and_gradients_intact(activation):
    torch.manual_seed(0)
    ff = make_feedforward(16, 32, activation=activation)
    x = torch.randn(3, 5, 16, requires_grad=True)
    before = x.detach().clone()
    out = ff(x)
    with torch.no_grad():
        assert torch.equal(ff(x), out.detach())  # the in-place no-grad path: same values
    assert torch.equal(x.detach(), before)
    out.square().sum().backward()  # autograd accepts the in-place ReLU (its output is saved)
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_relu_writes_in_place_only_without_gradients():
    """In training, an in-place ReLU on w1's output (a view of the matrix product's result)
    made autograd copy the whole base back in the backward pass (CopySlices)."""
    torch.manual_seed(0)
    h = torch.randn(4, 7, 16)
    want = torch.nn.functional.relu(h)
    with torch.no_grad():
        out = ReLU(inplace=True)(h)
    assert torch.equal(out, want) and out.data_ptr() == h.data_ptr()
    h = torch.randn(4, 7, 16, requires_grad=True)
    before = h.detach().clone()
    out = ReLU(inplace=True)(h)
    assert torch.equal(h.detach(), before) and out.data_ptr() != h.data_ptr()
    assert torch.equal(torch.autograd.grad(out.sum(), h)[0], (before > 0).float())


def test_a_training_ffn_leaves_no_in_place_copy_in_the_graph():
    ff = make_feedforward(16, 32, activation="relu")
    out = ff.act(ff.w1(torch.randn(3, 5, 16)))
    assert type(out.grad_fn).__name__ == "ReluBackward0"
