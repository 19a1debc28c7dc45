"""``addnorm export`` prints its two lines on success; what torch's exporter and onnxruntime
print while they work (logging, warnings, notes on optional packages) is held back, and shown
on stderr when the export fails or with ``--verbose``.

Provenance: the exporter is wrapped to make noise of every kind (a print, a Python warning, a
logging record, bytes written straight to file descriptor 2 as C++ code does), so what is
shown does not depend on what a torch version happens to print.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import addnorm.export
from addnorm.cli.parser import main
from addnorm.transformer.encoder_model import EncoderConfig, EncoderModel

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

SRC = str(Path(__file__).resolve().parents[2] / "src")
NOISE = ["noise: printed", "noise: warned", "noise: logged", "noise: fd 2"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    torch.manual_seed(0)
    model = EncoderModel(EncoderConfig(vocab_size=50, d_model=32, n_heads=2, n_layers=1,
                                       d_ff=64, max_len=64))
    return model.save_pretrained(tmp_path_factory.mktemp("export") / "enc")


@pytest.fixture
def noisy(monkeypatch):
    """``to_onnx`` making noise of every kind first; ``fail`` makes it raise afterwards."""
    real = addnorm.export.to_onnx
    state = {"fail": False}

    def to_onnx(*args, **kwargs):
        print(NOISE[0])
        warnings.warn(NOISE[1], FutureWarning, stacklevel=1)
        handler = logging.StreamHandler(sys.__stderr__)
        logging.getLogger("noisy").addHandler(handler)
        logging.getLogger("noisy").warning(NOISE[2])
        logging.getLogger("noisy").removeHandler(handler)
        os.write(2, (NOISE[3] + "\n").encode())
        if state["fail"]:
            raise RuntimeError("the exporter gave up\nsecond line")
        return real(*args, **kwargs)

    monkeypatch.setattr(addnorm.export, "to_onnx", to_onnx)
    return state


def test_a_successful_export_prints_its_two_lines_only(folder, tmp_path, noisy, capfd):
    assert main(["export", str(folder), "--out", str(tmp_path / "m.onnx")]) == 0
    out, err = capfd.readouterr()
    assert out.splitlines()[0] == f"wrote {tmp_path / 'm.onnx'}: the EncoderModel's forward"
    assert out.splitlines()[1].startswith("onnxruntime vs PyTorch on padded batches: ")
    assert len(out.splitlines()) == 2 and err == ""


def test_verbose_shows_what_the_exporter_printed(folder, tmp_path, noisy, capfd):
    with pytest.warns(FutureWarning, match=NOISE[1]):  # pytest takes warnings itself
        assert main(["export", str(folder), "--out", str(tmp_path / "m.onnx"),
                     "--verbose"]) == 0
    out, err = capfd.readouterr()
    for line in (NOISE[0], *NOISE[2:]):
        assert line in out + err


def test_a_failed_export_shows_what_the_exporter_printed_then_one_error_line(
    folder, tmp_path, noisy, capfd
):
    noisy["fail"] = True
    assert main(["export", str(folder), "--out", str(tmp_path / "m.onnx")]) == 1
    out, err = capfd.readouterr()
    assert out == ""
    for line in NOISE:
        assert line in err
    assert err.splitlines()[-1] == (
        "addnorm export: error: exporting the EncoderModel's forward failed (RuntimeError: "
        "the exporter gave up)"
    )
    assert "Traceback" not in err


def test_the_real_exporter_says_nothing_on_success(folder, tmp_path):
    """The command as a user runs it, with real file descriptors: nothing on stderr."""
    result = subprocess.run(
        [sys.executable, "-m", "addnorm", "export", str(folder), "--out",
         str(tmp_path / "m.onnx")],
        env={**os.environ, "PYTHONPATH": SRC}, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == "" and len(result.stdout.splitlines()) == 2
