"""addnorm.cache: what ``DecodingCache.extend`` records and returns. The model-level
equivalences (cached = uncached decoding, static = eager layout) are in tests/transformer."""

from __future__ import annotations

import pytest
import torch

from addnorm.cache import DecodingCache


def allocate(static: bool) -> DecodingCache:
    return DecodingCache.allocate(
        n_layers=1, batch_size=2, n_heads=1, d_head=2, max_len=6, dtype=torch.float32,
        device=torch.device("cpu"), static=static,
    )


@pytest.mark.parametrize("static", [False, True])
def test_no_padding_given_as_none_equals_an_all_false_mask(static):
    explicit, implicit = allocate(static), allocate(static)
    for new in (3, 1, 1):
        padding, positions = explicit.extend(torch.zeros(2, new, dtype=torch.bool))
        none_padding, none_positions = implicit.extend(None, new)
        assert torch.equal(none_positions, positions)  # the identity: arange continued
        if static:  # the static layout always carries its key padding (empty slots)
            assert none_padding is not None and torch.equal(none_padding, padding)
        else:  # eager, never padded: no mask at all
            assert none_padding is None and not padding.any()
    assert torch.equal(implicit.n_tokens, explicit.n_tokens)
    assert implicit.length == explicit.length == 5


def test_after_padding_the_eager_cache_returns_its_key_padding_even_for_none():
    cache = allocate(False)
    cache.extend(torch.tensor([[True, False], [False, False]]))
    padding, positions = cache.extend(None, 1)
    assert torch.equal(padding, torch.tensor([[True, False, False], [False, False, False]]))
    assert torch.equal(positions, torch.tensor([[1], [2]]))  # real tokens counted only


def test_none_needs_the_count_of_new_tokens():
    with pytest.raises(TypeError, match="new must be an int"):
        allocate(False).extend(None)
