"""Checkpoints on disk: safetensors for tensors, JSON for everything else, never pickle.

Layout of a run directory::

    <run_dir>/checkpoints/step-00001000/
        model.safetensors, optimizer.safetensors, rng.safetensors, [ema.safetensors]
        state.json      step, configs, optimizer structure, the lr scheduler's state_dict,
                        the EMA's n_averaged, RNG and data-order state
        manifest.json   written last: every file's size and sha256

A sharded (FSDP2) model's checkpoint holds the same tensors as
``torch.distributed.checkpoint`` shards (:mod:`addnorm.training.checkpoint_shards`); its
manifest says ``"layout": "sharded"``. ``load_checkpoint`` returns either layout the same way,
every tensor whole.

A checkpoint is a directory, written atomically: its files go into a hidden temporary
directory next to it (each file fsynced, the manifest last), which is then renamed to
``step-NNNNNNNN`` (a rename within one directory is atomic on POSIX). A write killed halfway
leaves only the hidden temporary directory, which loading ignores, so the previous checkpoint
stays the newest one; the next ``save_checkpoint`` of that run removes such leftovers
(``.tmp-step-*`` and ``.old-step-*``; one process writes a run's checkpoints at a time, see
``run_dir.RunLock``). A write that fails (a full disk, a read-only folder) removes its
temporary directory and raises ``CheckpointWriteError`` naming the checkpoint and the space it
needs. Old checkpoints are pruned by renaming each to a hidden ``.old-step-*`` name first (from
then on it is not listed, so a deletion cut short never leaves a listed checkpoint incomplete)
and then deleting its files.

Only what addnorm wrote is deleted (:mod:`addnorm.training.checkpoint_dir`, which also
holds the directory mechanics: fsync, rename into place, hashes).
The newest checkpoint of a run is the highest-numbered ``step-*`` directory with a manifest.
A run that keeps its best (:mod:`addnorm.training.best`) also writes ``best-NNNNNNNN``
directories beside them, the same way (``save_checkpoint(kind="best")``: atomic, the manifest
saying ``"kind": "best"``), which ``keep`` never prunes and ``list_checkpoints`` lists only when
asked for them (``kind="best"``); ``delete_checkpoints`` deletes both kinds, by the same rule.
Loading checks the manifest's structure and its sizes and hashes, so a malformed manifest or
a truncated or altered file raises ``CheckpointError`` naming that file instead of a traceback
from deep inside a loader. The manifest must list ``model.safetensors``, ``state.json`` and
every other ``.safetensors`` or ``.json`` file in the directory, so no file is read unverified;
JSON nested deeper than ``MAX_JSON_DEPTH`` or larger than ``MAX_JSON_BYTES`` is refused the
same way (``parse_json``). ``CheckpointError``, the JSON limits and ``write_file_atomic`` live in
:mod:`addnorm.utils.files`, below the models, which save and load pretrained folders with them.
"""

from __future__ import annotations

import contextlib
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

from addnorm.training.checkpoint_dir import (
    CHECKPOINT_DIR,
    FORMAT,
    MANIFEST,
    STATE,
    delete_checkpoint,
    describe,
    fsync_dir,
    is_ours,
    read_json,
    remove_leftovers,
    replace_dir,
    verify,
    write_json,
)
from addnorm.training.checkpoint_shards import (
    SHARD_FILE,
    agree_on_directory,
    is_shard_write_error,
    read_shards,
    shard_rank,
    write_shards,
)
from addnorm.utils.files import CheckpointError

__all__ = [
    "CHECKPOINT_KINDS",
    "CheckpointWriteError",
    "LoadedCheckpoint",
    "delete_checkpoint",
    "delete_checkpoints",
    "find_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "read_checkpoint_state",
    "save_checkpoint",
]

VERSION = 1
SHARDED = "sharded"  # the manifest's "layout" of a DCP checkpoint (absent: one file a part)
# The kinds of checkpoint directory: "step-N" (periodic, pruned to ``keep``) and "best-N" (a
# run's best weights, :mod:`addnorm.training.best`).
CHECKPOINT_KINDS = ("step", "best")
# Files every checkpoint has (its manifest apart): the weights and the state.
REQUIRED = ("model.safetensors", STATE)


class CheckpointWriteError(CheckpointError, OSError):
    """A checkpoint could not be written (a full disk, no permission); the message names it and
    the space it needs, ``errno`` is the cause's. The previous checkpoints are untouched."""


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
    sharded: bool = False,
    kind: str = "step",
) -> Path:
    """Write checkpoint ``step`` of ``run_dir`` atomically, then keep only the newest ``keep``.

    Args:
        tensors: file stem -> tensors, each stem written as ``<stem>.safetensors``.
        state: JSON-serialisable dict written as ``state.json``.
        sharded: write DCP shards (the module docstring): every rank of the process group
            calls it with its own tensors (``DTensor`` shards; tensors that are not sharded
            are written once), rank 0 with ``state``; each rank writes its part into the
            temporary directory, rank 0 seals and publishes it. Every rank returns the path.
        kind: ``"step"`` (a periodic checkpoint, ``step-N``) or ``"best"`` (``best-N``, a
            run's best weights: ``keep`` does not apply, and its manifest says
            ``"kind": "best"``; see :mod:`addnorm.training.best`).
    Returns:
        The checkpoint directory.
    Raises:
        CheckpointWriteError: a file could not be written (its temporary directory is removed,
            the previous checkpoints are untouched).
    """
    if kind not in CHECKPOINT_KINDS:
        raise ValueError(f"kind must be one of {CHECKPOINT_KINDS}, got {kind!r}")
    root = Path(run_dir) / "checkpoints"
    final = root / f"{kind}-{step:08d}"
    main = not sharded or shard_rank() == 0
    tmp = None
    try:
        if main:
            root.mkdir(parents=True, exist_ok=True)
            remove_leftovers(root)
            tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=root))
    except OSError as err:
        if not sharded:
            raise _write_error(final, err, tensors) from err
        error: BaseException | None = _write_error(final, err, tensors)
    else:
        error = None
    if sharded:  # every rank learns where to write (or that rank 0 could not make it)
        tmp = agree_on_directory(tmp)
        if tmp is None:
            raise error or CheckpointWriteError(
                f"cannot write checkpoint {final}: rank 0 could not create its directory"
            )
    assert tmp is not None
    try:
        if sharded:
            write_shards(tmp, tensors)
        else:
            _write_tensor_files(tmp, tensors)
        if main:
            _seal(tmp, step, state, layout=SHARDED if sharded else None, kind=kind)
            replace_dir(tmp, final)
    except BaseException as err:
        if main:
            shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(err, (OSError, SafetensorError)) or is_shard_write_error(err):
            raise _write_error(final, err, tensors) from err
        raise
    if not main or kind != "step":
        return final
    for old in [p for p in list_checkpoints(run_dir) if is_ours(p)][:-keep]:
        with contextlib.suppress(OSError):  # the new one is written; the next save retries
            delete_checkpoint(old)
    return final


def delete_checkpoints(run_dir: str | os.PathLike) -> None:
    """Delete every checkpoint of ``run_dir`` that addnorm wrote (of either kind) and the
    leftovers of killed writes, then ``checkpoints/`` itself if nothing else is in it (other
    files and folders stay; see the module docstring)."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return
    for kind in CHECKPOINT_KINDS:
        for path in list_checkpoints(run_dir, kind=kind):
            delete_checkpoint(path)
    remove_leftovers(root)
    with contextlib.suppress(OSError):
        root.rmdir()


def list_checkpoints(run_dir: str | os.PathLike, *, kind: str = "step") -> list[Path]:
    """The complete checkpoint directories of ``run_dir`` of ``kind`` (``"step"``: the
    periodic ones; ``"best"``: the best weights kept), oldest first."""
    if kind not in CHECKPOINT_KINDS:
        raise ValueError(f"kind must be one of {CHECKPOINT_KINDS}, got {kind!r}")
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = {}
    for child in root.iterdir():
        match = CHECKPOINT_DIR.match(child.name)
        if match is not None and match.group(1) == kind and (child / MANIFEST).is_file():
            found[child] = int(match.group(2))
    return sorted(found, key=found.__getitem__)


def read_checkpoint_state(path: str | os.PathLike) -> dict:
    """The ``state.json`` of the checkpoint directory ``path`` (bounded and checked as
    ``load_checkpoint`` reads it, its tensors not read nor its hashes checked);
    ``CheckpointError`` naming the file if it is missing or not a JSON object."""
    return read_json(Path(path) / STATE)


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
    manifest = read_json(path / MANIFEST)
    step, files = _check_manifest(path / MANIFEST, manifest)
    for name, expected in files.items():
        verify(path / name, expected)
    tensors: dict[str, dict[str, torch.Tensor]] = {}
    if manifest.get("layout") == SHARDED:
        tensors = read_shards(path, sorted(n for n in files if n.endswith(".safetensors")))
    for name in files:
        if name.endswith(".safetensors") and manifest.get("layout") != SHARDED:
            try:
                tensors[name.removesuffix(".safetensors")] = load_file(path / name, device="cpu")
            except (SafetensorError, OSError, ValueError) as err:
                raise CheckpointError(f"cannot read {path / name}: {err}") from None
    state = read_json(path / STATE)
    return LoadedCheckpoint(path=path, step=step, state=state, tensors=tensors)


def _check_manifest(where: Path, manifest: dict) -> tuple[int, dict[str, dict]]:
    """The step and file table of a manifest, after checking its structure (the format tag,
    an int ``step`` >= 0, and ``files``: plain file names -> ``{"bytes": int, "sha256": str}``).
    """

    def bad(why: str) -> CheckpointError:
        return CheckpointError(f"{where} is not a valid addnorm checkpoint manifest: {why}")

    if manifest.get("format") != FORMAT:
        raise bad(f"format is {manifest.get('format')!r}, expected {FORMAT!r}")
    step = manifest.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise bad(f"step must be an int >= 0, got {step!r}")
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise bad("files must be a non-empty object")
    for name, entry in files.items():
        if not name or name != Path(name).name or name in (".", ".."):
            raise bad(f"file name {name!r} is not a plain file name")
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("bytes"), int)
            and isinstance(entry.get("sha256"), str)
        ):
            raise bad(f'files[{name!r}] must be {{"bytes": int, "sha256": str}}, got {entry!r}')
    if manifest.get("kind", "step") not in CHECKPOINT_KINDS:
        raise bad(f"kind is {manifest.get('kind')!r}, expected one of {CHECKPOINT_KINDS}")
    layout = manifest.get("layout")
    if layout not in (None, SHARDED):
        raise bad(f"layout is {layout!r}, expected {SHARDED!r} or none")
    shards = [name for name in files if SHARD_FILE.match(name)]
    if layout == SHARDED and not shards:
        raise bad("files lists no shard-*.safetensors, which a sharded checkpoint holds")
    for name in REQUIRED if layout is None else (STATE,):
        if name not in files:
            raise bad(f"files does not list {name}")
    if layout == SHARDED and (extra := sorted(
        name for name in files if name.endswith(".safetensors") and name not in shards
    )):
        raise bad(f"a sharded checkpoint holds shard files only, not {extra}")
    for child in sorted(where.parent.iterdir()):  # a file a loader would read, unverified
        unlisted = child.name not in files and child.name != MANIFEST
        if unlisted and child.suffix in (".safetensors", ".json"):
            raise bad(f"files does not list {child.name}, which is in the checkpoint")
    return step, files


def _write_tensor_files(tmp: Path, tensors) -> None:
    """Write each part's tensors into ``tmp`` as ``<part>.safetensors``."""
    for stem, group in tensors.items():
        path = tmp / f"{stem}.safetensors"
        save_file({k: v.detach().cpu().contiguous().clone() for k, v in group.items()}, path)


def _seal(tmp: Path, step: int, state: dict, *, layout: str | None, kind: str = "step"
          ) -> None:
    """Write ``state.json`` and then the manifest of every file in ``tmp`` (sizes, hashes),
    and fsync them all."""
    write_json(tmp / STATE, state)
    files = {child.name: describe(child) for child in sorted(tmp.iterdir())}
    manifest = {"format": FORMAT, "version": VERSION, "step": step, "files": files}
    if layout is not None:
        manifest["layout"] = layout
    if kind != "step":  # (a periodic checkpoint's manifest is as before kinds existed)
        manifest["kind"] = kind
    write_json(tmp / MANIFEST, manifest)
    fsync_dir(tmp)


def _write_error(
    final: Path, err: BaseException, tensors: Mapping[str, Mapping[str, torch.Tensor]]
) -> CheckpointWriteError:
    """One line: the checkpoint, why it failed, the space it needs and the space free."""
    needed = sum(t.numel() * t.element_size() for group in tensors.values() for t in group.values())
    reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
    try:
        free = f", {_megabytes(shutil.disk_usage(final.parent).free)} free"
    except OSError:
        free = ""
    error = CheckpointWriteError(
        f"cannot write checkpoint {final}: {reason} (it needs about {_megabytes(needed)}{free}); "
        "the previous checkpoints are intact"
    )
    if isinstance(err, OSError):
        error.errno = err.errno
    elif found := re.search(r"os error (\d+)", str(err)):  # how safetensors words I/O errors
        error.errno = int(found[1])
    return error


def _megabytes(n_bytes: int) -> str:
    return f"{n_bytes / 1e6:.1f} MB"
