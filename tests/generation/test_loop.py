"""The decode loop (``addnorm.generation.loop``: greedy, sampling, stop ids, min_new_tokens,
return sequences, its argument checks), on the toy second-order Markov chain of
tests/toy_decoders.py, whose answers can be worked out by hand. Oracles used below: a per-row
Python loop (greedy), the softmax (sampling). Beam search is in test_beam_search.py.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from properties import examples
from toy_decoders import (
    DEVICES,
    HistoryCache,
    SecondOrderChain,
    greedy_reference,
    prompts,
    run,
    strip,
)

from addnorm.generation.config import GenerationConfig
from addnorm.generation.loop import generate_tokens

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


# ---------------------------------------------------------- min_new_tokens, return sequences


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
