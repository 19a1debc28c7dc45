"""The repetition rules (``addnorm.generation.repetition``): ``repetition_penalty`` and
``no_repeat_ngram_size``.

Provenance: transformers' own ``RepetitionPenaltyLogitsProcessor`` and
``NoRepeatNGramLogitsProcessor`` on the same random logits and histories; the invariant that
a left-padded row's rules are those of the row alone.
"""

from __future__ import annotations

import pytest
import torch
from transformers import (
    LogitsProcessorList,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
)

from addnorm.generation.repetition import apply_repetition_rules

VOCAB = 12


def _random_case(seed: int, batch: int = 4, length: int = 15, n_ids: int = 5):
    """Random logits of both signs and histories drawn from few ids, so repeats abound."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, VOCAB, generator=gen, dtype=torch.float64) * 3
    history = torch.randint(0, n_ids, (batch, length), generator=gen)
    return logits, history


def _no_padding(history: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(history, dtype=torch.bool)


@pytest.mark.parametrize("penalty", [1.3, 0.7, 2.0])
def test_repetition_penalty_matches_transformers_processor(penalty):
    logits, history = _random_case(0)
    ours = apply_repetition_rules(logits, history, _no_padding(history),
                                  repetition_penalty=penalty)
    theirs = RepetitionPenaltyLogitsProcessor(penalty)(history, logits.clone())
    # One IEEE multiply or divide per logit, correctly rounded on any machine: bitwise.
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    assert not torch.equal(ours, logits)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("length", [1, 3, 15])
def test_no_repeat_ngram_matches_transformers_processor(n, length):
    logits, history = _random_case(n, length=length, n_ids=3)
    ours = apply_repetition_rules(logits, history, _no_padding(history),
                                  no_repeat_ngram_size=n)
    theirs = NoRepeatNGramLogitsProcessor(n)(history, logits.clone())
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def test_both_rules_together_match_transformers_order():
    logits, history = _random_case(7)
    rules = {"repetition_penalty": 1.5, "no_repeat_ngram_size": 2}
    ours = apply_repetition_rules(logits, history, _no_padding(history), **rules)
    processors = LogitsProcessorList(
        [RepetitionPenaltyLogitsProcessor(1.5), NoRepeatNGramLogitsProcessor(2)]
    )
    expected = processors(history, logits.clone())
    torch.testing.assert_close(ours, expected, rtol=0, atol=0)  # one IEEE op per logit


def test_padding_is_not_part_of_the_history():
    logits, history = _random_case(3, batch=1)
    padded = torch.cat([torch.full((1, 4), 0), history], dim=1)  # left padding, id 0
    padding = torch.zeros_like(padded, dtype=torch.bool)
    padding[:, :4] = True
    rules = {"repetition_penalty": 1.4, "no_repeat_ngram_size": 3}
    alone = apply_repetition_rules(logits, history, _no_padding(history), **rules)
    got = apply_repetition_rules(logits, padded, padding, **rules)
    torch.testing.assert_close(got, alone, rtol=0, atol=0)  # the same per-logit ops: bitwise
