"""MultiHeadAttention and KVCache: oracles are nn.MultiheadAttention and SDPA given the same
weights, a softmax written by hand, and invariants (causality, permutation equivariance,
cached == uncached)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from properties import examples
from tolerances import FLOAT64_EXACT
from torch import nn

from addnorm.attention import MultiHeadAttention
from addnorm.cache import KVCache
from addnorm.rotary import RotaryEmbedding

D, H = 16, 4
DH = D // H
F64 = torch.float64
# Everything runs in float64 on unit-scale values (D = 16, <= 7 keys): each output is a few
# reductions of <= 48 terms, so any two orders of the same arithmetic agree to ~1e-14
# (measured <= 7e-16 on AVX2 and AVX-512). atol=1e-12 is that with a margin for other kernels;
# 1e-10 against nn.MultiheadAttention, whose fused kernels reorder more; atol=0 where both
# sides run the same operations on the same values.


def pair(seed: int = 0, *, bias: bool = True) -> tuple[MultiHeadAttention, nn.MultiheadAttention]:
    """Our module and torch's, holding the same weights (float64)."""
    torch.manual_seed(seed)
    ref = nn.MultiheadAttention(D, H, bias=bias, batch_first=True).to(F64)
    ours = MultiHeadAttention(D, H, bias=bias).to(F64)
    with torch.no_grad():
        ours.in_proj.weight.copy_(ref.in_proj_weight)
        ours.out_proj.weight.copy_(ref.out_proj.weight)
        if bias:
            ours.in_proj.bias.copy_(ref.in_proj_bias)
            ours.out_proj.bias.copy_(ref.out_proj.bias)
    return ours, ref


def randn(*shape: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(*shape, dtype=F64, generator=torch.Generator().manual_seed(seed))


def right_padding(lengths: list[int], total: int) -> torch.Tensor:
    """(B, total) bool, True = padding after each row's length."""
    return torch.arange(total)[None, :] >= torch.tensor(lengths)[:, None]


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("masks", ["none", "padding", "causal", "attend2d", "attend3d", "all"])
def test_self_attention_matches_torch_multihead_attention(train, bias, masks):
    ours, ref = pair(bias=bias)
    ours.train(train), ref.train(train)
    x = randn(3, 5, D)
    padding = right_padding([5, 3, 4], 5) if masks in ("padding", "all") else None
    attend = None
    if masks in ("attend2d", "all"):
        attend = randn(5, 5, seed=7) > -0.5
        attend.fill_diagonal_(True)
    if masks == "attend3d":
        attend = randn(3, 5, 5, seed=8) > -0.5
        attend[:, :, 0] = True
    causal = masks in ("causal", "all")
    torch_mask = None if attend is None else ~attend  # torch's bool attn_mask: True = blocked
    if causal:
        blocked = torch.ones(5, 5, dtype=torch.bool).triu(1)
        torch_mask = blocked if torch_mask is None else torch_mask | blocked
    if torch_mask is not None and torch_mask.ndim == 3:
        torch_mask = torch_mask.repeat_interleave(H, dim=0)  # (B * H, L, S)
    expected, _ = ref(x, x, x, key_padding_mask=padding, attn_mask=torch_mask)
    got = ours(x, padding_mask=padding, attend_mask=attend, causal=causal)
    torch.testing.assert_close(got, expected, atol=1e-10, rtol=0)


def test_cross_attention_matches_torch_multihead_attention():
    ours, ref = pair()
    x, memory = randn(2, 4, D), randn(2, 7, D, seed=2)
    padding = right_padding([7, 5], 7)
    expected, _ = ref(x, memory, memory, key_padding_mask=padding)
    torch.testing.assert_close(ours(x, memory, padding_mask=padding), expected, atol=1e-10, rtol=0)


def test_per_head_attend_mask_matches_sdpa_on_projected_heads():
    """Oracle: q, k, v projected by hand from W_q, W_k, W_v, then F.scaled_dot_product_attention."""
    ours, _ = pair()
    x = randn(2, 5, D)
    attend = randn(2, H, 5, 5, seed=3) > 0
    attend[..., 0] = True
    w_q, w_k, w_v = ours.in_proj.weight.chunk(3)
    b_q, b_k, b_v = ours.in_proj.bias.chunk(3)

    def heads(w, b):
        return (x @ w.T + b).reshape(2, 5, H, DH).permute(0, 2, 1, 3)

    o = F.scaled_dot_product_attention(heads(w_q, b_q), heads(w_k, b_k), heads(w_v, b_v),
                                       attn_mask=attend)
    expected = ours.out_proj(o.permute(0, 2, 1, 3).reshape(2, 5, D))
    torch.testing.assert_close(ours(x, attend_mask=attend), expected, atol=1e-12, rtol=0)


def test_weights_are_the_softmax_of_scaled_scores_and_rows_sum_to_one():
    ours, _ = pair()
    x = randn(2, 5, D)
    padding = right_padding([5, 3], 5)
    out, weights = ours.forward_with_weights(x, padding_mask=padding, causal=True)
    q, k, _ = ours.in_proj(x).chunk(3, dim=-1)
    q = q.reshape(2, 5, H, DH).transpose(1, 2)
    k = k.reshape(2, 5, H, DH).transpose(1, 2)
    scores = q @ k.transpose(-1, -2) / math.sqrt(DH)
    blocked = torch.ones(5, 5, dtype=torch.bool).triu(1) | padding[:, None, None, :]
    expected = scores.masked_fill(blocked, float("-inf")).softmax(-1)
    torch.testing.assert_close(weights, expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, H, 5, dtype=F64), **FLOAT64_EXACT)
    torch.testing.assert_close(out, ours(x, padding_mask=padding, causal=True), atol=1e-12, rtol=0)


@pytest.mark.parametrize("path", ["forward", "weights", "cached"])
def test_row_with_no_visible_key_returns_zeros_not_nan(path):
    ours, _ = pair()
    x = randn(2, 4, D).requires_grad_()
    padding = torch.tensor([[True] * 4, [False, False, True, True]])
    if path == "forward":
        out = ours(x, padding_mask=padding)
    elif path == "weights":
        out, weights = ours.forward_with_weights(x, padding_mask=padding)
        assert torch.equal(weights[0], torch.zeros_like(weights[0]))
        torch.testing.assert_close(weights[1].sum(-1), torch.ones(H, 4, dtype=F64), **FLOAT64_EXACT)
    else:
        cache = KVCache(2, H, 4, DH, dtype=F64)
        out = ours(x, padding_mask=padding, cache=cache)
    assert torch.equal(out[0], torch.zeros(4, D, dtype=F64))
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_attend_mask_row_all_false_gives_zero_output_row():
    ours, _ = pair()
    attend = torch.ones(3, 3, dtype=torch.bool)
    attend[1] = False
    out = ours(randn(1, 3, D), attend_mask=attend)
    assert torch.equal(out[0, 1], torch.zeros(D, dtype=F64))
    assert torch.isfinite(out).all()


def test_causal_mask_is_bottom_right_aligned():
    """The last L queries over all S keys equal the last L rows of full causal attention."""
    ours, _ = pair()
    x = randn(2, 6, D)
    full = ours(x, causal=True)
    # cross-attention from the last 2 positions to all 6 uses the same q/k/v rows
    tail = ours(x[:, -2:], x, causal=True)
    torch.testing.assert_close(tail, full[:, -2:], atol=1e-12, rtol=0)
    _, weights = ours.forward_with_weights(x[:, -2:], x, causal=True)
    assert torch.equal(weights[..., 0, 5], torch.zeros(2, H, dtype=F64))  # query 4 misses key 5
    assert (weights[..., 1, :] > 0).all()  # the last query sees every key


@pytest.mark.parametrize("rotary", [False, True])
def test_cached_decoding_equals_full_causal_attention(rotary):
    torch.manual_seed(0)
    rope = RotaryEmbedding(DH) if rotary else None
    ours = MultiHeadAttention(D, H, rotary=rope).to(F64)
    x = randn(2, 7, D)
    full = ours(x, causal=True)
    cache = KVCache(2, H, 7, DH, dtype=F64)
    chunks = [ours(x[:, :3], causal=True, cache=cache)]  # a prompt, then one token at a time
    chunks += [ours(x[:, i : i + 1], causal=True, cache=cache) for i in range(3, 7)]
    torch.testing.assert_close(torch.cat(chunks, 1), full, atol=1e-12, rtol=0)
    assert cache.length == 7


def test_cross_attention_cache_is_filled_once_and_reused():
    ours, _ = pair()
    x, memory = randn(2, 3, D), randn(2, 5, D, seed=2)
    cache = KVCache(2, H, 5, DH, dtype=F64)
    first = ours(x, memory, cache=cache)
    again = ours(x, torch.zeros_like(memory), cache=cache)  # memory no longer read
    torch.testing.assert_close(again, first, atol=0, rtol=0)
    torch.testing.assert_close(first, ours(x, memory), atol=1e-12, rtol=0)


@pytest.mark.parametrize("path", ["forward", "weights"])
@pytest.mark.parametrize("kind", ["self", "cross"])
def test_a_call_with_a_bad_mask_raises_and_leaves_the_cache_unchanged(path, kind):
    """The mask is validated before x's keys are appended: a failed call changes nothing, so
    the same cache still decodes exactly like full attention (identity: cached == uncached)."""
    ours, _ = pair()
    x, memory = randn(2, 3, D), (randn(2, 5, D, seed=2) if kind == "cross" else None)
    cache = KVCache(2, H, 5 if kind == "cross" else 3, DH, dtype=F64)
    call = ours.forward if path == "forward" else ours.forward_with_weights
    wrong = torch.zeros(2, 4, dtype=torch.bool)  # S is 3 (self) or 5 (cross), never 4
    with pytest.raises(ValueError, match=r"padding_mask .* must have shape"):
        call(x, memory, padding_mask=wrong, cache=cache)
    assert cache.length == 0
    assert torch.equal(cache.keys, torch.zeros_like(cache.keys))
    out = ours(x, memory, causal=kind == "self", cache=cache)
    torch.testing.assert_close(out, ours(x, memory, causal=kind == "self"), atol=1e-12, rtol=0)


@pytest.mark.parametrize("n", [0, 1, 3, 5])
def test_a_prefix_of_rows_or_of_causal_queries_gives_that_prefix_of_the_output(n):
    """Invariants: rows are independent, and causal query i sees only keys <= i; both hold for
    an empty prefix (B = 0 or L = 0), which gives an empty output, not a reshape error."""
    ours, _ = pair()
    x = randn(5, 5, D)
    torch.testing.assert_close(ours(x[:n]), ours(x)[:n], atol=1e-12, rtol=0)
    prefix = ours(x[:, :n], causal=True)
    torch.testing.assert_close(prefix, ours(x, causal=True)[:, :n], atol=1e-12, rtol=0)
    _, weights = ours.forward_with_weights(x[:, :n], causal=True)
    assert weights.shape == (5, H, n, n)


def test_changing_future_tokens_leaves_earlier_outputs_unchanged():
    ours, _ = pair()
    x = randn(2, 6, D)
    y = x.clone()
    y[:, 4:] = randn(2, 2, D, seed=9)
    torch.testing.assert_close(ours(x, causal=True)[:, :4], ours(y, causal=True)[:, :4],
                               atol=0, rtol=0)


@examples(20)
@given(seed=st.integers(0, 2**16), length=st.integers(2, 6))
def test_self_attention_without_positions_is_permutation_equivariant(seed, length):
    ours, _ = pair()
    x = randn(2, length, D, seed=seed)
    padding = randn(2, length, seed=seed + 1) > 0.5
    padding[:, 0] = False
    perm = torch.randperm(length, generator=torch.Generator().manual_seed(seed))
    out = ours(x, padding_mask=padding)
    permuted = ours(x[:, perm], padding_mask=padding[:, perm])
    torch.testing.assert_close(permuted, out[:, perm], atol=1e-12, rtol=0)


@examples(25)
@given(
    batch=st.integers(1, 3),
    query_len=st.integers(1, 6),
    key_len=st.integers(1, 6),
    seed=st.integers(0, 2**16),
)
def test_random_shapes_and_padding_match_torch(batch, query_len, key_len, seed):
    ours, ref = pair()
    x, memory = randn(batch, query_len, D, seed=seed), randn(batch, key_len, D, seed=seed + 1)
    padding = randn(batch, key_len, seed=seed + 2) > 0.3
    padding[:, 0] = False  # torch returns NaN for rows with no key; compared separately above
    expected, _ = ref(x, memory, memory, key_padding_mask=padding)
    got = ours(x, memory, padding_mask=padding)
    torch.testing.assert_close(got, expected, atol=1e-10, rtol=0)


def test_attention_dropout_acts_in_training_only():
    torch.manual_seed(0)
    ours = MultiHeadAttention(D, H, dropout=0.5).to(F64)
    plain = MultiHeadAttention(D, H).to(F64)
    plain.load_state_dict(ours.state_dict())
    x = randn(2, 5, D)
    ours.eval()
    torch.testing.assert_close(ours(x), plain(x), atol=0, rtol=0)
    ours.train()
    assert not torch.allclose(ours(x), plain(x))  # dropout 0.5 changes outputs by O(1)


def test_reset_parameters_draws_xavier_uniform_per_projection_and_zero_biases():
    """Glorot bound sqrt(6 / (fan_in + fan_out)) for each D x D matrix."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(64, 4)
    bound = math.sqrt(6 / (64 + 64))
    for w in (*mha.in_proj.weight.chunk(3), mha.out_proj.weight):
        assert w.abs().max() <= bound
        # 4096 uniform draws: P(all inside 0.95 * bound) = 0.95**4096 ~ 1e-91 (and seeded)
        assert w.abs().max() > 0.95 * bound
    assert torch.equal(mha.in_proj.bias, torch.zeros(3 * 64))
    assert torch.equal(mha.out_proj.bias, torch.zeros(64))


def test_kv_cache_reorder_index_selects_every_row():
    cache = KVCache(2, H, 4, DH, dtype=F64)
    keys, values = randn(2, H, 3, DH), randn(2, H, 3, DH, seed=2)
    cache.append(keys, values)
    index = torch.tensor([1, 1, 0])
    cache.reorder(index)
    k, v = cache.view()
    assert torch.equal(k, keys[index]) and torch.equal(v, values[index])
    assert cache.length == 3


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(d_model=510, n_heads=8), ValueError,
         r"d_model \(510\) must be divisible by n_heads \(8\)"),
        (dict(d_model=16, n_heads=0), ValueError, r"n_heads must be >= 1, got 0"),
        (dict(d_model=16, n_heads=4, dropout=1.0), ValueError, r"dropout must be in \[0, 1\)"),
        (dict(d_model=16, n_heads=4, rotary=RotaryEmbedding(8)), ValueError,
         r"rotary.d_head \(8\)"),
    ],
)
def test_bad_constructor_arguments_raise_naming_the_values(kwargs, error, match):
    with pytest.raises(error, match=match):
        MultiHeadAttention(**kwargs)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda m, x: m(x[0]), ValueError, r"x must have 3 dims"),
        (lambda m, x: m(x[..., :8]), ValueError, r"x last dim must be 16"),
        (lambda m, x: m(x, randn(2, 3, 8)), ValueError, r"memory last dim must be 16"),
        (lambda m, x: m(x, randn(3, 3, D)), ValueError, r"memory batch size \(3\)"),
        (lambda m, x: m(x, padding_mask=torch.zeros(2, 4, dtype=torch.bool)), ValueError,
         r"padding_mask .* must have shape \(2, 5\), got \(2, 4\)"),
        (lambda m, x: m(x, padding_mask=torch.zeros(2, 5)), TypeError,
         r"torch.bool, got torch.float"),
        (lambda m, x: m(x, attend_mask=torch.ones(5, 5)), TypeError, r"attend_mask .* torch.bool"),
        (lambda m, x: m(x, attend_mask=torch.ones(5, 4, dtype=torch.bool)), ValueError,
         r"attend_mask must have shape \(L, S\) = \(5, 5\).*got \(5, 4\)"),
        (lambda m, x: m(x, attend_mask=torch.ones(2, 3, 5, 5, dtype=torch.bool)), ValueError,
         r"\(B, H, L, S\) = \(2, 4, 5, 5\); got \(2, 3, 5, 5\)"),
        (lambda m, x: m(x, causal=1), TypeError, r"causal must be a bool"),
        (lambda m, x: m(x, cache=KVCache(2, H, 3, DH, dtype=F64)), ValueError,
         r"length \(0\) \+ new positions \(5\) exceeds max_len \(3\)"),
        (lambda m, x: m(x, cache="cache"), TypeError, r"cache must be a KVCache"),
    ],
)
def test_bad_inputs_raise_naming_the_values(call, error, match):
    ours, _ = pair()
    with pytest.raises(error, match=match):
        call(ours, randn(2, 5, D))


def test_weights_of_a_variable_length_packed_mask_are_the_padded_batchs():
    """A stack that packs a padded batch hands its layers a variable-length mask (queries
    (1, N, D), no allowed matrix): forward_with_weights returns forward's packed output and, at
    the real rows, the padded batch's weights."""
    from addnorm.attention_mask import packed_mask, self_attention_mask
    from addnorm.packing import Packing

    ours, _ = pair()
    x = randn(3, 5, D)
    padding = right_padding([5, 2, 3], 5)
    packing = Packing.from_padding(padding)
    mask = packed_mask(self_attention_mask(x, n_heads=H, padding_mask=padding), packing,
                       padding_only=True)
    assert mask.variable_length
    packed = packing.pack(x)  # (1, N, D)
    out, weights = ours.forward_with_weights(packed, mask=mask)
    torch.testing.assert_close(out, ours(packed, mask=mask), atol=1e-12, rtol=0)
    _, padded_weights = ours.forward_with_weights(x, padding_mask=padding)
    real = ~padding  # (B, L)
    torch.testing.assert_close(weights.permute(0, 2, 1, 3)[real],
                               padded_weights.permute(0, 2, 1, 3)[real], **FLOAT64_EXACT)
