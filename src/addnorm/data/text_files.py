"""A user's text files read as a stream of checked UTF-8 pieces, in bounded memory.

:func:`read_text_pieces` reads files block by block (``BLOCK_BYTES``), cuts each block after
its last line end (or, in a line longer than a block, before its last character) and yields
the pieces with where they start. Every piece is checked on the way:

- a CRLF line end is read as LF (``text``; ``data`` keeps the file's bytes, so offsets stay
  the file's), as a pairs file's lines are: a file saved on Windows is the same text;
- a NUL byte means a binary file, not text: :class:`DataError` naming the file and byte;
- bytes that are not UTF-8: :class:`DataError` naming the file and the byte offset, as
  ``addnorm translate`` names a line's;
- a file that fails while it is read, or whose size or modification time changes while it
  is read (or differs from the size it was fingerprinted with): :class:`DataReadError`
  (:func:`opened_unchanged` and :func:`check_read_whole`, which a pairs file's reading shares).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from addnorm.data.fingerprint import DataError, DataReadError

__all__ = [
    "BLOCK_BYTES",
    "TextPiece",
    "check_read_whole",
    "opened_unchanged",
    "read_text_pieces",
]

# Bytes read at a time (a piece is at most this plus the rest of a line cut at a block's end).
BLOCK_BYTES = 2**20


@dataclass(frozen=True)
class TextPiece:
    """A run of whole lines (or characters) of one file.

    Attributes:
        index: the file's position in the list read.
        offset: the byte offset of the piece's first byte in its file.
        data: the piece's bytes, as in the file.
        text: the same, decoded, CRLF line ends read as LF.
    """

    index: int
    offset: int
    data: bytes
    text: str

    @property
    def text_bytes(self) -> bytes:
        """``text``'s UTF-8 bytes: ``data`` with CRLF line ends as LF."""
        return self.data.replace(b"\r\n", b"\n") if b"\r\n" in self.data else self.data

    def part(self, start: int, stop: int) -> TextPiece:
        """The piece of ``data[start:stop]`` (cut at character starts, not inside a CRLF)."""
        data = self.data[start:stop]
        return TextPiece(self.index, self.offset + start, data, _as_text(data.decode("utf-8")))


def read_text_pieces(
    files: Sequence[Path], *, sizes: Sequence[int] | None = None, block: int = BLOCK_BYTES
) -> Iterator[TextPiece]:
    """The pieces of ``files`` in order (see the module docstring). ``sizes``: the size each
    file had when it was fingerprinted; a file of another size is one that changed."""
    for index, path in enumerate(files):
        expected = None if sizes is None else sizes[index]
        yield from _file_pieces(index, path, expected, block)


@contextmanager
def opened_unchanged(path: Path, expected: int | None
                     ) -> Iterator[tuple[BinaryIO, os.stat_result]]:
    """``path`` open for reading bytes, and its stat when opened; :class:`DataReadError` if
    it cannot be opened or its size is not ``expected`` (the size it was fingerprinted with)."""
    try:
        f = open(path, "rb")
    except OSError as err:
        raise DataReadError(f"{path}: cannot be read ({err.strerror or err})") from None
    with f:
        before = os.fstat(f.fileno())
        if expected is not None and before.st_size != expected:
            raise DataReadError(
                f"{path}: changed while it was read ({expected} bytes when first looked at, "
                f"{before.st_size} now)"
            )
        yield f, before


def check_read_whole(path: Path, f: BinaryIO, before: os.stat_result, read: int) -> None:
    """:class:`DataReadError` unless the ``read`` bytes were the whole file and its size and
    modification time are still those it was opened with."""
    after = os.fstat(f.fileno())
    if read != before.st_size or (after.st_size, after.st_mtime_ns) != (
        before.st_size, before.st_mtime_ns
    ):
        raise DataReadError(
            f"{path}: changed while it was read ({before.st_size} bytes when opened, "
            f"{read} read, {after.st_size} now)"
        )


def _file_pieces(index: int, path: Path, expected: int | None, block: int
                 ) -> Iterator[TextPiece]:
    with opened_unchanged(path, expected) as (f, before):
        offset, carry = 0, b""
        while True:
            try:
                chunk = f.read(block)
            except OSError as err:
                raise DataReadError(
                    f"{path}: reading failed at byte {offset + len(carry)} "
                    f"({err.strerror or err})"
                ) from None
            if chunk:
                data = carry + chunk
                cut = _cut(data)
                piece, carry = data[:cut], data[cut:]
            else:
                piece, carry = carry, b""
            if piece:
                yield TextPiece(index, offset, piece, _decode(piece, path, offset))
                offset += len(piece)
            if not chunk:
                break
        check_read_whole(path, f, before, offset)


def _cut(data: bytes) -> int:
    """Where to end a piece of ``data`` (the rest is carried to the next read): after its
    last line end; else before its last character (which may be incomplete; 0 when that is
    the only one: read more); else, when none of its last 4 bytes starts a character (not
    UTF-8), at its end, so that decoding names the bad bytes."""
    newline = data.rfind(b"\n")
    if newline >= 0:
        return newline + 1
    start = _last_char_start(data)
    return len(data) if start < 0 else start


def _last_char_start(data: bytes) -> int:
    """The index of the last byte of ``data`` that starts a UTF-8 character, looking at its
    last 4 bytes only (a character has at most 4); -1 if none of them does."""
    for i in range(len(data) - 1, max(len(data) - 5, -1), -1):
        if data[i] & 0xC0 != 0x80:
            return i
    return -1


def _decode(piece: bytes, path: Path, offset: int) -> str:
    """``piece`` as text; :class:`DataError` naming the file and byte of a NUL (binary) or of
    bytes that are not UTF-8."""
    nul = piece.find(b"\x00")
    if nul >= 0:
        raise DataError(
            f"{path}: a binary file, not text (a NUL byte at byte {offset + nul})"
        )
    try:
        return _as_text(piece.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise DataError(
            f"{path}: not UTF-8 text ({err.reason} at byte {offset + err.start})"
        ) from None


def _as_text(text: str) -> str:
    """``text`` with its CRLF line ends as LF."""
    return text.replace("\r\n", "\n") if "\r" in text else text
