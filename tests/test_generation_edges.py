"""Generation at the edges of its input space: tiny temperatures and nucleus masses, any top-k,
huge ``max_new_tokens``, and models that produce NaN.

Oracles: the limit of ``softmax(x / T)`` as T -> 0 (all mass on the argmax); the definition
of the nucleus (the likeliest token alone holds mass >= top_p whenever top_p <= its
probability); ``torch.softmax`` in float64 given the same logits; the greedy argmax.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from properties import examples
from tolerances import FLOAT64_EXACT

from addnorm.generation.config import GenerationConfig
from addnorm.generation.loop import generate_tokens
from addnorm.generation.sampling import sampling_probs
from addnorm.transformer.config import LMConfig, TransformerConfig
from addnorm.transformer.encoder_decoder import Transformer
from addnorm.transformer.lm import TransformerLM

BOUNDED = examples(25)
SUBNORMAL_64 = 5e-324  # the smallest positive float64
DTYPES = [torch.float32, torch.float64]


def spaced_logits(seed: int, batch: int, vocab: int, dtype: torch.dtype) -> torch.Tensor:
    """Logits whose values are distinct multiples of 0.25 (gaps >= 0.25, one argmax)."""
    gen = torch.Generator().manual_seed(seed)
    ranks = torch.stack([torch.randperm(vocab, generator=gen) for _ in range(batch)])
    return (ranks.to(dtype) - vocab / 2) * 0.25  # (B, V)


def one_step(logits: torch.Tensor, config: GenerationConfig, seed: int = 0) -> torch.Tensor:
    """One generated token per row from fixed first logits (no step is taken)."""
    return generate_tokens(
        lambda tokens, cache: None, logits, None, config,
        generator=torch.Generator().manual_seed(seed),
    )


def lm(**changes) -> TransformerLM:
    torch.manual_seed(0)
    cfg = LMConfig(vocab_size=11, d_model=16, n_heads=2, n_layers=1, d_ff=32, dropout=0.0,
                   max_len=32, **changes)
    return TransformerLM(cfg).eval()


def seq2seq(**changes) -> Transformer:
    torch.manual_seed(0)
    cfg = TransformerConfig(src_vocab_size=11, tgt_vocab_size=11, d_model=16, n_heads=2,
                            n_encoder_layers=1, n_decoder_layers=1, d_ff=32, dropout=0.0,
                            max_len=32, **changes)
    return Transformer(cfg).eval()


@functools.cache
def cached_model(kind: str, positions: str) -> TransformerLM | Transformer:
    """One model per kind and position code, shared by examples (generate changes nothing)."""
    return lm(position_encoding=positions) if kind == "lm" else seq2seq(
        position_encoding=positions)


PROMPT = torch.tensor([[4, 5, 6], [7, 8, 9]])


# ---------------------------------------------------------------------- temperature, top-p


@BOUNDED
@given(
    temperature=st.one_of(
        st.floats(SUBNORMAL_64, 1e-30), st.sampled_from([SUBNORMAL_64, 1e-45, 1e-38, 1e-300])
    ),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 1000),
)
def test_a_vanishing_temperature_samples_the_argmax(temperature, dtype, seed):
    # Oracle: softmax(x / T) -> one-hot argmax as T -> 0. With gaps >= 0.25 and T <= 1e-30,
    # every other token's probability exp(-0.25 / T) is exactly 0 in float64.
    logits = spaced_logits(seed, 6, 9, dtype)
    config = GenerationConfig(max_new_tokens=1, strategy="sample", temperature=temperature)
    probs = sampling_probs(logits, config)
    assert torch.isfinite(probs).all()
    assert torch.equal(probs, torch.nn.functional.one_hot(logits.argmax(-1), 9).to(probs.dtype))
    assert torch.equal(one_step(logits, config, seed)[:, 0], logits.argmax(dim=-1))


@BOUNDED
@given(temperature=st.floats(SUBNORMAL_64, 1e-30), seed=st.integers(0, 1000))
def test_a_vanishing_temperature_spreads_over_tied_maxima(temperature, seed):
    # Oracle: the limit of softmax(x / T) with two tied maxima puts 1/2 on each (exact).
    logits = spaced_logits(seed, 3, 7, torch.float32)
    top = logits.argmax(dim=-1, keepdim=True)
    second = logits.masked_fill(torch.zeros_like(logits, dtype=torch.bool).scatter(1, top, True),
                                float("-inf")).argmax(dim=-1, keepdim=True)
    logits = logits.scatter(1, second, logits.gather(1, top))  # tie the two largest
    probs = sampling_probs(logits, GenerationConfig(strategy="sample", temperature=temperature))
    expected = torch.zeros_like(probs).scatter(1, top, 0.5).scatter(1, second, 0.5)
    assert torch.equal(probs, expected)


@BOUNDED
@given(
    temperature=st.floats(0.01, 1e6),
    seed=st.integers(0, 1000),
)
def test_sampling_probabilities_are_the_softmax_of_logits_over_temperature(temperature, seed):
    # Oracle: torch.softmax(x / T) in float64 on the same logits (|x| <= 2.5, T >= 0.01, so
    # x / T <= 250 and the reference cannot overflow). Subtracting the row max first changes
    # the exponent by a few roundings of |x / T| <= 250: <= 250 * 4u = 1.1e-13 relative on
    # each probability, inside FLOAT64_EXACT.
    logits = spaced_logits(seed, 4, 20, torch.float64)
    config = GenerationConfig(strategy="sample", temperature=temperature)
    expected = torch.softmax(logits / temperature, dim=-1)
    torch.testing.assert_close(sampling_probs(logits, config), expected, **FLOAT64_EXACT)


@BOUNDED
@given(data=st.data(), dtype=st.sampled_from(DTYPES), seed=st.integers(0, 1000))
def test_a_nucleus_no_heavier_than_the_likeliest_token_is_greedy(data, dtype, seed):
    # Definition: the likeliest token alone holds mass p_max >= top_p, so the nucleus is that
    # one token, whatever top_p in (0, p_max] (subnormal included: it is kept, never dropped).
    logits = spaced_logits(seed, 5, 8, dtype)
    p_max = float(torch.softmax(logits.double(), dim=-1).amax(dim=-1).min())
    top_p = data.draw(st.one_of(st.floats(SUBNORMAL_64, p_max), st.just(SUBNORMAL_64)))
    config = GenerationConfig(max_new_tokens=1, strategy="sample", top_p=top_p)
    probs = sampling_probs(logits, config)
    assert torch.isfinite(probs).all()
    assert torch.equal(one_step(logits, config, seed)[:, 0], logits.argmax(dim=-1))


@BOUNDED
@given(
    top_k=st.integers(1, 50),
    top_p=st.one_of(st.none(), st.floats(SUBNORMAL_64, 1.0)),
    temperature=st.one_of(st.floats(SUBNORMAL_64, 1e-30), st.floats(1e-30, 1e30)),
    seed=st.integers(0, 1000),
)
def test_every_accepted_sampling_setting_draws_a_valid_token_of_the_top_k(
    top_k, top_p, temperature, seed
):
    # Invariant: a sampled token is one of the row's top_k logits (the whole vocabulary when
    # top_k >= V), and the probabilities are a finite distribution.
    logits = spaced_logits(seed, 4, 12, torch.float32)
    config = GenerationConfig(
        max_new_tokens=1, strategy="sample", top_k=top_k, top_p=top_p, temperature=temperature
    )
    probs = sampling_probs(logits, config)
    assert torch.isfinite(probs).all() and (probs >= 0).all()
    # float32 sum of <= 12 probabilities that add to 1: <= 12 u(float32) = 7.2e-7 off 1.
    ones = torch.ones_like(probs[:, 0])
    torch.testing.assert_close(probs.sum(-1), ones, rtol=0, atol=12 * 2**-24)
    token = one_step(logits, config, seed)[:, 0]
    allowed = logits.topk(min(top_k, 12), dim=-1).indices  # (B, k)
    assert (allowed == token[:, None]).any(dim=-1).all()


def test_a_model_samples_at_a_subnormal_temperature_as_it_decodes_greedily():
    # Oracle: the T -> 0 limit is the argmax, i.e. the model's own greedy decoding.
    model = lm()
    greedy = model.generate(PROMPT, dataclasses.replace(model.generation_config,
                                                        max_new_tokens=6))
    config = dataclasses.replace(model.generation_config, max_new_tokens=6, strategy="sample",
                                 temperature=SUBNORMAL_64, top_p=SUBNORMAL_64)
    assert torch.equal(model.generate(PROMPT, config, generator=torch.Generator()), greedy)


@pytest.mark.parametrize("temperature", [0, 0.0, -SUBNORMAL_64, float("nan"), float("inf")])
def test_a_temperature_outside_the_positive_floats_is_refused_naming_it(temperature):
    with pytest.raises(ValueError, match="temperature"):
        GenerationConfig(strategy="sample", temperature=temperature)


# ------------------------------------------------------------------------- NaN logits


@pytest.mark.parametrize("strategy", ["greedy", "sample", "beam"])
def test_a_model_with_nan_weights_is_reported_as_such(strategy):
    model = lm()
    with torch.no_grad():
        for weight in model.parameters():
            weight.fill_(float("nan"))
    config = dataclasses.replace(model.generation_config, strategy=strategy, max_new_tokens=3)
    with pytest.raises(ValueError, match="produced NaN logits at step 0"):
        model.generate(PROMPT, config, generator=torch.Generator())


@BOUNDED
@given(
    strategy=st.sampled_from(["greedy", "sample", "beam"]),
    nan_step=st.integers(1, 6),
    row=st.integers(0, 2),
    eos_id=st.sampled_from([None, 4]),
)
def test_nan_logits_at_step_k_are_reported_with_k_and_the_row(strategy, nan_step, row, eos_id):
    # With a stop rule the NaN is read with the step's stop flag; without one (no host read
    # per step at all) after the loop: either way the first bad step and row are named, and
    # torch.multinomial never sees the NaN.
    calls = []

    def step_fn(tokens, cache):
        calls.append(1)
        logits = torch.full((tokens.shape[0], 5), float("-inf"))
        logits[:, 3] = 0.0  # only token 3, never the stop token: every row lives to the end
        if len(calls) >= nan_step:
            logits[row if strategy != "beam" else row * 2, 1] = float("nan")
        return logits

    config = GenerationConfig(max_new_tokens=8, strategy=strategy, eos_id=eos_id,
                              **({"num_beams": 2} if strategy == "beam" else {}))
    with pytest.raises(ValueError, match=rf"NaN logits at step {nan_step} .*row "):
        generate_tokens(step_fn, torch.zeros(3, 5), _ReorderableNone(), config,
                        generator=torch.Generator().manual_seed(0))


class _ReorderableNone:
    def reorder(self, index: torch.Tensor) -> None:
        pass


# --------------------------------------------------------------------- max_new_tokens


@BOUNDED
@given(max_new_tokens=st.integers(2**40, 2**62), kind=st.sampled_from(["lm", "seq2seq"]),
       positions=st.sampled_from(["sinusoidal", "rotary"]))
def test_a_max_new_tokens_no_memory_holds_is_refused_before_allocating(
    max_new_tokens, kind, positions
):
    # 2**40 tokens of one layer of width 16 need >= 2 * 16 * 2**40 bytes = 32 TiB of cache
    # even at batch 1 in a one-byte dtype: more than any machine here; refused up front
    # (an attempted allocation would raise the allocator's RuntimeError instead).
    model = cached_model(kind, positions)
    config = dataclasses.replace(model.generation_config, max_new_tokens=max_new_tokens)
    with pytest.raises(ValueError, match=rf"max_new_tokens \({max_new_tokens}\)"):
        model.generate(PROMPT, config)


def test_a_learned_table_bounds_max_new_tokens_or_the_window_by_its_rows():
    # an encoder-decoder's decoder positions are the table's rows; a decoder-only model
    # slides its window past them (generation/window.py), a window no wider than the table
    model = seq2seq(position_encoding="learned")
    config = dataclasses.replace(model.generation_config, max_new_tokens=10**9)
    with pytest.raises(ValueError, match=r"max_new_tokens \(1000000000\) exceeds max_len \(32\)"):
        model.generate(PROMPT, config)
    model = lm(position_encoding="learned")
    config = dataclasses.replace(model.generation_config, max_new_tokens=10**9, window=33)
    with pytest.raises(ValueError, match=r"window \(33\) exceeds max_len \(32\)"):
        model.generate(PROMPT, config)


@examples(12)  # a model call each
@given(max_new_tokens=st.integers(1, 8), kind=st.sampled_from(["lm", "seq2seq"]),
       positions=st.sampled_from(["sinusoidal", "rotary", "learned"]))
def test_an_accepted_max_new_tokens_gives_at_most_that_many_tokens(max_new_tokens, kind,
                                                                     positions):
    model = cached_model(kind, positions)
    config = dataclasses.replace(model.generation_config, max_new_tokens=max_new_tokens)
    out = model.generate(PROMPT, config)
    assert out.dtype == torch.long and out.shape[0] == 2 and 1 <= out.shape[1] <= max_new_tokens
    assert ((out >= 0) & (out < 11)).all()


@pytest.mark.parametrize("kind", ["lm", "seq2seq"])
def test_start_refuses_a_cache_beyond_the_memory_before_allocating(kind, monkeypatch):
    """Both models' ``start`` ask check_cache_fits before DecodingCache.allocate: with the
    device's memory set to what M positions of cache take, M new tokens start and M + 1 are
    refused naming M (the LM's prompt positions count too; the seq2seq decoder has none)."""
    import addnorm.cache_checks as cache_module

    model = cached_model(kind, "rotary")
    cfg = model.cfg
    layers = cfg.n_layers if kind == "lm" else cfg.n_decoder_layers
    prompt_len = PROMPT.shape[1] if kind == "lm" else 0
    per_position = 2 * layers * PROMPT.shape[0] * cfg.d_model * 4  # float32 keys and values
    most = 5
    monkeypatch.setattr(cache_module, "device_memory", lambda device: (prompt_len + most)
                        * per_position)
    model.start(PROMPT, max_new_tokens=most)
    with pytest.raises(ValueError, match=rf"max_new_tokens \({most + 1}\).* at most {most} new"):
        model.start(PROMPT, max_new_tokens=most + 1)


@BOUNDED
@given(max_new_tokens=st.integers(2**40, 2**62), num_beams=st.integers(1, 4))
def test_beam_search_refuses_hypotheses_no_memory_holds_before_allocating(
    max_new_tokens, num_beams
):
    # Beam search keeps B * K finished hypotheses of max_new_tokens long ids (8 bytes each)
    # from the start: >= 8 * 2**40 bytes = 8 TiB here.
    config = GenerationConfig(max_new_tokens=max_new_tokens, strategy="beam",
                              num_beams=num_beams)
    with pytest.raises(ValueError, match=rf"max_new_tokens \({max_new_tokens}\)"):
        generate_tokens(lambda t, c: None, torch.zeros(2, 5), _ReorderableNone(), config)


@BOUNDED
@given(max_new_tokens=st.integers(1, 2**62), strategy=st.sampled_from(["greedy", "sample"]))
def test_greedy_and_sampling_allocate_per_token_so_any_count_is_accepted(
    max_new_tokens, strategy
):
    # Token by token decoding allocates nothing up front: a row that emits its stop token at
    # once ends decoding after one token, whatever max_new_tokens allows.
    logits = torch.full((3, 5), float("-inf"))
    logits[:, 4] = 0.0  # only the stop token
    config = GenerationConfig(max_new_tokens=max_new_tokens, strategy=strategy, eos_id=4)
    out = generate_tokens(lambda t, c: None, logits, None, config,
                          generator=torch.Generator().manual_seed(0))
    assert torch.equal(out, torch.full((3, 1), 4))


# ------------------------------------------------- beams and return sequences bounded by memory


@BOUNDED
@given(copies=st.integers(2**40, 2**62), kind=st.sampled_from(["lm", "seq2seq"]),
       strategy=st.sampled_from(["beam", "sample"]))
def test_beams_or_return_sequences_no_memory_holds_are_refused_before_allocating(
    copies, kind, strategy
):
    # 2**40 rows of at least 11 float32 logits each need >= 44 TiB: more than any machine
    # here; refused before the cache is expanded (which would raise the allocator's error).
    model = cached_model(kind, "rotary")
    name = "num_beams" if strategy == "beam" else "num_return_sequences"
    config = dataclasses.replace(model.generation_config, strategy=strategy, max_new_tokens=2,
                                 **{"num_beams": copies, "num_return_sequences": copies}
                                 if strategy == "beam" else {name: copies})
    with pytest.raises(ValueError, match=rf"{name} \({copies}\) with max_new_tokens \(2\) "
                                         rf"makes 2 x {copies} = {2 * copies:,} rows"):
        model.generate(PROMPT, config, generator=torch.Generator())


def _cache_bytes(cache) -> int:
    """The bytes of the tensors a DecodingCache holds per batch (keys and values of every
    layer, the encoder's memory)."""
    tensors = [cache.memory] if cache.memory is not None else []
    for layer in cache.layers:
        for kv in (layer.self_attn, layer.cross_attn):
            if kv is not None:
                tensors += [kv.keys, kv.values]
    return sum(t.nbytes for t in tensors)


@pytest.mark.parametrize("kind", ["lm", "seq2seq"])
def test_the_bytes_counted_per_row_are_those_of_the_cache_start_allocates(kind):
    # Provenance: the DecodingCache that start allocates, its tensors' nbytes per row.
    from addnorm.generation.generate import cache_bytes_per_row

    model = cached_model(kind, "rotary")
    config = dataclasses.replace(model.generation_config, max_new_tokens=5)
    cache, logits = model.start(PROMPT, max_new_tokens=5)
    counted = cache_bytes_per_row(model.generation_spec, config, PROMPT.shape[1], logits.dtype)
    assert counted == _cache_bytes(cache) // PROMPT.shape[0]


@pytest.mark.parametrize("kind", ["lm", "seq2seq"])
@pytest.mark.parametrize(("strategy", "name"), [("beam", "num_beams"),
                                                ("sample", "num_return_sequences")])
def test_the_rows_bound_is_exact_at_the_most_copies_it_names(strategy, name, kind,
                                                             monkeypatch):
    """Identity: with the device's memory set to what ``most`` copies of every row take, the
    check accepts ``most`` (and decoding runs) and refuses ``most + 1``, naming ``most``."""
    import addnorm.generation.decode_checks as checks_module
    from addnorm.generation.generate import cache_bytes_per_row

    model = cached_model(kind, "rotary")
    config = dataclasses.replace(model.generation_config, strategy=strategy, max_new_tokens=3,
                                 num_beams=4, num_return_sequences=1, eos_id=None)
    cache = cache_bytes_per_row(model.generation_spec, config, PROMPT.shape[1], torch.float32)
    # the cache and the float32 logits; beam search: both twice (the cache's reordered copy,
    # the log-probs' sums with the beam scores) and the hypotheses
    per_row = (cache + 11 * 4) * 2 + 3 * 8 if strategy == "beam" else cache + 11 * 4
    most = 3
    limit = PROMPT.shape[0] * most * per_row
    monkeypatch.setattr(checks_module, "device_memory", lambda device: limit)
    fits = dataclasses.replace(config, **{name: most})
    out = model.generate(PROMPT, fits, generator=torch.Generator().manual_seed(0))
    assert out.shape[0] == PROMPT.shape[0] * (1 if strategy == "beam" else most)
    with pytest.raises(ValueError, match=rf"{name} \({most + 1}\).* at most {most} fit 2 input"):
        model.generate(PROMPT, dataclasses.replace(config, **{name: most + 1}),
                       generator=torch.Generator())
