"""The logit rules (``addnorm.generation.logit_rules``): ``LogitRules`` reshapes a step's
logits as transformers' logits processors do, in their order.

Provenance: transformers' own ``RepetitionPenaltyLogitsProcessor``,
``NoRepeatNGramLogitsProcessor``, ``NoBadWordsLogitsProcessor``,
``MinNewTokensLengthLogitsProcessor``, ``ForcedEOSTokenLogitsProcessor`` and
``SuppressTokensLogitsProcessor``, in a ``LogitsProcessorList`` in that order, on the same
random logits and histories (no padding: transformers would read pad ids as tokens). Each rule
is one IEEE operation per logit or a write of -inf (0 for a forced id), so the results are
bitwise equal.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from properties import examples
from transformers import (
    ForcedEOSTokenLogitsProcessor,
    LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor,
    NoBadWordsLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensLogitsProcessor,
)

from addnorm.generation.config import GenerationConfig
from addnorm.generation.logit_rules import LogitRules

V = 9
IDS = st.integers(0, V - 1)
WORD = st.lists(st.integers(0, 3), min_size=1, max_size=3)  # few ids, so bad words match


def transformers_rules(config: GenerationConfig, prompt_length: int) -> LogitsProcessorList:
    """transformers' processors for ``config``'s rules, in the order of its ``generate``."""
    processors = LogitsProcessorList()
    if config.repetition_penalty != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(config.repetition_penalty))
    if config.no_repeat_ngram_size > 0:
        processors.append(NoRepeatNGramLogitsProcessor(config.no_repeat_ngram_size))
    if config.bad_words_ids:
        processors.append(NoBadWordsLogitsProcessor(
            [list(w) for w in config.bad_words_ids], list(config.stop_ids) or None))
    if config.min_new_tokens > 0 and config.stop_ids:
        processors.append(MinNewTokensLengthLogitsProcessor(
            prompt_length, config.min_new_tokens, list(config.stop_ids)))
    if config.forced_eos_id is not None:
        processors.append(ForcedEOSTokenLogitsProcessor(
            prompt_length + config.max_new_tokens, list(config.forced_ids)))
    if config.suppress_tokens:
        processors.append(SuppressTokensLogitsProcessor(list(config.suppress_tokens)))
    return processors


@examples(60)
@given(
    seed=st.integers(0, 10_000), batch=st.integers(1, 3), prompt_length=st.integers(1, 4),
    step=st.integers(0, 5), max_new_tokens=st.integers(1, 6), data=st.data(),
)
def test_the_rules_reshape_the_logits_as_transformers_processors_in_their_order(
    seed, batch, prompt_length, step, max_new_tokens, data
):
    eos = data.draw(st.lists(st.integers(0, 4), max_size=2, unique=True), label="eos_id")
    forced = data.draw(st.none() | st.lists(IDS, min_size=1, max_size=2, unique=True),
                       label="forced_eos_id")
    suppress = data.draw(st.lists(IDS, max_size=3, unique=True), label="suppress_tokens")
    if forced is not None and set(forced) <= set(suppress):
        suppress = [t for t in suppress if t != forced[0]]  # else refused: no token left
    config = GenerationConfig(
        max_new_tokens=max_new_tokens, eos_id=tuple(eos) or None,
        repetition_penalty=data.draw(st.sampled_from([1.0, 0.7, 1.5]), label="penalty"),
        no_repeat_ngram_size=data.draw(st.integers(0, 3), label="no_repeat_ngram_size"),
        bad_words_ids=data.draw(st.lists(WORD, max_size=3), label="bad_words_ids"),
        min_new_tokens=data.draw(st.integers(0, 4), label="min_new_tokens"),
        forced_eos_id=None if forced is None else tuple(forced),
        suppress_tokens=tuple(suppress),
    )
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, V, generator=gen) * 3  # (B, V), both signs
    history = torch.randint(0, 4, (batch, prompt_length + step), generator=gen)  # (B, L)
    padding = torch.zeros_like(history, dtype=torch.bool)
    rules = LogitRules(config, logits.device)
    ours = rules(logits, step, (history, padding))
    theirs = transformers_rules(config, prompt_length)(history, logits.clone())
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def test_a_forced_step_keeps_only_the_forced_ids_and_skips_the_other_rules():
    # The step of the max_new_tokens-th token: every logit -inf but the forced ids', at 0,
    # whatever the earlier rules would have banned (a bad word, min_new_tokens), then the
    # suppressed ids (a forced id that is also suppressed is -inf, as transformers leaves it).
    config = GenerationConfig(max_new_tokens=3, eos_id=2, min_new_tokens=5,
                              bad_words_ids=((2,), (4,)), forced_eos_id=(2, 4),
                              suppress_tokens=(4,))
    logits = torch.randn(2, V, generator=torch.Generator().manual_seed(0))
    history = torch.zeros(2, 3, dtype=torch.long)
    padding = torch.zeros_like(history, dtype=torch.bool)
    out = LogitRules(config, logits.device)(logits, 2, (history, padding))
    expected = torch.full_like(logits, float("-inf"))
    expected[:, 2] = 0.0
    assert torch.equal(out, expected)


def test_a_bad_words_prefix_never_matches_padding():
    # A row's padding is no part of its history (the repetition rules' convention): the bad
    # word (0, 5) bans 5 after a real 0, never after a pad token 0.
    config = GenerationConfig(max_new_tokens=4, bad_words_ids=((0, 5),))
    rules = LogitRules(config, torch.device("cpu"))
    history = torch.tensor([[0, 0, 0], [7, 8, 0]])  # row 0: all padding; row 1 ends in a 0
    padding = torch.tensor([[True, True, True], [False, False, False]])
    out = rules(torch.zeros(2, V), 0, (history, padding))
    assert out[0].isfinite().all() and out[1, 5] == float("-inf")
    assert out[1].isfinite().sum() == V - 1


def test_the_rules_that_read_the_history_ask_for_it():
    rules = LogitRules(GenerationConfig(max_new_tokens=2, bad_words_ids=((1, 2),)),
                       torch.device("cpu"))
    assert rules.needs_history
    with pytest.raises(ValueError, match="pass it"):
        rules(torch.zeros(1, V), 0, None)
    plain = LogitRules(GenerationConfig(max_new_tokens=2, suppress_tokens=(3,)),
                       torch.device("cpu"))
    assert not plain.needs_history
    assert plain(torch.zeros(1, V), 0, None)[0, 3] == float("-inf")


def test_a_one_token_bad_word_that_is_a_stop_id_is_not_banned_as_transformers_filters_it():
    # A row must be able to stop: transformers drops the one-token bad words that are eos ids.
    config = GenerationConfig(max_new_tokens=3, eos_id=(2, 6), bad_words_ids=((2,), (3,), (6, 1)))
    logits = torch.randn(2, V, generator=torch.Generator().manual_seed(1))
    history = torch.tensor([[6, 4], [5, 6]])
    padding = torch.zeros_like(history, dtype=torch.bool)
    ours = LogitRules(config, logits.device)(logits, 1, (history, padding))
    theirs = transformers_rules(config, prompt_length=1)(history, logits.clone())
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    assert ours[:, 2].isfinite().all() and (ours[:, 3] == float("-inf")).all()
    assert ours[0, 1].isfinite() and ours[1, 1] == float("-inf")  # (6, 1): after a 6 only
