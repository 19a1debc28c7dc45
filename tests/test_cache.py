"""addnorm.cache: what ``DecodingCache.extend`` records and returns. The model-level
equivalences (cached = uncached decoding, static = eager layout) are in tests/transformer."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from properties import examples
from torch._dynamo.utils import counters

from addnorm.cache import DecodingCache, memory_attention_mask


def allocate(static: bool) -> DecodingCache:
    return DecodingCache.allocate(
        n_layers=1, batch_size=2, n_heads=1, d_head=2, max_len=6, dtype=torch.float32,
        device=torch.device("cpu"), static=static,
    )


@pytest.mark.parametrize("static", [False, True])
def test_no_padding_given_as_none_equals_an_all_false_mask(static):
    explicit, implicit = allocate(static), allocate(static)
    for new in (3, 1, 1):
        start = implicit.length
        padding, positions = explicit.extend(torch.zeros(2, new, dtype=torch.bool))
        none_padding, none_positions = implicit.extend(None, new)
        if static:  # the static layout always carries its key padding and positions
            assert none_padding is not None and torch.equal(none_padding, padding)
            assert torch.equal(none_positions, positions)  # the identity: arange continued
        else:  # eager, never padded: no mask, and positions None, meaning start + arange(L)
            assert none_padding is None and none_positions is None and not padding.any()
            assert torch.equal(positions, (start + torch.arange(new)).expand(2, new))
    assert implicit.length == explicit.length == 5


def test_the_first_padding_after_unpadded_tokens_continues_every_row_from_length():
    # Oracle: a cache given the same tokens as all-False masks counts every row as real.
    unpadded, explicit = allocate(False), allocate(False)
    unpadded.extend(None, 3)
    explicit.extend(torch.zeros(2, 3, dtype=torch.bool))
    mask = torch.tensor([[True, False], [False, False]])
    _, positions = unpadded.extend(mask)
    _, want = explicit.extend(mask)
    assert torch.equal(positions, want)
    assert torch.equal(positions, torch.tensor([[2, 3], [3, 4]]))  # a pad: its row's last


def test_after_padding_the_eager_cache_returns_its_key_padding_even_for_none():
    cache = allocate(False)
    cache.extend(torch.tensor([[True, False], [False, False]]))
    padding, positions = cache.extend(None, 1)
    assert torch.equal(padding, torch.tensor([[True, False, False], [False, False, False]]))
    assert torch.equal(positions, torch.tensor([[1], [2]]))  # real tokens counted only


def test_none_needs_the_count_of_new_tokens():
    with pytest.raises(TypeError, match="new must be an int"):
        allocate(False).extend(None)


# ------------------------------------------------------------------ static layout


def two_caches(batch: int = 3, max_len: int = 7) -> tuple[DecodingCache, DecodingCache]:
    """A dynamic and a static cache of the same shape: 2 layers, 2 heads, Dh 4."""
    return tuple(
        DecodingCache.allocate(
            n_layers=2, batch_size=batch, n_heads=2, d_head=4, max_len=max_len,
            dtype=torch.float64, device=torch.device("cpu"), static=static,
        )
        for static in (False, True)
    )


def write(cache: DecodingCache, padding: torch.Tensor | None, keys: torch.Tensor):
    """One model step's writes: extend, then every layer's append (values = -keys)."""
    key_padding, positions = cache.extend(padding, keys.shape[2])
    cached = cache.layers[0].self_attn.cached_before(keys.shape[2])
    views = [layer.self_attn.append(keys, -keys) for layer in cache.layers]
    return key_padding, positions, cached, views


def new_keys(batch: int, new: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 2, new, 4, generator=generator, dtype=torch.float64)  # (B, H, L, Dh)


def test_eager_static_cache_returns_what_the_dynamic_cache_returns():
    # Oracle: the dynamic layout. Eager, a static cache fills its slots from the front and
    # returns the written prefix, so every view, key padding and position must be equal.
    dynamic, static = two_caches()
    prompt_padding = torch.tensor([[False] * 3, [True, False, False], [True, True, False]])
    steps = [(prompt_padding, 3), (None, 1), (torch.tensor([[False], [True], [False]]), 1),
             (None, 1)]
    for seed, (padding, new) in enumerate(steps):
        keys = new_keys(3, new, seed)
        got, expected = write(static, padding, keys), write(dynamic, padding, keys)
        static_padding, static_positions, static_cached, static_views = got
        dynamic_padding, dynamic_positions, dynamic_cached, dynamic_views = expected
        assert static_padding is not None and dynamic_padding is not None  # padding was given
        assert torch.equal(static_padding, dynamic_padding)
        assert torch.equal(static_positions, dynamic_positions)
        assert static_cached == dynamic_cached
        for (k, v), (k_ref, v_ref) in zip(static_views, dynamic_views, strict=True):
            assert torch.equal(k, k_ref) and torch.equal(v, v_ref)
    assert static.length == dynamic.length == 6
    assert all(layer.self_attn.length == 6 for layer in static.layers)
    assert static.padding_mask[:, 6:].all()  # the slot not yet written is padding


def test_eager_static_cache_refuses_overflow_as_the_dynamic_cache_does():
    for cache in two_caches(max_len=4):
        write(cache, None, new_keys(3, 3, 0))
        with pytest.raises(ValueError, match=r"cache overflow: length \(3\) \+ new tokens \(2\)"):
            cache.extend(None, 2)
        assert cache.length == 3  # a refused write leaves the cache as it was
        kv = cache.layers[0].self_attn
        with pytest.raises(ValueError, match=r"KV cache overflow: length \(3\) \+ new positions"):
            kv.append(new_keys(3, 2, 1), new_keys(3, 2, 1))
        assert kv.length == 3


def test_static_cache_reorder_follows_the_dynamic_cache():
    # Oracle: the dynamic layout, reordered by the same index (beam search's expand, then a
    # parent choice); the static count is shared by all rows and stays.
    dynamic, static = two_caches()
    index = torch.tensor([2, 2, 0, 1])
    for cache in (dynamic, static):
        write(cache, torch.tensor([[False, False], [True, False], [False, False]]),
              new_keys(3, 2, 0))
        cache.reorder(index)
    got, expected = write(static, None, new_keys(4, 1, 1)), write(dynamic, None, new_keys(4, 1, 1))
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    for (k, v), (k_ref, v_ref) in zip(got[3], expected[3], strict=True):
        assert torch.equal(k, k_ref) and torch.equal(v, v_ref)
    assert static.length == 3


def compiled_write(cache: DecodingCache, keys: torch.Tensor):
    return torch.compile(write, fullgraph=True, backend="eager")(cache, None, keys)


@torch.no_grad()
def test_compiled_static_steps_write_in_place_with_one_graph(fresh_dynamo):
    # Oracle: the dynamic layout. Compiled, a static cache writes the new token at slot
    # `written` of the same buffers and returns them whole: the written prefix equals the
    # dynamic cache's, the rest is padding, and the new query sees every slot.
    dynamic, static = two_caches()
    prompt_padding = torch.tensor([[False] * 3, [True, False, False], [True, True, False]])
    write(static, prompt_padding, new_keys(3, 3, 0))  # the prompt, eager
    write(dynamic, prompt_padding, new_keys(3, 3, 0))
    buffers = [layer.self_attn.keys for layer in static.layers]
    for step in range(1, 4):
        keys = new_keys(3, 1, step)
        key_padding, positions, cached, views = compiled_write(static, keys)
        _, dynamic_positions, _, dynamic_views = write(dynamic, None, keys)
        end = 3 + step
        assert cached == static.max_len - 1  # bottom-right causal: every slot visible
        assert torch.equal(positions, dynamic_positions)
        assert torch.equal(key_padding[:, :end], dynamic.padding_mask[:, :end])
        assert key_padding[:, end:].all()
        for (k, v), (k_ref, v_ref) in zip(views, dynamic_views, strict=True):
            assert k.shape[2] == static.max_len
            assert torch.equal(k[:, :, :end], k_ref) and torch.equal(v[:, :, :end], v_ref)
    for layer, buffer in zip(static.layers, buffers, strict=True):
        assert layer.self_attn.keys is buffer  # written in place, never reallocated
    assert static.length == 6 and static.layers[1].self_attn.length == 6
    assert counters["stats"]["unique_graphs"] == 1  # one graph for every step


@torch.no_grad()
def test_a_compiled_static_write_of_several_tokens_is_refused_while_tracing(fresh_dynamo):
    # With L > 1 the bottom-right causal rule over every slot would let a new token see the
    # later ones of its block. Dynamo reports the ValueError raised while tracing as an
    # Unsupported error (a RuntimeError) that carries its message.
    _, static = two_caches()
    with pytest.raises(RuntimeError, match=r"one new token per row \(L = 1\), got L = 3"):
        compiled_write(static, new_keys(3, 3, 0))
    kv = static.layers[0].self_attn
    append = torch.compile(kv.append, fullgraph=True, backend="eager")
    with pytest.raises(RuntimeError, match=r"one new token per row \(L = 1\), got L = 2"):
        append(new_keys(3, 2, 0), new_keys(3, 2, 0))
    assert static.length == 0 and kv.length == 0


@torch.no_grad()
def test_a_compiled_static_step_past_max_len_fails_inside_the_graph(fresh_dynamo):
    # A graph cannot read the count back to raise a ValueError; it asserts in graph instead.
    _, static = two_caches(max_len=4)
    write(static, None, new_keys(3, 3, 0))
    compiled_write(static, new_keys(3, 1, 1))  # the last slot
    with pytest.raises(RuntimeError, match=r"cache overflow: more tokens than max_len \(4\)"):
        compiled_write(static, new_keys(3, 1, 2))


def _effective(mask, batch: int, keys: int) -> list[torch.Tensor]:
    """A mask's tensors at their full shape (B, 1, 1, S) / (B, 1, 1, 1) / (B, 1, 1); None
    is what it means: every key allowed, no dead row."""
    allowed = torch.ones(batch, 1, 1, keys, dtype=torch.bool) if mask.allowed is None else (
        mask.allowed.expand(batch, 1, 1, keys))
    dead = [torch.zeros(batch, *shape, dtype=torch.bool) if t is None else t.expand(batch, *shape)
            for t, shape in ((mask.dead, (1, 1, 1)), (mask.dead_rows, (1, 1)))]
    return [allowed, *dead]


@examples(20)
@given(lengths=st.lists(st.integers(0, 4), min_size=1, max_size=4), data=st.data())
def test_the_memory_mask_follows_a_reorder_as_if_built_from_the_reordered_padding(lengths,
                                                                                   data):
    # Identity: reordering rows of a mask built from padding = building it from the reordered
    # padding (rows of no real token included: they see no key, and are opened and marked).
    batch = len(lengths)
    index = torch.tensor(data.draw(st.lists(st.integers(0, batch - 1), min_size=1,
                                            max_size=6)))
    memory = torch.randn(batch, 4, 2)
    padding = torch.arange(4)[None, :] >= torch.tensor(lengths)[:, None]  # (B, 4)
    cache = DecodingCache.allocate(
        n_layers=1, batch_size=batch, n_heads=1, d_head=2, max_len=3, dtype=torch.float32,
        device=torch.device("cpu"), memory=memory, memory_padding_mask=padding,
    )
    cache.reorder(index)
    rows = len(index)
    expected = memory_attention_mask(memory[index], padding[index])
    for got, want in zip(_effective(cache.memory_mask, rows, 4), _effective(expected, rows, 4),
                         strict=True):
        assert torch.equal(got, want)


# ------------------------------------------------------------------ ids, for sliding windows


def _with_ids(static: bool, max_len: int = 6) -> DecodingCache:
    return DecodingCache.allocate(
        n_layers=2, batch_size=2, n_heads=1, d_head=2, max_len=max_len, dtype=torch.float32,
        device=torch.device("cpu"), static=static, keep_ids=True,
    )


def _fill(cache: DecodingCache, ids: torch.Tensor, padding: torch.Tensor | None) -> None:
    """Record ``ids`` as a model's run does: extend, then every layer's keys and values
    (each position's value: its id, so what is kept can be read back)."""
    cache.extend(padding, ids.shape[1], ids=ids)
    kv = ids[:, None, :, None].float().expand(-1, 1, -1, 2)  # (B, H, L, Dh)
    for layer in cache.layers:
        layer.self_attn.append(kv, kv)


@pytest.mark.parametrize("static", [False, True])
def test_a_full_cache_gives_its_last_positions_and_restarts_from_a_fresh_one(static):
    cache = _with_ids(static)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [0, 0, 7, 8, 9, 11]])
    padding = ids == 0
    _fill(cache, ids, padding)
    kept, kept_padding = cache.last_positions(3)
    assert torch.equal(kept, ids[:, 3:]) and torch.equal(kept_padding, padding[:, 3:])
    fresh = _with_ids(False, max_len=4)
    window = torch.cat([kept, torch.tensor([[12], [13]])], dim=1)  # (2, 4)
    _fill(fresh, window, torch.zeros(2, 4, dtype=torch.bool))
    addresses = [t.data_ptr() for t in (cache.padding_mask, cache.ids, cache.n_tokens)]
    cache.restart_from(fresh)
    assert cache.length == 4 and torch.equal(cache.ids[:, :4], window)
    assert torch.equal(cache.n_tokens, torch.tensor([4, 4]))  # every row: 4 real tokens
    assert not cache.padding_mask[:, :4].any()
    assert bool((cache.padding_mask[:, 4:] == static).all())  # as allocate leaves them
    for layer in cache.layers:
        assert layer.self_attn.length == 4
        assert torch.equal(layer.self_attn.keys[:, 0, :4, 0], window.float())
    if static:  # in place: a compiled step's buffers keep their addresses
        assert addresses == [t.data_ptr() for t in (cache.padding_mask, cache.ids,
                                                    cache.n_tokens)]
    # the next step continues at position 4 of every row
    _, positions = cache.extend(None, 1, ids=torch.tensor([[1], [2]]))
    assert positions is None or torch.equal(positions, torch.tensor([[4], [4]]))


def test_a_dynamic_cache_slides_only_once_full_and_only_with_ids():
    cache = _with_ids(False)
    _fill(cache, torch.tensor([[5, 6], [7, 8]]), None)
    with pytest.raises(ValueError, match="holds 2 of its 6 positions"):
        cache.last_positions(2)
    with pytest.raises(ValueError, match="keep \\(7\\) exceeds"):
        cache.last_positions(7)
    with pytest.raises(ValueError, match="ids exactly when the cache keeps ids"):
        cache.extend(None, 1)
    plain = allocate(False)
    with pytest.raises(ValueError, match="keeps no ids"):
        plain.last_positions(1)
    with pytest.raises(ValueError, match="ids exactly when the cache keeps ids"):
        plain.extend(None, 1, ids=torch.tensor([[1], [2]]))


@pytest.mark.parametrize("static", [False, True])
def test_a_reorder_moves_the_ids_with_their_rows(static):
    cache = _with_ids(static)
    _fill(cache, torch.tensor([[5, 6], [7, 8]]), None)
    cache.reorder(torch.tensor([1, 1]))
    assert torch.equal(cache.ids[:, :2], torch.tensor([[7, 8], [7, 8]]))

