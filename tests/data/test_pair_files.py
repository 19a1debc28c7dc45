"""Sentence-pair files, TSV and JSON Lines: what is read, and what is refused (by file and line).

Provenance: the pairs read are the lines written (an identity); malformed lines are drawn by
hypothesis and each must be one ``DataError`` naming its line, with the reason the format
states; bytes that are not UTF-8 are named as Python's own decoder names them.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from properties import examples

from addnorm.data.fingerprint import DataError
from addnorm.data.pair_files import Pair, parse_pair_line, read_pairs

side = st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=12
               ).filter(lambda t: t.strip())


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


def test_parse_pair_line_keeps_the_texts_as_written():
    assert parse_pair_line(" a b \t 1 ", "tsv") == Pair(" a b ", " 1 ")
    assert parse_pair_line('{"target": "x", "source": "y"}', "jsonl") == Pair("y", "x")
