"""addnorm.attention_padding: the guards that keep padding's values out of attention's real
outputs and gradients, each held to its definition.

Provenance: identities. ``hidden_keys`` is "no live query row may attend the key", recomputed
from the mask's ``allowed`` and ``dead``; the two query guards leave the real rows' values bit
for bit (selected with ``torch.where``), and their gradients reach the real rows only.
(MultiHeadAttention with NaN, inf and 1e30 at padding: tests/test_padding_numerics.py.)
"""

from __future__ import annotations

import torch

from addnorm.attention_mask import self_attention_mask
from addnorm.attention_padding import finite_padding_queries, held_padding_rows, hidden_keys

PADDING = torch.tensor([[False, False, True], [True, True, True]])  # (B, L), row 1 all padding


def test_hidden_keys_are_those_no_live_row_attends():
    x = torch.zeros(2, 3, 4)
    assert hidden_keys(self_attention_mask(x, n_heads=2)) is None
    mask = self_attention_mask(x, n_heads=2, padding_mask=PADDING, causal=True)
    live = mask.allowed & ~mask.dead  # the all-padding row is opened for the kernel, not live
    expected = ~live.any(dim=-2)[..., None]  # (B|1, H|1, S, 1)
    assert torch.equal(hidden_keys(mask), expected)
    assert torch.equal(hidden_keys(mask)[:, 0, :, 0], PADDING)  # here: the padding keys


def test_finite_padding_queries_zero_only_the_padding_rows_non_finite_entries():
    q = torch.randn(2, 2, 3, 4)  # (B, H, L, Dh)
    q[0, :, 2, 0], q[1, :, 0, 1], q[0, :, 0, 3] = float("nan"), float("inf"), float("nan")
    q.requires_grad_()
    out = finite_padding_queries(q, PADDING)
    rows = PADDING[:, None, :, None].expand_as(q)  # (B, H, L, Dh)
    real_or_finite = ~rows | torch.isfinite(q)
    # bit for bit, and a NaN in a real row stays NaN
    torch.testing.assert_close(out[real_or_finite], q[real_or_finite], rtol=0, atol=0,
                               equal_nan=True)
    assert (out[rows & ~torch.isfinite(q)] == 0).all()
    out.sum().backward()
    assert torch.equal(q.grad, (~rows).to(q.dtype))  # padding rows get no gradient


def test_held_padding_rows_keep_their_values_and_stop_their_gradient():
    heads = torch.randn(2, 2, 3, 4, requires_grad=True)  # (B, H, L, Dh)
    out = held_padding_rows(heads, PADDING)
    assert torch.equal(out, heads)
    rows = PADDING[:, None, :, None].expand_as(heads)
    out.backward(torch.ones_like(out).masked_fill(rows, float("nan")))  # NaN from downstream
    assert torch.equal(heads.grad, (~rows).to(heads.dtype))  # stopped at the padding rows
