"""The model the inference flags name (``addnorm.cli.shared_flags.load_task_model``): a
checkpoint of the other task is refused, a damaged or missing one exits 1 naming the file or
the path, never a traceback.

Provenance: a tiny run of each task (tests/cli/conftest.py) and copies of it with one file
damaged; the documented exit codes (1 for a failing file). Folders of ``save_pretrained``
given as --checkpoint: test_pretrained_folders.py.
"""

from __future__ import annotations

import shutil

import pytest

from addnorm.cli.parser import main


def test_a_model_checkpoint_of_the_other_task_is_refused(lm_run, capsys):
    assert main(["translate", "x", "--checkpoint", str(lm_run)]) == 2
    assert "'lm'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "content", "command"),
    [
        ("model.safetensors", None, "translate"),
        ("state.json", b"{oops", "translate"),
        ("manifest.json", b"[not json", "info"),
    ],
)
def test_damaged_checkpoints_exit_1_naming_the_file(
    translate_run, tmp_path, capsys, name, content, command
):
    copy = damaged_copy(translate_run, tmp_path, name, content)
    argv = (
        ["info", str(copy)] if command == "info" else ["translate", "x", "--checkpoint", str(copy)]
    )
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert name in err and "Traceback" not in err


def test_missing_checkpoint_exits_1_naming_the_path(tmp_path, capsys):
    assert main(["info", str(tmp_path / "absent")]) == 1
    assert "absent" in capsys.readouterr().err


def damaged_copy(run, tmp_path, name, content: bytes | None):
    copy = tmp_path / "damaged"
    shutil.copytree(run, copy)
    target = next((copy / "checkpoints").iterdir()) / name
    if content is None:
        target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
    else:
        target.write_bytes(content)
    return copy
