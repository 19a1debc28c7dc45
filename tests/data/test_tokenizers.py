"""The character tokenizers (``addnorm.data.tokenizers``): ``CharTokenizer``'s vocabulary,
ids, batches and dict form.

Expected values: round-trip identities (decode(encode(t)) == t) and the documented id layout
(specials first, <pad> = 0). The dates' two vocabularies are checked against every date
format in test_dates.py.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from properties import examples

from addnorm.data.tokenizers import SPECIALS, CharTokenizer


@examples(50)
@given(text=st.text(alphabet="abcxyz -", max_size=40))
def test_tokenizer_round_trips_text_of_its_alphabet(text):
    tok = CharTokenizer("-abcxyz ")
    assert tok.decode(tok.encode(text, add_bos=True, add_eos=True)) == text


def test_specials_come_first_so_pad_is_zero():
    tok = CharTokenizer("ab")
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (0, 1, 2, 3)
    assert tok.encode("ba") == [len(SPECIALS) + 1, len(SPECIALS)]
    assert tok.vocab_size == len(SPECIALS) + 2


def test_unknown_characters_encode_as_unk_and_decoding_stops_at_eos():
    tok = CharTokenizer("ab")
    assert tok.encode("a?b") == [4, tok.unk_id, 5]
    assert tok.decode([4, tok.eos_id, 5]) == "a"


def test_encode_batch_right_pads_with_pad_id():
    tok = CharTokenizer("ab")
    batch = tok.encode_batch(["a", "abb"], add_eos=True)
    expected = torch.tensor([[4, 2, 0, 0], [4, 5, 5, 2]])  # a<eos><pad><pad>, abb<eos>
    assert torch.equal(batch, expected)


def test_tokenizer_survives_its_dict_form():
    tok = CharTokenizer("xyz")
    assert CharTokenizer.from_dict(tok.to_dict()) == tok


@pytest.mark.parametrize(
    ("chars", "error"),
    [(["ab"], ValueError), ("aa", ValueError), ([1], ValueError)],
)
def test_tokenizer_rejects_bad_vocabularies(chars, error):
    with pytest.raises(error, match="chars"):
        CharTokenizer(chars)


@pytest.mark.parametrize("data", [{"chars": "ab"}, [], {"chars": ["a"], "specials": ["<x>"]}])
def test_tokenizer_from_dict_rejects_bad_data(data):
    with pytest.raises(ValueError, match="tokenizer"):
        CharTokenizer.from_dict(data)
