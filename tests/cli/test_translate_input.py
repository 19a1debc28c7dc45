"""The inputs of ``addnorm translate`` and ``addnorm embed`` (``addnorm.cli.translate_input``):
standard input read lazily line by line, each line refused on its own when the model cannot
take it (too long, not UTF-8, a character outside the vocabulary), and batched lazily.

Provenance: the module's documented contract on streams written here (``io.BytesIO``, and a
stream that counts what is read of it); the commands' hostile inputs end to end are in
test_hostile_input.py and test_hostile_run_files.py.
"""

from __future__ import annotations

import io
import itertools
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st
from properties import examples

from addnorm.cli.checks import UsageError
from addnorm.cli.translate_input import Input, batched, open_stdin, refusal, stdin_inputs

KNOWN = frozenset("0123456789 -abc")


def test_lines_lose_their_ends_and_are_numbered_blank_lines_kept():
    stream = io.BytesIO(b"12 abc\r\n\n 3-4\nlast")
    assert list(stdin_inputs(stream, KNOWN, limit=10)) == [
        Input("line 1", "12 abc"), Input("line 2", ""), Input("line 3", " 3-4"),
        Input("line 4", "last", refusal("last", KNOWN, 10)),
    ]


def test_each_bad_line_is_refused_on_its_own_naming_why():
    stream = io.BytesIO(b"1\xff2\n" + b"9" * 50 + b"\n" + b"1x\n" + b"12\n")
    inputs = list(stdin_inputs(stream, KNOWN, limit=8))
    assert [i.where for i in inputs] == ["line 1", "line 2", "line 3", "line 4"]
    assert inputs[0].problem == "not UTF-8 text (invalid start byte at byte 1)"
    assert inputs[1].problem.startswith("over 8 characters (") and "max_len" in inputs[1].problem
    assert inputs[2].problem == ("the character 'x' (U+0078) at position 2 is not one the "
                                 "model knows")
    assert inputs[3] == Input("line 4", "12")


class CountingStream(io.BytesIO):
    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.most = 0

    def readline(self, size: int | None = -1) -> bytes:
        line = super().readline(size)
        self.most = max(self.most, len(line))
        return line


def test_a_long_line_is_skipped_in_blocks_not_read_whole():
    stream = CountingStream(b"1" * (1 << 20) + b"\n12\n")
    inputs = list(stdin_inputs(stream, KNOWN, limit=10))
    assert inputs[1] == Input("line 2", "12")
    assert stream.most <= 1 << 16  # at most one block in memory, whatever the line's length
    assert f"({(1 << 20) + 1} bytes or more)" in inputs[0].problem  # the line and its end


@examples(50)
@given(text=st.text(max_size=12), limit=st.integers(1, 10))
def test_refusal_is_none_exactly_for_blank_text_or_text_the_model_takes(text, limit):
    problem = refusal(text, KNOWN, limit)
    takes = not text.strip() or (len(text) <= limit and set(text) <= KNOWN)
    assert (problem is None) == takes


def test_without_a_vocabulary_only_length_and_utf8_are_checked():
    assert refusal("any ☃ text", None, 20) is None
    assert refusal("x" * 21, None, 20) == "21 characters; at most 20 are taken"
    assert refusal("a\udcffb", None, 20) == "not UTF-8 text (undecodable byte at position 2)"


def test_batched_takes_the_items_lazily_in_lists_of_size():
    assert list(batched(range(7), 3)) == [[0, 1, 2], [3, 4, 5], [6]]
    endless = batched(itertools.count(), 2)
    assert next(endless) == [0, 1] and next(endless) == [2, 3]


def test_a_closed_stdin_is_a_usage_error_naming_what_was_expected(monkeypatch):
    closed = io.StringIO()
    closed.close()
    monkeypatch.setattr(sys, "stdin", closed)
    with pytest.raises(UsageError, match="no sentences given and stdin is closed"):
        open_stdin("sentences")
    monkeypatch.setattr(sys, "stdin", io.StringIO("a\n"))
    assert open_stdin().readline() == "a\n"
