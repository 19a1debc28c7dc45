"""A user's sentence-pair files, read and checked line by line.

A pairs file is TSV, ``source<TAB>target`` a line, or JSON Lines, ``{"source": ...,
"target": ...}`` a line (other keys ignored), told apart by the name: ``.jsonl``, ``.ndjson``
and ``.json`` are JSON Lines, anything else TSV. Lines are read as bytes, one at a time, and
an empty line is skipped (a CRLF line end is read as LF); any other line that is not a pair is
refused with one :class:`~addnorm.data.fingerprint.DataError` naming the file and line: not
UTF-8 (and the byte), a NUL byte (a binary file), no tab or more than one, an empty side, a
line that is not a JSON object, a missing or non-string ``source`` / ``target``, a lone
surrogate (a JSON escape of half a UTF-16 pair), a side longer than ``MAX_SIDE_CHARS``. A TSV
file's first line may be a header row (``header``, :mod:`addnorm.data.tsv_header`).
:class:`PairFiles` is one ``--data`` path's files (a file, folder or glob), fingerprinted, and
their pairs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from addnorm.data.fingerprint import (
    DataError,
    DataFingerprint,
    DataReadError,
    absolute_path,
    data_note,
    fingerprint_files,
    note_skipped_links,
    resolve_data_listing,
)
from addnorm.data.text_files import check_read_whole, opened_unchanged
from addnorm.data.tsv_header import HEADER_CHOICES, header_verdict
from addnorm.utils.checks import check_choice
from addnorm.utils.files import parse_json

__all__ = [
    "JSONL_SUFFIXES",
    "MAX_SIDE_CHARS",
    "Pair",
    "PairFiles",
    "pair_format",
    "parse_pair_line",
    "read_pairs",
]

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
# The longest side of a pair, in characters: a sentence or a few; a longer line is a file
# that is not pairs, and its attention would need far more memory than any other pair's.
MAX_SIDE_CHARS = 2**14


class Pair(NamedTuple):
    """A source text and its target text."""

    source: str
    target: str


def parse_pair_line(text: str, fmt: str) -> Pair:
    """One line (without its line end) of a ``"tsv"`` or ``"jsonl"`` file as a pair; a
    ValueError saying what is wrong otherwise (the caller adds the file and line)."""
    if fmt == "tsv":
        fields = text.split("\t")
        if len(fields) == 1:
            raise ValueError("no tab between source and target")
        if len(fields) > 2:
            raise ValueError(
                f"{len(fields) - 1} tabs; a line is source<TAB>target (a text holding a tab "
                "needs JSON Lines)"
            )
        source, target = fields
    else:
        try:
            value = parse_json(text)
        except ValueError as err:  # JSONDecodeError, or nested too deeply
            raise ValueError(f"not JSON ({err})") from None
        if not isinstance(value, dict):
            raise ValueError(f'a JSON object {{"source": ..., "target": ...}} is expected, got '
                             f"{type(value).__name__}")
        for key in ("source", "target"):
            if key not in value:
                raise ValueError(f"no {key!r} key")
            if not isinstance(value[key], str):
                raise ValueError(f"{key!r} must be a string, got {type(value[key]).__name__}")
        source, target = value["source"], value["target"]
    for side, part in (("source", source), ("target", target)):
        if not part.strip():
            raise ValueError(f"the {side} is empty")
        _check_unicode(side, part)
    return Pair(source, target)


def _check_unicode(side: str, text: str) -> None:
    """ValueError naming the first lone surrogate of ``text`` (a JSON escape such as
    ``"\\ud800"`` of half a UTF-16 pair: no character, and no UTF-8 encodes it)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(
            f"the {side} holds a lone surrogate U+{ord(text[err.start]):04X} at character "
            f"{err.start + 1} (a JSON escape of half a UTF-16 pair, which is no character); "
            "write the character itself, or both halves of its pair"
        ) from None


def pair_format(path: Path) -> str:
    """``"jsonl"`` for a JSON Lines name (``JSONL_SUFFIXES``), else ``"tsv"``."""
    return "jsonl" if path.suffix.lower() in JSONL_SUFFIXES else "tsv"


def read_pairs(path: Path, *, what: str = "data", expected_size: int | None = None,
               header: str = "auto") -> list[Pair]:
    """The pairs of one file, in file order (see the module docstring for the formats and
    what is refused; ``header``: what a TSV file's first line is, one of ``HEADER_CHOICES``).
    Raises :class:`DataError` naming ``what``, the file and the line, and
    :class:`DataReadError` if the file fails or changes while it is read."""
    check_choice("header", header, HEADER_CHOICES)
    fmt = pair_format(path)
    where = f"{what} {path}"
    pairs: list[Pair] = []
    first = fmt == "tsv"  # the first non-empty line of a TSV file may be a header
    with opened_unchanged(path, expected_size) as (f, before):
        offset = 0
        for number, raw in enumerate(_lines(f, path), 1):
            start, offset = offset, offset + len(raw)
            line = raw.rstrip(b"\n").rstrip(b"\r")
            if number == 1 and line.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte order mark
                line, start = line[3:], start + 3
            if not line:
                continue
            nul = line.find(b"\x00")
            if nul >= 0:
                raise DataError(f"{where}: line {number}: a NUL byte at byte {start + nul}; a "
                                "binary file, not text")
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as err:
                raise DataError(f"{where}: line {number}: not UTF-8 text ({err.reason} at byte "
                                f"{start + err.start})") from None
            if first:
                first = False
                if _is_header(text, header, f"{where}: line {number}"):
                    continue
            try:
                pair = parse_pair_line(text, fmt)
            except ValueError as err:
                raise DataError(f"{where}: line {number}: {err}") from None
            for side, part in zip(("source", "target"), pair, strict=True):
                if len(part) > MAX_SIDE_CHARS:
                    raise DataError(
                        f"{where}: line {number}: the {side} is {len(part)} characters long, "
                        f"more than the {MAX_SIDE_CHARS} a side may have (a pair is a "
                        "sentence or a few); split it or leave the line out"
                    )
            pairs.append(pair)
        check_read_whole(path, f, before, offset)
    return pairs


def _is_header(text: str, header: str, where: str) -> bool:
    """Whether a TSV file's first line is a header row to skip (:mod:`tsv_header`);
    :class:`DataError` with a hint when ``auto`` cannot tell."""
    if header != "auto":
        return header == "yes"
    fields = text.split("\t")
    verdict = header_verdict(fields)
    if verdict == "header":
        data_note(f"{where}: {fields[0]!r}, {fields[1]!r} is a header row, skipped "
                  "(--header no trains on it as a pair)")
        return True
    if verdict == "unclear":
        raise DataError(f"{where}: {fields[0]!r}, {fields[1]!r} may be a header row; say "
                        "which: --header yes skips it, --header no trains on it as a pair")
    return False


def _lines(f, path: Path) -> Iterator[bytes]:
    while True:
        try:
            line = f.readline()
        except OSError as err:
            raise DataReadError(f"{path}: reading failed ({err.strerror or err})") from None
        if not line:
            return
        yield line


@dataclass(frozen=True)
class PairFiles:
    """One path's files (a pairs file, or a folder or glob of them) and their fingerprint."""

    path: str
    root: Path
    files: list[Path]
    fingerprint: DataFingerprint
    skipped_links: tuple[str, ...] = ()

    @classmethod
    def of(cls, path: str | os.PathLike, what: str, follow_links: bool = False) -> PairFiles:
        """The files at ``path``, listed and fingerprinted; no bytes is a :class:`DataError`."""
        listing = resolve_data_listing(path, what=what, follow_links=follow_links)
        note_skipped_links(f"{what} {os.fspath(path)}", listing.skipped_links)
        fingerprint = fingerprint_files(listing.files, listing.root)
        if fingerprint.size == 0:
            raise DataError(f"{what} {os.fspath(path)}: is empty (0 bytes)")
        return cls(absolute_path(path), listing.root, listing.files, fingerprint,
                   listing.skipped_links)

    def read(self, what: str, header: str = "auto") -> list[Pair]:
        """Every file's pairs, in name order; :class:`DataReadError` if a file changed since
        it was fingerprinted or while it was read."""
        sizes = {e.name: e.size for e in self.fingerprint.files}
        pairs: list[Pair] = []
        for path in self.files:
            expected = sizes.get(path.relative_to(self.root).as_posix())
            pairs += read_pairs(path, what=what, expected_size=expected, header=header)
        if not pairs:
            raise DataError(f"{what} {self.path}: holds no pairs (only empty lines)")
        after = fingerprint_files(self.files, self.root)
        if after.digest != self.fingerprint.digest:
            changed = "; ".join(self.fingerprint.changes(after)[:3])
            raise DataReadError(f"{self.path}: changed while it was read ({changed})")
        return pairs
