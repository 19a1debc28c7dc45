"""Crash safety kept honest: a training process killed with SIGKILL at random moments (some
of them while a checkpoint is being written) and resumed each time.

After every kill, every checkpoint the run lists must load (the newest complete one above
all), and the run must resume from it; at the end, the killed-and-resumed run must equal an
uninterrupted one: the same loss at every logged step (recomputed steps included) and the same
final weights and optimizer state, bit for bit (one thread, the same machine: the exact-resume
contract of ``addnorm.training.trainer``).

Provenance: the uninterrupted run of the same command is the reference.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from addnorm.cli.parser import main
from addnorm.training.checkpoint import list_checkpoints, load_checkpoint
from addnorm.training.metrics import read_metrics

FLAGS = [
    "--preset", "tiny", "--d-model", "32", "--n-heads", "2", "--d-ff", "64",
    "--n-encoder-layers", "1", "--n-decoder-layers", "1", "--batch-size", "4",
    "--eval-size", "4", "--log-every", "1", "--checkpoint-every", "1", "--max-minutes", "60",
    "--threads", "1", "--quiet",
]


def reference_run(out: Path, steps: int) -> None:
    threads = torch.get_num_threads()
    try:
        argv = ["train", "translate", *FLAGS, "--max-steps", str(steps), "--out", str(out)]
        assert main(argv) == 0
    finally:
        torch.set_num_threads(threads)


def start(out: Path, steps: int) -> subprocess.Popen:
    """``addnorm train`` into ``out``: resuming its newest checkpoint if it has one."""
    argv = [sys.executable, "-m", "addnorm", "train", "translate", "--out", str(out)]
    if list_checkpoints(out):
        argv += ["--resume", "--threads", "1", "--quiet", "--max-steps", str(steps)]
    else:  # killed before its first checkpoint: start again
        argv += [*FLAGS, "--max-steps", str(steps), "--overwrite"]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def kill_at_random(process: subprocess.Popen, out: Path, rng: random.Random, n: int) -> str:
    """SIGKILL ``process`` once it trains: the ``n``-th kill (odd ones) the moment a checkpoint
    write is seen under way, else after a random delay once a new checkpoint exists. Returns
    how it ended ("killed" or "finished")."""
    root = out / "checkpoints"
    before = len(list_checkpoints(out))
    delay = rng.uniform(0.0, 0.5)
    deadline = time.monotonic() + 300
    while process.poll() is None and time.monotonic() < deadline:
        names = os.listdir(root) if root.is_dir() else []
        writing = any(name.startswith(".tmp-step-") for name in names)
        if (n % 2 and writing) or (not n % 2 and len(list_checkpoints(out)) > before):
            if not n % 2:
                time.sleep(delay)
            process.send_signal(signal.SIGKILL)
            process.wait()
            return "killed"
        time.sleep(0.001)
    assert process.poll() is not None, "the training did not reach a checkpoint in 300 s"
    return "finished"


def check_every_checkpoint_loads(out: Path) -> None:
    found = list_checkpoints(out)
    for path in found:
        checkpoint = load_checkpoint(path)
        assert checkpoint.path == path and "model" in checkpoint.tensors
    if found:
        assert load_checkpoint(out).path == found[-1]


def kill_resume_and_compare(tmp_path: Path, n_kills: int, steps: int, seed: int) -> int:
    """Kill a run ``n_kills`` times, resume it to the end and compare it with the reference;
    returns how many kills left a half-written checkpoint behind."""
    reference = tmp_path / "reference"
    reference_run(reference, steps)
    out, rng = tmp_path / "killed", random.Random(seed)
    outcomes, mid_write = [], 0
    for n in range(n_kills):
        process = start(out, steps)
        outcomes.append(kill_at_random(process, out, rng, n))
        root = out / "checkpoints"
        mid_write += root.is_dir() and any(p.startswith(".tmp-step-") for p in os.listdir(root))
        check_every_checkpoint_loads(out)
    process = start(out, steps)
    _, err = process.communicate(timeout=600)
    assert process.returncode == 0, err.decode()
    assert b"Traceback" not in err
    assert outcomes == ["killed"] * n_kills
    expected = {r["step"]: r["loss"] for r in read_metrics(reference / "metrics.jsonl")}
    records = read_metrics(out / "metrics.jsonl")
    assert {r["step"] for r in records} == set(expected)
    assert all(r["loss"] == expected[r["step"]] for r in records)  # recomputed steps too
    final, resumed = load_checkpoint(reference), load_checkpoint(out)
    assert resumed.step == final.step == steps
    for stem in ("model", "optimizer"):
        assert final.tensors[stem].keys() == resumed.tensors[stem].keys()
        for name, value in final.tensors[stem].items():
            assert torch.equal(value, resumed.tensors[stem][name]), f"{stem}.{name}"
    return mid_write


def test_two_sigkills_then_resume_equals_the_uninterrupted_run(tmp_path):
    kill_resume_and_compare(tmp_path, n_kills=2, steps=20, seed=0)


@pytest.mark.slow
def test_ten_sigkills_at_random_moments_then_resume_equals_the_uninterrupted_run(tmp_path):
    mid_write = kill_resume_and_compare(tmp_path, n_kills=10, steps=150, seed=1)
    assert mid_write >= 1  # at least one kill landed inside a checkpoint write
