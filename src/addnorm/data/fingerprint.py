"""What a run remembers of a user's data, and what bad data raises.

A run trained on a user's files (``addnorm train lm --data PATH`` and the others) records
them in a :class:`DataRecord`: the path, how many files and bytes, a fingerprint, the
held-out split and the tokenizer. It is saved with the task in every checkpoint (and as the
run's ``data.json``), shown by ``addnorm info``, and checked again before a run resumes: a
resumed run whose files changed is refused, naming what changed (:class:`DataChangedError`).

- :func:`resolve_data_files`: a path as a user gives it, a file, a folder (searched
  recursively; names starting with "." skipped) or a glob, as a sorted list of regular files.
- :func:`fingerprint_files`: a :class:`DataFingerprint` of those files: their names relative
  to the path, their sizes and a hash of a sample of their content (evenly spaced blocks,
  ``SAMPLE_BYTES`` in all however large the files: a 1 GB corpus is not read in full).
  Modification times are not part of it: a copy of the same files has the same fingerprint.
- :class:`DataFingerprint` ``.changes(other)``: what differs, in words, file by file.

Errors (the CLI turns each into one line): :class:`DataError` (a ``ValueError``: the data
cannot be used, the command's exit status 2), :class:`DataChangedError` (a ``DataError``: the
files differ from a record) and :class:`DataReadError` (an ``OSError``: a file that fails or
changes while it is read, exit status 1). Messages start with the path they are about.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import hashlib
import os
import stat
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "MAX_LISTED_FILES",
    "SAMPLE_BYTES",
    "DataChangedError",
    "DataError",
    "DataFingerprint",
    "DataReadError",
    "DataRecord",
    "FileEntry",
    "absolute_path",
    "fingerprint_files",
    "is_glob",
    "reopening",
    "resolve_data_files",
]

# Bytes read to fingerprint a whole data set, spread over its files (each file gets at least
# MIN_FILE_SAMPLE and at most MAX_FILE_SAMPLE of them; a file no larger is read whole).
SAMPLE_BYTES = 16 * 2**20
MIN_FILE_SAMPLE = 1024
MAX_FILE_SAMPLE = 64 * 2**10
# Blocks a file's sample is cut into, spread evenly from its first byte to its last.
SAMPLE_BLOCKS = 16
# Files listed one by one in a record (so a change names the file); a larger data set keeps
# only its totals and digest.
MAX_LISTED_FILES = 1000
# Changes named in a DataChangedError message (the rest are counted).
_SHOWN_CHANGES = 3
_GLOB_CHARS = frozenset("*?[")


class DataError(ValueError):
    """Data that cannot be used as given (missing, empty, not text, malformed, too small);
    the message starts with the path and says what is wrong."""


class DataChangedError(DataError):
    """Files that differ from the record a run made of them; the message names the changes."""


class DataReadError(OSError):
    """A file that fails, or changes, while it is read; the message names the file."""


@dataclass(frozen=True)
class FileEntry:
    """One file of a data set: its name relative to the data's root (with "/"), its size in
    bytes and the hash of its content sample (hex)."""

    name: str
    size: int
    sample: str


@dataclass(frozen=True)
class DataFingerprint:
    """A data set's files, summed up without reading them in full.

    Attributes:
        n_files: how many files.
        size: their bytes in all.
        digest: SHA-256 (hex) of every file's name, size and sample hash, in name order.
        files: the files one by one (empty when there are more than ``MAX_LISTED_FILES``).
    """

    n_files: int
    size: int
    digest: str
    files: tuple[FileEntry, ...] = ()

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
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON: the totals, the digest and (when listed) each file's name, size and hash."""
        return {
            "n_files": self.n_files,
            "size": self.size,
            "digest": self.digest,
            "files": [[f.name, f.size, f.sample] for f in self.files] or None,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DataFingerprint:
        """Read back ``to_dict``'s JSON; ValueError if it is not one."""
        try:
            files = tuple(FileEntry(str(n), int(s), str(h)) for n, s, h in data["files"] or ())
            return cls(int(data["n_files"]), int(data["size"]), str(data["digest"]), files)
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

    def check_unchanged(self, now: DataFingerprint) -> None:
        """Raise :class:`DataChangedError` naming what differs if ``now`` (the same path
        fingerprinted again) is not the recorded fingerprint."""
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


def absolute_path(path: str | os.PathLike) -> str:
    """``path`` with ``~`` expanded, made absolute (not resolved: links and globs stay)."""
    return os.path.abspath(os.path.expanduser(os.fspath(path)))


def is_glob(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a glob pattern rather than a file or folder that exists."""
    text = os.fspath(path)
    return not os.path.lexists(text) and any(c in _GLOB_CHARS for c in text)


def resolve_data_files(
    path: str | os.PathLike,
    *,
    what: str = "data",
    accept: Callable[[Path], bool] | None = None,
    kinds: str = "files",
) -> tuple[Path, list[Path]]:
    """``(root, files)``: the regular files ``path`` names, sorted by their name relative to
    ``root``. ``path`` is a file (its folder is the root), a folder (every file below it,
    names starting with "." skipped at every level; the folder is the root) or a glob
    (``**`` for any depth; its longest part without wildcards is the root).

    ``accept``: keep only the files it accepts (a folder's or glob's; ``kinds`` names them in
    messages, e.g. "image files"). Raises :class:`DataError` starting with ``what`` and the
    path: it does not exist, matches nothing, is not a regular file, or holds no such files.
    """
    text = absolute_path(path)
    where = f"{what} {os.fspath(path)}"
    if is_glob(text):
        root = Path(_glob_root(text))
        matches = sorted(Path(p) for p in glob.glob(text, recursive=True))
        files = [p for p in matches if _is_regular(p) and (accept is None or accept(p))]
        if not files:
            found = "matches nothing" if not matches else f"matches no {kinds}"
            raise DataError(f"{where}: {found}")
        return root, sorted(files, key=lambda p: _relative(p, root))
    target = Path(text)
    try:
        info = target.stat()
    except FileNotFoundError:
        raise DataError(f"{where}: no such file or folder") from None
    except OSError as err:
        raise DataError(f"{where}: {err.strerror or err}") from None
    if stat.S_ISDIR(info.st_mode):
        files = []
        for folder, dirs, names in os.walk(target):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for name in sorted(names):
                file = Path(folder) / name
                if not name.startswith(".") and _is_regular(file) and (
                    accept is None or accept(file)
                ):
                    files.append(file)
        if not files:
            raise DataError(f"{where}: the folder holds no {kinds}")
        return target, sorted(files, key=lambda p: _relative(p, target))
    if not stat.S_ISREG(info.st_mode):
        raise DataError(f"{where}: not a regular file or folder")
    return target.parent, [target]


def _glob_root(pattern: str) -> str:
    """The longest leading folder of ``pattern`` without wildcards."""
    parts = Path(pattern).parts
    fixed = []
    for part in parts[:-1]:
        if any(c in _GLOB_CHARS for c in part):
            break
        fixed.append(part)
    return str(Path(*fixed)) if fixed else os.sep


def _is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except OSError:
        return False


def _relative(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return path.as_posix()


def fingerprint_files(files: Sequence[Path], root: Path) -> DataFingerprint:
    """The fingerprint of ``files`` (named relative to ``root``): sizes from ``stat``,
    contents from a sample of at most ``SAMPLE_BYTES`` spread over the files. Raises
    :class:`DataReadError` naming a file that cannot be read."""
    budget = SAMPLE_BYTES // max(len(files), 1)
    per_file = max(MIN_FILE_SAMPLE, min(MAX_FILE_SAMPLE, budget))
    entries = []
    for path in files:
        name = _relative(path, root)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                sample = _sample_hash(f, name, size, per_file)
        except OSError as err:
            raise DataReadError(f"{path}: cannot be read ({err.strerror or err})") from None
        entries.append(FileEntry(name, size, sample))
    entries.sort(key=lambda e: e.name)
    digest = hashlib.sha256()
    for entry in entries:
        digest.update(f"{entry.name}\0{entry.size}\0{entry.sample}\n".encode())
    listed = tuple(entries) if len(entries) <= MAX_LISTED_FILES else ()
    return DataFingerprint(len(entries), sum(e.size for e in entries), digest.hexdigest(), listed)


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
