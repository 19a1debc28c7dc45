"""Text files read as checked UTF-8 pieces: the pieces are the file (an identity, at any block
size), a bad byte is named by file and offset, and a file that changes while read is caught.

Provenance: joining the pieces must give back the file's bytes and their decoded text must be
``bytes.decode("utf-8")`` of the whole file (the reference decoder); the offsets of bad bytes
are those ``bytes.decode`` reports for the whole file.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from properties import examples

from addnorm.data import text_files
from addnorm.data.fingerprint import DataError, DataReadError
from addnorm.data.text_files import read_text_pieces


@examples(40)
@given(text=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                    max_size=300),
       block=st.integers(1, 64))
def test_pieces_join_to_the_file_and_decode_as_the_whole_does(tmp_path_factory, text, block):
    path = tmp_path_factory.mktemp("t") / "a.txt"
    path.write_bytes(text.encode("utf-8"))
    pieces = list(read_text_pieces([path], block=block))
    assert b"".join(p.data for p in pieces) == text.encode("utf-8")
    assert "".join(p.text for p in pieces) == text
    offsets = [p.offset for p in pieces]
    assert offsets == sorted(offsets) and (not pieces or offsets[0] == 0)
    for p in pieces:
        assert p.text == p.data.decode("utf-8")


@pytest.mark.parametrize("block", [3, 1 << 20])
def test_invalid_utf8_is_named_by_file_and_the_offset_the_decoder_reports(tmp_path, block):
    data = "line one\nzwei ü\n".encode() + b"\xff\xfe tail\n"
    path = tmp_path / "bad.txt"
    path.write_bytes(data)
    with pytest.raises(UnicodeDecodeError) as reference:
        data.decode("utf-8")
    with pytest.raises(DataError) as info:
        list(read_text_pieces([path], block=block))
    assert str(info.value) == (
        f"{path}: not UTF-8 text ({reference.value.reason} at byte {reference.value.start})"
    )


def test_a_nul_byte_marks_a_binary_file(tmp_path):
    path = tmp_path / "image.bin"
    path.write_bytes(b"GIF89a" + b"\x00\x01\x02" * 10)
    with pytest.raises(DataError, match=r"a binary file, not text \(a NUL byte at byte 6\)"):
        list(read_text_pieces([path]))


def test_a_file_that_grows_while_read_is_a_read_error(tmp_path, monkeypatch):
    path = tmp_path / "log.txt"
    path.write_bytes(b"x\n" * 100)
    pieces = read_text_pieces([path], block=16)
    next(pieces)
    with open(path, "ab") as f:  # another process appends while the pass runs
        f.write(b"more\n")
    with pytest.raises(DataReadError, match="changed while it was read"):
        list(pieces)


def test_a_file_of_another_size_than_fingerprinted_is_a_read_error(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes(b"abc\n")
    with pytest.raises(DataReadError, match=r"changed while it was read \(3 bytes when first"):
        list(read_text_pieces([path], sizes=[3]))


def test_a_cut_never_splits_a_character(tmp_path):
    """A line longer than a block is cut before a character start."""
    text = "é" * 50  # two bytes each, no line end
    path = tmp_path / "long.txt"
    path.write_text(text, encoding="utf-8")
    pieces = list(read_text_pieces([path], block=7))
    assert len(pieces) > 1 and "".join(p.text for p in pieces) == text
    assert text_files._last_char_start("aé".encode()) == 1
    assert text_files._last_char_start(b"\x80\x80\x80\x80") == -1


@pytest.mark.parametrize("block", [1, 2, 3, 7, 1024])
def test_crlf_line_ends_are_read_as_lf_and_offsets_stay_the_files(tmp_path, block):
    """Issue 41: CRLF text kept ``\\r`` as a character. The text is the LF text; ``data`` and
    the offsets stay the file's bytes, and a piece's part is read the same way."""
    lf = "one\ntwo ü\n\nthree"
    path = tmp_path / "crlf.txt"
    path.write_bytes(lf.replace("\n", "\r\n").encode())
    pieces = list(read_text_pieces([path], block=block))
    assert "".join(p.text for p in pieces) == lf
    assert b"".join(p.data for p in pieces) == path.read_bytes()
    assert b"".join(p.text_bytes for p in pieces) == lf.encode()
    assert all(p.offset == sum(len(q.data) for q in pieces[:i]) for i, p in enumerate(pieces))
    whole = next(iter(read_text_pieces([path], block=1024)))
    assert whole.part(0, 5).text == "one\n" and whole.part(5, 13).text == "two ü\n"
