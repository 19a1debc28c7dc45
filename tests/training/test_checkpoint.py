"""Checkpoints: round trips, atomic writes, and clear errors for damaged files.

Provenance: identities (what is saved is what is loaded) and the documented on-disk layout.
"""

from __future__ import annotations

import errno
import gc
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch

import addnorm.training.checkpoint as checkpoint_module
from addnorm.training.checkpoint import (
    CheckpointWriteError,
    delete_checkpoints,
    find_checkpoint,
    list_checkpoints,
    load_checkpoint,
    read_checkpoint_state,
    save_checkpoint,
)
from addnorm.utils.files import CheckpointError


def write(run_dir, step, value=0.0, keep=3):
    tensors = {"model": {"w": torch.full((2, 3), value), "step0d": torch.tensor(value)}}
    return save_checkpoint(run_dir, step, tensors, {"note": f"step {step}"}, keep=keep)


def test_saved_tensors_and_state_load_back_unchanged(tmp_path):
    path = write(tmp_path, 5, value=1.5)
    loaded = load_checkpoint(tmp_path)
    assert loaded.path == path and loaded.step == 5
    assert loaded.state == {"note": "step 5"}
    assert torch.equal(loaded.tensors["model"]["w"], torch.full((2, 3), 1.5))
    assert torch.equal(loaded.tensors["model"]["step0d"], torch.tensor(1.5))


def test_a_checkpoint_holds_only_safetensors_and_json(tmp_path):
    # Loading never unpickles: there is no file a pickle loader could be pointed at.
    path = write(tmp_path, 1)
    suffixes = {p.suffix for p in path.iterdir()}
    assert suffixes == {".safetensors", ".json"}


def test_the_newest_checkpoints_are_kept_and_found(tmp_path):
    for step in (10, 20, 30, 40):
        write(tmp_path, step, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000030", "step-00000040"]
    assert find_checkpoint(tmp_path).name == "step-00000040"


def test_a_write_killed_halfway_leaves_the_previous_checkpoint_loadable(tmp_path, monkeypatch):
    write(tmp_path, 10, value=1.0)
    real_write_json = checkpoint_module.write_json

    def dies_at_the_manifest(path, data):
        if path.name == checkpoint_module.MANIFEST:
            raise OSError("disk full (simulated)")
        real_write_json(path, data)

    monkeypatch.setattr(checkpoint_module, "write_json", dies_at_the_manifest)
    with pytest.raises(OSError, match="simulated"):
        write(tmp_path, 20, value=2.0)
    loaded = load_checkpoint(tmp_path)
    assert loaded.step == 10
    assert torch.equal(loaded.tensors["model"]["w"], torch.full((2, 3), 1.0))
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-00000010"]


def test_missing_directory_is_named(tmp_path):
    with pytest.raises(CheckpointError, match="nowhere"):
        load_checkpoint(tmp_path / "nowhere")


def test_run_directory_without_checkpoints_is_named(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint in"):
        load_checkpoint(tmp_path)


def test_truncated_safetensors_names_the_file(tmp_path):
    path = write(tmp_path, 1)
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:20])
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize("name", ["manifest.json", "state.json"])
def test_corrupt_json_names_the_file(tmp_path, name):
    path = write(tmp_path, 1)
    (path / name).write_text("{not json")
    with pytest.raises(CheckpointError, match=name):
        load_checkpoint(path)


def test_a_missing_file_is_named(tmp_path):
    path = write(tmp_path, 1)
    (path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="missing.*model.safetensors"):
        load_checkpoint(path)


def rewrite_manifest(path, change):
    manifest_path = path / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    change(manifest)
    manifest_path.write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    "change",
    [
        lambda m: m.pop("step"),
        lambda m: m.update(step="5"),
        lambda m: m.update(step=-1),
        lambda m: m.update(files=[]),
        lambda m: m["files"].update({"state.json": {"bytes": "12"}}),
        lambda m: m["files"].update({"../elsewhere.json": m["files"]["state.json"]}),
        lambda m: m["files"].pop("state.json"),
        lambda m: m.update(format="something-else"),
    ],
    ids=[
        "no-step",
        "str-step",
        "negative-step",
        "files-list",
        "bad-entry",
        "path-in-name",
        "no-state",
        "format",
    ],
)
def test_a_malformed_manifest_names_manifest_json(tmp_path, change):
    path = write(tmp_path, 1)
    rewrite_manifest(path, change)
    with pytest.raises(CheckpointError, match="manifest.json"):
        load_checkpoint(path)


def test_best_checkpoints_are_kept_apart_never_pruned_and_deleted_with_the_run(tmp_path):
    tensors = {"model": {"w": torch.zeros(2)}}
    best = save_checkpoint(tmp_path, 5, tensors, {"best": {"step": 5}}, kind="best")
    for step in (10, 20, 30):
        write(tmp_path, step, keep=1)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000030"]
    assert list_checkpoints(tmp_path, kind="best") == [best]  # keep does not touch it
    assert find_checkpoint(tmp_path).name == "step-00000030"  # a run's newest is a step's
    assert load_checkpoint(best).step == 5 and read_checkpoint_state(best) == {
        "best": {"step": 5}}
    manifest = json.loads((best / "manifest.json").read_text())
    assert manifest["kind"] == "best"
    assert "kind" not in json.loads(
        (tmp_path / "checkpoints" / "step-00000030" / "manifest.json").read_text())
    (tmp_path / "checkpoints" / ".tmp-best-00000007-abc").mkdir()  # a killed write's leftover
    delete_checkpoints(tmp_path)
    assert not (tmp_path / "checkpoints").exists()


KILLED_WRITER = """
import os, signal, sys, torch
import addnorm.training.checkpoint as ck
real = ck.write_json
def die_at_the_manifest(path, data):
    if path.name == ck.MANIFEST:
        os.kill(os.getpid(), signal.SIGKILL)
    real(path, data)
ck.write_json = die_at_the_manifest
ck.save_checkpoint(sys.argv[1], 20, {"model": {"w": torch.full((2, 3), 2.0)}}, {"note": "x"})
"""


def test_a_writer_killed_by_sigkill_leaves_the_previous_checkpoint_loadable(tmp_path):
    write(tmp_path, 10, value=1.0)
    done = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER, str(tmp_path)], timeout=60, check=False
    )
    assert done.returncode == -signal.SIGKILL
    root = tmp_path / "checkpoints"
    assert any(p.name.startswith(".tmp-step-00000020") for p in root.iterdir())
    assert load_checkpoint(tmp_path).step == 10
    write(tmp_path, 30, value=3.0)  # the next save clears the leftover
    assert sorted(p.name for p in root.iterdir()) == ["step-00000010", "step-00000030"]


def test_a_failed_write_removes_its_temporary_directory_and_names_the_space_needed(
    tmp_path, monkeypatch
):
    write(tmp_path, 10, value=1.0)

    def disk_full(tensors, path):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(checkpoint_module, "save_file", disk_full)
    with pytest.raises(CheckpointWriteError) as caught:
        write(tmp_path, 20, value=2.0)
    message = str(caught.value)
    # The tensors of ``write``: 6 + 1 float32 values.
    assert "step-00000020" in message and "No space left on device" in message
    assert f"needs about {7 * 4 / 1e6:.1f} MB" in message and "MB free" in message
    assert caught.value.errno == errno.ENOSPC and isinstance(caught.value, CheckpointError)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-00000010"]
    assert load_checkpoint(tmp_path).step == 10


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 256 KiB tmpfs (needs root and mount; skipped where the machine does not allow it)."""
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    command = ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount_point)]
    if shutil.which("mount") is None or subprocess.run(command, capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root and mount); ENOSPC is simulated above")
    yield mount_point
    gc.collect()  # loaded tensors map their files; -l detaches the mount even if one is left
    subprocess.run(["umount", "-l", str(mount_point)], check=True)


def test_a_full_disk_keeps_the_previous_checkpoints(small_tmpfs):
    def big(step):  # 80 KB of float32, so two fit in 256 KiB and a third does not
        tensors = {"model": {"w": torch.full((20_000,), float(step))}}
        return save_checkpoint(small_tmpfs, step, tensors, {"note": step}, keep=3)

    big(1)
    big(2)
    with pytest.raises(CheckpointWriteError, match="No space left on device") as caught:
        big(3)
    assert caught.value.errno == errno.ENOSPC and "step-00000003" in str(caught.value)
    root = small_tmpfs / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["step-00000001", "step-00000002"]
    loaded = load_checkpoint(small_tmpfs)
    assert loaded.step == 2
    assert torch.equal(loaded.tensors["model"]["w"], torch.full((20_000,), 2.0))


