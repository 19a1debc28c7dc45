"""``torchrun -m addnorm train lm|translate --data``: two processes share each global batch of a
user's windows or pairs as they share the bundled data's, and follow the one-process run; the
two ranks build the token cache once between them. (slow: starts torchrun.)

Provenance: the one-process run with the same seed is the reference; the tolerance is the one
the bundled tasks' torchrun test derives (tests/training/test_distributed.py: float32 losses
summed in another order, 1e-4 relative).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from addnorm.training.checkpoint import load_checkpoint
from addnorm.training.metrics import read_metrics

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def _train(out, task, data, cache, *flags, nproc):
    launcher = TORCHRUN if nproc > 1 else [sys.executable]
    command = [*launcher, "-m", "addnorm", "train", task, "--data", str(data), "--out",
               str(out), "--quiet", *flags]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ADDNORM_CACHE": str(cache)}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("task", "flags"),
    [
        ("lm", ["--max-steps", "8", "--eval-size", "2", "--batch-size", "8", "--seq-len", "32",
                "--log-every", "1", "--tokenizer", "bpe", "--vocab-size", "300"]),
        ("translate", ["--max-steps", "8", "--eval-size", "8", "--batch-size", "16",
                       "--log-every", "1"]),
    ],
)
def test_torchrun_on_your_data_equals_one_process_and_resumes_with_one(tmp_path, task, flags):
    if task == "lm":
        data = tmp_path / "notes.txt"
        data.write_text("".join(f"note {i}: {WORDS[i % 10]} {WORDS[i * 3 % 10]}\n"
                                for i in range(2000)), encoding="utf-8")
    else:
        data = tmp_path / "pairs.tsv"
        data.write_text("".join(f"{WORDS[i // 10]} {WORDS[i % 10]}\t{i}\n" for i in range(100)),
                        encoding="utf-8")
    one = _train(tmp_path / "one", task, data, tmp_path / "cache1", *flags, nproc=1)
    two = _train(tmp_path / "two", task, data, tmp_path / "cache2", *flags, nproc=2)
    assert one.returncode == 0, one.stderr[-2000:]
    assert two.returncode == 0, two.stderr[-2000:]
    assert two.stdout.count("trained 8 steps") == 1
    losses = [[r["loss"] for r in read_metrics(tmp_path / run / "metrics.jsonl")]
              for run in ("one", "two")]
    assert len(losses[0]) == len(losses[1]) == 8
    for x, y in zip(*losses, strict=True):
        assert abs(x - y) <= 1e-4 * abs(x), losses
    metrics = json.loads((tmp_path / "two" / "metrics.json").read_text())
    assert metrics["world_size"] == 2
    if task == "lm":  # one token file for both ranks (the second waited, then reused it)
        assert len(list((tmp_path / "cache2").rglob("tokens.bin"))) == 1
    resumed = _train(tmp_path / "two", task, data, tmp_path / "cache2", "--resume",
                     "--max-steps", "10", nproc=1)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert load_checkpoint(tmp_path / "two").step == 10
