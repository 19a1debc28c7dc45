"""addnorm.generation.window: past its window a decoder-only model's generation slides,
recomputing; positions past the window are never used.

Oracles: the model's own forward over the tokens each new token is predicted from (the
window's last slots, padding included, per the module docstring's schedule: every
``stride`` tokens a recomputation from ``window - stride + 1`` of them, then one more each
step); with ``stride=1`` nanoGPT's ``generate`` (crop the sequence to its last ``window``
tokens, run the forward, take the argmax), written out here; a learned position table of
exactly ``window`` rows, which any later position would index past. Float64 models:
FLOAT64_EXACT (cached steps, prefill and forward differ only in summation order).
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from properties import examples
from tiny_transformers import PAD, POSITIONS, V, language_model
from tolerances import FLOAT64_EXACT
from torch._dynamo.utils import counters

from addnorm.family import GenerationSpec
from addnorm.generation.config import GenerationConfig
from addnorm.generation.window import Window, default_stride, sliding_step, window_of
from addnorm.transformer.lm import TransformerLM


def _spec(context: int | None, max_positions: int | None = None) -> GenerationSpec:
    return GenerationSpec(vocab_size=V, eos_id=None, pad_id=PAD, start_id=None,
                          max_positions=max_positions, cached_layers=1, d_model=8,
                          device=torch.device("cpu"), context=context)


def _schedule(prompt_length: int, new: int, window: Window) -> list[int]:
    """How many slots each new token is predicted from (the module docstring's rule)."""
    count, seen = min(prompt_length, window.size), []
    for step in range(new):
        if step > 0:
            count = count + 1 if count < window.size else window.keep + 1
        seen.append(count)
    return seen


def _prompts(batch: int, length: int, pads: list[int], seed: int) -> torch.Tensor:
    ids = torch.randint(3, V, (batch, length), generator=torch.Generator().manual_seed(seed))
    for row, n in enumerate(pads):
        ids[row, :n] = PAD  # left padding
    return ids


def test_the_window_is_the_models_context_unless_the_config_names_one():
    assert (w := window_of(_spec(16), GenerationConfig())) is not None
    assert (w.size, w.stride, w.keep) == (16, default_stride(16), 12)
    w = window_of(_spec(16), GenerationConfig(window=40, window_stride=1))
    assert w is not None and (w.size, w.stride) == (40, 1)  # asked for: past the context
    assert [default_stride(n) for n in (1, 3, 4, 64)] == [1, 1, 1, 16]
    assert window_of(_spec(None), GenerationConfig()) is None  # an encoder-decoder's


@pytest.mark.parametrize(("spec", "config", "message"), [
    (_spec(None), GenerationConfig(window=4), "decoder-only model with a context"),
    (_spec(None), GenerationConfig(window_stride=2), "decoder-only model with a context"),
    (_spec(8, max_positions=8), GenerationConfig(window=9), r"window \(9\) exceeds max_len \(8\)"),
    (_spec(4), GenerationConfig(window_stride=5), r"window_stride \(5\) exceeds the window \(4\)"),
])
def test_a_window_the_model_cannot_take_is_refused(spec, config, message):
    with pytest.raises(ValueError, match=message):
        window_of(spec, config)


def test_the_config_refuses_a_stride_past_its_window():
    with pytest.raises(ValueError, match=r"window_stride \(5\) must be <= window \(4\)"):
        GenerationConfig(window=4, window_stride=5)
    with pytest.raises(ValueError, match="window must be >= 1"):
        GenerationConfig(window=0)


@examples(20)
@given(positions=st.sampled_from(POSITIONS), size=st.integers(1, 7), data=st.data(),
       batch=st.integers(1, 3), length=st.integers(1, 10), new=st.integers(1, 24))
@torch.no_grad()
def test_each_token_is_predicted_by_the_forward_of_its_window(positions, size, data, batch,
                                                              length, new):
    # Teacher-forced through start and the sliding step: every step's logits are the model's
    # forward over the slots the schedule says the token is predicted from, whatever the
    # padding (a left-padded row's window holds its padding until it slides out).
    window = Window(size, data.draw(st.integers(1, size), label="stride"))
    pads = data.draw(st.lists(st.integers(0, length - 1), min_size=batch, max_size=batch))
    model = language_model(positions)
    prompt = _prompts(batch, length, pads, seed=length)
    fed = torch.randint(3, V, (batch, new), generator=torch.Generator().manual_seed(new))
    sequence = torch.cat([prompt, fed], dim=1)  # (B, L0 + new)
    padding = sequence == PAD
    cache, logits = model.start(prompt, max_new_tokens=new, window=size)
    step = sliding_step(model.step, model, window, min(length, size))
    got = [logits] + [step(fed[:, i : i + 1], cache) for i in range(new - 1)]
    for i, seen in enumerate(_schedule(length, new, window)):
        end = length + i  # the token at `end` is predicted from the `seen` slots before it
        slots = slice(end - seen, end)
        expected = model(sequence[:, slots], padding_mask=padding[:, slots])[:, -1]
        torch.testing.assert_close(got[i], expected, **FLOAT64_EXACT)
    assert cache.length <= size


@examples(10)
@given(positions=st.sampled_from(POSITIONS), size=st.integers(1, 6),
       length=st.integers(1, 9), new=st.integers(1, 20))
@torch.no_grad()
def test_stride_one_is_nanogpts_generate(positions, size, length, new):
    # nanoGPT: idx_cond = idx[:, -block_size:]; logits = model(idx_cond)[:, -1]; argmax.
    model = language_model(positions)
    idx = _prompts(2, length, [0, 0], seed=size)
    config = GenerationConfig(max_new_tokens=new, pad_id=PAD, window=size, window_stride=1)
    generated = model.generate(idx, config)
    for _ in range(new):
        logits = model(idx[:, -size:])[:, -1]
        logits[:, PAD] = float("-inf")  # generation never emits padding
        idx = torch.cat([idx, logits.argmax(dim=-1, keepdim=True)], dim=1)
    assert torch.equal(generated, idx[:, length:])


@pytest.mark.parametrize("strategy", ["greedy", "sample", "beam"])
@torch.no_grad()
def test_positions_past_the_window_are_never_used(strategy, monkeypatch):
    # A learned table of exactly `window` rows: a position past it would index outside the
    # table (an IndexError on the CPU). A prompt of three windows, five windows of tokens.
    size = 6
    torch.manual_seed(0)
    model = TransformerLM(dataclasses.replace(language_model("learned").cfg, max_len=size))
    model = model.double().eval()
    assert model.context == size  # max_len: a model built here knows no run
    sizes = []
    allocate = type(model)._cache

    def recorded(self, batch, room, **kwargs):
        sizes.append(room)
        return allocate(self, batch, room, **kwargs)

    monkeypatch.setattr(type(model), "_cache", recorded)
    prompt = _prompts(2, 3 * size, [0, 4], seed=3)
    config = dataclasses.replace(model.generation_config, max_new_tokens=5 * size,
                                 strategy=strategy, num_beams=2, eos_id=None)
    out = model.generate(prompt, config, generator=torch.Generator().manual_seed(0))
    assert out.shape == (2, 5 * size)  # every token, none cut
    assert max(sizes) <= size  # the cache never holds more than the window


@torch.no_grad()
def test_beam_search_scores_its_beams_as_the_sliding_window_reads_them():
    # Beams reorder the cache, its ids included: each returned beam's score (length_penalty
    # 0: the sum of its tokens' log-probs) must be the log-probs of its tokens fed alone,
    # teacher-forced through the same window (decode_log_probs starts from a one-token
    # prompt, as this call does). No padding id and no stop id: nothing is banned, no beam
    # ends early. The model's context 8 slides by its default stride, 2.
    from addnorm.generation.scoring import decode_log_probs

    model = language_model("rotary", pad_id=None, eos_id=None)
    model.context = 8
    out = model.generate(torch.tensor([[7]]), num_beams=3, num_return_sequences=3,
                         max_new_tokens=20, length_penalty=0.0, early_stopping="never",
                         return_dict_in_generate=True, output_scores=True)
    assert out.sequences.shape == (3, 21)
    scores = decode_log_probs(model, out.sequences).sum(dim=1)  # (3,)
    torch.testing.assert_close(out.sequences_scores, scores, **FLOAT64_EXACT)


@pytest.fixture
def eager_backend(monkeypatch, fresh_dynamo):
    """``torch.compile`` with dynamo's capture but no code generation (fast to compile)."""
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
@torch.no_grad()
def test_the_compiled_step_slides_with_one_graph(strategy, eager_backend):
    # The slide runs eagerly beside the compiled step and writes the static cache in place:
    # the tokens of eager decoding, and every step of both calls one graph.
    model = language_model("rotary")
    prompt = torch.tensor([[5, 6, 7, 8], [PAD, PAD, 9, 10], [PAD, 11, 12, 13]])
    config = GenerationConfig(max_new_tokens=20, strategy=strategy, pad_id=PAD, window=6,
                              window_stride=2)
    expected = model.generate(prompt, config)
    for _ in range(2):
        assert torch.equal(model.generate(prompt, dataclasses.replace(config, compile=True)),
                           expected)
    assert counters["stats"]["unique_graphs"] == 1
