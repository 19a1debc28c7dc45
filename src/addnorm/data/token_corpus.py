"""A user's text as tokens on disk: tokenized once, in one streaming pass, into a memory-mapped
file, and read back as training windows in bounded memory.

:meth:`TokenCorpus.build` takes a path (a UTF-8 file, a folder of them or a glob; see
:func:`~addnorm.data.fingerprint.resolve_data_files`) and a tokenizer (``"char"``, ``"bpe"``,
a ``tokenizer.json`` file, or a tokenizer object) and returns the corpus. The files are
fingerprinted (names, sizes, a content sample) and tokenized by
:func:`~addnorm.data.tokenize_pass.tokenize_text` (the held-out split, the vocabulary, the
token file) into a cache folder keyed by the fingerprint, the tokenizer and the split
(``cache_root``: ``cache_dir``, else ``$ADDNORM_CACHE``, else ``$XDG_CACHE_HOME/addnorm`` or
``~/.cache/addnorm``), under a file lock, so a second process (another rank of ``torchrun``)
waits and then reuses the entry (:mod:`addnorm.data.token_cache`). A later build of the same
files with the same settings opens the entry without tokenizing the text again, after
checking it (an entry that fails is tokenized again, with one logged line saying why); a
read-only cache holding the entry is used as it is.

:meth:`TokenCorpus.reopen` opens a recorded corpus again (a resumed run): the files must
fingerprint as recorded (:class:`~addnorm.data.fingerprint.DataChangedError` names what
changed), and the saved tokenizer encodes them (the cache is rebuilt if it is gone).

:class:`TextWindows` is a map-style ``torch.utils.data.Dataset`` of a corpus's windows, for a
``DataLoader``; the trainer's batch source, :class:`addnorm.data.batches.TextBatches`, draws
its items with a seeded sampler.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from addnorm.data.fingerprint import (
    DataChangedError,
    DataError,
    DataReadError,
    DataRecord,
    reopening,
)
from addnorm.data.hf_tokenizer import (
    DEFAULT_BPE_VOCAB_SIZE,
    HFTokenizer,
    TextTokenizer,
    describe_tokenizer,
    token_byte_lengths,
    tokenizer_from_dict,
)
from addnorm.data.token_cache import (
    FORMAT,
    DamagedEntry,
    cache_root,
    clean_stale,
    entry_key,
    entry_lock,
    read_entry,
)
from addnorm.data.tokenize_pass import (
    BPE_TRAIN_BYTES,
    TextSource,
    bpe_for,
    text_source,
    tokenize_text,
    unwritable_cache,
)
from addnorm.data.tokenizers import CharTokenizer
from addnorm.utils.checks import check_choice, check_float, check_int

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
_SPLITS = ("train", "val")
_log = logging.getLogger(__name__)


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
        source = text_source(path, val_fraction, what, follow_links)
        tok: TextTokenizer | None
        if isinstance(tokenizer, (str, os.PathLike)) and os.fspath(tokenizer) in TOKENIZER_KINDS:
            kind = os.fspath(tokenizer)
            if kind == "char" and vocab_size is not None:
                raise DataError("vocab_size applies to the bpe tokenizer, not to char")
            tok = None if kind == "char" else bpe_for(source, vocab_size, cache_dir)
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
            source = text_source(record.path, float(record.split["val_fraction"]), "data",
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
        cls, source: TextSource, tokenizer: TextTokenizer | None, cache_dir
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
                    raise unwritable_cache(folder.parent, unwritable)
                chars = tokenizer if isinstance(tokenizer, CharTokenizer) else None
                tokenize_text(source, None if chars is not None else tokenizer, chars, folder)
                corpus = cls._open_cached(folder, source, rebuild=False)
        if corpus is None:  # pragma: no cover - written just above
            raise DataReadError(f"{folder}: the token file just written cannot be opened")
        return corpus

    @classmethod
    def _open_cached(cls, folder: Path, source: TextSource, *, rebuild: bool
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


def check_val_fraction(value: object) -> float:
    """``value`` as a float in (0, 0.5]: a held-out part of the text, smaller than the rest."""
    return check_float("val_fraction", value, min_value=0.0, min_inclusive=False, max_value=0.5)
