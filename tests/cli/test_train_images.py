"""``addnorm train dit --data`` end to end with a tiny DiT, in-process: a folder of classes
trains, reports its quality figures, records its data, samples by class name and resumes
with the same data spelt another way; larger images train at the default size and the run
says so in one line before training; each kind of bad data is one line and exit 2 before
anything is written (exit 1 for a file that fails while it is read), never a traceback.

Provenance: the printed figures are the ones metrics.json holds (the task's judge, computed
once); the class names are the folders the test writes; every refusal is checked against the
data the test damaged (its file named in the line); the size line is
``dit_data.default_image_size``'s worked out by hand (32 is 16 patches of 2 a side, past the
8 allowed: 16x16; 32 / 8 = 4 is the patch that keeps 32).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from image_folders import write_folder
from PIL import Image
from torchrun_runs import assert_two_ranks_train_as_one

from addnorm.cli.parser import main
from addnorm.tasks.trained import load_trained

TINY = ["--preset", "DiT-digits-tiny", "--batch-size", "4", "--eval-size", "6",
        "--max-steps", "2", "--quiet"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny DiT forwards run many times slower when threads oversubscribe the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def image_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    write_folder(root / "pics", {"ants": 6, "bees": 6, "wasps": 6}, size=8)
    return root


def _train(capsys, *flags: str) -> tuple[int, list[str], list[str]]:
    code = main(["train", "dit", *TINY, *flags])
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err.strip().splitlines()


def test_a_folder_of_classes_trains_reports_its_figures_and_samples_by_class_name(
    image_run, capsys, monkeypatch
):
    monkeypatch.chdir(image_run)  # --data as a user types it: relative
    code, out, _ = _train(capsys, "--data", "pics", "--out", "run")
    assert code == 0
    metrics = json.loads((image_run / "run" / "metrics.json").read_text())
    text = "\n".join(out)
    # random pictures under random class names: no judge can tell them apart, so the run
    # says class agreement is not judged and its headline is precision (image_quality's rule)
    assert metrics["judge_trusted"] == 0 and "class_agreement" not in metrics
    assert "class_agreement: not judged (a judge must score" in text
    assert f"precision: {metrics['precision']:.4f}" in text
    assert f"judge_test_accuracy: {metrics['judge_test_accuracy']:.4f}" in text
    assert (f"frechet_distance: {metrics['frechet_distance']:.2f} (real held-out images vs "
            f"train images: {metrics['frechet_distance_real']:.2f}") in text
    assert f"nearest_train_distance: {metrics['nearest_train_distance']:.2f}" in text
    assert "samples of your classes (ants, bees, wasps)" in text
    record = json.loads((image_run / "run" / "data.json").read_text())
    assert record["path"] == str(image_run / "pics")

    array = image_run / "bees.npy"
    assert main(["sample", "--checkpoint", "run", "--class", "bees", "--n", "3", "--steps",
                 "2", "--out", "bees.png", "--save-array", str(array), "--quiet",
                 "--device", "cpu"]) == 0
    saved = np.load(array)
    assert saved.shape == (3, 8, 8, 3) and saved.dtype == np.uint8
    assert (image_run / "bees.png").exists()
    capsys.readouterr()
    assert main(["sample", "--checkpoint", "run", "--class", "moths", "--out", "m.png"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("--class must be one of the run's 3 classes (ants, bees, wasps), "
                            "got 'moths'")

    assert main(["info", "run"]) == 0
    assert '"classes": [' in capsys.readouterr().out

    # The same folder named another way is no change; a changed file is refused, named.
    code, _, err = _train(capsys, "--data", str(image_run / "pics" / "."), "--resume",
                          "--out", "run", "--max-steps", "3")
    assert code == 2 and "drop --preset" in err[-1]  # the model comes from the checkpoint
    assert main(["train", "dit", "--data", "./pics", "--resume", "--out", "run",
                 "--max-steps", "3", "--quiet"]) == 0
    capsys.readouterr()
    changed = image_run / "pics" / "ants" / "img0.png"
    kept = changed.read_bytes()
    try:
        changed.write_bytes(kept + b"x")
        assert main(["train", "dit", "--resume", "--out", "run", "--max-steps", "4",
                     "--quiet"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "changed since the run recorded it (ants/img0.png: " in err[0]
    finally:
        changed.write_bytes(kept)


def test_larger_images_train_smaller_by_default_and_the_run_says_so_first(tmp_path, capsys):
    write_folder(tmp_path / "big", {"a": 3, "b": 3}, size=32)
    code, _, err = _train(capsys, "--data", str(tmp_path / "big"), "--out",
                          str(tmp_path / "run"), "--max-steps", "1", "--eval-size", "2")
    assert code == 0
    notes = [line for line in err if "not your images' 32x32" in line]
    assert notes == [
        "addnorm train dit: training at 16x16, not your images' 32x32: at --patch-size 2, "
        "32x32 is 256 patches an image (16x16: 64), and a step's time grows faster than the "
        "patches, too slow for the defaults on a CPU; --image-size 32 trains at their size, "
        "with --patch-size 4 at 64 patches"]
    before = err[err.index(notes[0]) - 1]
    assert before.startswith("training dit into")  # said with the announcement, before training
    _, model, _ = load_trained(tmp_path / "run")
    assert model.cfg.input_size == 16


def _damage(root, case: str):
    """Write a data set with one fault; returns (path to pass, a text its line must hold)."""
    if case == "missing":
        return root / "nowhere", "no such file or folder"
    if case == "empty folder":
        (root / "empty").mkdir()
        return root / "empty", "empty"
    if case == "no images":
        (root / "texts" / "a").mkdir(parents=True)
        (root / "texts" / "a" / "notes.txt").write_text("hello")
        return root / "texts", "notes.txt"
    write_folder(root / "d", {"a": 6, "b": 6}, size=8)
    if case == "corrupt image":
        (root / "d" / "b" / "img9.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
        return root / "d", "b/img9.png: cannot be decoded as an image"
    if case == "truncated image":
        whole = (root / "d" / "a" / "img1.png").read_bytes()
        (root / "d" / "a" / "img1.png").write_bytes(whole[: len(whole) // 2])
        return root / "d", "a/img1.png: cannot be decoded as an image"
    if case == "mixed modes":
        Image.fromarray(np.zeros((8, 8), np.uint8)).save(root / "d" / "a" / "gray.png")
        return root / "d", "images of mixed modes"
    if case == "class of one image":
        write_folder(root / "d", {"c": 1}, size=8)
        return root / "d", "class 'c' holds one image (c/img0.png)"
    if case == "fewer than a batch":
        write_folder(root / "few", {"a": 2, "b": 2}, size=8)
        return root / "few", "the train split holds 2 images, fewer than a batch"
    if case == "one held out":
        write_folder(root / "one", {"a": 6}, size=8)  # a flat folder: 1 held out, 5 train
        return root / "one" / "a", "the held-out split holds 1 image; scoring needs at least 2"
    if case == "npz without images":
        np.savez(root / "x.npz", pictures=np.zeros((4, 8, 8), np.uint8))
        return root / "x.npz", "holds no 'images' array (it holds pictures)"
    if case == "npz labels mismatched":
        np.savez(root / "x.npz", images=np.zeros((8, 8, 8), np.uint8), labels=np.arange(7))
        return root / "x.npz", "labels has shape (7,), but images holds 8 images"
    raise AssertionError(case)


@pytest.mark.parametrize("case", [
    "missing", "empty folder", "no images", "corrupt image", "truncated image", "mixed modes",
    "class of one image", "fewer than a batch", "one held out", "npz without images",
    "npz labels mismatched",
])
def test_bad_data_is_one_line_and_exit_2_with_nothing_written(tmp_path, capsys, case):
    path, message = _damage(tmp_path, case)
    out = tmp_path / "run"
    code, _, err = _train(capsys, "--data", str(path), "--out", str(out))
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("addnorm train: error: ") and message in err[0], err[0]
    assert not out.exists()


def test_a_file_that_fails_while_read_exits_1_with_one_line(tmp_path, capsys, monkeypatch):
    import builtins

    write_folder(tmp_path / "d", {"a": 6, "b": 6}, size=8, seed=3)
    real_open = builtins.open

    def failing_open(file, mode="r", *args, **kwargs):
        if str(file).endswith("b/img2.png") and "b" in mode:
            raise OSError(5, "Input/output error")
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", failing_open)
    code, _, err = _train(capsys, "--data", str(tmp_path / "d"), "--out",
                          str(tmp_path / "run"))
    assert code == 1 and len(err) == 1, err
    assert "b/img2.png: cannot be read (Input/output error)" in err[0]


@pytest.mark.slow
def test_torchrun_with_data_equals_the_one_process_run(tmp_path):
    """``torchrun -m addnorm train dit --data``: each rank keeps its rows of the global batch
    the one process draws, the label dropout included, so the logged losses are the one
    process's (to float32 summation order) and rank 0 reports once."""
    from training.test_distributed import _train_cli

    write_folder(tmp_path / "pics", {"ants": 8, "bees": 8, "wasps": 8}, size=8)
    flags = ["--data", str(tmp_path / "pics"), "--preset", "DiT-digits-tiny", "--max-steps",
             "8", "--eval-size", "6", "--batch-size", "8", "--log-every", "1"]
    one = _train_cli(tmp_path / "one", "dit", *flags, nproc=1)
    two = _train_cli(tmp_path / "two", "dit", *flags, nproc=2)
    assert one.returncode == 0, one.stderr[-2000:]
    assert two.returncode == 0, two.stderr[-2000:]
    assert two.stdout.count("trained 8 steps") == 1
    # The tolerance of every torchrun equivalence test (tests/torchrun_runs.py): float32
    # means summed in another order, plus Adam's steps on rounding noise.
    assert_two_ranks_train_as_one(tmp_path, 8)
