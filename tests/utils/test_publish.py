"""Files published whole: a failed write leaves the previous file (or none), a link at the
destination is replaced and its target left alone, companions arrive with the file, and a
killed writer's staging folder is removed by the next publish.

Provenance: each outcome is compared with the bytes the test wrote before (an identity: the
previous file is byte for byte what it was), a real ``ulimit -f`` (RLIMIT_FSIZE) in a child
process makes the write fail as a full disk does, and the PNG is read back by Pillow.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from addnorm.utils import publish
from addnorm.utils.publish import publishing, save_figure

SRC = str(Path(publish.__file__).resolve().parents[2])


def _entries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_a_link_at_the_destination_is_replaced_and_its_target_left_alone(tmp_path):
    """Issue 41's second finding: a resumed run wrote loss.png through a link to a file
    outside the run."""
    outside = tmp_path / "precious.txt"
    outside.write_bytes(b"not a figure")
    run = tmp_path / "run"
    run.mkdir()
    (run / "loss.png").symlink_to(outside)
    with publishing(run / "loss.png") as staged:
        staged.write_bytes(b"new figure")
    assert outside.read_bytes() == b"not a figure"
    assert not (run / "loss.png").is_symlink()
    assert (run / "loss.png").read_bytes() == b"new figure"
    assert _entries(run) == ["loss.png"]


def test_a_failed_write_leaves_the_previous_file_and_no_staging_folder(tmp_path):
    target = tmp_path / "model.onnx"
    target.write_bytes(b"the good export")
    with pytest.raises(OSError, match="No space left"):
        with publishing(target) as staged:
            staged.write_bytes(b"half of a new")
            raise OSError(28, "No space left on device")
    assert target.read_bytes() == b"the good export"
    assert _entries(tmp_path) == ["model.onnx"]
    with pytest.raises(FileNotFoundError, match="the writer wrote nothing"):
        with publishing(tmp_path / "none.png"):
            pass
    assert _entries(tmp_path) == ["model.onnx"]


def test_companion_files_are_published_beside_the_file(tmp_path):
    """A writer that puts data in files named after its own (ONNX's external data) works."""
    with publishing(tmp_path / "big.onnx") as staged:
        staged.write_bytes(b"graph")
        staged.with_name("big.onnx.data").write_bytes(b"weights")
    assert _entries(tmp_path) == ["big.onnx", "big.onnx.data"]


def test_the_published_file_has_the_permissions_a_plain_write_gives(tmp_path):
    (tmp_path / "plain").write_bytes(b"x")
    with publishing(tmp_path / "staged") as staged:
        staged.write_bytes(b"x")
    assert (tmp_path / "staged").stat().st_mode == (tmp_path / "plain").stat().st_mode


def test_a_dead_writers_staging_folder_is_removed_by_the_next_publish(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (tmp_path / f".grid.png.tmp-{dead}-abc").mkdir()
    (tmp_path / f".grid.png.tmp-{dead}-abc" / "grid.png").write_bytes(b"torn")
    alive = tmp_path / f".grid.png.tmp-{os.getpid()}-def"
    alive.mkdir()
    with publishing(tmp_path / "grid.png") as staged:
        staged.write_bytes(b"whole")
    assert _entries(tmp_path) == [alive.name, "grid.png"]


_LIMITED = textwrap.dedent("""
    import resource, sys
    from addnorm.utils.publish import publishing
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
    try:
        with publishing(sys.argv[1]) as staged:
            staged.write_bytes(b"x" * 1_000_000)
    except OSError as err:
        print(type(err).__name__, err.errno)
""")


def test_a_write_past_ulimit_f_leaves_the_previous_file(tmp_path):
    """Issue 41's third finding through its cause: a file size limit (``ulimit -f``) cuts the
    write; Python ignores SIGXFSZ, so the write fails with EFBIG."""
    target = tmp_path / "lm.onnx"
    target.write_bytes(b"the good export")
    done = subprocess.run([sys.executable, "-c", _LIMITED, str(target)], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": SRC}, timeout=120)
    assert done.stdout.split() == ["OSError", "27"], done.stderr  # EFBIG
    assert target.read_bytes() == b"the good export"
    assert _entries(tmp_path) == ["lm.onnx"]


def test_save_figure_writes_a_png_by_its_suffix(tmp_path):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from PIL import Image

    fig = Figure(figsize=(1, 1))
    FigureCanvasAgg(fig)
    fig.add_subplot().plot([0, 1], [1, 0])
    path = save_figure(fig, str(tmp_path / "f.png"), dpi=50)
    assert path == tmp_path / "f.png"
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size == (50, 50)
