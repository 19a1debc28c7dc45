"""What a run remembers of a user's data.

A run trained on a user's files (``addnorm train lm --data PATH`` and the others) records
them in a :class:`DataRecord`: the path, how many files and bytes, a fingerprint, the
held-out split and the tokenizer. It is saved with the task in every checkpoint (and as the
run's ``data.json``), shown by ``addnorm info``, and checked again before a run resumes: a
resumed run whose files changed is refused, naming what changed (:class:`DataChangedError`).

- :func:`fingerprint_files`: a :class:`DataFingerprint` of a data set's files (as
  :func:`~addnorm.data.listing.resolve_data_files` lists them): their names relative to the
  path, their sizes and a SHA-256 of each file's content, read whole: every byte, so any
  edit changes it. Files are hashed whole, smallest first, while their bytes fit
  ``HASH_BUDGET`` (1 GiB: a few seconds of hashing at most); a file past it is hashed from
  ``SAMPLE_BLOCKS`` evenly spaced blocks and known besides by its modification time and its
  inode (a ``stamp``), so that an edit of it in place is seen too. A copy of the same files
  has the same fingerprint when they fit the budget (a large file's stamp differs in a copy).
- :class:`DataFingerprint` ``.changes(other)``: what differs, in words, file by file.

The fingerprint is versioned (``fingerprint_version`` in the JSON). Records written before
version 2 (no such key) sampled at most 64 KiB of each file; they still read back, and a run
resumed from one is checked by the rule it was made with (:meth:`DataRecord.check_unchanged`
with the files: names, sizes and that sample), so an older run resumes as it did; its record
is kept as it was.

What bad data raises (:mod:`addnorm.data.data_errors`) and how a path is listed
(:mod:`addnorm.data.listing`) are importable from here too, where every data module has long
found them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from addnorm.data.data_errors import DataChangedError, DataError, DataReadError, data_note
from addnorm.data.listing import (
    DataListing,
    absolute_path,
    is_glob,
    note_skipped_links,
    relative_name,
    resolve_data_files,
    resolve_data_listing,
)

__all__ = [
    "MAX_LISTED_FILES",
    "SAMPLE_BYTES",
    "DataChangedError",
    "DataError",
    "DataFingerprint",
    "DataListing",
    "DataReadError",
    "DataRecord",
    "FINGERPRINT_VERSION",
    "FileEntry",
    "HASH_BUDGET",
    "absolute_path",
    "data_note",
    "fingerprint_files",
    "is_glob",
    "note_skipped_links",
    "reopening",
    "resolve_data_files",
    "resolve_data_listing",
]

# The fingerprint's rule: 2 hashes files whole up to HASH_BUDGET; 1 (records without a
# version) sampled at most MAX_FILE_SAMPLE of each file.
FINGERPRINT_VERSION = 2
# Bytes of a data set hashed whole (smallest files first); a file past it is sampled and
# stamped (modification time and inode).
HASH_BUDGET = 2**30
# Version 1: bytes read to fingerprint a whole data set, spread over its files (each file gets
# at least MIN_FILE_SAMPLE and at most MAX_FILE_SAMPLE; a file no larger is read whole).
# Version 2 samples a file past the budget with MAX_FILE_SAMPLE bytes.
SAMPLE_BYTES = 16 * 2**20
MIN_FILE_SAMPLE = 1024
MAX_FILE_SAMPLE = 64 * 2**10
# Blocks a file's sample is cut into, spread evenly from its first byte to its last.
SAMPLE_BLOCKS = 16
_READ_BYTES = 2**20  # a whole file is hashed this much at a time
# Files listed one by one in a record (so a change names the file); a larger data set keeps
# only its totals and digest.
MAX_LISTED_FILES = 1000
# Changes named in a DataChangedError message (the rest are counted).
_SHOWN_CHANGES = 3


@dataclass(frozen=True)
class FileEntry:
    """One file of a data set: its name relative to the data's root (with "/"), its size in
    bytes, the hash (hex) of its content (whole, or its sample), and for a sampled file of
    version 2 its ``stamp``: (modification time in ns, inode)."""

    name: str
    size: int
    sample: str
    stamp: tuple[int, int] | None = None

    def to_list(self) -> list:
        return [self.name, self.size, self.sample, *(self.stamp or ())]

    @classmethod
    def from_list(cls, item: Sequence[Any]) -> FileEntry:
        name, size, sample, *stamp = item
        if stamp and len(stamp) != 2:
            raise ValueError(f"a file's stamp is (mtime_ns, inode), got {stamp!r}")
        return cls(str(name), int(size), str(sample),
                   (int(stamp[0]), int(stamp[1])) if stamp else None)


@dataclass(frozen=True)
class DataFingerprint:
    """A data set's files, summed up without reading them in full.

    Attributes:
        n_files: how many files.
        size: their bytes in all.
        digest: SHA-256 (hex) of every file's name, size, hash and stamp, in name order.
        files: the files one by one (empty when there are more than ``MAX_LISTED_FILES``).
        version: the rule it was made by (``FINGERPRINT_VERSION``; 1: sampled).
    """

    n_files: int
    size: int
    digest: str
    files: tuple[FileEntry, ...] = ()
    version: int = FINGERPRINT_VERSION

    def changes(self, now: DataFingerprint) -> list[str]:
        """What differs from this fingerprint in ``now``, in words ("a.txt: 1200 -> 1300
        bytes", "b.txt: removed", "c.txt: content changed, same size"); [] if nothing."""
        if self.digest == now.digest:
            return []
        if not self.files or not now.files:
            return [
                f"{self.n_files} files of {self.size} bytes -> {now.n_files} files of "
                f"{now.size} bytes" if (self.n_files, self.size) != (now.n_files, now.size)
                else f"the content of its {self.n_files} files changed (same names and sizes)"
            ]
        before = {f.name: f for f in self.files}
        after = {f.name: f for f in now.files}
        out = [f"{name}: removed" for name in sorted(before.keys() - after.keys())]
        out += [f"{name}: added" for name in sorted(after.keys() - before.keys())]
        for name in sorted(before.keys() & after.keys()):
            old, new = before[name], after[name]
            if old.size != new.size:
                out.append(f"{name}: {old.size} -> {new.size} bytes")
            elif old.sample != new.sample:
                out.append(f"{name}: content changed, same size")
            elif old.stamp != new.stamp:
                out.append(f"{name}: modified or replaced, same size (a file past the "
                           "hashing budget is known by its size, time and inode)")
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON: the version, the totals, the digest and (when listed) each file's name, size,
        hash and stamp."""
        return {
            "fingerprint_version": self.version,
            "n_files": self.n_files,
            "size": self.size,
            "digest": self.digest,
            "files": [f.to_list() for f in self.files] or None,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DataFingerprint:
        """Read back ``to_dict``'s JSON (a record without ``fingerprint_version`` is of
        version 1); ValueError if it is not one."""
        try:
            files = tuple(FileEntry.from_list(item) for item in data["files"] or ())
            version = int(data.get("fingerprint_version", 1))
            if version not in (1, FINGERPRINT_VERSION):
                raise ValueError(f"fingerprint_version {version} is not 1 or "
                                 f"{FINGERPRINT_VERSION} (a newer addnorm's record?)")
            return cls(int(data["n_files"]), int(data["size"]), str(data["digest"]), files,
                       version)
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"not a data fingerprint: {err!r}") from None


@dataclass(frozen=True)
class DataRecord:
    """What a run remembers of the data it trained on.

    Attributes:
        path: the data's path as the run named it, made absolute (a glob stays a glob).
        kind: what the files hold and how they were read ("text", "pairs", "images", ...).
        fingerprint: the files (:class:`DataFingerprint`).
        split: how the held-out part was chosen and the size of each part (JSON).
        tokenizer: the tokenizer(s) the text was encoded with (JSON), or None.
        details: anything else worth showing (JSON): classes, entropy, ...
    """

    path: str
    kind: str
    fingerprint: DataFingerprint
    split: dict[str, Any] = field(default_factory=dict)
    tokenizer: dict[str, Any] | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def check_unchanged(
        self, now: DataFingerprint, *, files: Sequence[Path] = (), root: Path | None = None
    ) -> None:
        """Raise :class:`DataChangedError` naming what differs if ``now`` (the same path
        fingerprinted again) is not the recorded fingerprint. A record of another version
        (an older run's) is compared with ``files`` below ``root`` fingerprinted by its own
        rule (ValueError if they are not given)."""
        if now.version != self.fingerprint.version:
            if root is None:
                raise ValueError(f"a version {self.fingerprint.version} fingerprint is "
                                 "checked against the files themselves: pass files and root")
            now = fingerprint_files(files, root, version=self.fingerprint.version)
        changes = self.fingerprint.changes(now)
        if not changes:
            return
        shown = "; ".join(changes[:_SHOWN_CHANGES])
        more = len(changes) - _SHOWN_CHANGES
        if more > 0:
            shown += f"; and {more} more"
        raise DataChangedError(
            f"{self.path}: changed since the run recorded it ({shown}); a resumed run must "
            "train on the same files: restore them, or start a new run"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON for a checkpoint, ``data.json`` and ``addnorm info``."""
        return {
            "path": self.path,
            "kind": self.kind,
            **self.fingerprint.to_dict(),
            "split": self.split,
            "tokenizer": self.tokenizer,
            **({"details": self.details} if self.details else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DataRecord:
        """Read back ``to_dict``'s JSON; ValueError if it is not one."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a data record must be a JSON object, got {type(data).__name__}")
        try:
            return cls(
                path=str(data["path"]),
                kind=str(data["kind"]),
                fingerprint=DataFingerprint.from_dict(data),
                split=dict(data.get("split") or {}),
                tokenizer=data.get("tokenizer"),
                details=dict(data.get("details") or {}),
            )
        except (KeyError, TypeError) as err:
            raise ValueError(f"not a data record: {err!r}") from None

    def replace(self, **changes: Any) -> DataRecord:
        """A copy with ``changes`` (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)


def fingerprint_files(
    files: Sequence[Path], root: Path, *, version: int = FINGERPRINT_VERSION
) -> DataFingerprint:
    """The fingerprint of ``files`` (named relative to ``root``) by the rule of ``version``
    (see the module docstring): sizes and stamps from ``fstat``, contents hashed whole up to
    ``HASH_BUDGET`` (version 1: a sample of at most ``SAMPLE_BYTES`` spread over the files).
    Raises :class:`DataReadError` naming a file that cannot be read."""
    sizes = []
    for path in files:
        try:
            sizes.append(path.stat().st_size)
        except OSError as err:
            raise DataReadError(f"{path}: cannot be read ({err.strerror or err})") from None
    whole = _hashed_whole(sizes) if version != 1 else set()
    budget = SAMPLE_BYTES // max(len(files), 1)
    per_file = max(MIN_FILE_SAMPLE, min(MAX_FILE_SAMPLE, budget)) if version == 1 else (
        MAX_FILE_SAMPLE
    )
    entries = []
    for i, path in enumerate(files):
        name = relative_name(path, root)
        try:
            with open(path, "rb") as f:
                info = os.fstat(f.fileno())
                if i in whole:
                    entry = FileEntry(name, info.st_size, _whole_hash(f, name, info.st_size))
                else:
                    sample = _sample_hash(f, name, info.st_size, per_file)
                    stamp = None if version == 1 else (info.st_mtime_ns, info.st_ino)
                    entry = FileEntry(name, info.st_size, sample, stamp)
        except OSError as err:
            raise DataReadError(f"{path}: cannot be read ({err.strerror or err})") from None
        entries.append(entry)
    entries.sort(key=lambda e: e.name)
    digest = hashlib.sha256()
    for entry in entries:
        stamped = "" if entry.stamp is None else f"\0{entry.stamp[0]}\0{entry.stamp[1]}"
        digest.update(f"{entry.name}\0{entry.size}\0{entry.sample}{stamped}\n".encode())
    listed = tuple(entries) if len(entries) <= MAX_LISTED_FILES else ()
    return DataFingerprint(len(entries), sum(e.size for e in entries), digest.hexdigest(), listed,
                           version)


def _hashed_whole(sizes: Sequence[int]) -> set[int]:
    """The files (by position) hashed whole: smallest first (then by position) while their
    sizes fit ``HASH_BUDGET``."""
    left, chosen = HASH_BUDGET, set()
    for i in sorted(range(len(sizes)), key=lambda i: (sizes[i], i)):
        if sizes[i] > left:
            break
        left -= sizes[i]
        chosen.add(i)
    return chosen


def _whole_hash(f, name: str, size: int) -> str:
    """SHA-256 (hex) of the file's name, size and every byte of it (as version 1 hashed a
    file no larger than its sample)."""
    h = hashlib.sha256(f"{name}\0{size}\0".encode())
    while block := f.read(_READ_BYTES):
        h.update(block)
    return h.hexdigest()


def _sample_hash(f, name: str, size: int, budget: int) -> str:
    """SHA-256 (hex) of the file's name, size and sample: the whole file when it is at most
    ``budget`` bytes, else ``SAMPLE_BLOCKS`` blocks from its first byte to its last."""
    h = hashlib.sha256(f"{name}\0{size}\0".encode())
    if size <= budget:
        h.update(f.read(budget))
        return h.hexdigest()
    block = max(budget // SAMPLE_BLOCKS, 1)
    last = size - block
    for i in range(SAMPLE_BLOCKS):
        f.seek(last * i // (SAMPLE_BLOCKS - 1))
        h.update(f.read(block))
    return h.hexdigest()


@contextlib.contextmanager
def reopening(record: DataRecord) -> Iterator[None]:
    """Around opening a run's recorded data again (a corpus's ``reopen``): a
    :class:`DataChangedError` passes as it is; any other :class:`DataError` (the files are
    gone or unreadable) and a record whose fields do not parse (KeyError, TypeError,
    ValueError) become one :class:`DataChangedError` naming ``record.path``."""
    try:
        yield
    except DataChangedError:
        raise
    except DataError as err:
        raise DataChangedError(
            f"{record.path}: the files the run recorded cannot be read any more ({err}); "
            "a resumed run must train on the same files"
        ) from None
    except (KeyError, TypeError, ValueError) as err:
        raise DataChangedError(f"{record.path}: the run's data record is damaged: {err!r}"
                               ) from None
