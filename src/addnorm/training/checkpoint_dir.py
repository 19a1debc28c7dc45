"""A checkpoint directory on disk, apart from what its files hold: which directories addnorm
wrote, moving one into place atomically, its files' sizes and hashes, and deleting only what
addnorm wrote (the format itself: :mod:`addnorm.training.checkpoint`).

Only what addnorm wrote is deleted: a ``step-*`` directory only when its manifest is an addnorm
checkpoint manifest of that step (a user's folder of that name is left alone, and never
pruned), and in it, or in a leftover, only checkpoint files (``*.safetensors``, ``state.json``,
``manifest.json``; never through a symbolic link). A directory that still holds anything else
is left in place, with a warning logged (under the ``addnorm.training.checkpoint`` logger).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import secrets
from pathlib import Path

from addnorm.utils.files import (
    MAX_JSON_BYTES,
    CheckpointError,
    UnsafeFileError,
    parse_json,
    read_text,
)

__all__ = [
    "CHECKPOINT_DIR",
    "FORMAT",
    "MANIFEST",
    "STATE",
    "delete_checkpoint",
    "describe",
    "fsync_dir",
    "is_ours",
    "read_json",
    "remove_leftovers",
    "replace_dir",
    "verify",
    "write_json",
]

FORMAT = "addnorm-checkpoint"
MANIFEST = "manifest.json"
STATE = "state.json"
CHECKPOINT_DIR = re.compile(r"^(step|best)-(\d{8,})$")
# What killed writes and prunings leave: ".tmp-step-N-<mkdtemp's suffix>", ".old-step-N-<id>"
# (and the same of "best-N").
_LEFTOVER = re.compile(r"^\.(?:tmp|old)-(?:step|best)-\d{8,}-[A-Za-z0-9_]+(?:-[0-9a-f]+)?$")
_log = logging.getLogger("addnorm.training.checkpoint")  # the name it has always logged under


def is_ours(path: Path) -> bool:
    """Whether ``path`` is a checkpoint directory addnorm wrote: a real directory (not a link)
    named ``step-N`` (or ``best-N``) whose manifest is an addnorm checkpoint manifest of step
    N (of that kind)."""
    match = CHECKPOINT_DIR.match(path.name)
    if match is None or path.is_symlink() or not path.is_dir():
        return False
    try:
        manifest = read_json(path / MANIFEST)
    except (CheckpointError, OSError):
        return False
    step = manifest.get("step")
    return (
        manifest.get("format") == FORMAT
        and isinstance(step, int) and not isinstance(step, bool)
        and step == int(match.group(2))
        and manifest.get("kind", "step") == match.group(1)
        and isinstance(manifest.get("files"), dict)
    )


def delete_checkpoint(path: str | os.PathLike) -> None:
    """Delete a checkpoint directory addnorm wrote (any other is left alone): renamed first to
    a hidden leftover name, so from then on it is not listed and a deletion cut short leaves
    an unlisted leftover (removed by the next save), never a listed checkpoint missing files.
    One that also holds other files (put there by someone else) loses only its checkpoint
    files, manifest first, where it is."""
    path = Path(path)
    if not is_ours(path):
        _log.warning("addnorm: left %s in place: it is not a checkpoint addnorm wrote", path)
        return
    if any(not _is_checkpoint_file(child.name) for child in path.iterdir()):
        _remove_checkpoint_files(path)  # in place: what else is there stays where it was put
        return
    aside = path.with_name(f".old-{path.name}-{os.getpid()}-{secrets.token_hex(4)}")
    os.rename(path, aside)
    _fsync_dir_entry(path.parent)
    _remove_checkpoint_files(aside)


def remove_leftovers(root: Path) -> None:
    """Delete what killed writes and prunings left: the hidden temporary and set-aside
    directories (only their checkpoint files; see ``_remove_checkpoint_files``)."""
    for child in root.iterdir():
        if _LEFTOVER.match(child.name) and child.is_dir() and not child.is_symlink():
            _remove_checkpoint_files(child)


def _is_checkpoint_file(name: str) -> bool:
    return name in (MANIFEST, STATE) or name.endswith(".safetensors")


def _remove_checkpoint_files(path: Path) -> None:
    """Delete the checkpoint files in ``path`` (the manifest first) and then ``path`` itself if
    that empties it; anything else there (a user's file, a folder, a link) is kept, and said
    so in a warning."""
    children = sorted(path.iterdir(), key=lambda child: child.name != MANIFEST)
    kept = []
    for child in children:
        if _is_checkpoint_file(child.name) and child.is_file() and not child.is_symlink():
            with contextlib.suppress(FileNotFoundError):
                child.unlink()
        else:
            kept.append(child.name)
    if kept:
        _log.warning(
            "addnorm: left %s in place: it holds %s, which addnorm did not write", path,
            ", ".join(sorted(kept)[:5]) + (f" and {len(kept) - 5} more" if len(kept) > 5 else ""),
        )
        return
    with contextlib.suppress(FileNotFoundError):
        path.rmdir()


def describe(path: Path) -> dict:
    """A manifest entry: size in bytes and sha256 of the file's contents."""
    return {"bytes": path.stat().st_size, "sha256": _sha256(path)}


def verify(path: Path, expected: dict) -> None:
    if not path.is_file():
        raise CheckpointError(f"checkpoint file missing: {path}")
    size = path.stat().st_size
    if size != expected.get("bytes"):
        raise CheckpointError(
            f"checkpoint file truncated or altered: {path} has {size} bytes, "
            f"the manifest says {expected.get('bytes')}"
        )
    if _sha256(path) != expected.get("sha256"):
        raise CheckpointError(f"checkpoint file corrupt: {path} does not match its sha256")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_json(path: Path) -> dict:
    try:
        data = parse_json(read_text(path, max_bytes=MAX_JSON_BYTES, what="checkpoint file"))
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint file missing: {path}") from None
    except UnsafeFileError as err:
        raise CheckpointError(str(err)) from None
    except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError is a ValueError
        raise CheckpointError(f"checkpoint file is not valid JSON: {path} ({err})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"checkpoint file {path} must hold a JSON object")
    return data


def write_json(path: Path, data: dict) -> None:
    """Write JSON and fsync it (the file is still in the temporary directory)."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    """fsync every file in ``path`` and the directory entry itself (POSIX; no-op elsewhere)."""
    for child in path.iterdir():
        with open(child, "rb") as f:
            os.fsync(f.fileno())
    _fsync_dir_entry(path)


def replace_dir(tmp: Path, final: Path) -> None:
    """Rename ``tmp`` to ``final``; an existing ``final`` (same step, rewritten) is set aside
    first and removed after, so a complete checkpoint of some step always exists."""
    old = None
    if final.exists() or final.is_symlink():
        if not is_ours(final):
            raise FileExistsError(
                errno.EEXIST, f"{final} exists and is not a checkpoint addnorm wrote; move it away"
            )
        old = final.with_name(f".old-{final.name}-{os.getpid()}-{secrets.token_hex(4)}")
        os.rename(final, old)
    try:
        os.rename(tmp, final)
    except BaseException:
        if old is not None:  # put the previous one back
            os.rename(old, final)
        raise
    _fsync_dir_entry(final.parent)
    if old is not None:
        with contextlib.suppress(OSError):  # a leftover: the next save retries
            _remove_checkpoint_files(old)


def _fsync_dir_entry(path: Path) -> None:
    """fsync a directory, so the names in it (a rename) reach the disk."""
    if hasattr(os, "O_DIRECTORY"):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
