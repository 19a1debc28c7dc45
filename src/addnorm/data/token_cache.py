"""The token cache: where a tokenized corpus is kept, its lock, and the checks an entry passes
before it is trusted.

An entry is a folder ``<root>/tokens/<key>`` (the key hashes the data's fingerprint, the
tokenizer and the split) holding ``tokens.bin`` (the ids) and ``meta.json`` (their dtype,
count, split, tokenizer, checksum), each written under a temporary name and renamed, while
the process holds the entry's lock (``<key>.lock`` beside it, a :class:`filelock.FileLock`:
``flock`` on POSIX, the system's lock elsewhere), so of two processes building one entry one
writes and the other waits, then reuses it.

- :func:`entry_lock`: hold an entry's lock; where the cache cannot be written (a read-only
  folder) it gives the error instead, and the caller may still use a complete entry (entries
  are published by rename, so none is ever seen half-written) but writes nothing.
- :func:`clean_stale`: under the lock no other process is writing the entry, so any temporary
  file in it is a dead process's (a kill -9 while tokenizing): removed.
- :func:`read_entry`: the ids and the metadata of an entry, checked: ``meta.json`` parses and
  names a known dtype, the dtype is the one its tokenizer's vocabulary takes, ``tokens.bin``
  holds as many ids as recorded, its CRC-32 is the recorded one (for token files up to
  ``CHECKSUM_BYTES``) and every id is within the vocabulary. A missing entry is None; one that
  fails a check raises :class:`DamagedEntry` saying which.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from addnorm.data.fingerprint import absolute_path
from addnorm.utils.files import parse_json

__all__ = [
    "CHECKSUM_BYTES",
    "FORMAT",
    "DamagedEntry",
    "cache_root",
    "checksum",
    "clean_stale",
    "entry_key",
    "entry_lock",
    "id_dtype",
    "read_entry",
]

# The entry layout (part of every key: entries of another layout are never opened).
# 2: meta.json holds the ids' CRC-32 and vocabulary size; CRLF line ends are read as LF.
FORMAT = 2
# Token files up to this size are checksummed when opened (larger ones: sizes and ids only).
CHECKSUM_BYTES = 2**30
# Temporary names in an entry (tokens.bin's and write_file_atomic's for meta.json).
_TEMPORARY = (".tokens.bin.tmp-", ".meta.json.tmp-")
_CHUNK = 2**22  # ids read at a time by the checks


class DamagedEntry(Exception):
    """A cache entry that fails its checks; the message says which."""


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """Where token files are kept: ``cache_dir``, else ``$ADDNORM_CACHE``, else
    ``$XDG_CACHE_HOME/addnorm``, else ``~/.cache/addnorm``."""
    if cache_dir:
        return Path(absolute_path(cache_dir))
    if os.environ.get("ADDNORM_CACHE"):
        return Path(absolute_path(os.environ["ADDNORM_CACHE"]))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(absolute_path(base)) / "addnorm"


def entry_key(spec: dict) -> str:
    """A cache key: the first 32 hex digits of the SHA-256 of ``spec`` as sorted JSON."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:32]


def id_dtype(vocab_size: int) -> np.dtype:
    """The dtype ids of a vocabulary are stored in: uint16 when they fit, else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


@contextlib.contextmanager
def entry_lock(lock_file: Path) -> Iterator[OSError | None]:
    """Hold the lock ``lock_file`` (made with its folders) and yield None; where the cache
    cannot be written (the folder or the lock cannot be made or opened), yield that error
    instead, holding nothing."""
    from filelock import FileLock

    try:
        lock_file.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(lock_file)
        lock.acquire()
    except OSError as err:
        yield err
        return
    try:
        yield None
    finally:
        lock.release()


def clean_stale(folder: Path, prefixes: tuple[str, ...] = _TEMPORARY) -> list[str]:
    """Remove the temporary files in ``folder`` whose names start with one of ``prefixes``
    (call it holding the entry's lock: they are then a dead process's); their names."""
    try:
        names = [e.name for e in os.scandir(folder) if e.name.startswith(prefixes)]
    except OSError:
        return []
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            (folder / name).unlink()
    return names


def checksum(path: Path) -> int:
    """The CRC-32 of ``path``'s bytes."""
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            crc = zlib.crc32(block, crc)
    return crc


def read_entry_meta(folder: Path) -> Any:
    """The parsed ``meta.json`` of a cache entry (the token cache's and the latent cache's),
    or None if it has none (never completed); :class:`DamagedEntry` if it cannot be read or
    parsed."""
    try:
        text = (folder / "meta.json").read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as err:
        raise DamagedEntry(f"meta.json cannot be read ({err})") from None
    try:
        return parse_json(text)
    except ValueError as err:
        raise DamagedEntry(f"meta.json is not an entry's ({err!r})") from None


def read_entry(folder: Path) -> tuple[np.memmap, dict[str, Any]] | None:
    """The ids (a read-only memmap) and ``meta.json`` of the entry ``folder``, checked as the
    module docstring says; None if it has no ``meta.json`` (never completed). Raises
    :class:`DamagedEntry` saying what is wrong."""
    token_path = folder / "tokens.bin"
    meta = read_entry_meta(folder)
    if meta is None:
        return None
    try:
        dtype, n_tokens = np.dtype(meta["dtype"]), int(meta["n_tokens"])
        n_train, vocab_size = int(meta["n_train"]), int(meta["vocab_size"])
        recorded_crc, fmt = meta["crc32"], meta["format"]
    except (ValueError, KeyError, TypeError) as err:
        raise DamagedEntry(f"meta.json is not an entry's ({err!r})") from None
    if fmt != FORMAT:
        raise DamagedEntry(f"meta.json has format {fmt!r}, not {FORMAT}")
    if dtype != id_dtype(vocab_size):
        raise DamagedEntry(f"meta.json names dtype {dtype}, but {vocab_size} ids are stored as "
                           f"{id_dtype(vocab_size)}")
    if not 0 <= n_train <= n_tokens:
        raise DamagedEntry(f"meta.json has {n_train} train ids of {n_tokens}")
    try:
        size = token_path.stat().st_size
    except OSError as err:
        raise DamagedEntry(f"tokens.bin cannot be read ({err.strerror or err})") from None
    if size != n_tokens * dtype.itemsize:
        raise DamagedEntry(f"tokens.bin has {size} bytes, not the {n_tokens} x "
                           f"{dtype.itemsize} recorded")
    if size <= CHECKSUM_BYTES and checksum(token_path) != recorded_crc:
        raise DamagedEntry("tokens.bin's CRC-32 is not the one recorded")
    tokens = np.memmap(token_path, dtype=dtype, mode="r", shape=(n_tokens,)) if n_tokens else (
        np.zeros(0, dtype=dtype)
    )
    for start in range(0, n_tokens, _CHUNK):
        largest = int(tokens[start : start + _CHUNK].max())
        if largest >= vocab_size:
            raise DamagedEntry(f"tokens.bin holds id {largest} at or past id {start}, outside "
                               f"the vocabulary of {vocab_size}")
    return tokens, meta  # type: ignore[return-value]
