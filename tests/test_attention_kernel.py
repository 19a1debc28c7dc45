"""The attention kernel choice (addnorm.attention_kernel): SDPA, or on the CPU in bfloat16
without gradients the explicit product torch.nn's fast path computes.

Oracle: ``softmax(q k^T / sqrt(Dh)) v`` in float64 from the same bfloat16 q, k, v (their values
exactly). The explicit product rounds ``q / sqrt(Dh)`` and the scores to bfloat16 (relative
error u = 2**-8 each, so ``|ds| <= 2 u max|s|`` up to float32 sums), the softmax then moves
each weight by a relative ``2 max|ds|`` at most and rounds it (u), and the float32 sum
``p v`` is rounded once (u |out|): ``|out - exact| <= (4 u max|s| + u) max|v| + u |out|``,
checked with a factor of 2 for the float32 sums and the first-order expansion.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tolerances import u
from torch.overrides import TorchFunctionMode

from addnorm import MultiHeadAttention
from addnorm.attention_kernel import explicit_product_pays, scaled_dot_product

BF16 = torch.bfloat16


class SdpaCalls(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += func is F.scaled_dot_product_attention
        return func(*args, **(kwargs or {}))


def qkv(batch: int, heads: int, length: int, d_head: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, length, d_head, generator=gen).to(BF16) for _ in range(3)]


def exact(q, k, v, allowed=None):
    q, k, v = q.double(), k.double(), v.double()
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    return scores.softmax(-1) @ v, scores


@pytest.mark.parametrize("masking", ["none", "padding", "causal"])
def test_the_explicit_product_is_attention_to_bfloat16_rounding(masking):
    q, k, v = qkv(3, 4, 17, 32, seed=1)
    allowed = None
    if masking == "padding":
        allowed = torch.ones(3, 1, 1, 17, dtype=torch.bool)
        allowed[1, ..., 9:] = False
    if masking == "causal":
        allowed = torch.ones(17, 17, dtype=torch.bool).tril()
    watch = SdpaCalls()
    with torch.no_grad(), watch:
        out = scaled_dot_product(q, k, v, allowed=None if masking == "causal" else allowed,
                                 is_causal=masking == "causal")
    assert watch.count == 0  # the explicit product, not SDPA
    want, scores = exact(q, k, v, allowed)
    s_max = scores.masked_fill(scores.isinf(), 0).abs().max()
    bound = 2 * ((4 * u(BF16) * s_max + u(BF16)) * v.double().abs().max()
                 + u(BF16) * want.abs())
    assert out.dtype == BF16
    assert ((out.double() - want).abs() <= bound).all()


def test_sdpa_keeps_every_other_case():
    q, k, v = qkv(2, 2, 8, 16, seed=2)
    with torch.no_grad():
        assert explicit_product_pays(q, k, v, 0.0)
        assert not explicit_product_pays(q, k, v, 0.1)  # attention dropout
        assert not explicit_product_pays(q.half(), k.half(), v.half(), 0.0)  # float16 overflows
        assert not explicit_product_pays(q.float(), k.float(), v.float(), 0.0)
        long = torch.zeros(1, 1, 4097, 16, dtype=BF16)
        assert not explicit_product_pays(long, long, long, 0.0)  # more than 2**24 scores
    q.requires_grad_()
    assert not explicit_product_pays(q, k, v, 0.0)  # the backward would keep the scores


def test_bf16_attention_with_padding_and_dead_rows_is_finite_and_close_to_float32():
    """The module in bfloat16 without gradients (the explicit product) against the same
    module in float32: a fully padded row gives zeros, never NaN, and the rest agrees to a
    few bfloat16 roundings of unit-scale values: about seven (the weights and the input, in_proj,
    the scaled queries, the scores, the softmax, the heads, out_proj), each u relative, with a
    factor of 2 for the growth of the scores, so 16 u."""
    torch.manual_seed(0)
    attention = MultiHeadAttention(32, 4)
    x = torch.randn(3, 6, 32)
    padding = torch.zeros(3, 6, dtype=torch.bool)
    padding[0, 4:] = True
    padding[2] = True  # every key padding
    with torch.no_grad():
        want = attention(x, padding_mask=padding, causal=True)
        got = attention.bfloat16()(x.bfloat16(), padding_mask=padding, causal=True)
    assert torch.equal(got[2], torch.zeros_like(got[2]))
    torch.testing.assert_close(got.float(), want, rtol=16 * u(BF16), atol=16 * u(BF16))
