"""A sharded checkpoint (``torch.distributed.checkpoint`` shards written through
safetensors) read back whole, its manifest and shard headers checked, and nothing unpickled.

Provenance: identities (what is saved is what is loaded) and the documented on-disk layout.
(Saving and loading across world sizes under torchrun: tests/training/test_distributed.py.)
"""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from addnorm.training.checkpoint import load_checkpoint, save_checkpoint
from addnorm.training.checkpoint_shards import SHARD_FILE
from addnorm.utils.files import CheckpointError


def _sharded(tmp_path):
    """A sharded checkpoint written by this one process (one shard), and its tensors."""
    tensors = {"model": {"w": torch.arange(6.0).reshape(2, 3), "n": torch.tensor(3)},
               "optimizer": {"0.exp_avg": torch.ones(2, 3)}}
    path = save_checkpoint(tmp_path, 5, tensors, {"step": 5}, sharded=True)
    return path, tensors


def test_a_sharded_checkpoint_reads_back_whole_and_holds_no_pickle(tmp_path):
    path, tensors = _sharded(tmp_path)
    assert sorted(p.name for p in path.iterdir()) == [
        "manifest.json", "shard-00001-model-00001-of-00001.safetensors", "state.json"
    ]
    loaded = load_checkpoint(tmp_path)
    assert loaded.step == 5 and loaded.state == {"step": 5}
    assert sorted(loaded.tensors) == ["model", "optimizer"]
    for stem, group in tensors.items():
        for name, value in group.items():
            assert torch.equal(loaded.tensors[stem][name], value), (stem, name)


def test_a_sharded_manifest_without_shards_or_of_another_layout_is_refused(tmp_path):
    path, _ = _sharded(tmp_path)
    manifest = json.loads((path / "manifest.json").read_text())
    for changed, message in (
        ({**manifest, "layout": "zarr"}, "layout is 'zarr'"),
        ({**manifest, "files": {"state.json": manifest["files"]["state.json"]}},
         "lists no shard"),
    ):
        (path / "manifest.json").write_text(json.dumps(changed))
        with pytest.raises(CheckpointError, match=message):
            load_checkpoint(tmp_path)


def test_a_shard_whose_pieces_do_not_fill_its_tensor_is_refused_before_allocating(tmp_path):
    # A header (resealed in the manifest) that claims a piece far out in a huge tensor: the
    # whole tensor would take 8 TB; the pieces hold 6 values.
    from safetensors import safe_open
    from safetensors.torch import save_file

    path, _ = _sharded(tmp_path)
    shard = path / "shard-00001-model-00001-of-00001.safetensors"
    with safe_open(shard, "pt") as f:
        metadata = f.metadata()
        stored = {name: f.get_tensor(name) for name in f.keys()}
    info = json.loads(metadata["DCP_SHARDING_INFO"])
    info["model.w"]["saved_offsets"] = [10**12, 0]
    save_file(stored, shard, metadata={**metadata, "DCP_SHARDING_INFO": json.dumps(info)})
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"][shard.name] = {
        "bytes": shard.stat().st_size, "sha256": hashlib.sha256(shard.read_bytes()).hexdigest()
    }
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=r"pieces of 'model.w' \(6 values\) do not fill"):
        load_checkpoint(tmp_path)


def test_reading_a_sharded_checkpoint_unpickles_nothing(tmp_path, monkeypatch):
    import pickle

    _sharded(tmp_path)

    def refuse(*args, **kwargs):
        raise AssertionError("a checkpoint was unpickled")

    for module, name in ((pickle, "load"), (pickle, "loads"), (pickle, "Unpickler"),
                         (torch, "load")):
        monkeypatch.setattr(module, name, refuse)
    assert load_checkpoint(tmp_path).tensors["model"]["w"].shape == (2, 3)


def test_only_dcp_s_per_rank_shard_names_count_as_shards():
    assert SHARD_FILE.match("shard-00001-model-00001-of-00001.safetensors")
    assert SHARD_FILE.match("shard-00012-model-00001-of-00001.safetensors")
    for other in ("model.safetensors", "shard-1-model-1-of-1.safetensors",
                  "shard-00001-model-00001-of-00001.safetensors.tmp",
                  "../shard-00001-model-00001-of-00001.safetensors"):
        assert not SHARD_FILE.match(other), other
