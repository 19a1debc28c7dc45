"""Issue 41 through the commands: the files a run or a command writes for people (``loss.png``,
``watch.png``, an ``export``'s ONNX file, ``sample``'s array) are published whole, never
through a link, and a failed write leaves the previous file.

Provenance: a link's target is compared byte for byte with what the test put there (an
identity), and the failure is the system's own (an ``OSError`` with ENOSPC raised by the ONNX
writer after it wrote part of the file, as a full disk does; a real ``ulimit -f`` in a child
process).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_runs import TINY_LM

from addnorm.cli.parser import main
from addnorm.transformer.encoder_model import EncoderConfig, EncoderModel

SRC = str(Path(__file__).resolve().parents[2] / "src")


def test_a_resumed_run_replaces_links_to_its_figures_and_leaves_their_targets(tmp_path):
    """A resumed run wrote loss.png and watch.png through links, overwriting the files they
    pointed to outside the run."""
    out = tmp_path / "run"
    assert main(["train", "lm", *TINY_LM, "--watch", "1", "--max-steps", "2",
                 "--out", str(out)]) == 0
    outside = {}
    for name in ("loss.png", "watch.png"):
        target = tmp_path / f"precious-{name}.txt"
        target.write_bytes(f"a file the user keeps, not {name}".encode())
        outside[name] = target
        (out / name).unlink()
        (out / name).symlink_to(target)
    assert main(["train", "lm", "--out", str(out), "--resume", "--max-steps", "3",
                 "--quiet"]) == 0
    for name, target in outside.items():
        assert target.read_bytes() == f"a file the user keeps, not {name}".encode()
        assert not (out / name).is_symlink()
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    pytest.importorskip("onnxscript")
    torch.manual_seed(0)
    model = EncoderModel(EncoderConfig(vocab_size=50, d_model=32, n_heads=2, n_layers=1,
                                       d_ff=64, max_len=64))
    return model.save_pretrained(tmp_path_factory.mktemp("export") / "enc")


def test_an_export_that_fails_while_writing_leaves_the_previous_file(encoder, tmp_path,
                                                                     monkeypatch, capsys):
    """A failed export (disk full) left a truncated .onnx at --out that a later reader could
    not tell from a good one."""
    from torch.onnx._internal.exporter._onnx_program import ONNXProgram

    out = tmp_path / "enc.onnx"
    out.write_bytes(b"the good export of yesterday")

    def disk_full(self, destination, **kwargs):
        Path(destination).write_bytes(b"\x08\x0a" * 100)  # the start of a protobuf
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ONNXProgram, "save", disk_full)
    assert main(["export", str(encoder), "--out", str(out), "--no-check"]) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("addnorm export: error: exporting the EncoderModel's forward failed "
                           "(OSError: [Errno 28] No space left on device")
    assert out.read_bytes() == b"the good export of yesterday"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["enc.onnx"]


def test_an_export_cut_by_ulimit_f_leaves_nothing_at_out(encoder, tmp_path):
    """The issue's ``ulimit -f``: the file size limit cuts the ONNX file; nothing is left."""
    out = tmp_path / "enc.onnx"

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))

    done = subprocess.run(
        [sys.executable, "-m", "addnorm", "export", str(encoder), "--out", str(out),
         "--no-check"], env={**os.environ, "PYTHONPATH": SRC}, capture_output=True, text=True,
        preexec_fn=limit, timeout=600,
    )
    assert done.returncode == 1, done.stderr[-3000:]
    assert "File too large" in done.stderr.strip().splitlines()[-1]  # EFBIG: the limit bit
    assert list(tmp_path.iterdir()) == []
