"""The checks of the command's argument values that argparse cannot make
(``addnorm.cli.checks``): --out must be a directory path, a --device the machine lacks is
refused before a previous run is touched, a bad --config file exits 2 with one line naming
it, and an --out file is probed for writing without leaving the probe.

Provenance: the folder's contents before and after, and the documented exit codes (2 for bad
arguments). The hostile run files and inputs, across commands, are in
test_hostile_run_files.py.
"""

from __future__ import annotations

import json
import shutil

import pytest
from cli_runs import TINY_TRANSLATE

from addnorm.cli.checks import check_out_file
from addnorm.cli.parser import main
from addnorm.tasks.trained import load_trained


def test_out_must_be_a_directory_path(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("")
    for out in (afile, afile / "below"):
        assert main(["train", "translate", *TINY_TRANSLATE, "--out", str(out)]) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and "--out" in err[0] and "not a directory" in err[0]
    assert afile.read_text() == ""


def test_a_bad_device_leaves_the_previous_run_alone(translate_run, tmp_path, capsys):
    copy = tmp_path / "run"
    shutil.copytree(translate_run, copy)
    argv = ["train", "translate", *TINY_TRANSLATE, "--overwrite", "--out", str(copy)]
    assert main([*argv, "--device", "meta"]) == 2
    assert len(capsys.readouterr().err.splitlines()) == 1
    assert load_trained(copy)[2].step == 3


@pytest.mark.parametrize(
    ("content", "named"),
    [
        (json.dumps({"model": {"d_model": 64, "heads": 3}}).encode(), "heads"),
        (json.dumps({"model": 5}).encode(), '"model" must be a JSON object, got a number'),
        (json.dumps({"train": [1]}).encode(), '"train" must be a JSON object, got an array'),
        (json.dumps([1, 2]).encode(), "expected a JSON object"),
        (json.dumps({"optimizer": {}}).encode(), "optimizer"),
        (json.dumps({"model": {"src_vocab_size": 10}}).encode(), "src_vocab_size are set by"),
        (json.dumps({"model": {"d_model": "64"}}).encode(), "d_model"),
        (json.dumps({"train": {"bf16": "yes"}}).encode(), "bf16"),
        (b"{oops", "not valid JSON"),
        (b'{"model": {"norm": "\xff"}}', "not UTF-8"),
    ],
)
def test_bad_config_file_exits_2_with_one_line(tmp_path, capsys, content, named):
    config = tmp_path / "cfg.json"
    config.write_bytes(content)
    argv = ["train", "translate", "--config", str(config), "--out", str(tmp_path / "run")]
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and named in err[0], err
    assert "cfg.json" in err[0] or named in ("d_model", "bf16")


def test_export_accepts_a_new_file_or_an_existing_one_to_replace(tmp_path):
    check_out_file(tmp_path / "new.onnx")
    (tmp_path / "old.onnx").write_bytes(b"old")
    check_out_file(tmp_path / "old.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.onnx"]  # the probe is gone
