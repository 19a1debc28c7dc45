"""A checkpoint directory on disk (``addnorm.training.checkpoint_dir``): a rewritten step
replaced whole, a file altered in place caught by its hash, leftovers of killed writes removed,
and only what addnorm wrote deleted (a pruned checkpoint set aside first).

Provenance: identities (what was saved last is what loads) and the documented on-disk layout.
"""

from __future__ import annotations

import shutil

import pytest
import torch

import addnorm.training.checkpoint_dir as checkpoint_dir
from addnorm.training.checkpoint import (
    delete_checkpoints,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from addnorm.utils.files import CheckpointError


def write(run_dir, step, value=0.0, keep=3):
    tensors = {"model": {"w": torch.full((2, 3), value), "step0d": torch.tensor(value)}}
    return save_checkpoint(run_dir, step, tensors, {"note": f"step {step}"}, keep=keep)


def test_rewriting_the_same_step_replaces_it(tmp_path):
    write(tmp_path, 10, value=1.0)
    write(tmp_path, 10, value=3.0)
    assert torch.equal(load_checkpoint(tmp_path).tensors["model"]["w"], torch.full((2, 3), 3.0))


def test_a_file_altered_in_place_fails_its_hash(tmp_path):
    path = write(tmp_path, 1)
    state = path / "state.json"
    text = state.read_text()
    state.write_text(text.replace("step 1", "step 9"))  # same size, different bytes
    with pytest.raises(CheckpointError, match="sha256"):
        load_checkpoint(path)


def test_leftovers_of_killed_writes_are_removed_by_the_next_save(tmp_path):
    write(tmp_path, 10, value=1.0)
    root = tmp_path / "checkpoints"
    (root / ".tmp-step-00000020-abc").mkdir()
    (root / ".tmp-step-00000020-abc" / "model.safetensors").write_bytes(b"half")
    (root / ".old-step-00000010-123").mkdir()
    write(tmp_path, 20, value=2.0)
    assert sorted(p.name for p in root.iterdir()) == ["step-00000010", "step-00000020"]
    previous = load_checkpoint(root / "step-00000010")
    assert torch.equal(previous.tensors["model"]["w"], torch.full((2, 3), 1.0))


def test_a_best_folder_whose_manifest_is_no_best_checkpoints_is_left_alone(tmp_path):
    path = write(tmp_path, 5)
    mislabelled = tmp_path / "checkpoints" / "best-00000005"
    shutil.copytree(path, mislabelled)  # a step's manifest (no "kind") under a best's name
    delete_checkpoints(tmp_path)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["best-00000005"]
    with pytest.raises(ValueError, match="kind must be one of"):
        list_checkpoints(tmp_path, kind="newest")


def test_pruning_sets_the_checkpoint_aside_first_so_no_listed_checkpoint_is_incomplete(
    tmp_path, monkeypatch
):
    write(tmp_path, 10, keep=1)

    def killed_before_the_first_file(path):
        # Stands in for a kill during the deletion: the checkpoint (renamed first) is a hidden
        # leftover, its files all still there.
        assert path.name.startswith(".old-step-00000010-")
        assert (path / checkpoint_dir.MANIFEST).exists()
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(checkpoint_dir, "_remove_checkpoint_files", killed_before_the_first_file)
        with pytest.raises(KeyboardInterrupt):
            write(tmp_path, 20, keep=1)
    root = tmp_path / "checkpoints"
    leftovers = [p for p in root.iterdir() if p.name.startswith(".old-step-00000010-")]
    assert len(leftovers) == 1 and (leftovers[0] / "model.safetensors").exists()  # unlisted
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000020"]
    write(tmp_path, 30, keep=2)  # the next save removes the leftover
    assert sorted(p.name for p in root.iterdir()) == ["step-00000020", "step-00000030"]
