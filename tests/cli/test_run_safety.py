"""``addnorm train`` and ``addnorm demo`` never lose a user's files or finished work.

Provenance: the folder's contents before and after (a refused command changes nothing; a
replaced run loses only its own files), real processes (this process or a finished one as
the lock holder), a real full filesystem (a small tmpfs, where the machine allows mounting
one) and the exit codes ``addnorm.cli.parser`` documents: 2 for an unusable folder, 1 for a
failed write. A run stopped by SIGTERM (143) or Ctrl-C (130): test_exits.py.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import socket
import subprocess

import pytest
from cli_runs import TINY

from addnorm.cli.parser import main
from addnorm.tasks.translate import TranslateTask
from addnorm.training.checkpoint import load_checkpoint
from addnorm.training.run_dir import LOCK, MARKER, RunLock


def train(out, *flags: str) -> int:
    return main(["train", "translate", *TINY, "--out", str(out), *flags])


def tree(folder) -> dict[str, bytes | None]:
    """Every path under ``folder`` with its bytes (None for a folder)."""
    return {
        str(p.relative_to(folder)): None if p.is_dir() else p.read_bytes()
        for p in sorted(folder.rglob("*"))
    }


@pytest.fixture
def quick_eval(monkeypatch):
    """Skip the held-out scoring (seconds of decoding on a busy CPU; not what is tested)."""
    scores = {"test_exact_match": 0.0}
    monkeypatch.setattr(TranslateTask, "evaluate_run", lambda self, model, cfg: scores)
    monkeypatch.setattr(TranslateTask, "run_samples", lambda self, model: [])


@pytest.mark.parametrize("command", [["train", "translate"], ["demo", "--no-dit"]])
def test_an_empty_out_is_refused_instead_of_meaning_the_current_folder(
    command, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "mine.txt").write_text("mine")
    assert main([*command, "--out", ""]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "--out" in err[0] and "empty" in err[0]
    assert tree(tmp_path) == {"checkpoints": None, "checkpoints/mine.txt": b"mine"}


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
@pytest.mark.parametrize("foreign", ["metrics.json", "checkpoints"])
def test_a_folder_with_foreign_run_files_is_refused_and_left_untouched(
    foreign, overwrite, tmp_path, capsys
):
    if foreign == "checkpoints":
        (tmp_path / "checkpoints" / "step-00000001").mkdir(parents=True)
        (tmp_path / "checkpoints" / "step-00000001" / "weights.bin").write_bytes(b"\0" * 8)
    else:
        (tmp_path / foreign).write_text('{"accuracy": 0.99}')
    before = tree(tmp_path)
    assert train(tmp_path, *overwrite) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and foreign in err[0] and MARKER in err[0], err
    assert tree(tmp_path) == before


def test_the_demo_refuses_a_foreign_folder_before_any_training(tmp_path, capsys):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "loss.png").write_bytes(b"my plot")
    translate_out = tmp_path / "translate"
    argv = ["demo", "--out", str(translate_out), "--dit-out", str(foreign), "--quiet"]
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "loss.png" in err[0] and str(foreign) in err[0]
    assert not translate_out.exists()  # refused before the translator trained
    assert tree(foreign) == {"loss.png": b"my plot"}


def test_overwrite_replaces_only_the_runs_own_files(tmp_path, quick_eval, capsys):
    out = tmp_path / "run"
    assert train(out, "--max-steps", "2", "--checkpoint-every", "1") == 0
    assert json.loads((out / MARKER).read_text())["task"] == "translate"
    (out / "notes.txt").write_text("keep me")
    assert train(out, "--max-steps", "1") == 2  # a run is there: --resume or --overwrite
    assert "--overwrite" in capsys.readouterr().err
    assert train(out, "--max-steps", "1", "--overwrite") == 0
    assert (out / "notes.txt").read_text() == "keep me"
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-00000001"]
    assert sorted(p.name for p in out.iterdir()) == [
        MARKER, "checkpoints", "loss.png", "metrics.json", "metrics.jsonl", "notes.txt"
    ]


def test_a_second_writer_exits_2_naming_the_holder(tmp_path, capsys):
    out = tmp_path / "run"
    with RunLock(out):  # held by this (live) process, as by a training in progress
        for flags in ([], ["--resume"], ["--overwrite"]):
            argv = ["train", "translate", "--out", str(out), "--quiet", *flags]
            assert main(argv) == 2
            err = capsys.readouterr().err.splitlines()
            assert len(err) == 1 and "in use by another addnorm run" in err[0]
            assert f"pid {os.getpid()} on host {socket.gethostname()}" in err[0]
        assert sorted(p.name for p in out.iterdir()) == [LOCK]


def test_a_stale_lock_is_taken_over_with_a_note(tmp_path, quick_eval, caplog):
    finished = subprocess.Popen(["true"])
    finished.wait()
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK).write_text(json.dumps({"pid": finished.pid, "host": socket.gethostname()}))
    assert train(out, "--max-steps", "1") == 0
    assert f"pid {finished.pid}" in caplog.text and "stale lock" in caplog.text
    assert not (out / LOCK).exists()


def test_a_run_from_before_markers_can_be_resumed_but_not_replaced(tmp_path, quick_eval, capsys):
    out = tmp_path / "run"
    assert train(out, "--max-steps", "1") == 0
    (out / MARKER).unlink()
    before = tree(out)
    assert train(out, "--max-steps", "1", "--overwrite") == 2
    assert "no addnorm-run.json" in capsys.readouterr().err
    assert tree(out) == before
    assert main(["train", "translate", "--resume", "--out", str(out), "--max-steps", "2"]) == 0
    assert load_checkpoint(out).step == 2 and (out / MARKER).exists()


@pytest.fixture
def one_mib_tmpfs(tmp_path):
    """A 1 MiB tmpfs (needs root and mount; skipped where the machine does not allow it)."""
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    command = ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount_point)]
    if shutil.which("mount") is None or subprocess.run(command, capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root and mount); see the ENOSPC test below")
    yield mount_point
    gc.collect()  # loaded tensors map their files; -l detaches the mount even if one is left
    subprocess.run(["umount", "-l", str(mount_point)], check=True)


def assert_clean_write_failure(out, err: str, step: int) -> None:
    """One error line naming the checkpoint and its size; the earlier checkpoints intact."""
    lines = err.splitlines()
    assert lines[-1].startswith("addnorm train: error: cannot write checkpoint"), err
    assert f"step-{step:08d}" in lines[-1] and "needs about" in lines[-1]
    assert "No space left on device" in lines[-1] and "Traceback" not in err
    assert load_checkpoint(out).step == step - 1
    assert not any(p.name.startswith(".tmp") for p in (out / "checkpoints").iterdir())
    assert not (out / LOCK).exists()


def test_a_full_disk_exits_1_with_one_line_and_keeps_the_checkpoints(one_mib_tmpfs, capsys):
    # A checkpoint of this model is about 0.37 MB: two fit in 1 MiB, the third does not.
    out = one_mib_tmpfs / "run"
    assert train(out, "--max-steps", "50", "--checkpoint-every", "1") == 1
    assert_clean_write_failure(out, capsys.readouterr().err, step=3)
    assert load_checkpoint(out / "checkpoints" / "step-00000001").step == 1


def test_a_simulated_enospc_exits_1_with_one_line(tmp_path, monkeypatch, capsys):
    from safetensors import SafetensorError

    import addnorm.training.checkpoint as checkpoint_module

    real_save_file = checkpoint_module.save_file

    def full_at_step_2(tensors, path):
        if ".tmp-step-00000002" in str(path):
            raise SafetensorError(
                "Error while serializing: I/O error: No space left on device (os error 28)"
            )
        real_save_file(tensors, path)

    monkeypatch.setattr(checkpoint_module, "save_file", full_at_step_2)
    out = tmp_path / "run"
    assert train(out, "--max-steps", "50", "--checkpoint-every", "1") == 1
    assert_clean_write_failure(out, capsys.readouterr().err, step=2)
