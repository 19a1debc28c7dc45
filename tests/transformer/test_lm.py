"""TransformerLM: cached steps equal full recomputation, a padded row gives its logits alone,
causality, the unmasked is_causal path, and the cache's length bound. Oracles: invariants of
the same model (float64 where it stays in float64: FLOAT64_EXACT)."""

from __future__ import annotations

import pytest
import torch
from tiny_transformers import (
    PAD,
    POSITIONS,
    PROMPT,
    V,
    ids,
    language_model,
)
from tolerances import FLOAT32_MODEL, FLOAT64_EXACT

from addnorm.cache import DecodingCache


@pytest.mark.parametrize("positions", POSITIONS)
@torch.no_grad()
def test_lm_cached_steps_give_the_logits_of_full_recomputation(positions):
    model = language_model(positions)
    tokens = ids(2, 4)
    cache, first = model.start(PROMPT, max_new_tokens=5)
    steps = [first] + [model.step(tokens[:, i : i + 1], cache) for i in range(4)]
    full = model(torch.cat([PROMPT, tokens], dim=1))[:, 3:]
    torch.testing.assert_close(torch.stack(steps, 1), full, **FLOAT64_EXACT)
    assert cache.length == 8


@pytest.mark.parametrize("positions", ["sinusoidal", "rotary"])
@torch.no_grad()
def test_lm_left_and_right_padded_rows_give_their_logits_alone(positions):
    model = language_model(positions).float()
    row = torch.tensor([[7, 8, 9]])
    alone = model(row)[0]
    left = model(torch.tensor([[5, 6, 7, 8, 9], [PAD, PAD, 7, 8, 9]]))[1, 2:]
    right = model(torch.tensor([[5, 6, 7, 8, 9], [7, 8, 9, PAD, PAD]]))[1, :3]
    torch.testing.assert_close(left, alone, **FLOAT32_MODEL)  # float32, other shapes
    torch.testing.assert_close(right, alone, **FLOAT32_MODEL)


@torch.no_grad()
def test_lm_changing_future_tokens_leaves_earlier_logits_unchanged():
    model = language_model()
    sequence = ids(2, 6)
    changed = sequence.clone()
    changed[:, 4:] = ids(2, 2, seed=7)
    torch.testing.assert_close(model(sequence)[:, :4], model(changed)[:, :4], atol=0, rtol=0)


def test_step_beyond_the_preallocated_length_raises():
    model = language_model()
    cache, _ = model.start(PROMPT, max_new_tokens=1)
    assert isinstance(cache, DecodingCache)
    model.step(torch.full((2, 1), 4), cache)
    with pytest.raises(ValueError, match=r"length \(5\) \+ new tokens \(1\) exceeds max_len \(5\)"):
        model.step(torch.full((2, 1), 4), cache)


def test_an_unpadded_lm_batch_takes_sdpa_is_causal_path_with_the_same_logits(monkeypatch):
    """With no padding token at all, attention gets no mask tensor, only ``is_causal``.

    Oracle: the same blocks run with an explicit all-False padding mask (the masked path).
    """
    model = language_model()
    ids = torch.randint(3, V, (3, 9), generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        x = model.embed(ids, None)
        masked = model.blocks(x, padding_mask=torch.zeros(3, 9, dtype=torch.bool), causal=True)
        expected = model.to_logits(masked)
    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False):
        seen.append((attn_mask is None, is_causal))
        return sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal)

    monkeypatch.setattr("addnorm.attention.F.scaled_dot_product_attention", spy)
    with torch.no_grad():
        got = model(ids)
    assert seen and all(seen_entry == (True, True) for seen_entry in seen)
    torch.testing.assert_close(got, expected, **FLOAT64_EXACT)


def test_the_context_is_max_len_until_a_run_sets_it():
    model = language_model("learned")  # max_len 16
    assert model.context == 16 and model.generation_spec.context == 16
    model.context = 5
    assert model.context == 5 and model.generation_spec.context == 5
    model.context = None
    assert model.context == 16
    with pytest.raises(ValueError, match=r"context \(17\) exceeds max_len \(16\)"):
        model.context = 17
    with pytest.raises(ValueError, match="context must be >= 1"):
        model.context = 0
    computed = language_model("rotary")
    computed.context = 40  # positions computed for any length: a run's longer windows
    assert computed.context == 40


@pytest.mark.parametrize("positions", POSITIONS)
@torch.no_grad()
def test_a_prompt_longer_than_the_window_is_run_from_its_end(positions):
    # Oracle: the forward of the prompt's last `window` tokens (positions from 0), also when
    # the prompt is longer than a learned table (which the window lets it be).
    model = language_model(positions)
    prompt = ids(2, 20)
    prompt[1, :3] = PAD  # padding the window drops
    cache, logits = model.start(prompt, max_new_tokens=4, window=6)
    torch.testing.assert_close(logits, model(prompt[:, -6:])[:, -1], **FLOAT64_EXACT)
    assert cache.max_len == 6 and cache.length == 6 and torch.equal(cache.ids, prompt[:, -6:])
    assert torch.equal(cache.prompt_padding_mask, prompt == PAD)  # all of it, for the rules
    short, _ = model.start(prompt[:, -3:], max_new_tokens=2, window=6)
    assert short.max_len == 5  # a window bounds the cache; it never grows it


def test_a_window_past_a_learned_table_is_refused():
    model = language_model("learned")
    with pytest.raises(ValueError, match=r"window \(17\) exceeds max_len \(16\)"):
        model.start(PROMPT, max_new_tokens=2, window=17)
