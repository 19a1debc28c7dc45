"""Sentence pairs from TSV and JSON Lines: what is read, what is refused (by file and line),
the recorded held-out split, the tokenizers, and the batches.

Provenance: the pairs read are the lines written (an identity); malformed lines are drawn by
hypothesis and each must be one ``DataError`` naming its line, with the reason the format
states; the split is the stated CRC-32 rule recomputed with ``zlib``; a batch equals the
tokenizers' own encoding of the pairs it drew (replayed from a copy of its generator).
"""

from __future__ import annotations

import json
import random
import zlib

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from properties import examples

from addnorm.data.fingerprint import DataChangedError, DataError
from addnorm.data.pairs import (
    Pair,
    PairBatches,
    PairCorpus,
    TranslationPairs,
    parse_pair_line,
    read_pairs,
)

PAIRS = [Pair(f"number {i} in words", str(i)) for i in range(200)]
side = st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=12
               ).filter(lambda t: t.strip())


def _write_tsv(path, pairs):
    path.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    return path


@examples(30)
@given(pairs=st.lists(st.tuples(side, side), min_size=1, max_size=8),
       fmt=st.sampled_from(["tsv", "jsonl"]), crlf=st.booleans())
def test_the_pairs_read_are_the_lines_written(tmp_path_factory, pairs, fmt, crlf):
    path = tmp_path_factory.mktemp("p") / f"pairs.{fmt}"
    end = "\r\n" if crlf else "\n"
    if fmt == "tsv":
        pairs = [(s.replace("\t", " "), t.replace("\t", " ")) for s, t in pairs]
        lines = [f"{s}\t{t}" for s, t in pairs]
    else:
        lines = [json.dumps({"source": s, "target": t, "note": 1}) for s, t in pairs]
    path.write_bytes((end.join(lines) + end + end).encode("utf-8"))  # a trailing empty line
    assert read_pairs(path) == [Pair(s, t) for s, t in pairs]


@examples(40)
@given(
    good=st.lists(st.tuples(side, side), min_size=0, max_size=4),
    bad=st.one_of(
        st.tuples(st.just("tsv"), side.filter(lambda t: "\t" not in t), st.just("no tab")),
        st.tuples(st.just("tsv"), st.tuples(side, side, side).map("\t".join)
                  .filter(lambda t: t.count("\t") >= 2), st.just("tabs; a line is")),
        st.tuples(st.just("tsv"), side.map(lambda t: "  \t" + t.replace("\t", "")),
                  st.just("the source is empty")),
        st.tuples(st.just("tsv"), side.map(lambda t: t.replace("\t", "") + "\t "),
                  st.just("the target is empty")),
        st.tuples(st.just("jsonl"), side.filter(lambda t: not t.strip().startswith(("{", "[")))
                  .map(lambda t: "{" + t), st.just("not JSON")),
        st.tuples(st.just("jsonl"), st.sampled_from(['[1, 2]', '"text"', "3", "null"]),
                  st.just("a JSON object")),
        st.tuples(st.just("jsonl"), side.map(lambda t: json.dumps({"source": t})),
                  st.just("no 'target' key")),
        st.tuples(st.just("jsonl"), st.integers().map(
            lambda n: json.dumps({"source": n, "target": "x"})), st.just("'source' must be")),
    ),
)
def test_a_malformed_line_is_one_data_error_naming_its_line(tmp_path_factory, good, bad):
    fmt, line, reason = bad
    path = tmp_path_factory.mktemp("p") / f"pairs.{fmt}"
    good = [(s.replace("\t", " "), t.replace("\t", " ")) for s, t in good]
    lines = [f"{s}\t{t}" if fmt == "tsv" else json.dumps({"source": s, "target": t})
             for s, t in good]
    path.write_text("\n".join([*lines, line]) + "\n", encoding="utf-8")
    with pytest.raises(DataError) as info:
        read_pairs(path)
    message = str(info.value)
    assert message.startswith(f"data {path}: line {len(good) + 1}: ")
    assert reason in message and "\n" not in message


@examples(30)
@given(prefix=st.binary(max_size=20).filter(lambda b: b"\n" not in b and b"\0" not in b),
       junk=st.sampled_from([b"\xff", b"\xc3(", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"]))
def test_bytes_that_are_not_utf8_are_named_by_line_and_byte(tmp_path_factory, prefix, junk):
    path = tmp_path_factory.mktemp("p") / "pairs.tsv"
    head = b"ok\tfine\n"
    path.write_bytes(head + prefix + junk + b"\tx\n")
    data = path.read_bytes()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as reference:
        expected = f"not UTF-8 text ({reference.reason} at byte {reference.start})"
    else:  # pragma: no cover - junk is never UTF-8
        raise AssertionError
    with pytest.raises(DataError, match="line [12]: ") as info:
        read_pairs(path)
    assert expected in str(info.value)


def test_a_nul_byte_is_a_binary_file(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_bytes(b"a\tb\n\x00\x01\x02\n")
    with pytest.raises(DataError, match=r"line 2: a NUL byte at byte 4; a binary file"):
        read_pairs(path)


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


def test_parse_pair_line_keeps_the_texts_as_written():
    assert parse_pair_line(" a b \t 1 ", "tsv") == Pair(" a b ", " 1 ")
    assert parse_pair_line('{"target": "x", "source": "y"}', "jsonl") == Pair("y", "x")


def test_the_same_pairs_in_two_places_record_each_path(tmp_path):
    text = "".join(f"w{i}\t{i}\n" for i in range(40))
    first, second = tmp_path / "a.tsv", tmp_path / "b.tsv"
    first.write_text(text, encoding="utf-8")
    second.write_text(text, encoding="utf-8")
    assert PairCorpus.build(first).record.path == str(first)
    assert PairCorpus.build(second).record.path == str(second)  # not the first's, built alike
