"""nanoGPT's CPU recipe and addnorm side by side: the same model shape, data, held-out split,
learning-rate schedule and steps (or wall time); prints the held-out bits per character and
the tokens per second of both, scored by one function on the same held-out characters.

nanoGPT is not part of addnorm and nothing here builds or ships it: the script runs a checkout
you provide, at the commit it pins (``NANOGPT_COMMIT``; a git checkout at another commit, or
any of the four files it runs edited, is refused with one line)::

    git clone https://github.com/karpathy/nanoGPT
    git -C nanoGPT checkout 3adf61e154c3fe3fca428ad6bc3818b27a3b8291
    .venv/bin/python benchmarks/nanogpt_side_by_side.py --nanogpt nanoGPT --iters 2000 \
        --rounds 2 --threads 1

nanoGPT's side is the CPU recipe of its README, run as a subprocess in a temporary copy of
``train.py``, ``model.py``, ``configurator.py`` and ``config/train_shakespeare_char.py``::

    python train.py config/train_shakespeare_char.py --device=cpu --compile=False
        --eval_iters=20 --log_interval=1 --block_size=64 --batch_size=12 --n_layer=4
        --n_head=4 --n_embd=128 --max_iters=N --lr_decay_iters=N --dropout=0.0

plus ``--dataset`` (the text below, written in its character format: ``train.bin`` and
``val.bin`` of uint16 ids of the sorted characters, and ``meta.pkl``), ``--out_dir``, and
``--eval_interval=N --always_save_checkpoint=True`` so that its one checkpoint holds the
weights after exactly N optimizer steps. Its threads are set by ``OMP_NUM_THREADS``.

addnorm's side is ``addnorm train lm --data TEXT --tokenizer char`` with nanoGPT's model and
recipe mapped to flags: pre-LN, LayerNorm and linear layers without biases, GELU, a final
norm, learned positions (64 rows), no embedding scale, a tied output, 4 layers, 4 heads,
width 128, FFN 512, no dropout; windows of 64 characters, batch 12; AdamW lr 1e-3, betas
(0.9, 0.99), weight decay 0.1 on the matrices only (as nanoGPT's groups), gradient clip 1.0;
a linear warm-up of 100 steps and a cosine to 1e-4 at step N; float32, no compile.

Both hold out the same characters: the text is tokenized once by addnorm (its split: from the
first line start at or after 90% of the bytes, ``--val-fraction 0.1``, nanoGPT's fraction)
and nanoGPT's two files are written from those same ids. Both are scored by ``held_out_bits``
on every non-overlapping window of 65 characters that tiles the held-out text (64 of context,
each held-out character after the first predicted once); nanoGPT's final weights are read
from the ``ckpt.pt`` its own subprocess just wrote (``torch.load(weights_only=True)``: tensors
and plain containers only, no code runs) into its own ``model.py``'s ``GPT``.

Timing: tokens/s is over steps 2..N of each (the first step warms up; nanoGPT's per-iteration
``time`` lines, addnorm's ``elapsed_s`` records, both logged every step), so neither start-up
nor scoring counts; "train s" is N steps at that rate, "process s" the whole subprocess
(start-up, data, the runs' own evaluation, addnorm's samples). ``--rounds`` alternates the two
(nanoGPT first in odd rounds, addnorm first in even ones) and prints per-round rates.
``--minutes M`` instead of ``--iters`` runs a short pilot of each and gives each the steps
that fit M minutes at its own rate (each then completes its own schedule).

Differences that remain: the initialisation (nanoGPT: N(0, 0.02) for every matrix and
embedding, residual projections 0.02 / sqrt(2 * layers); addnorm: Xavier-uniform matrices,
N(0, 0.02) token table), the window draws (nanoGPT: ``torch.randint`` seeded 1337; addnorm:
its seeded ``random.Random``, seed 0; both uniform over the train split), the schedule's
step count (addnorm's warm-up peaks at step 100 and its cosine ends at step N; nanoGPT's at
steps 101 and N + 1), nanoGPT's extra step N + 1 (after its checkpoint; neither timed nor
scored), and addnorm's four special ids (four unused rows of the tied table).

Default data: the pydoc topics that ship with Python (``pydoc_data.topics``, joined as
``addnorm.data.text.load_topics_text``: about 466 kB; the text differs between Python
versions, so the header prints its size and SHA-256). ``--data`` takes any UTF-8 text (a
file, a folder or a glob, as ``addnorm train lm --data``), e.g. nanoGPT's tiny Shakespeare.
Not part of pytest (``tests/benchmarks/test_nanogpt_side_by_side.py`` tests its own logic).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import io
import json
import math
import os
import pickle
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from addnorm.data.tokenizers import CharTokenizer

if TYPE_CHECKING:
    from addnorm.data import TokenCorpus

NANOGPT_COMMIT = "3adf61e154c3fe3fca428ad6bc3818b27a3b8291"
# The files the script runs, with their git blob ids at NANOGPT_COMMIT (git hash-object).
NANOGPT_FILES = {
    "train.py": "de5785051050d64bbda37a4964c2c079f0739b2b",
    "model.py": "c698f8b60129d793494de058b0dd4e318c0dcb5e",
    "configurator.py": "a8bba9599537cbb34b378399a077b525a87d497f",
    "config/train_shakespeare_char.py": "41c81dfb4ea48523199e774ff1f309d9ab1a1181",
}
LAYERS, HEADS, WIDTH, CONTEXT, BATCH = 4, 4, 128, 64, 12
VAL_FRACTION = 0.1  # nanoGPT's prepare.py holds out the last 10%
DATASET = "addnorm_side_by_side"  # the folder under the copy's data/
PILOT_ITERS = 50
SYSTEMS = ("nanoGPT", "addnorm")


class SetupError(ValueError):
    """Bad input (a checkout, a path, a number): the script prints it as one line, exit 2."""


# ------------------------------------------------------------------------- the checkout


def git_blob_id(data: bytes) -> str:
    """The id git gives a file's content (``git hash-object``): SHA-1 of a header and it."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def check_nanogpt(path: str | os.PathLike) -> str:
    """Check that ``path`` holds nanoGPT at ``NANOGPT_COMMIT`` (a git checkout at that commit,
    or any copy whose four run files are that commit's) and say which; SetupError if not."""
    root = Path(path)
    fix = (f"get it with: git clone https://github.com/karpathy/nanoGPT && "
           f"git -C nanoGPT checkout {NANOGPT_COMMIT}")
    if not root.is_dir():
        raise SetupError(f"--nanogpt {root}: no such folder; {fix}")
    how = "a copy"
    if (root / ".git").exists():
        try:
            head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"],
                                  capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError) as err:
            raise SetupError(f"--nanogpt {root}: git rev-parse HEAD failed ({err})") from None
        if head != NANOGPT_COMMIT:
            raise SetupError(f"--nanogpt {root} is at commit {head}; this script runs nanoGPT "
                             f"at {NANOGPT_COMMIT}: git -C {root} checkout {NANOGPT_COMMIT}")
        how = "a git checkout"
    for name, blob in NANOGPT_FILES.items():
        file = root / name
        if not file.is_file():
            raise SetupError(f"--nanogpt {root}: no {name}, not a nanoGPT checkout; {fix}")
        if git_blob_id(file.read_bytes()) != blob:
            raise SetupError(f"--nanogpt {root}: {name} differs from nanoGPT's at "
                             f"{NANOGPT_COMMIT[:12]} (edited?); {fix}")
    return f"{how} at {NANOGPT_COMMIT[:12]} (the {len(NANOGPT_FILES)} files it runs checked)"


# ------------------------------------------------------------------------- the data


def nanogpt_ids(corpus: TokenCorpus) -> tuple[np.ndarray, dict]:
    """nanoGPT's numbering of an addnorm char corpus's characters: the table from addnorm's
    ids to nanoGPT's (uint16; addnorm's special ids map to 0 and never occur in the text)
    and the meta dict ``data/shakespeare_char/prepare.py`` pickles (vocab_size, itos, stoi:
    the sorted distinct characters of the whole text)."""
    tokenizer = corpus.tokenizer
    if not isinstance(tokenizer, CharTokenizer):
        raise TypeError(f"the corpus must be tokenized by character, got {tokenizer!r}")
    chars = tokenizer.chars
    itos = dict(enumerate(sorted(chars)))
    stoi = {c: i for i, c in itos.items()}
    lookup = np.zeros(tokenizer.vocab_size, dtype=np.uint16)  # (V_addnorm,) addnorm id -> nanoGPT's
    lookup[tokenizer.vocab_size - len(chars):] = [stoi[c] for c in chars]
    return lookup, {"vocab_size": len(chars), "itos": itos, "stoi": stoi}


def nanogpt_char_data(corpus: TokenCorpus) -> tuple[np.ndarray, np.ndarray, dict]:
    """nanoGPT's character format of an addnorm char corpus: the train and held-out ids
    (uint16) in its numbering, and its meta dict (:func:`nanogpt_ids`)."""
    lookup, meta = nanogpt_ids(corpus)
    train, val = (lookup[np.asarray(corpus.ids(s))] for s in ("train", "val"))
    return train, val, meta


def write_nanogpt_data(folder: Path, train: np.ndarray, val: np.ndarray, meta: dict) -> None:
    """``train.bin``, ``val.bin`` (raw uint16) and ``meta.pkl`` in ``folder``, as nanoGPT's
    ``train.py`` reads them."""
    folder.mkdir(parents=True, exist_ok=True)
    train.astype(np.uint16).tofile(folder / "train.bin")
    val.astype(np.uint16).tofile(folder / "val.bin")
    with open(folder / "meta.pkl", "wb") as f:
        pickle.dump(meta, f)


def default_text(folder: Path) -> Path:
    """The pydoc topics that ship with this Python, joined as addnorm's bundled corpus, in a
    file in ``folder``."""
    from addnorm.data.text import load_topics_text

    path = folder / "pydoc_topics.txt"
    path.write_text(load_topics_text(), encoding="utf-8")
    return path


# ------------------------------------------------------------------------- scoring


def bits_per_char(nats: float) -> float:
    """A mean cross-entropy in nats per character (nanoGPT's loss) in bits per character."""
    return nats / math.log(2)


@torch.no_grad()
def held_out_bits(logits_of: Callable[[torch.Tensor], torch.Tensor], windows: torch.Tensor,
                  chunk: int = 64) -> float:
    """Bits per character of a model over ``windows`` (N, L + 1): column 0..L-1 is the
    input, 1..L the targets; ``logits_of`` maps (B, L) ids to (B, L, V) logits."""
    total, count = 0.0, 0
    for part in windows.split(chunk):
        logits = logits_of(part[:, :-1])  # (B, L, V)
        targets = part[:, 1:]  # (B, L)
        total += F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(),
                                 reduction="sum").item()
        count += targets.numel()
    return bits_per_char(total / count)


def load_nanogpt(copy: Path, checkpoint: Path) -> torch.nn.Module:
    """nanoGPT's ``GPT`` (from the copy's ``model.py``) with the weights of the ``ckpt.pt``
    its subprocess just wrote, read with ``weights_only=True``."""
    spec = importlib.util.spec_from_file_location("nanogpt_model", copy / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    saved = torch.load(checkpoint, map_location="cpu", weights_only=True)
    with contextlib.redirect_stdout(io.StringIO()):  # it prints its parameter count
        model = module.GPT(module.GPTConfig(**saved["model_args"]))
    model.load_state_dict(saved["model"])
    return model.eval()


def parameters(model: torch.nn.Module) -> int:
    """Distinct parameters (a tied table counted once)."""
    return sum(p.numel() for p in model.parameters())


# ------------------------------------------------------------------------- the two runs


def nanogpt_command(iters: int, out_dir: Path) -> list[str]:
    """The README's CPU recipe for ``iters`` steps on our data, checkpointing at the end."""
    return [
        sys.executable, "train.py", "config/train_shakespeare_char.py", "--device=cpu",
        "--compile=False", "--eval_iters=20", "--log_interval=1",
        f"--block_size={CONTEXT}", f"--batch_size={BATCH}", f"--n_layer={LAYERS}",
        f"--n_head={HEADS}", f"--n_embd={WIDTH}", f"--max_iters={iters}",
        f"--lr_decay_iters={iters}", "--dropout=0.0", f"--dataset={DATASET}",
        f"--out_dir={out_dir}", f"--eval_interval={iters}", "--always_save_checkpoint=True",
    ]


def addnorm_command(data: Path, iters: int, threads: int, cache: Path, out: Path) -> list[str]:
    """``addnorm train lm`` with nanoGPT's shape and recipe (see the module docstring)."""
    return [
        sys.executable, "-m", "addnorm", "train", "lm", "--data", str(data),
        "--tokenizer", "char", "--val-fraction", str(VAL_FRACTION), "--cache-dir", str(cache),
        "--out", str(out), "--overwrite", "--device", "cpu", "--threads", str(threads),
        "--quiet", "--d-model", str(WIDTH), "--n-heads", str(HEADS),
        "--n-layers", str(LAYERS), "--d-ff", str(4 * WIDTH), "--dropout", "0",
        "--activation", "gelu", "--norm", "layer", "--norm-position", "pre", "--no-bias",
        "--final-norm", "true", "--position-encoding", "learned", "--max-len", str(CONTEXT),
        "--embed-scale", "none", "--tie-output", "--seq-len", str(CONTEXT),
        "--batch-size", str(BATCH), "--max-steps", str(iters), "--max-minutes", "none",
        "--lr", "1e-3", "--schedule", "cosine", "--warmup", "100",
        "--final-lr-fraction", "0.1", "--weight-decay", "0.1", "--beta1", "0.9",
        "--beta2", "0.99", "--grad-clip", "1.0", "--seed", "0", "--checkpoint-every", "0",
        "--log-every", "1", "--eval-size", "1000000000", "--no-bf16", "--no-compile",
    ]


_ITER = re.compile(r"^iter (\d+): loss [-\d.naif]+, time ([\d.]+)ms", re.M)
_EVAL = re.compile(r"^step (\d+): train loss [\d.]+, val loss ([\d.]+)", re.M)


def nanogpt_timing(log: str, iters: int) -> dict:
    """Tokens/s over steps 2..N (iterations 1..N-1) and nanoGPT's own last val estimate
    (nats, over eval_iters random batches) in bits per character, from its stdout."""
    times = {int(i): float(ms) / 1000 for i, ms in _ITER.findall(log)}
    missing = [i for i in range(1, iters) if i not in times]
    if missing or iters < 2:
        raise RuntimeError(f"nanoGPT's log lacks the time of iterations {missing[:5]}")
    seconds = sum(times[i] for i in range(1, iters))
    evals = {int(s): float(v) for s, v in _EVAL.findall(log)}
    return {"tokens_per_s": (iters - 1) * BATCH * CONTEXT / seconds,
            "own_bpc": bits_per_char(evals[iters]) if iters in evals else math.nan}


def addnorm_timing(run: Path, iters: int) -> dict:
    """Tokens/s over steps 2..N from the run's per-step records, and its own held-out score."""
    records = {}
    for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if "elapsed_s" in record:
            records[record["step"]] = record["elapsed_s"]
    seconds = records[iters] - records[1]
    final = json.loads((run / "metrics.json").read_text(encoding="utf-8"))
    return {"tokens_per_s": (iters - 1) * BATCH * CONTEXT / seconds,
            "own_bpc": float(final["val_bpc"])}


def _run(command: Sequence[str], cwd: Path | None, env: dict, log: Path) -> float:
    """Run ``command`` with stdout and stderr to ``log``; its wall seconds. RuntimeError with
    the log's end if it fails."""
    began = time.perf_counter()
    with open(log, "w", encoding="utf-8") as out:
        code = subprocess.run(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                              check=False).returncode
    seconds = time.perf_counter() - began
    if code != 0:
        tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
        raise RuntimeError(f"{command[1]} exited {code}; end of {log}:\n" + "\n".join(tail))
    return seconds


class SideBySide:
    """The prepared workspace: the copy of nanoGPT with its data, addnorm's corpus, and the
    held-out windows of both in their own ids."""

    def __init__(self, nanogpt: Path, data: Path, work: Path, threads: int) -> None:
        from addnorm.data import TokenCorpus
        from addnorm.data.fingerprint import DataError

        self.work, self.data, self.threads = work, data, threads
        self.copy = work / "nanoGPT"
        for name in NANOGPT_FILES:
            (self.copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(nanogpt / name, self.copy / name)
        self.cache = work / "cache"
        try:
            corpus = TokenCorpus.build(data, "char", val_fraction=VAL_FRACTION,
                                       cache_dir=self.cache, what="--data")
        except DataError as err:
            raise SetupError(str(err)) from None
        train, val, meta = nanogpt_char_data(corpus)
        write_nanogpt_data(self.copy / "data" / DATASET, train, val, meta)
        self.corpus = corpus
        self.windows = corpus.eval_windows("val", CONTEXT)  # (N, 65) addnorm ids
        lookup = nanogpt_ids(corpus)[0].astype(np.int64)
        self.nano_windows = torch.from_numpy(lookup[self.windows.numpy()])  # same characters
        self.distinct = meta["vocab_size"]
        self.env = {**os.environ, "OMP_NUM_THREADS": str(threads),
                    "MKL_NUM_THREADS": str(threads)}

    def run(self, system: str, iters: int, tag: str) -> dict:
        """Train ``system`` for ``iters`` steps and score it: steps, seconds, tokens/s,
        held-out bits per character (ours and the run's own), parameters."""
        folder = self.work / f"{system}-{tag}"
        folder.mkdir(parents=True, exist_ok=True)
        log = folder / "log.txt"
        if system == "nanoGPT":
            wall = _run(nanogpt_command(iters, folder / "out"), self.copy, self.env, log)
            found = nanogpt_timing(log.read_text(encoding="utf-8"), iters)
            model = load_nanogpt(self.copy, folder / "out" / "ckpt.pt")
            # GPT returns every position's logits only when given targets (any ids will do)
            bits = held_out_bits(lambda ids: model(ids, ids.contiguous())[0],
                                 self.nano_windows)
        else:
            import addnorm

            wall = _run(addnorm_command(self.data, iters, self.threads, self.cache,
                                        folder / "run"), None, self.env, log)
            found = addnorm_timing(folder / "run", iters)
            model = addnorm.load(folder / "run", weights="raw")
            bits = held_out_bits(model, self.windows)
        return {**found, "steps": iters, "process_s": wall, "bpc": bits,
                "train_s": iters * BATCH * CONTEXT / found["tokens_per_s"],
                "parameters": parameters(model)}


# ------------------------------------------------------------------------- the report


def machine_lines(threads: int) -> list[str]:
    """The CPU (model, cores, AVX-512 flags), torch, Python and the threads each run gets."""
    try:
        info = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        info = ""
    named = re.search(r"^model name\s*:\s*(.+)$", info, re.M)
    listed = re.search(r"^flags\s*:(.*)$", info, re.M)
    model = named.group(1) if named else platform.processor() or platform.machine()
    flags = sorted({f for f in listed.group(1).split() if f.startswith("avx512")}) if listed else []
    return [
        f"machine: {model}, {os.cpu_count()} CPUs; avx512: {' '.join(flags) or 'none'}",
        f"torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()}), "
        f"Python {platform.python_version()}, {threads} thread(s) per run",
    ]


def table(results: dict[str, list[dict]]) -> str:
    """One row per system: medians over the rounds (min-max of tokens/s when more than one)."""
    head = (f"{'':8} {'steps':>6} {'train s':>8} {'process s':>9} {'tokens/s':>17} "
            f"{'held-out bpc':>12} {'own estimate':>12} {'params':>8}")
    rows = [head]
    for system, runs in results.items():
        rates = [r["tokens_per_s"] for r in runs]
        spread = f" ({min(rates):.0f}-{max(rates):.0f})" if len(runs) > 1 else ""
        med = {k: statistics.median(r[k] for r in runs)
               for k in ("steps", "train_s", "process_s", "tokens_per_s", "bpc", "own_bpc")}
        rows.append(f"{system:8} {med['steps']:>6.0f} {med['train_s']:>8.1f} "
                    f"{med['process_s']:>9.1f} {med['tokens_per_s']:>7.0f}{spread:>10} "
                    f"{med['bpc']:>12.4f} {med['own_bpc']:>12.4f} {runs[0]['parameters']:>8}")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nanogpt", required=True, metavar="DIR",
                        help=f"a checkout of karpathy/nanoGPT at {NANOGPT_COMMIT}")
    parser.add_argument("--data", metavar="FILE",
                        help="a UTF-8 text (default: the pydoc topics that ship with Python)")
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--iters", type=int, help="optimizer steps of each (default 2000)")
    budget.add_argument("--minutes", type=float,
                        help="training minutes of each (steps from a pilot of each)")
    parser.add_argument("--rounds", type=int, default=1, help="alternating rounds (default 1)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--workdir", metavar="DIR",
                        help="keep the copies, logs and runs here (default: a temporary folder)")
    args = parser.parse_args(argv)
    try:
        where = check_nanogpt(args.nanogpt)
        if args.iters is not None and args.iters < 2:
            raise SetupError(f"--iters must be >= 2, got {args.iters}")
        if args.minutes is not None and not args.minutes > 0:
            raise SetupError(f"--minutes must be > 0, got {args.minutes}")
        if args.rounds < 1 or not 1 <= args.threads <= (os.cpu_count() or 1):
            raise SetupError(f"--rounds must be >= 1 and --threads 1..{os.cpu_count()}, got "
                             f"{args.rounds} and {args.threads}")
    except SetupError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="nanogpt-side-by-side-") as scratch:
        work = Path(args.workdir or scratch).resolve()
        work.mkdir(parents=True, exist_ok=True)
        data = Path(args.data).resolve() if args.data else default_text(work)
        try:
            bench = SideBySide(Path(args.nanogpt).resolve(), data, work, args.threads)
        except SetupError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        text = data.read_bytes() if data.is_file() else b""
        print(*machine_lines(args.threads), sep="\n")
        split = bench.corpus.record.split
        name = str(data) if args.data else (
            f"the pydoc topics of Python {platform.python_version()}")
        print(f"nanoGPT: {where}\ndata: {name}"
              + (f" ({len(text)} bytes, sha256 {hashlib.sha256(text).hexdigest()[:16]})"
                 if text else "")
              + f"; {split['train_tokens']} train / {split['val_tokens']} held-out characters, "
              f"{bench.distinct} distinct; scored on "
              f"{bench.windows.shape[0]} windows of {CONTEXT + 1}")
        iters = dict.fromkeys(SYSTEMS, args.iters or 2000)
        if args.minutes is not None:
            for system in SYSTEMS:
                pilot = bench.run(system, PILOT_ITERS, "pilot")
                iters[system] = max(2, round(args.minutes * 60 * pilot["tokens_per_s"]
                                             / (BATCH * CONTEXT)))
            print(f"pilot ({PILOT_ITERS} steps each): {args.minutes} min = "
                  + ", ".join(f"{s} {n} steps" for s, n in iters.items()))
        results: dict[str, list[dict]] = {s: [] for s in SYSTEMS}
        load = os.getloadavg()[0]
        for r in range(args.rounds):
            for system in SYSTEMS if r % 2 == 0 else SYSTEMS[::-1]:
                result = bench.run(system, iters[system], f"round{r + 1}")
                results[system].append(result)
                print(f"round {r + 1}: {system:8} {result['steps']} steps, "
                      f"{result['tokens_per_s']:.0f} tokens/s, held-out "
                      f"{result['bpc']:.4f} bpc, process {result['process_s']:.0f} s; "
                      f"load average {os.getloadavg()[0]:.1f}", flush=True)
        ratios = [a["tokens_per_s"] / n["tokens_per_s"]
                  for a, n in zip(results["addnorm"], results["nanoGPT"], strict=True)]
        print(f"load average (1 min) at the start {load:.1f}, at the end "
              f"{os.getloadavg()[0]:.1f}\n")
        print(table(results))
        print(f"\naddnorm / nanoGPT tokens/s: {statistics.median(ratios):.3f}x"
              + (f" (rounds {min(ratios):.3f}-{max(ratios):.3f})" if len(ratios) > 1 else ""))
        print("held-out bpc: both models on the same held-out characters (held_out_bits); "
              "own estimate: nanoGPT's estimate_loss (20 random batches) / ln 2, addnorm's "
              "val_bpc")
    return 0


if __name__ == "__main__":
    sys.exit(main())
