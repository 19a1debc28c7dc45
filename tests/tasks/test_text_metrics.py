"""Edit distance and the error rates built on it.

Provenance: the distance is held to the textbook dynamic-programming table (Wagner-Fischer,
written out below, a reference implementation) on hypothesis-drawn sequences, and to the
metric's identities (distance 0 to itself, the length to an empty sequence, symmetry, the
triangle inequality, the length difference as a floor and the longer length as a ceiling);
the worked examples are the textbooks' (kitten -> sitting: 3, Levenshtein's classic; flaw ->
lawn: 2; intention -> execution: 5 with substitutions costing 1, Jurafsky & Martin) and
torchmetrics' documented example (its ``word_error_rate`` gives 0.5000 and its
``char_error_rate`` 0.3415 on the same two pairs, printed to 4 decimals: the tolerance).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from addnorm.data.tokenizers import CharTokenizer
from addnorm.tasks.text_metrics import edit_distance, error_rate, sequence_error_rates


def _table_distance(a, b) -> int:
    """Wagner-Fischer: the full table, one row at a time."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        new = [i]
        for j, y in enumerate(b, 1):
            new.append(min(row[j] + 1, new[j - 1] + 1, row[j - 1] + (x != y)))
        row = new
    return row[-1]


# Small alphabets make matches common, so every branch of the bit-vector step is taken;
# lengths past 64 cross what one machine word would hold.
_texts = st.text(alphabet="abc", max_size=80)
_ids = st.lists(st.integers(0, 3), max_size=80)


@settings(max_examples=300, deadline=None)
@given(_texts, _texts)
def test_the_distance_is_the_full_tables(a, b):
    assert edit_distance(a, b) == _table_distance(a, b)


@settings(max_examples=200, deadline=None)
@given(_ids, _ids)
def test_token_ids_are_items_like_characters(a, b):
    assert edit_distance(a, b) == _table_distance(a, b)
    assert edit_distance(tuple(a), b) == edit_distance(a, b)


@settings(max_examples=200, deadline=None)
@given(_texts, _texts, _texts)
def test_the_distance_is_a_metric(a, b, c):
    assert edit_distance(a, a) == 0
    assert edit_distance(a, "") == edit_distance("", a) == len(a)
    assert edit_distance(a, b) == edit_distance(b, a)
    assert edit_distance(a, c) <= edit_distance(a, b) + edit_distance(b, c)
    assert abs(len(a) - len(b)) <= edit_distance(a, b) <= max(len(a), len(b))
    assert (edit_distance(a, b) == 0) == (a == b)


@pytest.mark.parametrize(("a", "b", "distance"), [
    ("kitten", "sitting", 3), ("flaw", "lawn", 2), ("intention", "execution", 5),
    ("", "", 0), ("a", "", 1), ("abc", "abc", 0),
])
def test_the_worked_examples(a, b, distance):
    assert edit_distance(a, b) == distance


def test_torchmetrics_documented_example():
    predictions = ["this is the prediction", "there is an other sample"]
    references = ["this is the reference", "there is another one"]
    words = error_rate([p.split() for p in predictions], [r.split() for r in references])
    assert words == pytest.approx(0.5, abs=5e-5)
    assert error_rate(predictions, references) == pytest.approx(0.3415, abs=5e-5)


def test_rates_are_summed_over_the_corpus_not_averaged():
    # 1 edit in a 1-unit reference and 0 in a 9-unit one: 1/10 (a mean of ratios is 0.5).
    assert error_rate(["x", "abcdefghi"], ["y", "abcdefghi"]) == 0.1
    assert error_rate(["abcd"], ["ab"]) == 1.0  # insertions count: a rate can reach past 1
    assert error_rate(["abc"], [""]) == 3.0  # no reference units: divided by 1
    with pytest.raises(ValueError, match="2 predictions for 1 references"):
        error_rate(["a", "b"], ["a"])


def test_the_sequence_scores_of_a_split():
    tok = CharTokenizer("abcdefghij -")
    predictions = ["abc def", "ghij", "a-b"]
    answers = ["abc def", "ghi", "a-c d"]
    scores = sequence_error_rates("test", predictions, answers, tok.encode)
    # char tokens: the token error rate is the character error rate (an identity)
    assert scores["test_token_error_rate"] == scores["test_char_error_rate"] == (0 + 1 + 3) / 15
    # words: 0 of 2, 1 of 1 ("ghij" for "ghi"), 2 of 2 ("a-b" for "a-c", "d" deleted)
    assert scores["test_word_error_rate"] == 3 / 5
    assert scores["test_sequence_error_rate"] == 2 / 3  # 1 - exact match
    assert set(scores) == {f"test_{k}_error_rate" for k in ("token", "char", "word", "sequence")}
    with pytest.raises(ValueError, match="no predictions"):
        sequence_error_rates("test", [], [], tok.encode)
    with pytest.raises(ValueError, match="1 predictions for 2 references"):
        sequence_error_rates("test", ["a"], ["a", "b"], tok.encode)


def test_the_token_rate_counts_a_tokenizers_units():
    # Two-character tokens: "abxb" for "abab" is 1 wrong token of 2, 1 wrong character of 4.
    def pairs(text: str) -> list[str]:
        return [text[i:i + 2] for i in range(0, len(text), 2)]

    scores = sequence_error_rates("val", ["abxb"], ["abab"], pairs)
    assert scores["val_token_error_rate"] == 1 / 2
    assert scores["val_char_error_rate"] == 1 / 4
