"""A 1 GiB text trains in bounded memory: ``addnorm train lm --data`` tokenizes it in one
streaming pass into a memory-mapped token file and trains its first steps, with the peak
resident memory of the process under 1 GiB. (slow: writes 1 GiB of text and 2 GiB of tokens,
both deleted after.)

Provenance: the token file holds one uint16 id per character, so its size is twice the
characters of the text (an identity for this ASCII text: one character per byte); the peak
memory is the kernel's ``ru_maxrss`` of the finished command.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

GIB = 2**30
WORDS = ("the of and to in is that for it as with was on be by this are from at or an have "
         "not which but all were when there can one more some time would other into out "
         "about up them these so its only after first also new two like way may then").split()


def _write_corpus(path, size: int) -> None:
    """``size`` bytes of ASCII lines of words, written 16 MiB at a time."""
    rng = np.random.default_rng(0)
    words = np.array(WORDS)
    written = 0
    with open(path, "w", encoding="ascii") as f:
        while written < size:
            picks = words[rng.integers(0, len(words), 3_000_000)]
            lines = picks.reshape(-1, 12)
            block = "\n".join(" ".join(row) for row in lines) + "\n"
            block = block[: size - written]
            f.write(block)
            written += len(block)


@pytest.mark.slow
def test_a_1_gib_corpus_tokenizes_in_one_pass_under_1_gib_and_trains(tmp_path):
    folder = tmp_path / "big"
    folder.mkdir()
    text = folder / "corpus.txt"
    cache = tmp_path / "cache"
    try:
        _write_corpus(text, GIB)
        env = {**os.environ, "ADDNORM_CACHE": str(cache), "OMP_NUM_THREADS": "2"}
        command = [sys.executable, "-m", "addnorm", "train", "lm", "--data", str(text),
                   "--out", str(tmp_path / "run"), "--max-steps", "3", "--batch-size", "8",
                   "--seq-len", "64", "--eval-size", "2", "--log-every", "1", "--quiet"]
        start = time.perf_counter()
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=3600)
        seconds = time.perf_counter() - start
        assert done.returncode == 0, done.stderr[-2000:]
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # KiB on Linux
        tokens = next(cache.rglob("tokens.bin"))
        meta = json.loads((tokens.parent / "meta.json").read_text())
        assert meta["n_tokens"] == GIB and tokens.stat().st_size == 2 * GIB
        assert "trained 3 steps" in done.stdout
        assert peak < GIB, f"peak resident memory {peak / 2**20:.0f} MiB"
        print(f"\n1 GiB corpus: {seconds:.0f} s for the command, {GIB / seconds / 1e6:.1f} M "
              f"tokens/s overall; peak resident memory {peak / 2**20:.0f} MiB")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)
