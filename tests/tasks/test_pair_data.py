"""What every kind of translate pairs reports (``addnorm.tasks.pair_data``): exact match, and
the error rates in the target tokenizer's tokens beside it.

Provenance: identities: exact match is one minus the sequence error rate; predictions equal to
their answers score 1 and every error rate 0; the error rates are
:func:`~addnorm.tasks.text_metrics.sequence_error_rates`' with the tokenizer's ``encode``.
"""

from __future__ import annotations

import pytest

from addnorm.data.tokenizers import date_target_tokenizer
from addnorm.tasks.pair_data import answer_scores, exact_match
from addnorm.tasks.text_metrics import sequence_error_rates

ANSWERS = ["2024-01-31", "1999-12-01", "2001-07-04", "1987-02-28"]
PREDICTIONS = ["2024-01-31", "1999-12-10", "2001-07-04", "1978-02-28"]


def test_exact_match_is_one_minus_the_sequence_error_rate_and_counts_the_split():
    figures = exact_match("test", PREDICTIONS, ANSWERS)
    rates = sequence_error_rates("test", PREDICTIONS, ANSWERS, list)
    assert figures["test_exact_match"] == pytest.approx(1 - rates["test_sequence_error_rate"])
    assert figures["n_test"] == len(ANSWERS)


def test_answer_scores_are_exact_match_and_the_error_rates_in_the_target_tokens():
    tok = date_target_tokenizer()
    scores = answer_scores("val", PREDICTIONS, ANSWERS, tok)
    assert scores == {**exact_match("val", PREDICTIONS, ANSWERS),
                      **sequence_error_rates("val", PREDICTIONS, ANSWERS, tok.encode)}
    perfect = answer_scores("val", ANSWERS, ANSWERS, tok)
    assert perfect["val_exact_match"] == 1
    assert all(v == 0 for k, v in perfect.items() if k.endswith("error_rate"))

