"""Decoding algorithms, checked on a toy model whose answers can be worked out by hand.

The toy model is a second-order Markov chain: the logits of the next token are
``table[previous, current]``, where ``previous`` and ``current`` are the last two tokens of the
row's history. The history lives in a toy cache whose ``reorder`` is ``index_select(0, index)``,
as the interface requires, so a beam search that follows the wrong parent reads the wrong
history and stops matching the brute-force oracle. Oracles used below: a per-row Python loop
(greedy), exhaustive enumeration of every sequence (beam search), the softmax (sampling).
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from properties import examples

from addnorm.generation.config import GenerationConfig
from addnorm.generation.loop import generate_tokens

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


class HistoryCache:
    """Holds every token seen per row; ``reorder`` follows the documented contract."""

    def __init__(self, history: torch.Tensor) -> None:
        self.history = history  # (B, n)

    def reorder(self, index: torch.Tensor) -> None:
        self.history = self.history.index_select(0, index)

    @property
    def length(self) -> int:
        return self.history.shape[1]


class SecondOrderChain:
    """Toy model: next-token logits = ``table[previous, current]``."""

    def __init__(self, vocab: int, seed: int, scale: float = 2.0, device: str = "cpu") -> None:
        gen = torch.Generator().manual_seed(seed)
        table = torch.randn(vocab, vocab, vocab, generator=gen, dtype=torch.float64) * scale
        self.table = table.to(device)

    def start(self, prompt: torch.Tensor) -> tuple[HistoryCache, torch.Tensor]:
        cache = HistoryCache(prompt.clone())  # prompt (B, 2)
        return cache, self._logits(cache.history)

    def step(self, tokens: torch.Tensor, cache: HistoryCache) -> torch.Tensor:
        cache.history = torch.cat([cache.history, tokens], dim=1)
        return self._logits(cache.history)

    def _logits(self, history: torch.Tensor) -> torch.Tensor:
        return self.table[history[:, -2], history[:, -1]]

    def log_prob(self, prompt_row: list[int], sequence: list[int]) -> float:
        """Sum of next-token log-probabilities, computed one token at a time."""
        previous, current = prompt_row
        total = 0.0
        for token in sequence:
            total += float(torch.log_softmax(self.table[previous, current], dim=-1)[token])
            previous, current = current, token
        return total


def run(chain, prompt, config, generator=None):
    cache, first_logits = chain.start(prompt)
    out = generate_tokens(chain.step, first_logits, cache, config, generator=generator)
    return out, cache


def prompts(batch: int, vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(vocab, (batch, 2), generator=torch.Generator().manual_seed(seed))


def greedy_reference(chain, prompt_row, n, stop_ids=(), pad_id=0) -> list[int]:
    """Greedy one row at a time: argmax until a stop token, then pad_id."""
    previous, current = prompt_row
    out: list[int] = []
    ended = False
    for _ in range(n):
        if ended:
            out.append(pad_id)
            continue
        token = int(chain.table[previous, current].argmax())
        out.append(token)
        ended = token in stop_ids
        previous, current = current, token
    return out


def brute_force_best(chain, prompt_row, vocab, n, stop_ids=(), length_penalty=0.0):
    """Best of every sequence that ends in a stop token (length <= n) or reaches length n."""
    candidates = []
    for length in range(1, n + 1):
        for seq in itertools.product(range(vocab), repeat=length):
            if any(t in stop_ids for t in seq[:-1]):
                continue
            if length < n and seq[-1] not in stop_ids:
                continue
            score = chain.log_prob(prompt_row, list(seq)) / length**length_penalty
            candidates.append((score, list(seq)))
    return max(candidates)


def strip(row: list[int], stop_ids, pad_id=0) -> list[int]:
    """A returned row without the padding after its stop token."""
    for i, token in enumerate(row):
        if token in stop_ids:
            assert all(t == pad_id for t in row[i + 1 :]), row
            return row[: i + 1]
    return row


# ---------------------------------------------------------------------------------- greedy


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_follows_the_argmax_chain_computed_row_by_row(device):
    chain = SecondOrderChain(vocab=7, seed=1, device=device)
    prompt = prompts(5, 7).to(device)
    out, _ = run(chain, prompt, GenerationConfig(max_new_tokens=6))
    expected = [greedy_reference(chain, row, 6) for row in prompt.tolist()]
    assert out.dtype == torch.long and out.device.type == device
    assert out.tolist() == expected


def test_greedy_feeds_every_token_but_the_last_back_through_the_cache():
    # Invariant: N tokens take N - 1 steps, each appending the token just emitted.
    chain = SecondOrderChain(vocab=6, seed=2)
    prompt = prompts(4, 6)
    out, cache = run(chain, prompt, GenerationConfig(max_new_tokens=5))
    assert torch.equal(cache.history[:, :2], prompt)
    assert torch.equal(cache.history[:, 2:], out[:, :-1])


def test_stop_token_is_kept_then_rows_are_padded_until_all_rows_stop():
    # Oracle: greedy_reference; a row stops at its first stop token, later columns are pad_id,
    # and decoding ends as soon as every row has stopped (fewer than max_new_tokens columns).
    chain = SecondOrderChain(vocab=5, seed=3)
    chain.table[..., 4] += 3.0  # make token 4 likely, so rows stop at different steps
    prompt = prompts(6, 5, seed=3)
    config = GenerationConfig(max_new_tokens=20, eos_id=4, pad_id=0)
    out, cache = run(chain, prompt, config)
    full = [greedy_reference(chain, row, 20, (4,), 0) for row in prompt.tolist()]
    lengths = [len(strip(row, (4,))) for row in full]
    assert all(row[n - 1] == 4 for row, n in zip(full, lengths, strict=True))
    assert len(set(lengths)) > 1 and max(lengths) < 20  # the case under test really occurs
    assert out.shape == (6, max(lengths))
    assert out.tolist() == [row[: max(lengths)] for row in full]
    assert cache.length == 2 + max(lengths) - 1  # no step after every row has stopped


def test_any_of_several_stop_ids_ends_a_row():
    chain = SecondOrderChain(vocab=6, seed=4)
    chain.table[..., 4] += 1.5
    chain.table[..., 5] += 1.5
    prompt = prompts(8, 6, seed=4)
    config = GenerationConfig(max_new_tokens=15, eos_id=(4, 5), pad_id=1)
    out, _ = run(chain, prompt, config)
    full = [greedy_reference(chain, row, 15, (4, 5), 1) for row in prompt.tolist()]
    assert {row[len(strip(row, (4, 5), 1)) - 1] for row in full} == {4, 5}
    assert out.tolist() == [row[: out.shape[1]] for row in full]


# -------------------------------------------------------------------------------- sampling


def test_sampling_with_the_same_generator_seed_reproduces():
    chain = SecondOrderChain(vocab=8, seed=5)
    prompt = prompts(4, 8)
    config = GenerationConfig(max_new_tokens=10, strategy="sample", top_k=5, top_p=0.9)
    a, _ = run(chain, prompt, config, torch.Generator().manual_seed(7))
    b, _ = run(chain, prompt, config, torch.Generator().manual_seed(7))
    assert torch.equal(a, b)


@pytest.mark.parametrize(
    "config_kwargs", [{"top_k": 1}, {"top_p": 1e-9}, {"top_k": 1, "top_p": 0.5}]
)
def test_sampling_restricted_to_the_single_best_token_is_greedy(config_kwargs):
    # top_k=1 keeps only the argmax; a nucleus of mass 1e-9 holds only the most likely token.
    chain = SecondOrderChain(vocab=9, seed=6)
    prompt = prompts(6, 9)
    sampled, _ = run(
        chain,
        prompt,
        GenerationConfig(max_new_tokens=8, strategy="sample", **config_kwargs),
        torch.Generator().manual_seed(0),
    )
    greedy, _ = run(chain, prompt, GenerationConfig(max_new_tokens=8))
    assert torch.equal(sampled, greedy)


def test_temperature_divides_the_logits():
    # Identity: sampling z at temperature T draws exactly as sampling z / T at temperature 1.
    chain = SecondOrderChain(vocab=6, seed=8)
    scaled = SecondOrderChain(vocab=6, seed=8)
    scaled.table = chain.table / 0.37
    prompt = prompts(5, 6)
    hot, _ = run(
        chain,
        prompt,
        GenerationConfig(max_new_tokens=12, strategy="sample", temperature=0.37),
        torch.Generator().manual_seed(11),
    )
    plain, _ = run(
        scaled,
        prompt,
        GenerationConfig(max_new_tokens=12, strategy="sample"),
        torch.Generator().manual_seed(11),
    )
    assert torch.equal(hot, plain)


def sample_counts(logits: torch.Tensor, config: GenerationConfig, draws: int) -> torch.Tensor:
    """Token counts of one-token generations from the same logits in ``draws`` rows."""
    first = logits.expand(draws, -1)
    out = generate_tokens(
        lambda tokens, cache: None, first, None, config, generator=torch.Generator().manual_seed(3)
    )
    return torch.bincount(out[:, 0], minlength=logits.shape[-1]).double()


LOGITS = torch.tensor([[1.2, 0.3, -0.4, 2.0, 0.0, -1.5]], dtype=torch.float64)
P = torch.softmax(LOGITS[0], dim=-1)


def top_k_probs(k: int) -> torch.Tensor:
    """Softmax renormalised over the k largest logits (the definition of top-k)."""
    keep = torch.zeros_like(P, dtype=torch.bool)
    keep[P.topk(k).indices] = True
    return torch.where(keep, P, 0.0) / P[keep].sum()


def nucleus_probs(top_p: float) -> torch.Tensor:
    """Softmax renormalised over the smallest likeliest set with mass >= top_p (by hand)."""
    keep = torch.zeros_like(P, dtype=torch.bool)
    mass = 0.0
    for token in P.argsort(descending=True).tolist():
        keep[token] = True
        mass += float(P[token])
        if mass >= top_p:
            break
    return torch.where(keep, P, 0.0) / P[keep].sum()


@pytest.mark.parametrize(
    ("config_kwargs", "expected"),
    [
        ({}, P),
        ({"temperature": 0.5}, torch.softmax(LOGITS[0] / 0.5, dim=-1)),
        ({"top_k": 3}, top_k_probs(3)),
        ({"top_p": 0.6}, nucleus_probs(0.6)),
        ({"top_p": 0.9}, nucleus_probs(0.9)),
    ],
    ids=["softmax", "temperature", "top_k", "top_p_0.6", "top_p_0.9"],
)
def test_sampling_frequencies_match_the_shaped_softmax(config_kwargs, expected):
    # Each frequency lies within 5 binomial standard errors of its probability (a false alarm
    # has probability < 1e-5 per token; the seed is fixed, so the test is deterministic).
    draws = 40_000
    config = GenerationConfig(max_new_tokens=1, strategy="sample", **config_kwargs)
    freq = sample_counts(LOGITS, config, draws) / draws
    tolerance = 5 * (expected * (1 - expected) / draws).sqrt()
    assert torch.all((freq - expected).abs() <= tolerance), (freq, expected)
    assert torch.all(freq[expected == 0] == 0)  # filtered tokens are never drawn


def test_nucleus_keeps_the_token_that_crosses_top_p():
    # P sorted: 0.3955, 0.2718, 0.1103, ... (softmax of LOGITS); top_p just above the first
    # probability needs the second token too, top_p equal to it needs only the first.
    first = float(P.max())
    assert torch.equal(nucleus_probs(first).nonzero(), P.argmax().reshape(1, 1))
    assert int((nucleus_probs(first + 1e-6) > 0).sum()) == 2
    for top_p, n_kept in [(first, 1), (first + 1e-6, 2)]:
        config = GenerationConfig(max_new_tokens=1, strategy="sample", top_p=top_p)
        assert int((sample_counts(LOGITS, config, 2_000) > 0).sum()) == n_kept


def test_sampled_rows_are_padded_after_their_stop_token():
    chain = SecondOrderChain(vocab=5, seed=9, scale=0.5)
    prompt = prompts(64, 5)
    config = GenerationConfig(max_new_tokens=30, strategy="sample", eos_id=2, pad_id=0)
    out, cache = run(chain, prompt, config, torch.Generator().manual_seed(1))
    ended = 0
    for row in out.tolist():
        ended += 2 in row
        strip(row, (2,))  # asserts that only pad_id follows the first stop token
    assert ended > 0
    assert torch.equal(cache.history[:, 2:], out[:, :-1])


# ----------------------------------------------------------------------------- beam search


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


def ranked_hypotheses(chain, prompt_row, vocab, n, stop_ids, length_penalty):
    """Every hypothesis :func:`brute_force_best` considers, best first."""
    candidates = []
    for length in range(1, n + 1):
        for seq in itertools.product(range(vocab), repeat=length):
            ends = seq[-1] in stop_ids
            if any(t in stop_ids for t in seq[:-1]) or (length < n and not ends):
                continue
            score = chain.log_prob(prompt_row, list(seq)) / length**length_penalty
            candidates.append((score, list(seq)))
    return sorted(candidates, reverse=True)


@examples(15)
@given(strategy=st.sampled_from(["greedy", "sample", "beam"]), min_new=st.integers(0, 5),
       seed=st.integers(0, 10_000))
def test_no_stop_token_comes_before_min_new_tokens(strategy, min_new, seed):
    # The stop token has logit +30 everywhere: without the rule every row would end at once;
    # with it the stop comes exactly at token min_new + 1 (greedy, sampling, and the best
    # beam, whose length penalty 0 ranks ~0 above everything else).
    chain = SecondOrderChain(vocab=5, seed=seed)
    chain.table[..., 1] += 30.0
    config = GenerationConfig(max_new_tokens=8, strategy=strategy, eos_id=1, num_beams=2,
                              length_penalty=0.0, min_new_tokens=min_new)
    out, _ = run(chain, prompts(3, 5, seed=seed), config, torch.Generator().manual_seed(seed))
    for row in out.tolist():
        assert 1 not in row[:min_new] and row[min_new] == 1, row


def test_sampled_return_sequences_are_grouped_per_prompt_row_and_drawn_apart():
    # A chain whose every row is certain (+50): each of a row's r samples is its greedy row.
    certain = SecondOrderChain(vocab=6, seed=16, scale=0.1)
    winners = torch.randint(6, (6, 6, 1), generator=torch.Generator().manual_seed(2))
    certain.table.scatter_add_(-1, winners, torch.full((6, 6, 1), 50.0, dtype=torch.float64))
    prompt = prompts(3, 6, seed=1)
    greedy, _ = run(certain, prompt, GenerationConfig(max_new_tokens=6))
    sample = GenerationConfig(max_new_tokens=6, strategy="sample", num_return_sequences=4)
    out, cache = run(certain, prompt, sample, torch.Generator().manual_seed(0))
    assert torch.equal(out, greedy.repeat_interleave(4, dim=0))
    assert torch.equal(cache.history[:, :2], prompt.repeat_interleave(4, dim=0))
    # a near-flat chain: a row's 4 samples of 6 tokens are independent, so they differ
    flat = SecondOrderChain(vocab=6, seed=16, scale=0.1)
    out, _ = run(flat, prompt, sample, torch.Generator().manual_seed(0))
    assert all(len(set(map(tuple, out[b * 4 : b * 4 + 4].tolist()))) > 1 for b in range(3))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("strategy", ["greedy", "sample", "beam"])
def test_the_logit_rules_and_limits_run_on_cuda_with_one_sync_per_token_at_most(strategy):
    # The rules, min-p, max_time and the recorded scores on the device: the tokens are the
    # CPU's (sampling: the draws differ by generator, so only their validity is checked), and
    # the synchronisations torch counts grow by one per decoded token at most (the stop check).
    import warnings

    cpu_chain = SecondOrderChain(vocab=6, seed=15)
    gpu_chain = SecondOrderChain(vocab=6, seed=15, device="cuda")
    prompt = prompts(4, 6)
    config = GenerationConfig(
        max_new_tokens=7, strategy=strategy, eos_id=5, bad_words_ids=((1, 2), (3,)),
        suppress_tokens=(4,), forced_eos_id=5, max_time=3600.0, min_new_tokens=2,
        **({"num_beams": 3} if strategy == "beam" else {}),
        **({"min_p": 0.05} if strategy == "sample" else {}),
    )
    generator = torch.Generator("cuda").manual_seed(0) if strategy == "sample" else None
    on_cpu, _ = run(cpu_chain, prompt, config, torch.Generator().manual_seed(0))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            on_gpu, _ = run(gpu_chain, prompt.cuda(), config, generator)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = sum("synchroniz" in str(w.message) for w in caught)
    assert syncs <= on_gpu.shape[1] + 3, syncs  # a step's read, the checks before and after
    assert not (on_gpu == 3).any() and not (on_gpu == 4).any()  # banned and suppressed
    if strategy != "sample":
        assert torch.equal(on_cpu, on_gpu.cpu())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_beam_and_sampling_run_on_cuda_like_on_cpu():
    cpu_chain = SecondOrderChain(vocab=6, seed=15)
    gpu_chain = SecondOrderChain(vocab=6, seed=15, device="cuda")
    prompt = prompts(4, 6)
    config = GenerationConfig(max_new_tokens=7, strategy="beam", num_beams=3, eos_id=5)
    on_cpu, _ = run(cpu_chain, prompt, config)
    on_gpu, _ = run(gpu_chain, prompt.cuda(), config)
    assert torch.equal(on_cpu, on_gpu.cpu())
    sample = GenerationConfig(max_new_tokens=7, strategy="sample", top_k=3, eos_id=5)
    out, _ = run(gpu_chain, prompt.cuda(), sample, torch.Generator("cuda").manual_seed(0))
    assert out.device.type == "cuda"


# ------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"max_new_tokens": 0}, ValueError, "max_new_tokens"),
        ({"max_new_tokens": 2.5}, TypeError, "max_new_tokens"),
        ({"max_new_tokens": True}, TypeError, "max_new_tokens"),
        ({"strategy": "top_k"}, ValueError, "strategy"),
        ({"strategy": "sample", "temperature": 0.0}, ValueError, 'strategy="greedy"'),
        ({"strategy": "sample", "temperature": -1.0}, ValueError, "temperature"),
        ({"strategy": "sample", "temperature": float("nan")}, ValueError, "temperature"),
        ({"strategy": "sample", "top_k": 0}, ValueError, "top_k"),
        ({"strategy": "sample", "top_p": 0.0}, ValueError, "top_p"),
        ({"strategy": "sample", "top_p": 1.5}, ValueError, "top_p"),
        ({"num_beams": 0}, ValueError, "num_beams"),
        ({"length_penalty": float("inf")}, ValueError, "length_penalty"),
        ({"eos_id": -1}, ValueError, "eos_id"),
        ({"eos_id": ()}, ValueError, "eos_id"),
        ({"eos_id": (2, -3)}, ValueError, "eos_id[1]"),
        ({"eos_id": "2"}, TypeError, "eos_id"),
        ({"pad_id": -1}, ValueError, "pad_id"),
        ({"top_k": 5}, ValueError, "top_k=5"),
        ({"strategy": "beam", "temperature": 0.7}, ValueError, "temperature=0.7"),
        ({"min_new_tokens": -1}, ValueError, "min_new_tokens"),
        ({"num_return_sequences": 0}, ValueError, "num_return_sequences"),
        ({"num_return_sequences": 2}, ValueError, "needs strategy='sample' or 'beam'"),
        ({"strategy": "beam", "num_beams": 2, "num_return_sequences": 3}, ValueError,
         "must be <= num_beams"),
        ({"beam_stop": "never"}, ValueError, "beam_stop"),
        ({"strategy": "sample", "min_p": 0.0}, ValueError, "min_p must be > 0"),
        ({"strategy": "sample", "min_p": 1.5}, ValueError, "min_p must be <= 1"),
        ({"min_p": 0.1}, ValueError, "min_p=0.1 only apply to strategy='sample'"),
        ({"bad_words_ids": "ab"}, TypeError, "bad_words_ids must be a sequence"),
        ({"bad_words_ids": [[1], []]}, ValueError, "bad_words_ids[1] must hold at least one"),
        ({"bad_words_ids": [[1, -2]]}, ValueError, "bad_words_ids[0][1] must be >= 0"),
        ({"bad_words_ids": [3]}, TypeError, "bad_words_ids[0] must be a sequence"),
        ({"suppress_tokens": 3}, TypeError, "suppress_tokens must be a sequence"),
        ({"suppress_tokens": [1, 2.0]}, TypeError, "suppress_tokens[1]"),
        ({"forced_eos_id": -1}, ValueError, "forced_eos_id must be >= 0"),
        ({"forced_eos_id": ()}, ValueError, "forced_eos_id must be an int, a non-empty tuple"),
        ({"forced_eos_id": (2, 3), "suppress_tokens": (3, 2)}, ValueError,
         "also in suppress_tokens"),
        ({"max_time": 0}, ValueError, "max_time must be > 0"),
        ({"max_time": float("inf")}, ValueError, "max_time must be finite"),
        ({"max_time": "1s"}, TypeError, "max_time must be a number"),
    ],
)
def test_bad_generation_config_is_rejected_with_its_name(kwargs, error, words):
    kwargs = {"max_new_tokens": 4, **kwargs}
    with pytest.raises(error, match=words.replace("[", r"\[").replace("]", r"\]")):
        GenerationConfig(**kwargs)


def test_a_list_of_stop_ids_is_stored_as_a_tuple():
    config = GenerationConfig(max_new_tokens=3, eos_id=[1, 2])
    assert config.eos_id == (1, 2) and config.stop_ids == (1, 2)
    assert GenerationConfig(max_new_tokens=3, eos_id=4).stop_ids == (4,)
    lists = GenerationConfig(bad_words_ids=[[1, 2], [3]], suppress_tokens=[4, 5],
                             forced_eos_id=[6, 7])
    assert (lists.bad_words_ids, lists.suppress_tokens, lists.forced_ids) == (
        ((1, 2), (3,)), (4, 5), (6, 7))
    hash(lists)  # frozen and hashable, as every config


def nan_at(row: int) -> torch.Tensor:
    logits = torch.zeros(3, 5)
    logits[row, 2] = float("nan")
    return logits


@pytest.mark.parametrize(
    ("first_logits", "error", "words"),
    [
        (torch.zeros(5), ValueError, "first_logits must have 2 dims"),
        (torch.zeros(3, 5, dtype=torch.long), TypeError, "floating-point"),
        ([[0.0, 1.0]], TypeError, "torch.Tensor"),
        (nan_at(1), ValueError, "row 1 has NaN"),
        (torch.full((3, 5), float("-inf")), ValueError, "only -inf"),
        (torch.tensor([[0.0, float("inf")]]), ValueError, r"\+inf"),
    ],
)
def test_bad_first_logits_are_rejected(first_logits, error, words):
    with pytest.raises(error, match=words):
        generate_tokens(lambda t, c: None, first_logits, None, GenerationConfig(max_new_tokens=2))


@pytest.mark.parametrize("strategy", ["greedy", "sample", "beam"])
@pytest.mark.parametrize(
    ("bad_output", "words"),
    [
        (lambda n: torch.zeros(n, 4), r"must have shape \(\d+, 5\)"),
        (lambda n: torch.full((n, 5), float("nan")), "step 2"),
        (lambda n: "logits", "torch.Tensor"),
    ],
)
def test_bad_step_function_output_is_reported_with_the_step(strategy, bad_output, words):
    calls = []

    def step_fn(tokens, cache):
        calls.append(tokens.shape[0])
        return torch.zeros(tokens.shape[0], 5) if len(calls) < 2 else bad_output(tokens.shape[0])

    config = GenerationConfig(max_new_tokens=5, strategy=strategy)
    with pytest.raises((ValueError, TypeError), match=words):
        generate_tokens(step_fn, torch.zeros(2, 5), HistoryCache(torch.zeros(2, 1)), config)


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda f, c: generate_tokens(f, torch.zeros(2, 5), c, {"max_new_tokens": 2}),
         TypeError, "GenerationConfig"),
        (lambda f, c: generate_tokens("step", torch.zeros(2, 5), c,
                                      GenerationConfig(max_new_tokens=2)),
         TypeError, "step_fn must be callable"),
        (lambda f, c: generate_tokens(f, torch.zeros(2, 5), c,
                                      GenerationConfig(max_new_tokens=2, eos_id=5)),
         ValueError, r"eos_id \(5\) must be < the vocabulary size V \(5\)"),
        (lambda f, c: generate_tokens(f, torch.zeros(2, 5), c,
                                      GenerationConfig(max_new_tokens=2, pad_id=7)),
         ValueError, r"pad_id \(7\)"),
        (lambda f, c: generate_tokens(f, torch.zeros(2, 5), object(),
                                      GenerationConfig(max_new_tokens=2, strategy="beam")),
         TypeError, "reorder"),
        (lambda f, c: generate_tokens(f, torch.zeros(2, 5), object(),
                                      GenerationConfig(max_new_tokens=2, strategy="sample",
                                                       num_return_sequences=2)),
         TypeError, "num_return_sequences > 1 needs cache.reorder"),
        (lambda f, c: generate_tokens(f, torch.zeros(2, 5), c,
                                      GenerationConfig(max_new_tokens=2, strategy="sample"),
                                      generator=3),
         TypeError, "generator"),
    ],
)
def test_bad_generate_tokens_arguments_are_rejected(call, error, words):
    with pytest.raises(error, match=words):
        call(lambda tokens, cache: torch.zeros(2, 5), HistoryCache(torch.zeros(2, 1)))
