"""Files handed in from outside, read without trusting them: regular files only, sizes bounded,
a safetensors header read and checked before any tensor data, JSON nesting bounded; files
written atomically; and :class:`CheckpointError`, what a missing or damaged model or checkpoint
on disk becomes.

A path named ``config.json`` may be a directory, a FIFO (opening it for reading blocks until
a writer comes), a device (``/dev/zero`` never ends) or a symlink to one of those; a
``model.safetensors`` may have a header that claims terabytes. The readers here refuse such
files with :class:`UnsafeFileError` naming the file and what is wrong, before reading more
than they must:

- :func:`regular_file_size`: ``stat`` (symlinks followed) and refuse anything but a regular
  file; nothing is opened.
- :func:`read_bytes`, :func:`read_text`: a regular file of at most ``max_bytes`` (as UTF-8).
- :func:`read_safetensors_header`: the tensors of a safetensors file as a dict of
  :class:`TensorInfo`, from its header as ``safetensors.safe_open`` reads and checks it (the
  format's rules: a bounded header, known dtypes, data offsets that tile the data exactly).
  No tensor data is read.
- :func:`parse_json`: ``json.loads`` refusing nesting deeper than ``MAX_JSON_DEPTH``; with
  ``MAX_JSON_BYTES``, the limits of every JSON file addnorm reads (``config.json`` of a
  pretrained folder, a checkpoint's ``state.json`` and ``manifest.json``, ``--config``).
- :func:`write_file_atomic`: a file written under a temporary name, fsynced and renamed, so a
  reader sees the old file or the new one, never a torn one.

Files are opened with ``O_NONBLOCK`` and checked again on the open descriptor, so a path
swapped for a FIFO between the check and the open cannot block the reader.

The loaders above (``addnorm.pretrained.mixin``, ``addnorm.training.checkpoint``) turn these errors
into :class:`CheckpointError` naming the file. This module imports nothing from the rest of
addnorm: it sits below the models and training.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

__all__ = [
    "MAX_JSON_BYTES",
    "MAX_JSON_DEPTH",
    "SAFETENSORS_DTYPES",
    "CheckpointError",
    "TensorInfo",
    "UnsafeFileError",
    "parse_json",
    "read_bytes",
    "read_safetensors_header",
    "read_text",
    "regular_file_size",
    "write_file_atomic",
]

# What a config.json, state.json, manifest.json or --config may hold: far more than any
# addnorm writes.
MAX_JSON_DEPTH = 64
MAX_JSON_BYTES = 64 * 2**20

# The format's dtype names and the torch dtypes they hold (a file of another is refused).
SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16,
    "U16": torch.uint16, "I32": torch.int32, "U32": torch.uint32, "I64": torch.int64,
    "U64": torch.uint64, "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32,
    "F64": torch.float64, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "C64": torch.complex64,
}
_KINDS = {  # stat.S_IFMT -> words for the message
    stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


class UnsafeFileError(ValueError):
    """A file is not what it must be (not a regular file, too large, a malformed header); the
    message names the file."""


class CheckpointError(Exception):
    """A pretrained model or a checkpoint on disk is missing, incomplete or corrupt; the
    message names the file (the CLI turns it into exit status 1)."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a safetensors header: its dtype and shape (its data is not read)."""

    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def regular_file_size(path: str | os.PathLike, *, what: str = "file") -> int:
    """The size in bytes of ``path``, a regular file or a symlink to one; nothing is opened.

    Raises:
        FileNotFoundError: nothing is there (the caller words "missing").
        UnsafeFileError: a directory, FIFO, device or socket (or a symlink to one), a dangling
            symlink, or a path that cannot be examined.
    """
    path = Path(path)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise UnsafeFileError(
                f"{what} {path}: a symlink to {os.readlink(path)}, which does not exist"
            ) from None
        raise
    except OSError as err:  # a symlink loop, a name too long, no permission
        raise UnsafeFileError(f"{what} {path}: cannot examine it ({err.strerror or err})") from None
    _check_regular(path, info, what)
    return info.st_size


def _check_regular(path: Path, info: os.stat_result, what: str) -> None:
    if not stat.S_ISREG(info.st_mode):
        kind = _KINDS.get(stat.S_IFMT(info.st_mode), "not a regular file")
        via = f" (a symlink to {os.path.realpath(path)})" if os.path.islink(path) else ""
        raise UnsafeFileError(f"{what} {path}: must be a regular file, but it is {kind}{via}")


def _open_regular(path: Path, what: str) -> tuple[int, int]:
    """``(fd, size)`` of ``path`` opened for reading, checked to be a regular file both before
    opening (a device is never opened) and on the descriptor (a swap in between is caught)."""
    regular_file_size(path, what=what)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise UnsafeFileError(f"{what} {path}: cannot open it ({err.strerror or err})") from None
    try:
        info = os.fstat(fd)
        _check_regular(path, info, what)
    except BaseException:
        os.close(fd)
        raise
    return fd, info.st_size


def _read_exactly(fd: int, n: int, path: Path, what: str) -> bytes:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 24))
        if not chunk:
            raise UnsafeFileError(f"{what} {path}: ended early, after {n - left} of {n} bytes")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_bytes(path: str | os.PathLike, *, max_bytes: int, what: str = "file") -> bytes:
    """The bytes of the regular file ``path``, refused unread when over ``max_bytes``.

    Raises:
        FileNotFoundError: nothing is there.
        UnsafeFileError: not a regular file, or larger than ``max_bytes``.
    """
    path = Path(path)
    fd, size = _open_regular(path, what)
    try:
        if size > max_bytes:
            raise UnsafeFileError(
                f"{what} {path}: has {size} bytes, more than the {max_bytes} it may have"
            )
        return _read_exactly(fd, size, path, what)
    finally:
        os.close(fd)


def read_text(path: str | os.PathLike, *, max_bytes: int, what: str = "file") -> str:
    """The UTF-8 text of the regular file ``path``, refused unread when over ``max_bytes``.

    Raises:
        FileNotFoundError: nothing is there.
        UnsafeFileError: not a regular file, larger than ``max_bytes``, or not UTF-8.
    """
    data = read_bytes(path, max_bytes=max_bytes, what=what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UnsafeFileError(f"{what} {path}: not UTF-8 text ({err})") from None


def read_safetensors_header(
    path: str | os.PathLike, *, what: str = "safetensors file"
) -> dict[str, TensorInfo]:
    """Every tensor of the safetensors file ``path``: name -> dtype and shape, from its
    header alone (``__metadata__`` left out). The header is read and checked by
    ``safetensors.safe_open`` (the format's rules: a bounded header, known dtypes, shapes that
    match their data offsets, offsets that tile the data exactly), so a file this accepts
    holds exactly the bytes its tensors need; ``safe_open`` maps the file and reads no tensor
    data until asked, and this asks for none.

    Raises:
        FileNotFoundError: nothing is there.
        UnsafeFileError: not a regular file, a header safetensors refuses (its words say what
            is wrong), or a dtype torch has no type for.
    """
    path = Path(path)
    fd, _ = _open_regular(path, what)
    try:
        # The descriptor checked to be a regular file, reopened by name where the system has
        # one: a path swapped for a FIFO since the check cannot block safe_open.
        by_fd = f"/dev/fd/{fd}"
        source = by_fd if os.path.exists(by_fd) else path
        try:
            with safe_open(source, framework="pt") as f:
                found = {key: (f.get_slice(key).get_dtype(), f.get_slice(key).get_shape())
                         for key in f.keys()}  # noqa: SIM118
        except (SafetensorError, OSError) as err:
            raise UnsafeFileError(f"{what} {path}: not a valid safetensors file ({err})") from None
    finally:
        os.close(fd)
    tensors = {}
    for key, (name, shape) in found.items():
        if name not in SAFETENSORS_DTYPES:
            raise UnsafeFileError(
                f"{what} {path}: tensor {key!r} has the dtype {name}, which torch cannot hold; "
                f"known: {list(SAFETENSORS_DTYPES)}"
            )
        tensors[key] = TensorInfo(dtype=SAFETENSORS_DTYPES[name], shape=tuple(shape))
    return tensors


def parse_json(text: str) -> object:
    """``json.loads(text)``, refusing nesting deeper than ``MAX_JSON_DEPTH`` with a
    ``ValueError`` (``json.JSONDecodeError`` for invalid JSON) instead of a RecursionError in
    the decoder or in whatever walks the result later. Used for every JSON file a user or a
    checkpoint hands in: ``config.json``, ``--config``, ``state.json``, ``manifest.json``."""
    try:
        data = json.loads(text)
    except RecursionError:
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels") from None
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
        children = value.values() if isinstance(value, dict) else value
        if isinstance(value, (dict, list)):
            stack.extend((child, depth + 1) for child in children)
    return data


def write_file_atomic(path: Path, write: Callable[[Path], object]) -> None:
    """``write(tmp)`` to a temporary name beside ``path``, fsync it, then rename it onto
    ``path``: a reader sees the old file or the new one, never a torn one."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
