"""A user's text tokenized once into a memory-mapped token file: the ids are the text (decode is
the inverse of the one pass), the held-out split starts where its rule says, the cache is
reused without reading the text, a recorded corpus reopens only unchanged, and the windows
are slices of the ids.

Provenance: identities (decoding the ids gives the text back; a token's bytes summed over the
ids give the text's UTF-8 length; a window equals the slice of the ids at its offset), the
split rule restated on the joined bytes, and the order-0 entropy computed from
``collections.Counter`` of the bytes.
"""

from __future__ import annotations

import collections
import math
import random

import numpy as np
import pytest
import torch

from addnorm.data import token_corpus
from addnorm.data.fingerprint import DataChangedError, DataError, DataReadError
from addnorm.data.hf_tokenizer import HFTokenizer
from addnorm.data.token_corpus import TextWindows, TokenCorpus

TEXT_A = "".join(f"line {i}: the quick brown fox — {i * i} ü\n" for i in range(300))
TEXT_B = "zweite Datei, ohne Zeilenende am Schluss: ångström"


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """Every corpus of these tests is cached in the test's own folder."""
    monkeypatch.setenv("ADDNORM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def corpus_dir(tmp_path):
    folder = tmp_path / "texts"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text(TEXT_A, encoding="utf-8")
    (folder / "sub" / "b.txt").write_text(TEXT_B, encoding="utf-8")
    return folder


def _decoded(corpus: TokenCorpus, split: str) -> str:
    return corpus.tokenizer.decode(corpus.ids(split).tolist())


@pytest.mark.parametrize("tokenizer", ["char", "bpe"])
def test_the_ids_decode_to_the_text_split_at_a_line_start(corpus_dir, tokenizer):
    kwargs = {"vocab_size": 300} if tokenizer == "bpe" else {}
    corpus = TokenCorpus.build(corpus_dir, tokenizer, val_fraction=0.1, **kwargs)
    text = TEXT_A + TEXT_B  # the files joined in name order: a.txt, sub/b.txt
    train, val = _decoded(corpus, "train"), _decoded(corpus, "val")
    assert train + val == text
    data = text.encode()
    start = math.floor(len(data) * 0.9)
    expected = data.index(b"\n", start - 1) + 1  # the first line start at or after it
    assert len(train.encode()) == expected
    split = corpus.record.split
    assert split["val_from"] == {"file": "a.txt", "byte": expected}
    assert (split["train_bytes"], split["val_bytes"]) == (expected, len(data) - expected)
    assert split["val_chars"] == len(val)
    assert (split["train_tokens"], split["val_tokens"]) == (corpus.n_train, len(corpus.ids("val")))
    assert corpus.token_bytes()[np.asarray(corpus.tokens)].sum() == len(data)


def test_a_character_vocabulary_is_in_order_of_first_appearance_and_fits_uint16(corpus_dir):
    corpus = TokenCorpus.build(corpus_dir)
    text = TEXT_A + TEXT_B
    assert "".join(corpus.tokenizer.chars) == "".join(dict.fromkeys(text))
    assert corpus.tokens.dtype == np.uint16
    assert isinstance(corpus.tokens, np.memmap)


def test_the_byte_entropy_is_the_order_0_entropy_of_the_bytes(corpus_dir):
    corpus = TokenCorpus.build(corpus_dir)
    data = (TEXT_A + TEXT_B).encode()
    counts = collections.Counter(data)
    expected = -sum(c / len(data) * math.log2(c / len(data)) for c in counts.values())
    # The same sum in another order: float64 rounding over 256 terms (Higham 3.1).
    assert corpus.record.details["byte_entropy"] == pytest.approx(expected, rel=1e-12)


def test_a_second_build_opens_the_cache_without_reading_the_text(corpus_dir, monkeypatch):
    first = TokenCorpus.build(corpus_dir, "bpe", vocab_size=300)
    monkeypatch.setattr(token_corpus, "read_text_pieces", _no_reading)
    second = TokenCorpus.build(corpus_dir, "bpe", vocab_size=300)
    assert second.tokenizer == first.tokenizer
    assert np.array_equal(second.tokens, first.tokens)
    assert second.record == first.record


def _no_reading(*args, **kwargs):
    raise AssertionError("the text was read again")


def test_bpe_training_is_deterministic_and_keyed_by_its_settings(corpus_dir, tmp_path):
    one = TokenCorpus.build(corpus_dir, "bpe", vocab_size=300)
    again = TokenCorpus.build(corpus_dir, "bpe", vocab_size=300, cache_dir=tmp_path / "other")
    assert again.tokenizer.to_json() == one.tokenizer.to_json()
    bigger = TokenCorpus.build(corpus_dir, "bpe", vocab_size=400)
    assert bigger.tokenizer.vocab_size > one.tokenizer.vocab_size


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


@pytest.mark.parametrize(
    ("setup", "kwargs", "message"),
    [
        (lambda d: (d / "e.txt").write_bytes(b""), {}, "is empty"),
        (lambda d: (d / "one.txt").write_text("x"), {"val_fraction": 0.1},
         "too short to split"),
        (lambda d: (d / "b.bin").write_bytes(b"ab\x00c"), {}, "a binary file"),
        (lambda d: (d / "l.txt").write_bytes(b"ok\n\xc3("), {}, "not UTF-8 text"),
        (lambda d: (d / "t.txt").write_text("text\n" * 50), {"vocab_size": 10**7},
         "byte-level BPE needs 259 to"),
    ],
)
def test_unusable_text_is_one_data_error(tmp_path, setup, kwargs, message):
    folder = tmp_path / "d"
    folder.mkdir()
    setup(folder)
    tokenizer = "bpe" if "vocab_size" in kwargs else "char"
    with pytest.raises(DataError, match=message):
        TokenCorpus.build(folder, tokenizer, **kwargs)
    assert not list((tmp_path / "cache").rglob("tokens.bin"))  # nothing half-written kept


def test_a_file_changed_during_the_pass_is_a_read_error_and_leaves_no_cache(
    corpus_dir, cache, monkeypatch
):
    real = token_corpus.read_text_pieces

    def changing(files, **kwargs):
        for i, piece in enumerate(real(files, **kwargs)):
            if i == 0:
                (corpus_dir / "sub" / "b.txt").write_text("changed!", encoding="utf-8")
            yield piece

    monkeypatch.setattr(token_corpus, "read_text_pieces", changing)
    with pytest.raises(DataReadError, match="changed while it was read"):
        TokenCorpus.build(corpus_dir)
    assert not list(cache.rglob("tokens.bin")) and not list(cache.rglob(".tokens*"))


def test_a_tokenizer_file_encodes_the_text_with_its_own_specials(corpus_dir, tmp_path):
    trained = HFTokenizer.train_bpe(iter([TEXT_A]), 300)
    path = tmp_path / "tokenizer.json"
    path.write_text(trained.to_json(), encoding="utf-8")
    corpus = TokenCorpus.build(corpus_dir, path)
    assert corpus.tokenizer == trained
    assert _decoded(corpus, "train") + _decoded(corpus, "val") == TEXT_A + TEXT_B
    assert corpus.record.tokenizer == {"kind": "tokenizer.json", "vocab_size": 300,
                                       "file": str(path)}
