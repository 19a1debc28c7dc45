"""``torchrun -m addnorm train lm|translate --data``: two processes share each global batch of a
user's windows or pairs as they share the bundled data's, and follow the one-process run; the
two ranks build the token cache once between them; ``train dit --data --vae`` likewise, the two
ranks encoding the latent cache once between them. (slow: starts torchrun.)

Provenance: the one-process run with the same seed is the reference; the tolerance is the one
the bundled tasks' torchrun test derives (tests/training/test_distributed.py: float32 losses
summed in another order, 1e-4 relative).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from torchrun_runs import assert_two_ranks_train_as_one

from addnorm.training.checkpoint import load_checkpoint

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
    assert_two_ranks_train_as_one(tmp_path, 8)
    if task == "lm":  # one token file for both ranks (the second waited, then reused it)
        assert len(list((tmp_path / "cache2").rglob("tokens.bin"))) == 1
    resumed = _train(tmp_path / "two", task, data, tmp_path / "cache2", "--resume",
                     "--max-steps", "10", nproc=1)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert load_checkpoint(tmp_path / "two").step == 10


# Runs the CLI with LatentVAE.encode counted: each call appends "RANK ROWS" to $ENCODE_LOG.
_COUNTED_CLI = """
import os, sys
from addnorm.interop.diffusers_vae import LatentVAE
real = LatentVAE.encode
def counted(self, x, **kwargs):
    with open(os.environ["ENCODE_LOG"], "a") as log:
        log.write(f"{os.environ.get('RANK', '0')} {x.shape[0]}\\n")
    return real(self, x, **kwargs)
LatentVAE.encode = counted
from addnorm.cli import main
raise SystemExit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_torchrun_on_latents_equals_one_process_and_encodes_the_cache_once(tmp_path):
    """``torchrun -m addnorm train dit --data --vae``: both ranks ask for the latent cache
    entry under its lock, one encodes it and the other reads it (the encoding is not shared
    between ranks), and the losses are the one process's; the checkpoint resumes in one
    process without encoding again. Provenance: the one-process run; the rows counted are
    the 24 images and their mirrors; the tolerance is the file's (above)."""
    from data.test_images import write_folder
    from small_pipeline import autoencoder

    write_folder(tmp_path / "pics", {"ants": 8, "bees": 8, "wasps": 8}, size=16)
    autoencoder().save_pretrained(tmp_path / "vae")
    (tmp_path / "counted.py").write_text(_COUNTED_CLI, encoding="utf-8")
    flags = ["--data", str(tmp_path / "pics"), "--vae", str(tmp_path / "vae"), "--preset",
             "DiT-digits-tiny", "--max-steps", "6", "--eval-size", "2", "--batch-size", "8",
             "--log-every", "1", "--no-keep-best"]

    def train(run, *args, nproc):
        launcher = TORCHRUN if nproc > 1 else [sys.executable]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "ENCODE_LOG": str(tmp_path / f"{run}.log"),
               "ADDNORM_CACHE": str(tmp_path / f"cache-{run[:3]}")}
        done = subprocess.run([*launcher, str(tmp_path / "counted.py"), "train", "dit",
                               "--out", str(tmp_path / run[:3]), "--quiet", *args], env=env,
                              capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-2000:]
        log = tmp_path / f"{run}.log"
        lines = log.read_text().split() if log.exists() else []
        return lines[0::2], sum(int(n) for n in lines[1::2])  # ranks that encoded, rows

    assert train("one", *flags, nproc=1)[1] == 48
    ranks, rows = train("two", *flags, nproc=2)
    assert rows == 48 and len(set(ranks)) == 1  # one rank encoded every row, once
    assert len(list((tmp_path / "cache-two").rglob("meta.json"))) == 1
    assert_two_ranks_train_as_one(tmp_path, 6)
    assert train("two-resumed", "--resume", "--max-steps", "8", nproc=1) == ([], 0)
    assert load_checkpoint(tmp_path / "two").step == 8
