"""Run folders: the marker that proves addnorm wrote a run, and the lock of its one writer.

Provenance: the rules in ``addnorm.training.run_dir``'s docstring, checked on the folder's
contents before and after (what addnorm wrote goes, anything else stays), and real processes
(this one, a finished one) as the lock holders.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import time

import pytest
import torch

from addnorm.training.checkpoint import save_checkpoint
from addnorm.training.run_dir import (
    ABANDONED_EMPTY_LOCK_S,
    LOCK,
    MARKER,
    RunDirError,
    RunLock,
    _parse_lock,
    check_fresh_run_dir,
    check_unlocked,
    clear_run,
    read_marker,
    write_marker,
)


def tree(folder) -> dict[str, bytes | None]:
    """Every path under ``folder`` with its bytes (None for a folder)."""
    return {
        str(p.relative_to(folder)): None if p.is_dir() else p.read_bytes()
        for p in sorted(folder.rglob("*"))
    }


def fake_run(folder, task="translate"):
    """What a finished run leaves: marker, checkpoints, metrics, plots."""
    write_marker(folder, task)
    save_checkpoint(folder, 2, {"model": {"w": torch.zeros(2)}}, {"note": "weights"})
    (folder / "checkpoints" / ".tmp-step-00000003-x").mkdir()
    for name in ("metrics.jsonl", "metrics.json", "loss.png", "samples.png"):
        (folder / name).write_text(name)


def lock_record(pid: int, host: str | None = None, **extra) -> str:
    return json.dumps({"pid": pid, "host": host or socket.gethostname(), **extra})


def finished_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    done = subprocess.Popen(["true"])
    done.wait()
    return done.pid


def test_a_fresh_run_may_start_in_a_missing_or_empty_folder(tmp_path):
    check_fresh_run_dir(tmp_path / "missing", overwrite=False)
    check_fresh_run_dir(tmp_path, overwrite=False)
    (tmp_path / LOCK).write_text(lock_record(os.getpid()))  # its own lock does not count
    check_fresh_run_dir(tmp_path, overwrite=False)


@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("foreign", ["metrics.json", "checkpoints/", "notes.txt"])
def test_a_folder_addnorm_did_not_start_is_refused_naming_what_is_there(
    tmp_path, foreign, overwrite
):
    if foreign.endswith("/"):
        (tmp_path / foreign).mkdir()
    else:
        (tmp_path / foreign).write_text("mine")
    with pytest.raises(RunDirError, match=f"no {MARKER}.*holds {foreign}"):
        check_fresh_run_dir(tmp_path, overwrite=overwrite)


def test_a_marked_run_is_replaced_only_when_asked(tmp_path):
    fake_run(tmp_path)
    with pytest.raises(RunDirError, match="already holds an addnorm translate run"):
        check_fresh_run_dir(tmp_path, overwrite=False)
    check_fresh_run_dir(tmp_path, overwrite=True)


def test_a_marker_addnorm_did_not_write_proves_nothing(tmp_path):
    (tmp_path / MARKER).write_text('{"format": "something-else", "task": "translate"}')
    assert read_marker(tmp_path) is None
    with pytest.raises(RunDirError, match=f"holds {MARKER}"):
        check_fresh_run_dir(tmp_path, overwrite=True)


def test_clearing_a_run_deletes_its_own_files_and_nothing_else(tmp_path):
    fake_run(tmp_path)
    (tmp_path / "notes.txt").write_text("keep me")
    (tmp_path / "checkpoints" / "README").write_text("keep me too")
    clear_run(tmp_path)
    assert tree(tmp_path) == {
        "checkpoints": None,
        "checkpoints/README": b"keep me too",
        "notes.txt": b"keep me",
    }


def test_clearing_a_folder_without_marker_deletes_nothing(tmp_path):
    fake_run(tmp_path)
    (tmp_path / MARKER).unlink()
    before = tree(tmp_path)
    with pytest.raises(RunDirError, match="nothing was deleted"):
        clear_run(tmp_path)
    assert tree(tmp_path) == before


def test_the_lock_admits_one_writer_and_is_released_on_every_way_out(tmp_path):
    run = tmp_path / "run"
    with RunLock(run):
        holder = json.loads((run / LOCK).read_text())
        assert (holder["pid"], holder["host"]) == (os.getpid(), socket.gethostname())
        for attempt in (RunLock(run).acquire, lambda: check_unlocked(run)):
            with pytest.raises(RunDirError, match=f"pid {os.getpid()} on host "):
                attempt()
    assert not (run / LOCK).exists()
    with pytest.raises(InterruptedError), RunLock(run):
        raise InterruptedError
    assert not (run / LOCK).exists()


def test_a_lock_whose_process_is_gone_is_taken_over_with_a_warning(tmp_path, caplog):
    dead = finished_pid()
    (tmp_path / LOCK).write_text(lock_record(dead))
    check_unlocked(tmp_path)  # stale: no error
    with caplog.at_level(logging.WARNING), RunLock(tmp_path):
        assert json.loads((tmp_path / LOCK).read_text())["pid"] == os.getpid()
    assert f"pid {dead}" in caplog.text and "stale lock" in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs /proc")
def test_a_lock_whose_pid_now_runs_a_later_process_is_taken_over(tmp_path):
    # The pid is alive (this process), but it started at another time than the lock says.
    (tmp_path / LOCK).write_text(lock_record(os.getpid(), started="1"))
    with RunLock(tmp_path):
        pass


@pytest.mark.parametrize(
    ("record", "named"),
    [
        (lock_record(1, host="elsewhere.invalid"), "on host elsewhere.invalid"),
        ("", "empty or damaged"),
    ],
)
def test_a_lock_that_cannot_be_judged_stale_is_never_taken_over(tmp_path, record, named):
    (tmp_path / LOCK).write_text(record)
    with pytest.raises(RunDirError, match=named):
        RunLock(tmp_path).acquire()
    assert (tmp_path / LOCK).read_text() == record


def test_an_empty_lock_left_by_a_writer_killed_before_its_record_is_taken_over(tmp_path):
    # SIGKILL between O_EXCL creation and the write leaves an empty file; a live writer fills
    # it within microseconds, so one older than the grace period was abandoned.
    lock = tmp_path / LOCK
    lock.write_text("")
    old = time.time() - ABANDONED_EMPTY_LOCK_S - 5
    os.utime(lock, (old, old))
    check_unlocked(tmp_path)
    with RunLock(tmp_path):
        assert _parse_lock(lock.read_text())["pid"] == os.getpid()
    assert not lock.exists()
