"""Tests for addnorm.residual.AddNorm (SPEC section 5).

Provenance of expected values: the post-LN and pre-LN formulas evaluated with torch's
built-in norms (nn.LayerNorm, nn.BatchNorm1d, nn.RMSNorm, nn.GroupNorm) given the same
parameters, and the identities of SPEC 5 (a zero sublayer leaves pre-LN's x unchanged;
d out / d x = 1 + d Sublayer / d x for pre-LN).
"""

from __future__ import annotations

import inspect

import pytest
import torch
from tolerances import FLOAT64_EXACT
from torch import nn
from torch.autograd.functional import jacobian

from addnorm.norms import GroupNorm, LayerNorm, NoNorm, RMSNorm
from addnorm.residual import NORM_POSITIONS, AddNorm

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
F64 = torch.float64
# float64 comparisons use FLOAT64_EXACT: a projection and a norm over D = 64 unit-scale
# values, ~1e-15 apart in any order (measured <= 1.8e-15 on AVX2 and AVX-512).
D = 64  # a multiple of 32, make_norm's default n_groups for "group"


def builtin_norm(kind: str, ours: nn.Module):
    """torch's own norm of that kind with our parameters, applied to (B, L, D)."""
    if kind == "layer":
        ref = nn.LayerNorm(D, eps=1e-3)
    elif kind == "rms":
        ref = nn.RMSNorm(D, eps=1e-3)
    elif kind == "batch":
        ref = nn.BatchNorm1d(D, eps=1e-3)
    else:
        ref = nn.GroupNorm(32, D, eps=1e-3)
    ref = ref.to(ours.weight.device, F64)
    ref.load_state_dict(ours.state_dict(), strict=True)
    if kind in ("layer", "rms"):
        return ref
    return lambda h: ref(h.transpose(1, 2)).transpose(1, 2)  # (B, D, L) layout


def make_add_norm(norm_position: str, kind: str, device: str = "cpu") -> AddNorm:
    add_norm = AddNorm(D, norm_position=norm_position, norm=kind, eps=1e-3).to(device, F64)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in add_norm.norm.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=F64) * 0.5 + 1.0)
    return add_norm


def fixed_linear(device: str = "cpu") -> nn.Linear:
    torch.manual_seed(1)
    return nn.Linear(D, D).to(device, F64)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["layer", "batch", "rms", "group"])
def test_post_ln_normalizes_after_the_residual(kind, device):
    """Post-LN (the paper): out = Norm(x + Sublayer(x))."""
    add_norm, sublayer = make_add_norm("post", kind, device), fixed_linear(device)
    norm = builtin_norm(kind, add_norm.norm)
    x = torch.randn(3, 5, D, dtype=F64, device=device)
    torch.testing.assert_close(add_norm(x, sublayer), norm(x + sublayer(x)), **FLOAT64_EXACT)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["layer", "batch", "rms", "group"])
def test_pre_ln_normalizes_only_the_sublayers_input(kind, device):
    """Pre-LN: out = x + Sublayer(Norm(x))."""
    add_norm, sublayer = make_add_norm("pre", kind, device), fixed_linear(device)
    norm = builtin_norm(kind, add_norm.norm)
    x = torch.randn(3, 5, D, dtype=F64, device=device)
    torch.testing.assert_close(add_norm(x, sublayer), x + sublayer(norm(x)), **FLOAT64_EXACT)


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_any_callable_sublayer_works_and_vectors_are_accepted(norm_position):
    """A lambda sublayer on (B, D) input, checked against nn.LayerNorm."""
    add_norm = make_add_norm(norm_position, "layer")
    norm = builtin_norm("layer", add_norm.norm)

    def sublayer(h):
        return torch.tanh(h) * 3.0

    x = torch.randn(4, D, dtype=F64)
    expected = norm(x + sublayer(x)) if norm_position == "post" else x + sublayer(norm(x))
    torch.testing.assert_close(add_norm(x, sublayer), expected, **FLOAT64_EXACT)


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_an_injected_norm_module_is_used_as_is(norm_position):
    injected = RMSNorm(D, eps=1e-2).double()
    add_norm = AddNorm(D, norm_position=norm_position, norm=injected, eps=0.5)
    assert add_norm.norm is injected
    x, sublayer = torch.randn(2, 3, D, dtype=F64), fixed_linear()
    ref = nn.RMSNorm(D, eps=1e-2).double()  # eps=0.5 of AddNorm is unused
    expected = ref(x + sublayer(x)) if norm_position == "post" else x + sublayer(ref(x))
    torch.testing.assert_close(add_norm(x, sublayer), expected, **FLOAT64_EXACT)


@pytest.mark.parametrize("norm_position", ["post", "pre"])
@pytest.mark.parametrize(
    "builtin",
    [lambda: nn.LayerNorm(D), lambda: nn.RMSNorm(D), lambda: nn.RMSNorm([D]), nn.Identity],
)
def test_a_last_dim_torch_norm_can_be_injected_and_the_mask_is_not_passed_to_it(
    builtin, norm_position
):
    """Oracle: the formula with torch's norm called as norm(h); per-token norms need no mask."""
    norm = builtin().double()
    add_norm = AddNorm(D, norm_position=norm_position, norm=norm)
    x, sublayer = torch.randn(2, 3, D, dtype=F64), fixed_linear()
    padding_mask = torch.tensor([[False, False, True], [False, True, True]])
    expected = norm(x + sublayer(x)) if norm_position == "post" else x + sublayer(norm(x))
    torch.testing.assert_close(add_norm(x, sublayer), expected, **FLOAT64_EXACT)
    torch.testing.assert_close(
        add_norm(x, sublayer, padding_mask=padding_mask), expected, **FLOAT64_EXACT
    )


@pytest.mark.parametrize(
    "channels_first",
    [
        lambda: nn.BatchNorm1d(8),
        lambda: nn.BatchNorm2d(8),
        lambda: nn.LazyBatchNorm1d(),
        lambda: nn.GroupNorm(2, 8),
        lambda: nn.InstanceNorm1d(8),
    ],
)
def test_a_channels_first_torch_norm_is_refused_pointing_to_addnorms_own(channels_first):
    """nn.BatchNorm1d on (B, L, D) would normalize over L per position: the wrong axis."""
    with pytest.raises(TypeError, match=r"dim 1 .*addnorm.norms.BatchNorm / addnorm.norms.Group"):
        AddNorm(8, norm=channels_first())


@pytest.mark.parametrize(
    ("norm", "match"),
    [
        (nn.LayerNorm(16), r"LayerNorm has normalized_shape \(16,\).* d_model is 8"),
        (nn.RMSNorm([4, 8]), r"RMSNorm has normalized_shape \(4, 8\).* d_model is 8"),
        (LayerNorm(16), r"LayerNorm has d_model 16.* d_model is 8"),
        (GroupNorm(2, 16), r"GroupNorm has d_model 16.* d_model is 8"),
    ],
)
def test_an_injected_norm_of_another_width_is_refused_naming_both(norm, match):
    with pytest.raises(ValueError, match=match):
        AddNorm(8, norm=norm)


@pytest.mark.parametrize("kind", ["layer", "batch", "rms", "group"])
def test_with_a_zero_sublayer_pre_returns_x_exactly_and_post_returns_norm_x(kind):
    """SPEC 5: pre-LN keeps an untouched identity path; post-LN normalizes it."""
    x = torch.randn(2, 4, D, dtype=F64) * 5 + 3

    def zero(h):
        return torch.zeros_like(h)

    assert torch.equal(make_add_norm("pre", kind)(x, zero), x)
    post = make_add_norm("post", kind)
    torch.testing.assert_close(post(x, zero), builtin_norm(kind, post.norm)(x), **FLOAT64_EXACT)


def test_pre_ln_gradient_with_a_zero_weight_sublayer_is_the_identity():
    """SPEC 5: dy/dx = 1 + dSublayer/dx, and dSublayer/dx = 0 when its weight is 0."""
    sublayer = nn.Linear(8, 8).double()
    with torch.no_grad():
        sublayer.weight.zero_()
    add_norm = AddNorm(8, norm_position="pre").double()
    x = torch.randn(2, 3, 8, dtype=F64)
    jac = jacobian(lambda v: add_norm(v, sublayer), x).reshape(48, 48)
    assert torch.equal(jac, torch.eye(48, dtype=F64))


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_jacobian_is_identity_plus_the_sublayer_branch_only_for_pre_ln(norm_position):
    """SPEC 5: for pre-LN, d out/dx = I + d Sublayer(Norm(x))/dx; post-LN has no such path."""
    torch.manual_seed(2)
    sublayer = nn.Linear(8, 8).double()
    add_norm = AddNorm(8, norm_position=norm_position).double()
    x = torch.randn(1, 3, 8, dtype=F64)
    jac = jacobian(lambda v: add_norm(v, sublayer), x).reshape(24, 24)
    branch = jacobian(lambda v: sublayer(add_norm.norm(v)), x).reshape(24, 24)
    identity_plus_branch = torch.eye(24, dtype=F64) + branch
    # pre: equal up to float64 rounding (~1e-15); post: O(1) apart.
    assert torch.allclose(jac, identity_plus_branch, **FLOAT64_EXACT) == (norm_position == "pre")


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_dropout_hits_the_sublayer_output_only_in_training(norm_position):
    add_norm = AddNorm(D, norm_position=norm_position, dropout=0.5, eps=1e-3).double()
    norm = builtin_norm("layer", add_norm.norm)
    x, sublayer = torch.randn(2, 3, D, dtype=F64), fixed_linear()

    def formula(drop):
        if norm_position == "post":
            return norm(x + drop(sublayer(x)))
        return x + drop(sublayer(norm(x)))

    torch.manual_seed(3)
    y_train = add_norm(x, sublayer)
    torch.manual_seed(3)  # replay the same dropout draw by hand
    torch.testing.assert_close(
        y_train, formula(lambda h: nn.functional.dropout(h, 0.5)), **FLOAT64_EXACT
    )
    add_norm.eval()
    torch.testing.assert_close(add_norm(x, sublayer), formula(lambda h: h), **FLOAT64_EXACT)
    assert not torch.allclose(y_train, add_norm(x, sublayer))  # dropout 0.5: O(1) apart


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_padding_mask_reaches_the_norm_so_batchnorm_ignores_padding(norm_position):
    """SPEC claim 5 through Add & Norm: a sentence's output ignores its batch's padding."""
    add_norm = make_add_norm(norm_position, "batch")
    sublayer = fixed_linear()
    torch.manual_seed(4)
    sentence = torch.randn(1, 3, D, dtype=F64)
    other = torch.randn(1, 3, D, dtype=F64)
    outputs = []
    for max_len in (3, 7):
        x = torch.zeros(2, max_len, D, dtype=F64)
        x[0, :3], x[1, :3] = sentence[0], other[0]
        padding_mask = torch.arange(max_len)[None, :].expand(2, -1) >= 3
        outputs.append(add_norm(x, sublayer, padding_mask=padding_mask)[:, :3])
    torch.testing.assert_close(outputs[0], outputs[1], **FLOAT64_EXACT)


def test_an_injected_norm_receives_the_padding_mask():
    seen = {}

    class Spy(LayerNorm):
        def forward(self, x, padding_mask=None):
            seen["padding_mask"] = padding_mask
            return super().forward(x, padding_mask)

    padding_mask = torch.tensor([[False, False, True]])
    AddNorm(4, norm=Spy(4))(torch.randn(1, 3, 4), lambda h: h, padding_mask=padding_mask)
    assert seen["padding_mask"] is padding_mask


def test_a_foreign_module_that_takes_padding_mask_receives_it():
    """Any injected module but torch's mask-less ones is called with the mask (one signature)."""
    seen = {}

    class MaskedScale(nn.Module):
        def forward(self, x, padding_mask=None):
            seen["padding_mask"] = padding_mask
            return 2.0 * x

    padding_mask = torch.tensor([[False, True, True]])
    x = torch.randn(1, 3, 4)
    out = AddNorm(4, norm=MaskedScale())(x, torch.tanh, padding_mask=padding_mask)
    assert seen["padding_mask"] is padding_mask
    # post: norm(x + f(x)); the same float32 ops, equal, so the float32 defaults fit.
    torch.testing.assert_close(out, 2.0 * (x + torch.tanh(x)))


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_a_switched_off_norm_gives_the_plain_residual_and_receives_the_mask(norm_position):
    """NoNorm (the identity): both forms reduce to x + f(x); the mask is passed to it."""
    seen = []

    class Spy(NoNorm):
        def forward(self, x, padding_mask=None):
            seen.append(padding_mask)
            return super().forward(x, padding_mask)

    add_norm = AddNorm(D, norm_position=norm_position, norm=Spy())
    x, sublayer = torch.randn(2, 3, D, dtype=F64), fixed_linear()
    padding_mask = torch.tensor([[False, False, True], [False, True, True]])
    assert torch.equal(add_norm(x, sublayer, padding_mask=padding_mask), x + sublayer(x))
    assert seen == [padding_mask]


def test_an_injected_torch_norm_keeps_its_state_dict_keys_and_loads_both_ways():
    """No wrapper: AddNorm.norm is the module passed in, so keys stay norm.weight/norm.bias."""
    torch.manual_seed(0)
    norm = nn.LayerNorm(D)
    nn.init.normal_(norm.weight)
    add_norm = AddNorm(D, norm=norm)
    assert add_norm.norm is norm
    assert sorted(add_norm.state_dict()) == ["norm.bias", "norm.weight"]
    AddNorm(D).load_state_dict(add_norm.state_dict(), strict=True)  # addnorm's LayerNorm
    AddNorm(D, norm=nn.LayerNorm(D)).load_state_dict(AddNorm(D).state_dict(), strict=True)


def test_the_norm_call_form_is_chosen_without_reading_signatures(monkeypatch):
    """Decided by type, once: inspect.signature is never consulted."""

    def refuse(*args, **kwargs):
        raise AssertionError("inspect.signature called")

    monkeypatch.setattr(inspect, "signature", refuse)
    padding_mask = torch.tensor([[False, True]])
    for norm in ("layer", "batch", LayerNorm(8), nn.LayerNorm(8), nn.Identity(), NoNorm()):
        add_norm = AddNorm(8, norm=norm).eval()
        add_norm(torch.randn(1, 2, 8), torch.tanh, padding_mask=padding_mask)


def test_norm_positions_are_post_and_pre():
    """NORM_POSITIONS names the choices; the attribute is norm_position."""
    assert NORM_POSITIONS == ("post", "pre")
    add_norm = AddNorm(8, norm_position="pre")
    assert add_norm.norm_position == "pre" and "norm_position='pre'" in repr(add_norm)


@pytest.mark.parametrize(
    ("sublayer", "error", "match"),
    [
        (lambda h: h[..., :-1], ValueError, r"shape of its input \(2, 3, 8\).*got \(2, 3, 7\)"),
        (lambda h: h[0], ValueError, r"shape of its input \(2, 3, 8\).*got \(3, 8\)"),
        (lambda h: h.tolist(), ValueError, r"shape of its input \(2, 3, 8\).*got list"),
        ("linear", TypeError, r"sublayer must be callable, got str"),
    ],
)
@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_a_sublayer_that_breaks_the_residual_is_refused(norm_position, sublayer, error, match):
    with pytest.raises(error, match=match):
        AddNorm(8, norm_position=norm_position)(torch.randn(2, 3, 8), sublayer)


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (lambda: AddNorm(0), ValueError, r"d_model must be >= 1, got 0"),
        (lambda: AddNorm(-3), ValueError, r"d_model must be >= 1, got -3"),
        (lambda: AddNorm(2.5), TypeError, r"d_model must be an int, got float \(2.5\)"),
        (
            lambda: AddNorm(8, norm_position="middle"),
            ValueError,
            r"norm_position must be one of 'post', 'pre'; got 'middle'",
        ),
        (lambda: AddNorm(8, position="pre"), TypeError, r"unexpected keyword argument 'position'"),
        (lambda: AddNorm(8, norm="instance"), ValueError, r"kind .*'group'; got 'instance'"),
        (lambda: AddNorm(8, norm=3), TypeError, r"norm must be .* nn.Module, got int"),
        (lambda: AddNorm(8, dropout=1.0), ValueError, r"dropout must be in \[0, 1\), got 1.0"),
        (lambda: AddNorm(8, eps=-1.0), ValueError, r"eps must be >= 0.0, got -1.0"),
        (lambda: AddNorm(8, norm="group"), ValueError, r"d_model \(8\) .* n_groups \(32\)"),
    ],
)
def test_add_norm_constructor_rejects_bad_values_naming_them(build, error, match):
    with pytest.raises(error, match=match):
        build()


@pytest.mark.parametrize(
    ("x", "padding_mask", "error", "match"),
    [
        (torch.randn(2, 3, 7), None, ValueError, r"x last dim must be 8.*\(2, 3, 7\)"),
        (torch.randn(8), None, ValueError, r"x must have 2 or 3 dims, got shape \(8,\)"),
        (torch.randn(1, 2, 3, 8), None, ValueError, r"x must have 2 or 3 dims.*\(1, 2, 3, 8\)"),
        (torch.ones(2, 3, 8, dtype=torch.int32), None, TypeError, r"floating.*torch.int32"),
        (torch.randn(2, 3, 8), torch.zeros(3, 2, dtype=torch.bool), ValueError, r"\(2, 3\)"),
        (torch.randn(2, 3, 8), torch.zeros(2, 3), TypeError, r"padding_mask.*torch.float32"),
        (torch.randn(2, 8), torch.zeros(2, 8, dtype=torch.bool), ValueError, r"\(B, L, D\)"),
    ],
)
def test_add_norm_forward_rejects_bad_input_naming_it(x, padding_mask, error, match):
    with pytest.raises(error, match=match):
        AddNorm(8)(x, lambda h: h, padding_mask=padding_mask)
