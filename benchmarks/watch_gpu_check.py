"""The watch on an accelerator, in one short run: a 4-layer LM trained 6 steps with
``Trainer(watch=2)`` eagerly in float32, under bf16 autocast and compiled, each against the
same run without the watch.

Checks, per mode: the watched steps (1, 2, 4, 6) are written; every number of a record is
finite; the watch changes no number of training beyond the kernels' own run-to-run rounding
(the loss of every step against the unwatched run's: the watch draws no random number and
runs under ``no_grad``, but CUDA's atomic-add kernels are not bit-reproducible, and compiled, a
watched step runs the eager module). Then times steps (CUDA-synchronised wall clock) with and
without the watch and prints the overhead at ``--watch 50``. Exit 1 on a failed check.

    python benchmarks/watch_gpu_check.py            # cuda
    python benchmarks/watch_gpu_check.py --device cpu --steps 6   # the CPU smoke test
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import addnorm
from addnorm.training import Callback
from addnorm.training.config import TrainConfig
from addnorm.training.metrics import read_metrics
from addnorm.training.schedules import ScheduleConfig
from addnorm.training.trainer import Trainer
from addnorm.training.watch import read_watch

# Two runs of the same float32 steps differ by kernel rounding (non-deterministic reductions,
# eager against compiled kernels): a few float32 roundings of a cross-entropy of size ~5 over 6
# small-lr steps, far below a relative 1e-4. bf16 autocast rounds each matmul's output to 8
# bits (u = 2**-8 ~ 4e-3), so two roundings of the logits apart: 2e-2 relative.
LOSS_RTOL = {"float32": 1e-4, "bf16": 2e-2, "compile": 1e-4, "compile-bf16": 2e-2}


class Batches:
    """Seeded random token windows (B, L) of a vocabulary of 256."""

    def __init__(self, batch: int, length: int, seed: int = 0) -> None:
        self.g = torch.Generator().manual_seed(seed)
        self.batch, self.length = batch, length

    def next_batch(self):
        ids = torch.randint(0, 256, (self.batch, self.length + 1), generator=self.g)
        return {"ids": ids[:, :-1], "targets": ids[:, 1:]}

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def lm_loss(model, batch):
    logits = model(batch["ids"])  # (B, L, V)
    return F.cross_entropy(logits.flatten(0, 1).float(), batch["targets"].flatten()), (
        batch["targets"].numel())


class StepClock(Callback):
    def __init__(self, device: torch.device) -> None:
        self.device, self.times = device, []

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def on_fit_start(self, trainer) -> None:
        self._last = self._now()

    def on_step_end(self, trainer, loss, tokens) -> None:
        now = self._now()
        self.times.append((trainer.step, now - self._last))
        self._last = now


def fit(out: Path, device: torch.device, steps: int, watch: int | None, *, bf16: bool,
        compile: bool, d_model: int, batch: int, length: int) -> list[tuple[int, float]]:
    cfg = dataclasses.replace(addnorm.PRESETS["lm-tiny"], vocab_size=256, n_layers=4,
                              d_model=d_model, n_heads=4, d_ff=4 * d_model, dropout=0.0,
                              max_len=length)
    torch.manual_seed(0)
    model = addnorm.TransformerLM(cfg).to(device)
    train_cfg = TrainConfig(max_steps=steps, batch_size=batch, lr=1e-3, warmup=1,
                            checkpoint_every=0, log_every=1, bf16=bf16, compile=compile)
    clock = StepClock(device)
    Trainer(model, lm_loss, Batches(batch, length), train_cfg, run_dir=out,
            schedule=ScheduleConfig("constant", 1e-3, 1, total_steps=steps), watch=watch,
            callbacks=[clock]).fit()
    return clock.times


def finite(value) -> bool:
    if isinstance(value, dict):
        return all(finite(v) for v in value.values())
    if isinstance(value, list):
        return all(finite(v) for v in value)
    return not isinstance(value, float) or math.isfinite(value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--time-steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=256)
    args = parser.parse_args()
    device = torch.device(args.device)
    size = dict(d_model=args.d_model, batch=args.batch, length=args.length)
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for mode, bf16, compile in [("float32", False, False), ("bf16", True, False),
                                    ("compile", False, True), ("compile-bf16", True, True)]:
            fit(root / f"{mode}-plain", device, args.steps, None, bf16=bf16, compile=compile,
                **size)
            fit(root / f"{mode}-watch", device, args.steps, 2, bf16=bf16, compile=compile,
                **size)
            records = read_watch(root / f"{mode}-watch" / "watch.jsonl")
            expected = sorted({1, args.steps, *range(2, args.steps + 1, 2)})
            steps = [r["step"] for r in records]
            plain = [r["loss"] for r in read_metrics(root / f"{mode}-plain" / "metrics.jsonl")]
            watched = [r["loss"] for r in read_metrics(root / f"{mode}-watch" / "metrics.jsonl")]
            same = len(plain) == len(watched) and all(
                math.isclose(a, b, rel_tol=LOSS_RTOL[mode], abs_tol=0.0)
                for a, b in zip(plain, watched, strict=True))
            ok = steps == expected and all(finite(r) for r in records) and same
            diff = max(abs(a - b) for a, b in zip(plain, watched, strict=False))
            print(f"{mode:13s} watched steps {steps}; finite: {all(finite(r) for r in records)}; "
                  f"losses {'match' if same else 'DIFFER'} the unwatched run "
                  f"(max |diff| {diff:.2e})")
            if not ok:
                failures.append(mode)
        # timing: runs watched every 4 steps beside runs without, in rounds that alternate
        # the order, eager float32 and bf16
        for bf16 in (False, True):
            plain, unwatched, watched_t = [], [], []
            for r in range(args.rounds):
                for every in ((None, 4) if r % 2 == 0 else (4, None)):
                    times = fit(root / f"t{r}-{every}", device, args.time_steps, every,
                                bf16=bf16, compile=False, **size)[2:]
                    for s, t in times:
                        if every is None:
                            plain.append(t)
                        else:
                            (watched_t if s % 4 == 0 or s == args.time_steps
                             else unwatched).append(t)
            t_p, t_u, t_w = (statistics.median(x) for x in (plain, unwatched, watched_t))
            n = 50
            overhead = (t_w - t_p + (n - 1) * (t_u - t_p)) / (n * t_p)
            print(f"timing {'bf16' if bf16 else 'float32':7s} step {t_p * 1e3:.2f} ms without, "
                  f"{t_u * 1e3:.2f} ms unwatched, {t_w * 1e3:.2f} ms watched (medians of "
                  f"{args.rounds} alternating rounds); overhead at --watch {n}: {overhead:+.1%} "
                  f"(watched steps alone: {(t_w - t_p) / (n * t_p):+.1%})")
    print("FAILED: " + ", ".join(failures) if failures else "all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
