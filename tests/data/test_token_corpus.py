"""A user's text tokenized once into a memory-mapped token file: the cache is reused without
reading the text, a recorded corpus reopens only unchanged, a tokenizer file encodes with its
own specials, and the windows are slices of the ids (the pass itself: test_tokenize_pass.py).

Provenance: identities (decoding the ids gives the text back; a window equals the slice of the
ids at its offset).
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from user_text import TEXT_A, TEXT_B, decoded

from addnorm.data import tokenize_pass
from addnorm.data.fingerprint import DataChangedError
from addnorm.data.hf_tokenizer import HFTokenizer
from addnorm.data.token_corpus import TextWindows, TokenCorpus

pytestmark = pytest.mark.usefixtures("cache")  # every corpus cached in the test's folder


def test_a_second_build_opens_the_cache_without_reading_the_text(corpus_dir, monkeypatch):
    first = TokenCorpus.build(corpus_dir, "bpe", vocab_size=300)
    monkeypatch.setattr(tokenize_pass, "read_text_pieces", _no_reading)
    second = TokenCorpus.build(corpus_dir, "bpe", vocab_size=300)
    assert second.tokenizer == first.tokenizer
    assert np.array_equal(second.tokens, first.tokens)
    assert second.record == first.record


def _no_reading(*args, **kwargs):
    raise AssertionError("the text was read again")


def test_reopen_encodes_with_the_saved_tokenizer_and_refuses_changed_files(corpus_dir, cache):
    corpus = TokenCorpus.build(corpus_dir)
    import shutil

    shutil.rmtree(cache)  # the cache is gone: the files are encoded again, identically
    again = TokenCorpus.reopen(corpus.record, corpus.tokenizer)
    assert np.array_equal(again.tokens, corpus.tokens)
    (corpus_dir / "sub" / "b.txt").write_text(TEXT_B + "!", encoding="utf-8")
    with pytest.raises(DataChangedError, match=r"sub/b.txt: \d+ -> \d+ bytes"):
        TokenCorpus.reopen(corpus.record, corpus.tokenizer)
    shutil.rmtree(corpus_dir)
    with pytest.raises(DataChangedError, match="cannot be read any more"):
        TokenCorpus.reopen(corpus.record, corpus.tokenizer)


def test_windows_are_slices_of_the_ids(corpus_dir):
    corpus = TokenCorpus.build(corpus_dir)
    rng, copy = random.Random(5), random.Random(5)
    windows = corpus.random_windows(rng, 4, 16)
    train = corpus.ids("train")
    starts = [copy.randrange(len(train) - 17) for _ in range(4)]
    assert windows.dtype == torch.long and windows.shape == (4, 17)
    for row, s in zip(windows, starts, strict=True):
        assert row.tolist() == train[s : s + 17].tolist()
    tiles = corpus.eval_windows("val", 10, max_windows=3)
    val = corpus.ids("val")
    assert tiles.tolist() == [val[i * 10 : i * 10 + 11].tolist() for i in range(3)]


def test_text_windows_feed_a_dataloader(corpus_dir):
    corpus = TokenCorpus.build(corpus_dir)
    dataset = TextWindows(corpus, 8)
    assert len(dataset) == corpus.n_train - 8
    item = dataset[3]
    assert item["ids"].tolist() == corpus.ids("train")[3:11].tolist()
    assert item["targets"].tolist() == corpus.ids("train")[4:12].tolist()
    loader = torch.utils.data.DataLoader(dataset, batch_size=5, shuffle=True,
                                         generator=torch.Generator().manual_seed(0))
    batch = next(iter(loader))
    assert batch["ids"].shape == batch["targets"].shape == (5, 8)
    assert torch.equal(batch["ids"][:, 1:], batch["targets"][:, :-1])
    with pytest.raises(IndexError):
        dataset[len(dataset)]


def test_a_corpus_pickles_by_its_token_file(corpus_dir):
    import pickle

    corpus = TokenCorpus.build(corpus_dir)
    copy = pickle.loads(pickle.dumps(corpus))
    assert isinstance(copy.tokens, np.memmap) and np.array_equal(copy.tokens, corpus.tokens)
    assert len(pickle.dumps(corpus)) < corpus.tokens.nbytes


def test_a_tokenizer_file_encodes_the_text_with_its_own_specials(corpus_dir, tmp_path):
    trained = HFTokenizer.train_bpe(iter([TEXT_A]), 300)
    path = tmp_path / "tokenizer.json"
    path.write_text(trained.to_json(), encoding="utf-8")
    corpus = TokenCorpus.build(corpus_dir, path)
    assert corpus.tokenizer == trained
    assert decoded(corpus, "train") + decoded(corpus, "val") == TEXT_A + TEXT_B
    assert corpus.record.tokenizer == {"kind": "tokenizer.json", "vocab_size": 300,
                                       "file": str(path)}
