"""Character tokenizers and the pydoc_data text corpus.

Expected values: round-trip identities (decode(encode(t)) == t), the documented id layout
(specials first, <pad> = 0), and the corpus definition (sorted topics, contiguous splits).
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from properties import examples

from addnorm.data.batches import TextBatches
from addnorm.data.text import TextCorpus, load_topics_text
from addnorm.data.tokenizers import SPECIALS, CharTokenizer


@pytest.fixture(scope="module")
def corpus() -> TextCorpus:
    return TextCorpus()


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


def test_corpus_is_the_sorted_pydoc_topics(corpus):
    from pydoc_data.topics import topics

    text = load_topics_text()
    first = sorted(topics)[0]
    assert text.startswith(topics[first].strip("\n"))
    assert corpus.text == text


def test_splits_are_contiguous_blocks_that_tile_the_corpus(corpus):
    whole = torch.tensor(corpus.tokenizer.encode(corpus.text))
    joined = torch.cat([corpus.ids("train"), corpus.ids("val"), corpus.ids("test")])
    assert torch.equal(joined, whole)
    assert corpus.tokenizer.decode(corpus.ids("val").tolist()) in corpus.text
    assert corpus.tokenizer.unk_id not in whole.tolist()


def test_eval_windows_predict_each_character_once(corpus):
    windows = corpus.eval_windows("val", 64, max_windows=5)
    val = corpus.ids("val")
    targets = windows[:, 1:].reshape(-1)
    assert torch.equal(targets, val[1 : 1 + 5 * 64])


def test_text_batches_shift_targets_by_one_and_resume_their_order(corpus):
    batches = TextBatches(corpus, batch_size=3, length=16, seed=1)
    first = batches.next_batch()
    assert torch.equal(first["ids"][:, 1:], first["targets"][:, :-1])
    state = batches.state_dict()
    expected = batches.next_batch()
    batches.load_state_dict(state)
    assert torch.equal(batches.next_batch()["ids"], expected["ids"])


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"batch_size": 0, "length": 8}, ValueError),
        ({"batch_size": 2, "length": 10**9}, ValueError),
    ],
)
def test_random_windows_reject_bad_sizes(corpus, kwargs, error):
    with pytest.raises(error):
        corpus.random_windows(random.Random(0), **kwargs)


def test_corpus_rejects_a_too_short_text():
    with pytest.raises(ValueError, match="text"):
        TextCorpus("tiny")
