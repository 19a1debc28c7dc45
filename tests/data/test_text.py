"""The pydoc_data text corpus and its batches (the character tokenizer is in
test_tokenizers.py).

Expected values: the corpus definition (sorted topics, contiguous splits).
"""

from __future__ import annotations

import random

import pytest
import torch

from addnorm.data.batches import TextBatches
from addnorm.data.text import TextCorpus, load_topics_text


@pytest.fixture(scope="module")
def corpus() -> TextCorpus:
    return TextCorpus()


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


def test_text_batches_draw_the_corpus_random_windows(corpus):
    """The windows of the trainer's batches are TextWindows items at the offsets the corpus's
    own random_windows draws (the reference) with the same seed: every window but the
    last."""
    batches = TextBatches(corpus, batch_size=5, length=16, seed=4)
    rng = random.Random(4)
    for _ in range(3):
        batch, windows = batches.next_batch(), corpus.random_windows(rng, 5, 16)
        assert torch.equal(batch["ids"], windows[:, :-1])
        assert torch.equal(batch["targets"], windows[:, 1:])
    assert batches.sampler.n == len(batches.dataset) - 1


def test_text_batches_refuse_a_window_longer_than_the_train_split():
    short = TextCorpus("abcdefghij" * 11)  # 99 train characters
    TextBatches(short, batch_size=2, length=97, seed=0)  # 2 windows: the first is drawn
    with pytest.raises(ValueError, match=r"length \(98\) must be < the train split \(99 ids\)"):
        TextBatches(short, batch_size=2, length=98, seed=0)


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
