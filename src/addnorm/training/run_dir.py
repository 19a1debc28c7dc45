"""Run folders: the marker that proves addnorm wrote a run, and the lock of its one writer.

A run folder (``addnorm train --out``, the demo's ``runs/translate`` and ``runs/dit``) gets
``addnorm-run.json`` when a run starts: ``{"format": "addnorm-run", "version": 1, "task":
...}``. The marker is addnorm's proof that the run files beside it are its own, so:

- a fresh run starts only in a missing or empty folder, or in one with the marker (replacing
  that run only when asked to, ``overwrite=True``); any other folder is refused, naming what
  is in it;
- replacing a run deletes only addnorm's own files (``RUN_FILES`` and the marker; in
  ``checkpoints/`` only checkpoint directories, in ``tensorboard/`` only event files).
  Anything else in the folder stays.

While a run writes, ``addnorm-run.lock`` holds the writer's pid, host and process start time.
It is created with ``O_CREAT | O_EXCL``, so of two writers exactly one gets it; the other gets
``RunDirError`` naming the holder. A lock whose process is gone (its pid no longer runs on
this host, or now runs a later process, or is no pid a process can have: not an int from 1 to
2**31 - 1) is taken over, with a warning logged (which reaches stderr when the application
has not configured logging). So is an empty lock file older than ``ABANDONED_EMPTY_LOCK_S``: a
writer killed between creating the file and writing its record (microseconds apart) leaves
one. Two kinds of lock are never taken over, and the error says how to clear them:

- a lock naming another host: from here addnorm cannot tell whether that process still runs
  (a container that was killed leaves one behind, and the next container has another host
  name). If no run writes to the folder any more, delete the lock file and start again.
- a damaged lock (not empty, yet not a record addnorm writes): someone else's file. Delete
  it after checking that no addnorm run writes there.

A lock file (like the marker) is read only if it is a regular file of at most
``MAX_LOCK_BYTES``; anything else there is refused, naming the file to delete.
``RunLock(run_dir, reentrant=True)`` (the ``addnorm train`` command's, taken before it says
anything) lets a nested ``RunLock`` of the same folder in this process pass through while it
is held; a plain ``RunLock`` never does, so one process cannot write a folder twice.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import socket
from pathlib import Path
from typing import TypeGuard

from addnorm.training.checkpoint import delete_checkpoints
from addnorm.utils.files import UnsafeFileError, read_bytes, write_file_atomic

__all__ = [
    "ABANDONED_EMPTY_LOCK_S",
    "LOCK",
    "MARKER",
    "MAX_LOCK_BYTES",
    "RUN_FILES",
    "RunDirError",
    "TENSORBOARD_DIR",
    "RunLock",
    "check_fresh_run_dir",
    "check_unlocked",
    "clear_run",
    "read_marker",
    "write_marker",
]

MARKER = "addnorm-run.json"
LOCK = "addnorm-run.lock"
ABANDONED_EMPTY_LOCK_S = 10.0
MAX_LOCK_BYTES = 4096  # a record is about 120 bytes; a larger file is damaged
_MAX_MARKER_BYTES = 4096  # a marker is about 60 bytes
_MAX_PID = 2**31 - 1  # pid_t is a signed 32-bit int
# Lock files held by a RunLock(reentrant=True) of this process: resolved path -> record.
_LENT: dict[Path, str] = {}
# What a run writes besides the marker (samples.png: the dit demo's grid; watch.*: --watch),
# and the folder of its TensorBoard event files (of which only ``events.out.tfevents.*`` files
# are deleted).
RUN_FILES = (
    "checkpoints", "metrics.jsonl", "metrics.json", "loss.png", "samples.png", "quality.png",
    "watch.jsonl", "watch.png",
)
TENSORBOARD_DIR = "tensorboard"
_EVENTS_PREFIX = "events.out.tfevents."
_FORMAT = "addnorm-run"
_VERSION = 1
_log = logging.getLogger(__name__)


class RunDirError(Exception):
    """A run folder cannot be used as asked: it holds files addnorm did not write, another
    run, or another writer's lock. The message names the folder and what is in the way."""


def read_marker(run_dir: str | os.PathLike) -> dict | None:
    """The run marker of ``run_dir`` (``{"format", "version", "task"}``), or None if it has
    none or the file there is not one addnorm wrote."""
    try:  # (a regular file, read bounded: never a FIFO's wait or /dev/zero's endless bytes)
        data = json.loads(read_bytes(Path(run_dir) / MARKER, max_bytes=_MAX_MARKER_BYTES))
    except (OSError, ValueError, RecursionError):  # (RecursionError: nested absurdly deep)
        return None
    ours = isinstance(data, dict) and data.get("format") == _FORMAT
    return data if ours and isinstance(data.get("task"), str) else None


def write_marker(run_dir: str | os.PathLike, task: str) -> None:
    """Mark ``run_dir`` as holding a run of ``task`` (written atomically)."""
    text = json.dumps({"format": _FORMAT, "version": _VERSION, "task": task}) + "\n"
    write_file_atomic(Path(run_dir) / MARKER, lambda tmp: tmp.write_text(text))


def check_fresh_run_dir(run_dir: str | os.PathLike, *, overwrite: bool) -> None:
    """Raise ``RunDirError`` unless a fresh run may start in ``run_dir``: it is missing or
    empty (a lock file aside), or it holds an addnorm run (its marker) and ``overwrite``."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        return
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir} exists and is not a folder")
    entries = sorted(
        p.name + ("/" if p.is_dir() else "") for p in run_dir.iterdir() if p.name != LOCK
    )
    if not entries:
        return
    marker = read_marker(run_dir)
    if marker is None:
        raise RunDirError(
            f"{run_dir} is not empty and holds no addnorm run (no {MARKER}): it holds "
            f"{_list(entries)}; addnorm starts a run only in a new or empty folder and never "
            "deletes files it did not write"
        )
    if not overwrite:
        raise RunDirError(
            f"{run_dir} already holds an addnorm {marker['task']} run; resume it, or "
            "overwrite it (which deletes only the run's own files)"
        )


def clear_run(run_dir: str | os.PathLike) -> None:
    """Delete the previous run in ``run_dir``: its checkpoints, metrics, plots and marker.
    Other files stay. Raises ``RunDirError`` if ``run_dir`` has no marker (then nothing there
    is provably addnorm's)."""
    run_dir = Path(run_dir)
    if read_marker(run_dir) is None:
        raise RunDirError(f"{run_dir} holds no addnorm run (no {MARKER}); nothing was deleted")
    delete_checkpoints(run_dir)
    for name in RUN_FILES:
        target = run_dir / name
        if target.is_symlink() or target.is_file():
            target.unlink()
    _remove_event_files(run_dir / TENSORBOARD_DIR)
    (run_dir / MARKER).unlink()  # last: a clear cut short can be finished by the next run


def _remove_event_files(folder: Path) -> None:
    """Delete the TensorBoard event files in ``folder`` (regular files named
    ``events.out.tfevents.*``), then ``folder`` if that empties it; anything else stays."""
    if folder.is_symlink() or not folder.is_dir():
        return
    for child in folder.iterdir():
        if child.name.startswith(_EVENTS_PREFIX) and child.is_file() and not child.is_symlink():
            child.unlink()
    with contextlib.suppress(OSError):  # not empty: someone else's files stay with it
        folder.rmdir()


def check_unlocked(run_dir: str | os.PathLike) -> None:
    """Raise ``RunDirError`` naming the holder if a live process holds ``run_dir``'s lock (a
    stale lock passes: taking the lock will take it over)."""
    path = Path(run_dir) / LOCK
    text = _read_lock(path)
    if text is None:
        return
    holder = _parse_lock(text)
    if not _is_taken_over(path, text, holder):
        raise RunDirError(_busy_message(path, holder))


class RunLock:
    """The exclusive lock of one run folder: ``with RunLock(run_dir): ...`` takes it (making
    the folder if needed) or raises ``RunDirError`` naming the holder, and gives it back on
    every way out of the block. With ``reentrant=True``, a nested ``RunLock`` of the same
    folder in this process passes through (holding nothing) while this one is held."""

    def __init__(self, run_dir: str | os.PathLike, *, reentrant: bool = False) -> None:
        self.path = Path(run_dir) / LOCK
        self.reentrant = reentrant
        self._text: str | None = None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()

    def acquire(self) -> None:
        """Create the lock file, taking over a stale one; raise ``RunDirError`` if it is held."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lent = _LENT.get(self.path.resolve())
        if lent is not None and _read_lock(self.path) == lent:
            return  # held by an enclosing reentrant lock of this process
        text = json.dumps(_holder_record())
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self._take_over_if_stale()
                continue
            try:
                os.write(fd, text.encode("utf-8"))
            finally:
                os.close(fd)
            self._text = text
            if self.reentrant:
                _LENT[self.path.resolve()] = text
            return
        raise RunDirError(_busy_message(self.path, None))

    def release(self) -> None:
        """Remove the lock file if this lock still holds it."""
        if self._text is None:
            return
        if self.reentrant:
            _LENT.pop(self.path.resolve(), None)
        try:
            if _read_lock(self.path) == self._text:
                self.path.unlink()
        except (OSError, RunDirError):  # replaced meanwhile: not ours to remove
            pass
        self._text = None

    def _take_over_if_stale(self) -> None:
        """Remove the existing lock file if its holder is gone, else raise ``RunDirError``."""
        text = _read_lock(self.path)
        if text is None:  # released meanwhile: try again
            return
        holder = _parse_lock(text)
        if not _is_taken_over(self.path, text, holder):
            raise RunDirError(_busy_message(self.path, holder))
        aside = self.path.with_name(f"{LOCK}.stale-{os.getpid()}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:  # another process took it over first
            return
        if _read_lock(aside) != text:  # a fresh lock, taken meanwhile
            os.rename(aside, self.path)
            raise RunDirError(_busy_message(self.path, _parse_lock(_read_lock(self.path) or "")))
        aside.unlink()
        if holder is None:
            _log.warning("addnorm: took over the abandoned empty lock %s", self.path)
            return
        _log.warning(
            "addnorm: took over the stale lock %s (pid %s on %s, since %s, %s)",
            self.path, _shown(holder.get("pid")), _shown(holder["host"]),
            _shown(holder.get("since", "?")),
            "is no longer running" if _valid_pid(holder.get("pid")) else "names no process",
        )


def _read_lock(path: Path) -> str | None:
    """The text of the lock file ``path`` (undecodable bytes replaced), or None if there is
    none; ``RunDirError`` if it cannot be read, or is not a regular file of at most
    ``MAX_LOCK_BYTES`` (a folder, a FIFO, /dev/zero: never waited on or read whole)."""
    try:
        data = read_bytes(path, max_bytes=MAX_LOCK_BYTES, what="the lock file")
    except FileNotFoundError:
        return None
    except UnsafeFileError as err:
        raise RunDirError(
            f"{err}; if no addnorm run writes to {path.parent}, delete it and try again"
        ) from None
    except OSError as err:
        raise RunDirError(f"cannot read the lock file {path}: {err.strerror or err}") from None
    return data.decode("utf-8", errors="replace")


def _holder_record() -> dict:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": _process_start(os.getpid()),
        "since": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


def _parse_lock(text: str) -> dict | None:
    """The holder a lock file names (a JSON object with a string ``host``; its ``pid`` is
    judged by ``_is_stale``), or None if it is not a lock record (empty or damaged)."""
    if len(text) > MAX_LOCK_BYTES:
        return None
    try:
        holder = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if isinstance(holder, dict) and "pid" in holder and isinstance(holder.get("host"), str):
        return holder
    return None


def _valid_pid(pid: object) -> TypeGuard[int]:
    """Whether ``pid`` is one a process can have (an int from 1 to 2**31 - 1)."""
    return type(pid) is int and 0 < pid <= _MAX_PID


def _is_taken_over(path: Path, text: str, holder: dict | None) -> bool:
    """Whether a lock may be taken over: its holder is gone, or it is an empty file older than
    ``ABANDONED_EMPTY_LOCK_S`` (its writer died before writing its record)."""
    if holder is not None:
        return _is_stale(holder)
    if text:
        return False  # damaged, not merely unwritten: someone else's file
    try:
        age = dt.datetime.now().timestamp() - path.stat().st_mtime
    except FileNotFoundError:
        return False
    return age > ABANDONED_EMPTY_LOCK_S


def _is_stale(holder: dict) -> bool:
    """Whether the lock's process is gone: same host, and its pid is no pid a process can
    have, is not running, or now runs a process started at another time (pid reuse)."""
    if holder["host"] != socket.gethostname():
        return False  # cannot tell: assume it runs
    pid = holder.get("pid")
    if not _valid_pid(pid):
        return True  # no process here has it: no addnorm wrote it, none holds it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # runs, as another user
        pass
    started = _process_start(pid)
    if started == "zombie":
        return True
    return started is not None and holder.get("started") not in (None, started)


def _process_start(pid: int) -> str | None:
    """When ``pid`` started (clock ticks since boot, from /proc), "zombie" for a process that
    has exited but not been reaped, or None where /proc cannot tell."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # from field 3 (state) on
    return "zombie" if fields[0] in ("Z", "X") else fields[19]  # field 22: starttime


def _busy_message(path: Path, holder: dict | None) -> str:
    """One line: the folder, who holds it, and how to clear a lock addnorm cannot judge."""
    if holder is None:
        return (
            f"{path.parent} cannot be used: its lock file {path} is empty or damaged (not a "
            "lock record addnorm writes); if no addnorm run writes there, delete "
            f"{path} and try again"
        )
    who = (
        f"pid {_shown(holder.get('pid'))} on host {_shown(holder['host'])}, since "
        f"{_shown(holder.get('since', '?'))}"
    )
    if holder["host"] != socket.gethostname():
        return (
            f"{path.parent} is in use by another addnorm run ({who}; addnorm cannot check a "
            f"process on another host); wait for it to end or choose another folder; if no "
            f"run writes there any more (e.g. its container was stopped), delete {path} and "
            "try again"
        )
    return (
        f"{path.parent} is in use by another addnorm run ({who}; lock file {path}); wait for "
        "it to end or choose another folder"
    )


def _shown(value: object, limit: int = 64) -> str:
    """A lock record's value for a one-line message: at most ``limit`` characters, quoted
    when it holds characters that are not printable (a newline would break the line)."""
    text = value if isinstance(value, str) else json.dumps(value)
    if len(text) > limit:
        text = text[:limit] + "..."
    return text if text.isprintable() else repr(text)


def _list(names: list[str], limit: int = 6) -> str:
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown} and {len(names) - limit} more"
