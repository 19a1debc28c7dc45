"""Checkpoints on disk: safetensors for tensors, JSON for everything else, never pickle.

Layout of a run directory::

    <run_dir>/checkpoints/step-00001000/
        model.safetensors, optimizer.safetensors, rng.safetensors, [ema.safetensors]
        state.json      step, configs, optimizer structure, RNG and data-order state
        manifest.json   written last: every file's size and sha256

A checkpoint is a directory, written atomically: its files go into a hidden temporary
directory next to it (each file fsynced, the manifest last), which is then renamed to
``step-NNNNNNNN`` (a rename within one directory is atomic on POSIX). A write killed halfway
leaves only the hidden temporary directory, which loading ignores, so the previous checkpoint
stays the newest one. The newest checkpoint of a run is the highest-numbered ``step-*``
directory. Loading checks the manifest's sizes and hashes, so a truncated or altered file
raises ``CheckpointError`` naming that file instead of a traceback from deep inside a loader.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

__all__ = [
    "CheckpointError",
    "LoadedCheckpoint",
    "find_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "save_checkpoint",
]

FORMAT = "addnorm-checkpoint"
VERSION = 1
MANIFEST = "manifest.json"
STATE = "state.json"
_STEP_DIR = re.compile(r"^step-(\d{8,})$")


class CheckpointError(Exception):
    """A checkpoint is missing, incomplete or corrupt; the message names the file."""


@dataclass(frozen=True)
class LoadedCheckpoint:
    """What ``load_checkpoint`` returns.

    Attributes:
        path: the checkpoint directory.
        step: the optimizer step it was written after.
        state: the parsed ``state.json``.
        tensors: one dict of CPU tensors per safetensors file, keyed by file stem
            ("model", "optimizer", "rng", "ema").
    """

    path: Path
    step: int
    state: dict
    tensors: dict[str, dict[str, torch.Tensor]]


def save_checkpoint(
    run_dir: str | os.PathLike,
    step: int,
    tensors: Mapping[str, Mapping[str, torch.Tensor]],
    state: dict,
    *,
    keep: int = 2,
) -> Path:
    """Write checkpoint ``step`` of ``run_dir`` atomically, then keep only the newest ``keep``.

    Args:
        tensors: file stem -> tensors, each stem written as ``<stem>.safetensors``.
        state: JSON-serialisable dict written as ``state.json``.
    Returns:
        The checkpoint directory.
    """
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:08d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=root))
    try:
        files = {}
        for stem, group in tensors.items():
            path = tmp / f"{stem}.safetensors"
            save_file({k: v.detach().cpu().contiguous().clone() for k, v in group.items()}, path)
            files[path.name] = _describe(path)
        _write_json(tmp / STATE, state)
        files[STATE] = _describe(tmp / STATE)
        manifest = {"format": FORMAT, "version": VERSION, "step": step, "files": files}
        _write_json(tmp / MANIFEST, manifest)
        _fsync_dir(tmp)
        _replace_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """The complete checkpoint directories of ``run_dir``, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _STEP_DIR.match(p.name) and (p / MANIFEST).is_file()]
    return sorted(found, key=lambda p: int(_STEP_DIR.match(p.name).group(1)))


def find_checkpoint(path: str | os.PathLike) -> Path:
    """Resolve ``path`` (a checkpoint directory, or a run directory: its newest checkpoint)."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint not found: {path} does not exist")
    if not path.is_dir():
        raise CheckpointError(f"checkpoint must be a directory, got the file {path}")
    if (path / MANIFEST).exists():
        return path
    found = list_checkpoints(path)
    if not found:
        raise CheckpointError(
            f"no checkpoint in {path}: expected {path / MANIFEST} or "
            f"{path / 'checkpoints' / 'step-*' / MANIFEST}"
        )
    return found[-1]


def load_checkpoint(path: str | os.PathLike) -> LoadedCheckpoint:
    """Load and verify a checkpoint (or a run directory's newest one); tensors on the CPU."""
    path = find_checkpoint(path)
    manifest = _read_json(path / MANIFEST)
    if manifest.get("format") != FORMAT or not isinstance(manifest.get("files"), dict):
        raise CheckpointError(f"{path / MANIFEST} is not an addnorm checkpoint manifest")
    for name, expected in manifest["files"].items():
        _verify(path / name, expected)
    tensors = {}
    for name in manifest["files"]:
        if name.endswith(".safetensors"):
            try:
                tensors[name.removesuffix(".safetensors")] = load_file(path / name, device="cpu")
            except (SafetensorError, OSError, ValueError) as err:
                raise CheckpointError(f"cannot read {path / name}: {err}") from None
    state = _read_json(path / STATE)
    return LoadedCheckpoint(path=path, step=int(manifest["step"]), state=state, tensors=tensors)


def _describe(path: Path) -> dict:
    """A manifest entry: size in bytes and sha256 of the file's contents."""
    return {"bytes": path.stat().st_size, "sha256": _sha256(path)}


def _verify(path: Path, expected: dict) -> None:
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


def _read_json(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint file missing: {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"checkpoint file is not valid JSON: {path} ({err})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"checkpoint file {path} must hold a JSON object")
    return data


def _write_json(path: Path, data: dict) -> None:
    """Write JSON and fsync it (the file is still in the temporary directory)."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    """fsync every file in ``path`` and the directory entry itself (POSIX; no-op elsewhere)."""
    for child in path.iterdir():
        with open(child, "rb") as f:
            os.fsync(f.fileno())
    _fsync_dir_entry(path)


def _replace_dir(tmp: Path, final: Path) -> None:
    """Rename ``tmp`` to ``final``; an existing ``final`` (same step, rewritten) is set aside
    first and removed after, so a complete checkpoint of some step always exists."""
    old = None
    if final.exists():
        old = final.with_name(f".old-{final.name}-{os.getpid()}")
        os.rename(final, old)
    os.rename(tmp, final)
    _fsync_dir_entry(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _fsync_dir_entry(path: Path) -> None:
    """fsync a directory, so the names in it (a rename) reach the disk."""
    if hasattr(os, "O_DIRECTORY"):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
