"""Sentence pairs from TSV and JSON Lines as a corpus: the recorded held-out split, the
tokenizers, and the batches (reading the files: test_pair_files.py).

Provenance: the split is the stated CRC-32 rule recomputed with ``zlib``; a batch equals the
tokenizers' own encoding of the pairs it drew (replayed from a copy of its generator).
"""

from __future__ import annotations

import json
import random
import zlib

import pytest
import torch

from addnorm.data.fingerprint import DataChangedError, DataError
from addnorm.data.pairs import Pair, PairBatches, PairCorpus, TranslationPairs

PAIRS = [Pair(f"number {i} in words", str(i)) for i in range(200)]


def _write_tsv(path, pairs):
    path.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    return path


def test_the_held_out_split_is_the_crc32_rule_and_recorded(tmp_path):
    path = _write_tsv(tmp_path / "pairs.tsv", PAIRS)
    corpus = PairCorpus.build(path, val_fraction=0.2)
    expected = [p for p in PAIRS if zlib.crc32(p.source.encode()) % 10**6 < 200_000]
    assert corpus.held_out == expected
    assert corpus.train == [p for p in PAIRS if p not in expected]
    assert corpus.record.split["val_pairs"] == len(expected)
    assert corpus.record.kind == "pairs" and corpus.record.details["format"] == "tsv"


def test_a_valid_file_is_the_held_out_split(tmp_path):
    data = _write_tsv(tmp_path / "train.tsv", PAIRS[:150])
    valid = tmp_path / "valid.jsonl"
    valid.write_text("".join(json.dumps({"source": s, "target": t}) + "\n" for s, t in PAIRS[150:]))
    corpus = PairCorpus.build(data, valid=valid)
    assert corpus.train == PAIRS[:150] and corpus.held_out == PAIRS[150:]
    assert corpus.record.details["valid"]["path"] == str(valid)
    valid.write_text("changed\tpair\n")
    with pytest.raises(DataChangedError, match="valid.jsonl"):
        PairCorpus.reopen(corpus.record, corpus.src_tok, corpus.tgt_tok)


@pytest.mark.parametrize(("tokenizer", "shared"), [("char", False), ("char", True),
                                                  ("bpe", False), ("bpe", True)])
def test_tokenizers_per_side_or_shared(tmp_path, tokenizer, shared):
    path = _write_tsv(tmp_path / "pairs.tsv", PAIRS)
    kwargs = {"vocab_size": 270} if tokenizer == "bpe" else {}
    corpus = PairCorpus.build(path, tokenizer=tokenizer, shared_vocab=shared, **kwargs)
    assert (corpus.src_tok is corpus.tgt_tok) == shared
    if tokenizer == "char" and not shared:
        assert corpus.tgt_tok.chars == tuple("0123456789")
    for p in corpus.train[:5]:
        assert corpus.src_tok.decode(corpus.src_tok.encode(p.source)) == p.source
    assert corpus.longest_target == max(len(corpus.tgt_tok.encode(p.target)) for p in PAIRS)


def test_batches_are_the_tokenizers_encoding_of_the_pairs_drawn(tmp_path):
    corpus = PairCorpus.build(_write_tsv(tmp_path / "pairs.tsv", PAIRS))
    batches = PairBatches(corpus, batch_size=6, seed=3)
    state = batches.state_dict()
    batch = batches.next_batch()
    rng = random.Random(3)
    drawn = [corpus.train[rng.randrange(len(corpus.train))] for _ in range(6)]
    expected = corpus.collate(drawn)
    assert all(torch.equal(batch[k], expected[k]) for k in ("src", "tgt_in", "tgt_out"))
    assert batch["tgt_in"][:, 0].eq(corpus.tgt_tok.bos_id).all()
    batches.load_state_dict(state)
    assert torch.equal(batches.next_batch()["src"], batch["src"])


def test_translation_pairs_feed_a_dataloader(tmp_path):
    corpus = PairCorpus.build(_write_tsv(tmp_path / "pairs.tsv", PAIRS))
    dataset = TranslationPairs(corpus, "val")
    assert len(dataset) == len(corpus.held_out)
    assert dataset[0] == dict(corpus.held_out[0]._asdict())
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, collate_fn=corpus.collate)
    batch = next(iter(loader))
    assert batch["src"].shape[0] == 4 and batch["tgt_in"].shape == batch["tgt_out"].shape


@pytest.mark.parametrize(
    ("content", "kwargs", "message"),
    [
        ("", {}, "is empty"),
        ("\n\n", {}, "holds no pairs"),
        ("a\tb\n", {}, "the held-out split of its 1 pairs is empty"),
        ("a\tb\n", {"tokenizer": "char", "vocab_size": 300}, "applies to the bpe"),
    ],
)
def test_unusable_pairs_are_one_data_error(tmp_path, content, kwargs, message):
    path = tmp_path / "pairs.tsv"
    path.write_text(content)
    with pytest.raises(DataError, match=message):
        PairCorpus.build(path, **kwargs)


def test_the_same_pairs_in_two_places_record_each_path(tmp_path):
    text = "".join(f"w{i}\t{i}\n" for i in range(40))
    first, second = tmp_path / "a.tsv", tmp_path / "b.tsv"
    first.write_text(text, encoding="utf-8")
    second.write_text(text, encoding="utf-8")
    assert PairCorpus.build(first).record.path == str(first)
    assert PairCorpus.build(second).record.path == str(second)  # not the first's, built alike
