"""The one streaming pass that tokenizes a user's text into a token cache entry.

- the files are read in name order as one text, block by block
  (:mod:`addnorm.data.text_files`: not UTF-8, binary or changing files are refused naming the
  file and byte), and fingerprinted again afterwards: a file that changed while it was read is
  a :class:`DataReadError`;
- the held-out split is the end of that text: from the first line start at or after byte
  ``(1 - val_fraction) * size`` (or that byte's character, in a last line without a line
  end); the record names the file and byte where it starts. It is cut in the text, so every
  tokenizer holds out the same characters and their bits per byte compare;
- ``"char"``: one id per character, ids in the order characters first appear (so one pass
  both builds the vocabulary and encodes); ``"bpe"``: a byte-level BPE trained by
  ``tokenizers`` on the train split (at most ``BPE_TRAIN_BYTES`` of it, evenly spaced
  blocks), then the text encoded with it; any other tokenizer encodes the text line by line;
- the ids go to ``tokens.bin`` (uint16 when the vocabulary allows, else uint32) beside
  ``meta.json`` (counts, split, tokenizer, CRC-32, byte entropies), in the entry folder
  :class:`~addnorm.data.token_corpus.TokenCorpus` holds the lock of
  (:mod:`addnorm.data.token_cache`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from addnorm.data.fingerprint import (
    DataChangedError,
    DataError,
    DataFingerprint,
    DataReadError,
    absolute_path,
    fingerprint_files,
    note_skipped_links,
    resolve_data_listing,
)
from addnorm.data.hf_tokenizer import (
    DEFAULT_BPE_VOCAB_SIZE,
    HFTokenizer,
    TextTokenizer,
    check_bpe_vocab_size,
)
from addnorm.data.text_files import TextPiece, read_text_pieces
from addnorm.data.token_cache import (
    FORMAT,
    cache_root,
    clean_stale,
    entry_key,
    entry_lock,
    id_dtype,
)
from addnorm.data.tokenizers import SPECIALS, CharTokenizer
from addnorm.utils.files import write_file_atomic

__all__ = [
    "BPE_TRAIN_BYTES",
    "DEFAULT_BPE_VOCAB_SIZE",
    "MAX_CHARS",
    "TextSource",
    "bpe_for",
    "text_source",
    "tokenize_text",
    "unwritable_cache",
]

# The most text a BPE is trained on: a larger train split gives evenly spaced blocks of it.
BPE_TRAIN_BYTES = 256 * 2**20
# The most distinct characters a character vocabulary holds (ids must fit uint16).
MAX_CHARS = 2**16 - len(SPECIALS)
_SPLITS = ("train", "val")


@dataclass(frozen=True)
class TextSource:
    """The files of a corpus and where its held-out split starts."""

    path: str
    root: Path
    files: list[Path]
    fingerprint: DataFingerprint
    val_fraction: float
    follow_links: bool = False
    skipped_links: tuple[str, ...] = ()

    def reading(self) -> dict[str, Any]:
        """How the files were listed, where it is not the default (a resumed run lists them
        the same way), and the links left out: for the record's details."""
        out: dict[str, Any] = {"follow_links": True} if self.follow_links else {}
        if self.skipped_links:
            out["links_skipped"] = list(self.skipped_links)
        return out

    def name(self, index: int) -> str:
        """File ``index``'s name relative to the root (as the fingerprint names it)."""
        return self.files[index].relative_to(self.root).as_posix()

    @property
    def val_start(self) -> int:
        """The byte of the joined text from which the held-out split starts (then moved to
        the next line start)."""
        return math.floor(self.fingerprint.size * (1 - self.val_fraction))


def text_source(path: str | os.PathLike, val_fraction: float, what: str,
                follow_links: bool = False) -> TextSource:
    """The files at ``path`` listed and fingerprinted; empty text, or text too short to hold
    anything out, is a :class:`DataError` starting with ``what`` and the path."""
    listing = resolve_data_listing(path, what=what, follow_links=follow_links)
    where = f"{what} {os.fspath(path)}"
    note_skipped_links(where, listing.skipped_links)
    fingerprint = fingerprint_files(listing.files, listing.root)
    if fingerprint.size == 0:
        raise DataError(f"{where}: is empty (0 bytes of text)")
    source = TextSource(absolute_path(path), listing.root, listing.files, fingerprint,
                        val_fraction, follow_links, listing.skipped_links)
    if source.val_start >= fingerprint.size:
        raise DataError(
            f"{where}: {fingerprint.size} bytes leave no held-out text at val_fraction "
            f"{val_fraction}"
        )
    return source


def unwritable_cache(folder: Path, err: OSError) -> DataReadError:
    """The error of a cache folder that cannot be written, naming it and what to do."""
    return DataReadError(
        f"{folder}: the token cache cannot be written ({err.strerror or err}); choose another "
        "folder with --cache-dir or $ADDNORM_CACHE"
    )


def _pieces(source: TextSource, *, desc: str, stop_at_val: bool = False
            ) -> Iterator[tuple[str, TextPiece]]:
    """``("train" | "val", piece)`` over the text, the piece holding the split's start cut
    in two there; with ``stop_at_val``, only the train pieces. A progress bar on stderr
    counts the bytes (shown on a terminal only)."""
    from tqdm import tqdm

    listed = {e.name: e.size for e in source.fingerprint.files}
    sizes = [listed[source.name(i)] if listed else p.stat().st_size
             for i, p in enumerate(source.files)]
    starts = np.cumsum([0, *sizes])
    val_start, in_val = source.val_start, False
    with tqdm(total=source.fingerprint.size, unit="B", unit_scale=True, desc=desc,
              disable=None, file=sys.stderr, leave=False) as bar:
        for piece in read_text_pieces(source.files, sizes=sizes):
            bar.update(len(piece.data))
            if in_val:
                yield "val", piece
                continue
            begin = int(starts[piece.index]) + piece.offset
            end = begin + len(piece.data)
            if end <= val_start:
                yield "train", piece
                continue
            cut = _split_at(piece.data, val_start - begin)
            if cut > 0:
                yield "train", piece.part(0, cut)
            if stop_at_val:
                return
            in_val = True
            if cut < len(piece.data):
                yield "val", piece.part(cut, len(piece.data))


def _split_at(data: bytes, at: int) -> int:
    """The first line start at or after index ``at`` of ``data`` (a piece's end is one), or,
    in a last line without a line end, the first character start at or after ``at``."""
    if at <= 0:
        return 0
    newline = data.find(b"\n", at - 1)
    if newline >= 0:
        return newline + 1
    while at < len(data) and data[at] & 0xC0 == 0x80:
        at += 1
    return at


def bpe_for(source: TextSource, vocab_size: int | None, cache_dir) -> HFTokenizer:
    """The byte-level BPE of ``vocab_size`` ids trained on ``source``'s train split (or the
    cached one from an earlier build of the same files)."""
    vocab_size = check_bpe_vocab_size(vocab_size)
    key = entry_key({"bpe": FORMAT, "digest": source.fingerprint.digest,
                     "vocab_size": vocab_size, "val_fraction": source.val_fraction,
                     "train_bytes": BPE_TRAIN_BYTES})
    path = cache_root(cache_dir) / "bpe" / f"{key}.json"
    with entry_lock(path.with_suffix(".lock")) as unwritable:
        if unwritable is None:
            clean_stale(path.parent, (f".{path.name}.tmp-",))
        if path.is_file():
            with contextlib.suppress(DataError, OSError):
                return HFTokenizer.from_json(path.read_text(encoding="utf-8"), source="bpe")
        if unwritable is not None:
            raise unwritable_cache(path.parent, unwritable)
        train_bytes = source.val_start
        every = max(1, math.ceil(train_bytes / BPE_TRAIN_BYTES))
        texts = (
            piece.text
            for i, (_, piece) in enumerate(_pieces(source, desc="training BPE", stop_at_val=True))
            if i % every == 0
        )
        tokenizer = HFTokenizer.train_bpe(texts, vocab_size)
        text = tokenizer.to_json()
        write_file_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
    return tokenizer


class _CharEncoder:
    """Characters to ids through a table indexed by code point; new characters get the next
    ids (in the order they first appear) unless the vocabulary is fixed."""

    def __init__(self, fixed: CharTokenizer | None) -> None:
        self.table = np.full(0x110000, -1, dtype=np.int32)
        self.chars: list[str] = []
        self.fixed = fixed is not None
        for c in fixed.chars if fixed is not None else ():
            self._add(c)

    def _add(self, c: str) -> None:
        self.table[ord(c)] = len(SPECIALS) + len(self.chars)
        self.chars.append(c)

    def encode(self, text: str, where: str) -> np.ndarray:
        points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        ids = self.table[points]
        if (ids < 0).any():
            new, first = np.unique(points[ids < 0], return_index=True)
            if self.fixed:
                raise DataChangedError(
                    f"{where}: holds the character {chr(int(new[0]))!r}, which the run's "
                    "tokenizer does not"
                )
            if len(self.chars) + len(new) > MAX_CHARS:
                raise DataError(
                    f"{where}: more than {MAX_CHARS} distinct characters; use --tokenizer bpe"
                )
            for point in new[np.argsort(first, kind="stable")]:
                self._add(chr(int(point)))
            ids = self.table[points]
        return ids.astype(np.uint16)

    def tokenizer(self) -> CharTokenizer:
        return CharTokenizer(self.chars)


def tokenize_text(
    source: TextSource,
    tokenizer: TextTokenizer | None,
    chars: CharTokenizer | None,
    folder: Path,
) -> None:
    """The one pass: encode ``source`` (with ``tokenizer``, or characters: ``chars``' fixed
    vocabulary or one built on the way) into ``folder``/tokens.bin and meta.json."""
    encoder = _CharEncoder(chars) if tokenizer is None else None
    dtype = id_dtype(2**16 if tokenizer is None else tokenizer.vocab_size)
    crc = 0
    counts = {"train": 0, "val": 0}
    byte_counts = {s: np.zeros(256, dtype=np.int64) for s in _SPLITS}
    val_chars, val_from, crlf = 0, None, 0
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".tokens.bin.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as out:
            for split, piece in _pieces(source, desc="tokenizing"):
                if split == "val" and val_from is None:
                    val_from = {"file": source.name(piece.index), "byte": piece.offset}
                if encoder is not None:
                    ids = encoder.encode(piece.text, str(source.files[piece.index]))
                else:
                    assert tokenizer is not None
                    ids = _encode_lines(tokenizer, piece.text, dtype)
                data = ids.tobytes()
                out.write(data)
                crc = zlib.crc32(data, crc)
                counts[split] += len(ids)
                byte_counts[split] += np.bincount(  # the text's bytes: CRLF read as LF
                    np.frombuffer(piece.text_bytes, dtype=np.uint8), minlength=256)
                crlf += len(piece.data) - len(piece.text_bytes)
                if split == "val":
                    val_chars += len(piece.text)
            out.flush()
            os.fsync(out.fileno())
        after = fingerprint_files(source.files, source.root)
        if after.digest != source.fingerprint.digest:
            changed = "; ".join(source.fingerprint.changes(after)[:3])
            raise DataReadError(f"{source.path}: changed while it was read ({changed})")
        if min(counts.values()) < 2:
            raise DataError(
                f"data {source.path}: too short to split: {counts['train']} tokens to train "
                f"on and {counts['val']} held out at val_fraction {source.val_fraction}; add "
                "text or change val_fraction"
            )
        final = encoder.tokenizer() if encoder is not None else tokenizer
        assert final is not None
        split_info = {
            "val_fraction": source.val_fraction,
            "rule": "the held-out text starts at the first line start at or after "
                    f"byte {source.val_start} of the files joined in name order",
            "val_from": val_from,
            "train_tokens": counts["train"],
            "val_tokens": counts["val"],
            "train_bytes": int(byte_counts["train"].sum()),
            "val_bytes": int(byte_counts["val"].sum()),
            "val_chars": val_chars,
        }
        meta = {
            "format": FORMAT,
            "dtype": dtype.name,
            "n_tokens": counts["train"] + counts["val"],
            "n_train": counts["train"],
            "vocab_size": final.vocab_size,
            "crc32": crc,
            "split": split_info,
            "tokenizer": final.to_dict(),
            "details": {
                "byte_entropy": _entropy(byte_counts["train"] + byte_counts["val"]),
                "val_byte_entropy": _entropy(byte_counts["val"]),
                **({"crlf_line_ends_read_as_lf": crlf} if crlf else {}),
            },
        }
        os.replace(tmp, folder / "tokens.bin")
        text = json.dumps(meta)
        write_file_atomic(folder / "meta.json", lambda t: t.write_text(text, encoding="utf-8"))
    finally:
        tmp.unlink(missing_ok=True)


def _encode_lines(tokenizer: TextTokenizer, text: str, dtype: np.dtype) -> np.ndarray:
    """``text``'s ids, its lines encoded in parallel (``HFTokenizer.encode_many``)."""
    if isinstance(tokenizer, HFTokenizer):
        rows = tokenizer.encode_many(text.splitlines(keepends=True))
        return np.fromiter((i for row in rows for i in row), dtype=dtype)
    return np.asarray(tokenizer.encode(text), dtype=dtype)


def _entropy(counts: np.ndarray) -> float:
    """The order-0 entropy (bits per byte) of a byte histogram: -sum p log2 p."""
    total = counts.sum()
    if total == 0:
        return 0.0
    p = counts[counts > 0] / total
    return float(-(p * np.log2(p)).sum())
