"""The inputs of ``addnorm translate`` and ``addnorm embed``: their arguments, or standard
input read lazily as bytes, line by line, each line checked before the model sees it.

A line the model cannot take is refused on its own (an ``Input`` with a ``problem``): not
UTF-8, longer than the command's limit (at most ``4 * limit + 2`` bytes of it are read; the
rest is skipped unread, so a line of millions of characters costs no memory), or holding a
character outside the model's vocabulary (``translate``; ``embed``'s tokenizer takes any
text). A closed standard input is a usage error.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
from collections.abc import Iterable, Iterator
from typing import IO

from addnorm.cli.checks import UsageError

__all__ = ["Input", "batched", "open_stdin", "refusal", "stdin_inputs"]


@dataclasses.dataclass(frozen=True)
class Input:
    """One input of ``translate``: where it came from (``line 3``, ``argument 2``), its text,
    and why it is refused (None: it is translated)."""

    where: str
    text: str
    problem: str | None = None


def open_stdin(what: str = "dates") -> IO[bytes] | IO[str]:
    """Standard input as bytes (as text where it has no byte buffer, e.g. in tests); a closed
    or missing stdin (``addnorm translate <&-``) is a usage error naming ``what`` was
    expected."""
    stream = sys.stdin
    if stream is None or getattr(stream, "closed", False):
        raise UsageError(f"no {what} given and stdin is closed; pass {what} as arguments or lines")
    return getattr(stream, "buffer", stream)


def stdin_inputs(stream: IO[bytes] | IO[str], known: frozenset[str] | None, limit: int
                  ) -> Iterator[Input]:
    """The lines of ``stream`` without their line ends, read as they are needed, each at most
    ``limit`` characters: at most ``4 * limit + 2`` bytes of a line are read (a UTF-8
    character has at most 4), and the rest of a longer line is skipped in blocks, unread."""
    most = 4 * limit + 2
    for number in itertools.count(1):
        try:
            line = stream.readline(most)
        except ValueError:  # closed while we read it
            raise UsageError("stdin was closed while being read") from None
        if not line:
            return
        where = f"line {number}"
        if len(line) == most and not _ends_line(line):
            extra = _skip_rest_of_line(stream)
            yield Input(where, "", f"over {limit} characters ({len(line) + extra} bytes or "
                         f"more); {_takes_at_most(known, limit)}")
            continue
        if isinstance(line, bytes):
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as err:
                yield Input(where, "", f"not UTF-8 text ({err.reason} at byte {err.start})")
                continue
        else:
            text = line
        text = text.removesuffix("\n").removesuffix("\r")
        yield Input(where, text, refusal(text, known, limit))


def _ends_line(line: bytes | str) -> bool:
    return line.endswith(b"\n") if isinstance(line, bytes) else line.endswith("\n")


def _skip_rest_of_line(stream: IO[bytes] | IO[str]) -> int:
    """Read and drop the rest of the current line in 64 KiB blocks; how much was dropped."""
    skipped = 0
    while block := stream.readline(1 << 16):
        skipped += len(block)
        if _ends_line(block):
            break
    return skipped


def refusal(text: str, known: frozenset[str] | None, limit: int) -> str | None:
    """Why the model cannot take ``text`` (longer than ``limit``, a character outside its
    vocabulary ``known``, or with ``known`` None, text that is not UTF-8: an argument's
    undecodable bytes arrive as lone surrogates), or None. Blank text (spaces, tabs) gets a
    blank answer."""
    if not text.strip():
        return None
    if len(text) > limit:
        return f"{len(text)} characters; {_takes_at_most(known, limit)}"
    if known is None:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as err:
            return f"not UTF-8 text (undecodable byte at position {err.start + 1})"
        return None
    unknown = next((c for c in text if c not in known), None)
    if unknown is not None:
        return (
            f"the character {unknown!r} (U+{ord(unknown):04X}) at position "
            f"{text.index(unknown) + 1} is not one the model knows"
        )
    return None


def _takes_at_most(known: frozenset[str] | None, limit: int) -> str:
    if known is None:  # embed: no vocabulary of characters, a limit of its own
        return f"at most {limit} are taken"
    return f"the model takes at most {limit} (its max_len)"


def batched(items: Iterable[Input], size: int) -> Iterator[list[Input]]:
    """Consecutive lists of ``size`` items (the last may be shorter), taken lazily."""
    iterator = iter(items)
    while batch := list(itertools.islice(iterator, size)):
        yield batch
