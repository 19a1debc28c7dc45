"""The tokenize pass, through the corpus it builds: the ids decode to the text, the held-out
split starts where its rule says, a character vocabulary is in order of first appearance, the
byte entropy is the bytes', BPE training is deterministic, and unusable or changing text is one
error that leaves nothing in the cache.

Provenance: identities (decoding the ids gives the text back; a token's bytes summed over the
ids give the text's UTF-8 length), the split rule restated on the joined bytes, and the order-0
entropy computed from ``collections.Counter`` of the bytes.
"""

from __future__ import annotations

import collections
import math

import numpy as np
import pytest
from user_text import TEXT_A, TEXT_B, decoded

from addnorm.data import tokenize_pass
from addnorm.data.fingerprint import DataError, DataReadError
from addnorm.data.token_corpus import TokenCorpus

pytestmark = pytest.mark.usefixtures("cache")  # every corpus cached in the test's folder


@pytest.mark.parametrize("tokenizer", ["char", "bpe"])
def test_the_ids_decode_to_the_text_split_at_a_line_start(corpus_dir, tokenizer):
    kwargs = {"vocab_size": 300} if tokenizer == "bpe" else {}
    corpus = TokenCorpus.build(corpus_dir, tokenizer, val_fraction=0.1, **kwargs)
    text = TEXT_A + TEXT_B  # the files joined in name order: a.txt, sub/b.txt
    train, val = decoded(corpus, "train"), decoded(corpus, "val")
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


def test_bpe_training_is_deterministic_and_keyed_by_its_settings(corpus_dir, tmp_path):
    one = TokenCorpus.build(corpus_dir, "bpe", vocab_size=300)
    again = TokenCorpus.build(corpus_dir, "bpe", vocab_size=300, cache_dir=tmp_path / "other")
    assert again.tokenizer.to_json() == one.tokenizer.to_json()
    bigger = TokenCorpus.build(corpus_dir, "bpe", vocab_size=400)
    assert bigger.tokenizer.vocab_size > one.tokenizer.vocab_size


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
    real = tokenize_pass.read_text_pieces

    def changing(files, **kwargs):
        for i, piece in enumerate(real(files, **kwargs)):
            if i == 0:
                (corpus_dir / "sub" / "b.txt").write_text("changed!", encoding="utf-8")
            yield piece

    monkeypatch.setattr(tokenize_pass, "read_text_pieces", changing)
    with pytest.raises(DataReadError, match="changed while it was read"):
        TokenCorpus.build(corpus_dir)
    assert not list(cache.rglob("tokens.bin")) and not list(cache.rglob(".tokens*"))


