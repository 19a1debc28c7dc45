"""A user's text as tokens on disk: tokenized once, in one streaming pass, into a memory-mapped
file, and read back as training windows in bounded memory.

:meth:`TokenCorpus.build` takes a path (a UTF-8 file, a folder of them or a glob; see
:func:`~addnorm.data.fingerprint.resolve_data_files`) and a tokenizer (``"char"``, ``"bpe"``,
a ``tokenizer.json`` file, or a tokenizer object) and returns the corpus:

- the files are fingerprinted (names, sizes, a content sample) and read in name order as
  one text, block by block (:mod:`addnorm.data.text_files`: not UTF-8, binary or changing
  files are refused naming the file and byte);
- the held-out split is the end of that text: from the first line start at or after byte
  ``(1 - val_fraction) * size`` (or that byte's character, in a last line without a line
  end); the record names the file and byte where it starts. It is cut in the text, so every
  tokenizer holds out the same characters and their bits per byte compare;
- ``"char"``: one id per character, ids in the order characters first appear (so one pass
  both builds the vocabulary and encodes); ``"bpe"``: a byte-level BPE trained by
  ``tokenizers`` on the train split (at most ``BPE_TRAIN_BYTES`` of it, evenly spaced
  blocks), then the text encoded with it; a ``tokenizer.json``: that file's tokenizer;
- the ids go to ``tokens.bin`` (uint16 when the vocabulary allows, else uint32) in a cache
  folder keyed by the fingerprint, the tokenizer and the split (``cache_root``: ``cache_dir``,
  else ``$ADDNORM_CACHE``, else ``$XDG_CACHE_HOME/addnorm`` or ``~/.cache/addnorm``), beside
  ``meta.json``; both are written under temporary names and renamed, under a file lock, so a
  second process (another rank of ``torchrun``) waits and then reuses them
  (:mod:`addnorm.data.token_cache`). A later build of the same files with the same settings
  opens them without tokenizing the text again, after checking the entry (an entry that fails
  is tokenized again, with one logged line saying why); a read-only cache holding the entry
  is used as it is.

:meth:`TokenCorpus.reopen` opens a recorded corpus again (a resumed run): the files must
fingerprint as recorded (:class:`~addnorm.data.fingerprint.DataChangedError` names what
changed), and the saved tokenizer encodes them (the cache is rebuilt if it is gone).

:class:`TextWindows` is a map-style ``torch.utils.data.Dataset`` of a corpus's windows, for a
``DataLoader``; the trainer's batch source, :class:`addnorm.data.batches.TextBatches`, draws
its items with a seeded sampler.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import random
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from addnorm.data.fingerprint import (
    DataChangedError,
    DataError,
    DataFingerprint,
    DataReadError,
    DataRecord,
    absolute_path,
    fingerprint_files,
    note_skipped_links,
    reopening,
    resolve_data_listing,
)
from addnorm.data.hf_tokenizer import (
    HFTokenizer,
    TextTokenizer,
    describe_tokenizer,
    token_byte_lengths,
    tokenizer_from_dict,
)
from addnorm.data.text_files import TextPiece, read_text_pieces
from addnorm.data.token_cache import (
    FORMAT,
    DamagedEntry,
    cache_root,
    clean_stale,
    entry_key,
    entry_lock,
    id_dtype,
    read_entry,
)
from addnorm.data.tokenizers import SPECIALS, CharTokenizer
from addnorm.utils.checks import check_choice, check_float, check_int
from addnorm.utils.files import write_file_atomic

__all__ = [
    "BPE_TRAIN_BYTES",
    "DEFAULT_BPE_VOCAB_SIZE",
    "TOKENIZER_KINDS",
    "TextWindows",
    "TokenCorpus",
    "cache_root",
    "check_val_fraction",
]

# The tokenizers a corpus can be built with by name (anything else names a tokenizer.json).
TOKENIZER_KINDS = ("char", "bpe")
DEFAULT_BPE_VOCAB_SIZE = 2048
# The most text a BPE is trained on: a larger train split gives evenly spaced blocks of it.
BPE_TRAIN_BYTES = 256 * 2**20
# The most distinct characters a character vocabulary holds (ids must fit uint16).
MAX_CHARS = 2**16 - len(SPECIALS)
_SPLITS = ("train", "val")
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Source:
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


class TokenCorpus:
    """A tokenized text: its ids in a memory-mapped file, the train / held-out boundary, its
    tokenizer and the record of the files it came from.

    Build one with :meth:`build` (or :meth:`reopen`); the constructor takes the parts.

    Args:
        tokens: the ids, train split first (a 1-d integer array, usually a ``np.memmap``).
        n_train: how many of them are the train split.
        tokenizer: the tokenizer that made them.
        record: the files, split and tokenizer (:class:`DataRecord`).
        token_file: the file ``tokens`` maps, if any.
    """

    def __init__(
        self,
        tokens: np.ndarray,
        n_train: int,
        tokenizer: TextTokenizer,
        record: DataRecord,
        token_file: Path | None = None,
    ) -> None:
        if tokens.ndim != 1:
            raise ValueError(f"tokens must be 1-d, got shape {tokens.shape}")
        check_int("n_train", n_train, min_value=0)
        if n_train > len(tokens):
            raise ValueError(f"n_train ({n_train}) must be <= the {len(tokens)} tokens")
        self.tokens, self.n_train = tokens, n_train
        self.tokenizer, self.record, self.token_file = tokenizer, record, token_file
        self._token_bytes: np.ndarray | None = None

    # ---------------------------------------------------------------- building and opening

    @classmethod
    def build(
        cls,
        path: str | os.PathLike,
        tokenizer: str | os.PathLike | TextTokenizer = "char",
        *,
        vocab_size: int | None = None,
        val_fraction: float = 0.05,
        cache_dir: str | os.PathLike | None = None,
        what: str = "data",
        follow_links: bool = False,
    ) -> TokenCorpus:
        """Tokenize the text at ``path`` (a file, folder or glob) with ``tokenizer``
        (``"char"``, ``"bpe"`` with ``vocab_size`` ids (default ``DEFAULT_BPE_VOCAB_SIZE``),
        a ``tokenizer.json`` path, or a tokenizer object), holding out the last
        ``val_fraction`` of it; or open the cached result of the same call. A folder's
        links leading outside it are read only with ``follow_links``. Raises
        :class:`DataError` for unusable text or settings (messages start with ``what`` and
        the path) and :class:`DataReadError` for a file that fails or changes while read."""
        check_val_fraction(val_fraction)
        source = _source(path, val_fraction, what, follow_links)
        tok: TextTokenizer | None
        if isinstance(tokenizer, (str, os.PathLike)) and os.fspath(tokenizer) in TOKENIZER_KINDS:
            kind = os.fspath(tokenizer)
            if kind == "char" and vocab_size is not None:
                raise DataError("vocab_size applies to the bpe tokenizer, not to char")
            tok = None if kind == "char" else _bpe_for(source, vocab_size, cache_dir)
        elif isinstance(tokenizer, (str, os.PathLike)):
            if vocab_size is not None:
                raise DataError("vocab_size applies to the bpe tokenizer, not to a file's")
            tok = HFTokenizer.from_file(tokenizer)
        else:
            tok = tokenizer
        return cls._open_or_tokenize(source, tok, cache_dir)

    @classmethod
    def reopen(
        cls,
        record: DataRecord,
        tokenizer: TextTokenizer,
        *,
        cache_dir: str | os.PathLike | None = None,
    ) -> TokenCorpus:
        """The corpus ``record`` describes, encoded by ``tokenizer`` (a run's saved one).
        Raises :class:`DataChangedError` naming what changed if the files no longer
        fingerprint as recorded (or are gone)."""
        with reopening(record):
            source = _source(record.path, float(record.split["val_fraction"]), "data",
                             bool(record.details.get("follow_links", False)))
        record.check_unchanged(source.fingerprint, files=source.files, root=source.root)
        corpus = cls._open_or_tokenize(source, tokenizer, cache_dir)
        if corpus.tokenizer.to_dict() != tokenizer.to_dict():
            raise DataChangedError(
                f"{record.path}: its characters differ from those the run's tokenizer holds"
            )
        return corpus

    @classmethod
    def _open_or_tokenize(
        cls, source: _Source, tokenizer: TextTokenizer | None, cache_dir
    ) -> TokenCorpus:
        spec = "char" if isinstance(tokenizer, CharTokenizer) or tokenizer is None else (
            hashlib.sha256(json.dumps(tokenizer.to_dict(), sort_keys=True).encode()).hexdigest()
        )
        key = entry_key({"tokens": FORMAT, "digest": source.fingerprint.digest,
                         "tokenizer": spec, "val_fraction": source.val_fraction})
        folder = cache_root(cache_dir) / "tokens" / key
        with entry_lock(folder.with_name(f"{key}.lock")) as unwritable:
            if unwritable is None:
                clean_stale(folder)
            corpus = cls._open_cached(folder, source, rebuild=unwritable is None)
            if corpus is None:
                if unwritable is not None:
                    raise _unwritable(folder.parent, unwritable)
                chars = tokenizer if isinstance(tokenizer, CharTokenizer) else None
                _tokenize(source, None if chars is not None else tokenizer, chars, folder)
                corpus = cls._open_cached(folder, source, rebuild=False)
        if corpus is None:  # pragma: no cover - written just above
            raise DataReadError(f"{folder}: the token file just written cannot be opened")
        return corpus

    @classmethod
    def _open_cached(cls, folder: Path, source: _Source, *, rebuild: bool
                     ) -> TokenCorpus | None:
        """The corpus cached in ``folder``, checked (:func:`read_entry`); None if it is
        missing, or damaged and ``rebuild`` (said in one logged line); a damaged entry that
        cannot be rebuilt is a :class:`DataReadError` naming it."""
        try:
            entry = read_entry(folder)
            if entry is None:
                return None
            tokens, meta = entry
            tokenizer = tokenizer_from_dict(meta["tokenizer"])
            if tokenizer.vocab_size != meta["vocab_size"]:
                raise DamagedEntry(f"its tokenizer has {tokenizer.vocab_size} ids, not the "
                                   f"{meta['vocab_size']} recorded")
            record = DataRecord(
                path=source.path,
                kind="text",
                fingerprint=source.fingerprint,
                split=dict(meta["split"]),
                tokenizer=describe_tokenizer(tokenizer),
                details={**meta["details"], "token_file": str(folder / "tokens.bin"),
                         **source.reading()},
            )
        except (DamagedEntry, DataError, KeyError, TypeError, ValueError) as err:
            if not rebuild:
                raise DataReadError(f"{folder}: the token cache entry is damaged ({err}) and "
                                    "cannot be written again here; remove it, or choose "
                                    "another folder with --cache-dir or $ADDNORM_CACHE"
                                    ) from None
            _log.warning("addnorm: the token cache entry %s failed its check (%s); "
                         "tokenizing the text again", folder, err)
            return None
        return cls(tokens, int(meta["n_train"]), tokenizer, record, folder / "tokens.bin")

    # ---------------------------------------------------------------- reading

    def ids(self, split: str) -> np.ndarray:
        """The ids of one split ("train" or "val"), in text order (a view of the file)."""
        check_choice("split", split, _SPLITS)
        return self.tokens[: self.n_train] if split == "train" else self.tokens[self.n_train :]

    def random_windows(self, rng: random.Random, batch_size: int, length: int) -> torch.Tensor:
        """A LongTensor (B, length + 1) of train windows at offsets drawn from ``rng`` (as
        :meth:`addnorm.data.text.TextCorpus.random_windows` draws them): columns
        0 .. length - 1 are the input, 1 .. length the next-token targets."""
        check_int("batch_size", batch_size, min_value=1)
        check_int("length", length, min_value=1)
        data = self.ids("train")
        if len(data) <= length + 1:
            raise ValueError(f"length ({length}) must be < the train split ({len(data)} tokens)")
        starts = [rng.randrange(len(data) - length - 1) for _ in range(batch_size)]
        windows = np.stack([data[s : s + length + 1] for s in starts]).astype(np.int64)
        return torch.from_numpy(windows)

    def eval_windows(self, split: str, length: int, *, max_windows: int | None = None
                     ) -> torch.Tensor:
        """Non-overlapping windows (N, length + 1) that tile ``split`` from its start (at most
        ``max_windows``); consecutive windows share one token."""
        check_int("length", length, min_value=1)
        data = self.ids(split)
        n = (len(data) - 1) // length
        if max_windows is not None:
            n = min(n, check_int("max_windows", max_windows, min_value=1))
        if n <= 0:
            raise ValueError(f"split {split!r} ({len(data)} tokens) is shorter than {length + 1}")
        windows = np.stack([data[i * length : i * length + length + 1] for i in range(n)])
        return torch.from_numpy(windows.astype(np.int64))

    def token_bytes(self) -> np.ndarray:
        """The UTF-8 bytes each id stands for (:func:`token_byte_lengths`)."""
        if self._token_bytes is None:
            self._token_bytes = token_byte_lengths(self.tokenizer)
        return self._token_bytes

    def __len__(self) -> int:
        return len(self.tokens)

    def __repr__(self) -> str:
        return (f"TokenCorpus({self.record.path!r}, tokens={len(self.tokens)}, "
                f"n_train={self.n_train}, tokenizer={self.tokenizer!r})")

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (a DataLoader worker) by its file, not its tokens."""
        state = dict(self.__dict__)
        if self.token_file is not None:
            state["tokens"] = (str(self.token_file), self.tokens.dtype.str, len(self.tokens))
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        if isinstance(state["tokens"], tuple):
            file, dtype, n = state["tokens"]
            state["tokens"] = np.memmap(file, dtype=np.dtype(dtype), mode="r", shape=(n,))
        self.__dict__.update(state)


class TextWindows(torch.utils.data.Dataset):
    """Every window of ``length + 1`` consecutive ids of a corpus's split, as a map-style
    dataset: item ``i`` is ``{"ids": (length,), "targets": (length,)}`` starting at id ``i``
    (the targets are the ids shifted by one). A ``DataLoader(..., shuffle=True)`` draws
    random windows; the trainer's :class:`~addnorm.data.batches.TextBatches` draws them with
    a :class:`~addnorm.data.sampler.SeededSampler`.

    Args:
        corpus: a :class:`TokenCorpus` (or the bundled :class:`~addnorm.data.text.TextCorpus`).
        length: ids per window (the model's context).
        split: "train" or "val".
    """

    def __init__(self, corpus, length: int, split: str = "train") -> None:
        self.corpus = corpus
        self.length = check_int("length", length, min_value=1)
        self.split = split
        self._n = len(corpus.ids(split)) - length
        if self._n <= 0:
            raise ValueError(
                f"length ({length}) must be < the {split} split ({len(corpus.ids(split))} ids)"
            )

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < self._n:
            raise IndexError(f"window {index} out of range 0 .. {self._n - 1}")
        window = np.asarray(self.corpus.ids(self.split)[index : index + self.length + 1])
        ids = torch.from_numpy(window.astype(np.int64))  # (length + 1,)
        return {"ids": ids[:-1], "targets": ids[1:]}


# -------------------------------------------------------------------- the one pass


def check_val_fraction(value: object) -> float:
    """``value`` as a float in (0, 0.5]: a held-out part of the text, smaller than the rest."""
    value = check_float("val_fraction", value, min_value=0.0, min_inclusive=False,
                        max_value=0.5)
    return value


def _source(path: str | os.PathLike, val_fraction: float, what: str,
            follow_links: bool = False) -> _Source:
    listing = resolve_data_listing(path, what=what, follow_links=follow_links)
    where = f"{what} {os.fspath(path)}"
    note_skipped_links(where, listing.skipped_links)
    fingerprint = fingerprint_files(listing.files, listing.root)
    if fingerprint.size == 0:
        raise DataError(f"{where}: is empty (0 bytes of text)")
    source = _Source(absolute_path(path), listing.root, listing.files, fingerprint,
                     val_fraction, follow_links, listing.skipped_links)
    if source.val_start >= fingerprint.size:
        raise DataError(
            f"{where}: {fingerprint.size} bytes leave no held-out text at val_fraction "
            f"{val_fraction}"
        )
    return source


def _unwritable(folder: Path, err: OSError) -> DataReadError:
    return DataReadError(
        f"{folder}: the token cache cannot be written ({err.strerror or err}); choose another "
        "folder with --cache-dir or $ADDNORM_CACHE"
    )


def _pieces(source: _Source, *, desc: str, stop_at_val: bool = False
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


def _bpe_for(source: _Source, vocab_size: int | None, cache_dir) -> HFTokenizer:
    """The byte-level BPE of ``vocab_size`` ids trained on ``source``'s train split (or the
    cached one from an earlier build of the same files)."""
    from addnorm.data.hf_tokenizer import MAX_VOCAB_SIZE, MIN_BPE_VOCAB_SIZE

    vocab_size = DEFAULT_BPE_VOCAB_SIZE if vocab_size is None else vocab_size
    check_int("vocab_size", vocab_size, min_value=1)
    if not MIN_BPE_VOCAB_SIZE <= vocab_size <= MAX_VOCAB_SIZE:
        raise DataError(
            f"vocab_size {vocab_size}: a byte-level BPE needs {MIN_BPE_VOCAB_SIZE} to "
            f"{MAX_VOCAB_SIZE} ids (256 bytes and {MIN_BPE_VOCAB_SIZE - 256} special tokens "
            "at least)"
        )
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
            raise _unwritable(path.parent, unwritable)
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


def _tokenize(
    source: _Source,
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
