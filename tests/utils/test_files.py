"""Reading files a user or a checkpoint hands in without trusting them, and writing atomically.

Provenance: json.loads and the safetensors library are the oracles of what a well-formed file
holds; a FIFO or a directory is refused from its stat, before anything is opened.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from addnorm.utils.files import (
    MAX_JSON_DEPTH,
    UnsafeFileError,
    parse_json,
    read_bytes,
    read_safetensors_header,
    read_text,
    regular_file_size,
    write_file_atomic,
)


def test_parse_json_refuses_nesting_past_the_limit_and_equals_json_loads_below_it():
    ok = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert parse_json(ok) == json.loads(ok)
    for depth in (MAX_JSON_DEPTH + 1, 1_000_000):
        with pytest.raises(ValueError, match="nested deeper"):
            parse_json('{"a": ' * depth + "1" + "}" * depth)
    with pytest.raises(json.JSONDecodeError):
        parse_json("{")


def test_the_header_reader_agrees_with_safetensors_on_the_files_it_writes(tmp_path):
    tensors = {"w": torch.randn(3, 4), "half": torch.zeros(2, dtype=torch.bfloat16),
               "scalar": torch.tensor(7, dtype=torch.int64), "empty": torch.zeros(0, 5),
               "flags": torch.ones(4, dtype=torch.bool)}
    path = tmp_path / "t.safetensors"
    save_file(tensors, path, metadata={"format": "pt"})
    found = read_safetensors_header(path)
    with safe_open(path, framework="pt") as f:
        names = list(f.keys())
        reference = {k: (list(f.get_slice(k).get_shape()), f.get_tensor(k).dtype) for k in names}
    assert {k: (list(v.shape), v.dtype) for k, v in found.items()} == reference
    assert found["w"].numel == 12 and found["scalar"].shape == ()


def test_a_fifo_or_a_directory_is_refused_from_its_stat_and_a_file_over_its_limit_unread(
    tmp_path,
):
    os.mkfifo(tmp_path / "pipe")  # opening it for reading would block: stat refuses it first
    with pytest.raises(UnsafeFileError, match="pipe: must be a regular file, but it is a FIFO"):
        read_bytes(tmp_path / "pipe", max_bytes=10)
    with pytest.raises(UnsafeFileError, match="but it is a directory"):
        regular_file_size(tmp_path)
    (tmp_path / "link").symlink_to(tmp_path / "nothing")
    with pytest.raises(UnsafeFileError, match="a symlink to .*nothing, which does not exist"):
        regular_file_size(tmp_path / "link")
    with pytest.raises(FileNotFoundError):
        regular_file_size(tmp_path / "absent")
    (tmp_path / "big").write_bytes(b"x" * 11)
    assert regular_file_size(tmp_path / "big") == 11
    with pytest.raises(UnsafeFileError, match="has 11 bytes, more than the 10 it may have"):
        read_bytes(tmp_path / "big", max_bytes=10)
    assert read_text(tmp_path / "big", max_bytes=11) == "x" * 11
    (tmp_path / "latin").write_bytes(b"\xff")
    with pytest.raises(UnsafeFileError, match="not UTF-8 text"):
        read_text(tmp_path / "latin", max_bytes=10)


def test_an_atomic_write_replaces_the_file_or_leaves_the_old_one_and_no_temporary(tmp_path):
    path = tmp_path / "state.json"
    write_file_atomic(path, lambda tmp: tmp.write_text("old"))
    assert path.read_text() == "old"

    def torn(tmp: Path) -> None:
        tmp.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_file_atomic(path, torn)
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == [
        "state.json"]
    write_file_atomic(path, lambda tmp: tmp.write_text("new"))
    assert path.read_text() == "new"
