"""Files a run or a command writes for people (figures, sample grids, ONNX exports, arrays),
published whole: a reader, or a later run, finds the previous good file or the new one,
never a torn one, and a link at the destination is replaced, not written through.

:func:`publishing` stages the file in a new private folder beside the destination, under the
destination's own name (so a writer that picks the format from the suffix, or that writes
companion files named after it, as ONNX's external data, works unchanged); when the block
ends without an error every staged file is fsynced and renamed into the destination's folder
(companions first, the named file last), replacing whatever was there (a symlink included:
the link is replaced, its target left as it was), and the folder's entry is fsynced. When
the block raises (a full disk, ``ulimit -f``, a failing encoder, Ctrl-C) the staging folder
is removed and the destination is untouched; a staging folder a killed process left (its
name holds the process id) is removed by the next publish of the same file.
:func:`save_figure` is ``fig.savefig`` through it.

:func:`addnorm.utils.files.write_file_atomic` does the same for the small JSON files a run
keeps; this module is for the larger files whose writers want a path of their own.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["publishing", "save_figure"]


@contextlib.contextmanager
def publishing(path: str | os.PathLike) -> Iterator[Path]:
    """Yield the path to write ``path``'s content to (see the module docstring); publish it
    when the block ends, or leave ``path`` untouched when the block raises."""
    path = Path(path)
    _remove_dead_stages(path)
    stage = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-{os.getpid()}-", dir=path.parent))
    try:
        staged = stage / path.name
        yield staged
        if not staged.is_file():
            raise FileNotFoundError(f"{path}: the writer wrote nothing")
        companions = sorted(p for p in stage.iterdir() if p.name != path.name)
        for file in [*companions, staged]:
            _fsync(file)
        for file in [*companions, staged]:
            os.replace(file, path.parent / file.name)
        _fsync_folder(path.parent)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def save_figure(fig: Any, path: str | os.PathLike, *, dpi: float) -> Path:
    """``fig.savefig(path, dpi=dpi)`` published whole (:func:`publishing`); returns ``path``
    as a Path."""
    path = Path(path)
    with publishing(path) as staged:
        fig.savefig(staged, dpi=dpi)
    return path


def _remove_dead_stages(path: Path) -> None:
    """Remove the staging folders of ``path`` whose process is gone (a kill -9 mid-write)."""
    prefix = f".{path.name}.tmp-"
    with contextlib.suppress(OSError):
        for entry in os.scandir(path.parent):
            pid = entry.name[len(prefix):].split("-", 1)[0]
            if entry.name.startswith(prefix) and pid.isdigit() and not _alive(int(pid)) and (
                entry.is_dir(follow_symlinks=False)
            ):
                shutil.rmtree(entry.path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def _fsync(file: Path) -> None:
    with open(file, "rb") as f:
        os.fsync(f.fileno())


def _fsync_folder(folder: Path) -> None:
    """fsync a folder's entry, so a rename in it survives a crash (POSIX; elsewhere a folder
    cannot be opened, and nothing is done)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
