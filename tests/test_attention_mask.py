"""The attention mask: padding, attend and causal masks combined once, ready for SDPA.

Provenance: the definitions in the module docstring, restated element by element here: key j
of S may be attended by query i of L iff it is not padding, the attend mask allows it, and
(causal) ``j <= i + (S - L)``; a row that sees no key is opened and marked dead. Shapes and
polarity are checked against torch.nn's ``key_padding_mask`` (True = padding) negated.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from properties import examples

from addnorm.attention_mask import (
    build_attention_mask,
    causal_attend_mask,
    cross_attention_mask,
    packed_mask,
    self_attention_mask,
)
from addnorm.packing import Packing

CPU = torch.device("cpu")


def allowed_by_definition(padding, attend, causal, batch, heads, length, keys):
    """(B, H, L, S) bool from the definition, one element at a time."""
    out = torch.zeros(batch, heads, length, keys, dtype=torch.bool)
    for b, h, i, j in itertools.product(range(batch), range(heads), range(length), range(keys)):
        ok = padding is None or not bool(padding[b, j])
        ok = ok and (attend is None or bool(attend[b, h, i, j]))
        ok = ok and (not causal or j <= i + (keys - length))
        out[b, h, i, j] = ok
    return out


@examples(40)
@given(batch=st.integers(1, 3), heads=st.integers(1, 2), length=st.integers(1, 4),
       cached=st.integers(0, 3), causal=st.booleans(), use_padding=st.booleans(),
       use_attend=st.booleans(), seed=st.integers(0, 2**16))
def test_the_combined_mask_is_the_definition_with_dead_rows_opened_and_marked(
    batch, heads, length, cached, causal, use_padding, use_attend, seed
):
    keys = cached + length
    g = torch.Generator().manual_seed(seed)
    padding = torch.rand(batch, keys, generator=g) < 0.3 if use_padding else None
    attend = torch.rand(batch, heads, length, keys, generator=g) < 0.7 if use_attend else None
    mask = build_attention_mask(batch=batch, n_heads=heads, query_len=length, key_len=keys,
                                device=CPU, padding_mask=padding, attend_mask=attend,
                                causal=causal)
    want = allowed_by_definition(padding, attend, causal, batch, heads, length, keys)
    dead = ~want.any(-1, keepdim=True)  # (B, H, L, 1)
    if mask.allowed is None:  # nothing masked, or SDPA's is_causal path
        assert bool(want.all()) or (mask.is_causal and torch.equal(
            want, causal_attend_mask(length, keys, CPU).expand_as(want)))
        return
    assert torch.equal(mask.allowed.expand_as(want), want | dead)  # dead rows opened
    if mask.dead is None:
        assert not bool(dead.any())
    else:
        assert torch.equal(mask.dead.expand_as(dead), dead)
        assert torch.equal(mask.dead_rows.expand(batch, length, 1), dead.all(dim=1))
    if padding is not None:
        assert torch.equal(mask.query_padding, padding[:, cached:])  # the last L keys


def test_causal_is_bottom_right_aligned_and_one_query_after_a_cache_sees_every_key():
    assert causal_attend_mask(2, 4, CPU).tolist() == [[True, True, True, False],
                                                      [True, True, True, True]]
    x = torch.zeros(2, 1, 8)
    one = self_attention_mask(x, n_heads=2, causal=True, cached=5)
    assert one.allowed is None and not one.is_causal  # nothing to mask
    square = self_attention_mask(torch.zeros(2, 3, 8), n_heads=2, causal=True)
    assert square.allowed is None and square.is_causal  # SDPA's fast path


def test_a_row_with_every_key_padding_is_dead_and_the_cross_mask_uses_the_memorys_padding():
    x, memory = torch.zeros(2, 3, 8), torch.zeros(2, 4, 8)
    padding = torch.tensor([[True] * 4, [False, False, True, True]])
    mask = cross_attention_mask(x, memory, n_heads=2, padding_mask=padding)
    rows = mask.dead_rows.expand(2, 3, 1)  # (B, L|1, 1): one row of keys for every query
    assert rows[:, :, 0].tolist() == [[True] * 3, [False] * 3]
    assert mask.query_padding is None  # the memory's padding says nothing of the queries
    assert bool(mask.allowed[0].all())  # opened: no kernel sees a row of -inf


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"attend_mask": torch.ones(3, 5, dtype=torch.bool)}, ValueError,
     r"attend_mask must have shape \(L, S\) = \(3, 3\).*got \(3, 5\)"),
    ({"attend_mask": torch.ones(3, 3)}, TypeError, "attend_mask"),
    ({"padding_mask": torch.zeros(2, 4, dtype=torch.bool)}, ValueError, "padding_mask"),
    ({"causal": 1}, TypeError, r"causal must be a bool, got int \(1\)"),
])
def test_bad_masks_are_refused_naming_them(kwargs, error, match):
    with pytest.raises(error, match=match):
        self_attention_mask(torch.zeros(2, 3, 8), n_heads=2, **kwargs)
    with pytest.raises(ValueError, match=r"memory batch size \(1\) must equal x batch size \(2\)"):
        cross_attention_mask(torch.zeros(2, 3, 8), torch.zeros(1, 3, 8), n_heads=2)


def test_a_padding_only_mask_packs_to_variable_length_and_a_causal_one_packs_its_dead_rows():
    padding = torch.tensor([[False, False, True], [False, False, False]])
    packing = Packing.from_padding(padding)
    x = torch.zeros(2, 3, 8)
    plain = self_attention_mask(x, n_heads=2, padding_mask=padding)
    assert packed_mask(plain, packing, padding_only=True).variable_length
    attend = torch.tensor([[True, False, False], [True, True, False], [False, False, False]])
    masked = self_attention_mask(x, n_heads=2, padding_mask=padding, attend_mask=attend)
    packed = packed_mask(masked, packing)
    assert not packed.variable_length and packed.query_padding is None
    assert packed.dead_rows.shape == (1, 5, 1)  # the 5 real tokens
    assert packed.dead_rows[0, :, 0].tolist() == [False, False, False, False, True]
    assert torch.equal(packed.allowed, masked.allowed)  # the kernel still sees the padded rows
