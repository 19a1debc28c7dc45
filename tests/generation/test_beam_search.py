"""Beam search (``addnorm.generation.beam_search``), checked on the toy second-order Markov
chain of tests/toy_decoders.py against exhaustive enumeration of every sequence, and against
greedy decoding (one beam)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from properties import examples
from toy_decoders import (
    SecondOrderChain,
    brute_force_best,
    prompts,
    ranked_hypotheses,
    run,
    strip,
)

from addnorm.generation.config import GenerationConfig


@pytest.mark.parametrize("eos_id", [None, 3])
def test_one_beam_is_greedy(eos_id):
    # With length_penalty 0, a width-1 beam keeps the argmax extension each step; a stop token
    # ranked first finishes a hypothesis that scores at least the live beam, so decoding ends.
    chain = SecondOrderChain(vocab=6, seed=10)
    chain.table[..., 3] += 1.0
    prompt = prompts(6, 6)
    common = {"max_new_tokens": 9, "eos_id": eos_id}
    beam, _ = run(chain, prompt, GenerationConfig(strategy="beam", num_beams=1,
                                                  length_penalty=0.0, **common))
    greedy, _ = run(chain, prompt, GenerationConfig(**common))
    assert torch.equal(beam, greedy)


def test_exhaustive_beam_without_stop_tokens_finds_the_most_likely_sequence():
    # Oracle: enumeration of all V ** n sequences. K = V ** (n - 1) beams keep every prefix.
    vocab, n = 3, 4
    chain = SecondOrderChain(vocab=vocab, seed=11)
    prompt = prompts(4, vocab)
    config = GenerationConfig(max_new_tokens=n, strategy="beam", num_beams=vocab ** (n - 1))
    out, _ = run(chain, prompt, config)
    for row, prompt_row in zip(out.tolist(), prompt.tolist(), strict=True):
        assert row == brute_force_best(chain, prompt_row, vocab, n)[1]


@examples(30)
@given(
    seed=st.integers(0, 10_000),
    length_penalty=st.sampled_from([0.0, 0.6, 1.0, 2.0, -0.5]),
    stop_ids=st.sampled_from([(2,), (0, 3)]),
)
def test_exhaustive_beam_with_stop_tokens_matches_brute_force(seed, length_penalty, stop_ids):
    # Oracle: enumeration of every sequence ending in a stop token (any length <= n) or reaching
    # n tokens, scored sum log p / n ** length_penalty. K = V ** n beams: every candidate ranks
    # among the K best, so the search is exhaustive, and the stopping rule only ends a row
    # when nothing left can beat it. Reorder bugs would feed the chain the wrong history.
    vocab, n = 4, 3
    chain = SecondOrderChain(vocab=vocab, seed=seed, scale=1.5)
    prompt = prompts(3, vocab, seed=seed)
    config = GenerationConfig(
        max_new_tokens=n, strategy="beam", num_beams=vocab**n, eos_id=stop_ids,
        length_penalty=length_penalty,
    )
    out, _ = run(chain, prompt, config)
    for row, prompt_row in zip(out.tolist(), prompt.tolist(), strict=True):
        score, best = brute_force_best(chain, prompt_row, vocab, n, stop_ids, length_penalty)
        got = strip(row, stop_ids)
        got_score = chain.log_prob(prompt_row, got) / len(got) ** length_penalty
        # float64 sums of <= 3 log-probs, maybe in another order: FLOAT64_EXACT's 1e-12.
        assert math.isclose(got_score, score, rel_tol=1e-12, abs_tol=1e-12)
        assert got == best


@examples(20)
@given(seed=st.integers(0, 10_000))
def test_a_wide_beam_scores_at_least_as_well_as_greedy(seed):
    # Invariant: a beam wide enough to keep every prefix returns the optimum, so its
    # log-probability is >= that of greedy's sequence (and of any other sequence).
    vocab, n = 4, 4
    chain = SecondOrderChain(vocab=vocab, seed=seed)
    prompt = prompts(3, vocab, seed=seed)
    beam, _ = run(chain, prompt, GenerationConfig(max_new_tokens=n, strategy="beam",
                                                  num_beams=vocab ** (n - 1),
                                                  length_penalty=0.0))
    greedy, _ = run(chain, prompt, GenerationConfig(max_new_tokens=n))
    for b, g, p in zip(beam.tolist(), greedy.tolist(), prompt.tolist(), strict=True):
        assert chain.log_prob(p, b) >= chain.log_prob(p, g) - 1e-12


def test_beam_rows_are_decoded_independently():
    # Vectorisation invariant: a batch gives each row the result it gets on its own.
    chain = SecondOrderChain(vocab=7, seed=12)
    chain.table[..., 6] += 1.0
    prompt = prompts(5, 7)
    config = GenerationConfig(max_new_tokens=8, strategy="beam", num_beams=3, eos_id=6)
    out, _ = run(chain, prompt, config)
    for i in range(5):
        alone, _ = run(chain, prompt[i : i + 1], config)
        assert strip(out[i].tolist(), (6,)) == strip(alone[0].tolist(), (6,))


def test_beam_cache_holds_the_history_of_the_returned_beam():
    # The best hypothesis of length n extends a live beam whose first n - 1 tokens were fed to
    # the cache; after the reorders, one of its row's K cache rows must hold exactly them.
    chain = SecondOrderChain(vocab=8, seed=13)
    prompt = prompts(4, 8)
    k, n = 3, 6
    out, cache = run(chain, prompt, GenerationConfig(max_new_tokens=n, strategy="beam",
                                                     num_beams=k))
    assert cache.history.shape == (4 * k, 2 + n - 1)
    history = cache.history.view(4, k, 2 + n - 1)
    for b in range(4):
        assert torch.equal(history[b, 0, :2], prompt[b])
        assert any(torch.equal(history[b, j, 2:], out[b, :-1]) for j in range(k))


def test_beam_stops_early_once_no_live_beam_can_win():
    # A stop token with logit +30 everywhere (length_penalty 0). Step 1: the stop token is one
    # of the K = 2 best extensions (score ~0) and leaves; the live beams score ~-30. Step 2: the
    # two best extensions are both stops (~-30), filling K finished slots; the live beams are
    # now at ~-60 and can only fall, so every row is done after two steps, not 50.
    chain = SecondOrderChain(vocab=5, seed=14)
    chain.table[..., 1] += 30.0
    prompt = prompts(3, 5)
    config = GenerationConfig(
        max_new_tokens=50, strategy="beam", num_beams=2, eos_id=1, length_penalty=0.0
    )
    out, cache = run(chain, prompt, config)
    assert out.tolist() == [[1]] * 3
    assert cache.length == 2 + 1  # the prompt and the one token fed back before stopping


def test_length_penalty_keeps_searching_while_a_long_beam_could_still_win():
    # Same chain with length_penalty 1: a live beam at ~-60 could still end at length 50 with
    # score ~-60 / 50 > -30 / 2, the K-th finished score, so the search goes on past step 2.
    chain = SecondOrderChain(vocab=5, seed=14)
    chain.table[..., 1] += 30.0
    config = GenerationConfig(max_new_tokens=50, strategy="beam", num_beams=2, eos_id=1)
    out, cache = run(chain, prompts(3, 5), config)
    assert out.tolist() == [[1]] * 3
    assert cache.length > 2 + 1


@pytest.mark.parametrize("beam_stop", ["heuristic", "k_finished"])
def test_hugging_faces_stopping_rules_end_where_the_exact_one_searches_on(beam_stop):
    # The chain of the two tests above, length_penalty 1. After step 2 the K = 2 finished
    # hypotheses score ~-15 (two tokens) and the live beams ~-60. "k_finished" (Hugging
    # Face's early_stopping=True) stops: K have finished. "heuristic" (early_stopping=False)
    # scores the live beam at its current length, ~-60 / 2 = -30 < -15, and stops too, where
    # "exact" goes on because ~-60 / 50 could still win.
    chain = SecondOrderChain(vocab=5, seed=14)
    chain.table[..., 1] += 30.0
    config = GenerationConfig(max_new_tokens=50, strategy="beam", num_beams=2, eos_id=1,
                              beam_stop=beam_stop)
    out, cache = run(chain, prompts(3, 5), config)
    assert out.tolist() == [[1]] * 3
    assert cache.length == 2 + 1


@examples(15)
@given(seed=st.integers(0, 10_000), stop_ids=st.sampled_from([(2,), (0, 3)]))
def test_without_a_length_penalty_the_heuristic_is_the_exact_rule(seed, stop_ids):
    # length_penalty 0: the best score a live beam can reach is its sum now, at any length,
    # which is what the heuristic compares: the two rules are one.
    chain = SecondOrderChain(vocab=6, seed=seed, scale=1.5)
    config = GenerationConfig(max_new_tokens=7, strategy="beam", num_beams=3, eos_id=stop_ids,
                              length_penalty=0.0)
    exact, _ = run(chain, prompts(3, 6, seed=seed), config)
    heuristic, _ = run(chain, prompts(3, 6, seed=seed),
                       dataclasses.replace(config, beam_stop="heuristic"))
    assert torch.equal(exact, heuristic)


@examples(20)
@given(seed=st.integers(0, 10_000), rows=st.integers(1, 4),
       length_penalty=st.sampled_from([0.0, 1.0, -0.5]))
def test_exhaustive_beam_returns_the_r_best_hypotheses_best_first(seed, rows, length_penalty):
    # Oracle: the enumeration of test_exhaustive_beam_with_stop_tokens_matches_brute_force,
    # ranked; row b * r + j is row b's j-th best.
    vocab, n, stop_ids = 3, 3, (2,)
    chain = SecondOrderChain(vocab=vocab, seed=seed, scale=1.5)
    prompt = prompts(2, vocab, seed=seed)
    config = GenerationConfig(max_new_tokens=n, strategy="beam", num_beams=vocab**n,
                              eos_id=stop_ids, length_penalty=length_penalty,
                              num_return_sequences=rows)
    out, _ = run(chain, prompt, config)
    assert out.shape[0] == 2 * rows
    for b, prompt_row in enumerate(prompt.tolist()):
        ranked = ranked_hypotheses(chain, prompt_row, vocab, n, stop_ids, length_penalty)
        got = [strip(row, stop_ids) for row in out[b * rows : (b + 1) * rows].tolist()]
        assert got == [seq for _, seq in ranked[:rows]]
