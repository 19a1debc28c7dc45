"""What ``--watch`` costs a training run: the step times of each task's default model and
batch (``addnorm train TASK`` with no flags) without the watch and with it.

Each round trains the task twice from the same seed, ``--steps`` steps each, in one process:
once without the watch and once with ``watch=--every`` (so that run has watched and unwatched
steps side by side); the order of the two alternates from round to round, so a drift of the
machine hits both alike. A step's time runs from the end of the previous step to the end of
its own (the data, the forward, the backward, the update, the logging and the watch's own
work), the first two steps of a run left out (warm-up). Reported: the median step time
without the watch, of an unwatched and of a watched step with it, and the overhead of the
watch at interval N, ``(t_watched - t_plain + (N - 1) * (t_unwatched - t_plain)) / (N *
t_plain)``: one watched step in N. With ``--threads 1`` the clock is the process's CPU time,
which other jobs on a shared machine disturb least. Not part of pytest.

    python benchmarks/watch_overhead.py --tasks translate lm dit --rounds 5 --threads 1
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path

import torch

from addnorm.tasks.registry import task_class
from addnorm.tasks.run import schedule_for
from addnorm.training import Callback
from addnorm.training.state import seed_everything
from addnorm.training.trainer import Trainer


class StepClock(Callback):
    """The time of each step, from the previous step's end (or the fit's start) to its end."""

    def __init__(self, clock) -> None:
        self.clock, self.times = clock, []

    def on_fit_start(self, trainer) -> None:
        self._last = self.clock()

    def on_step_end(self, trainer, loss, tokens) -> None:
        now = self.clock()
        self.times.append((trainer.step, now - self._last))
        self._last = now


def run(task_name: str, steps: int, watch: int | None, clock, out: Path) -> list[tuple[int, float]]:
    task_cls = task_class(task_name)
    task_cfg = task_cls.default_task_config()
    task = task_cls.from_config(task_cfg)
    model_cfg = task.prepare(task_cls.default_model_config())
    train_cfg = dataclasses.replace(
        task_cls.default_train_config(), max_steps=steps, checkpoint_every=0, max_minutes=None
    )
    seed_everything(train_cfg.seed)
    model = task.build_model(model_cfg)
    timer = StepClock(clock)
    trainer = Trainer(
        model, task.loss_fn(task_cfg), task.batches(model_cfg, train_cfg, task_cfg), train_cfg,
        run_dir=out, schedule=schedule_for(train_cfg), watch=watch, callbacks=[timer],
    )
    trainer.fit()
    return timer.times[2:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=["translate", "lm", "dit"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--every", type=int, default=3, help="the watched run's interval")
    parser.add_argument("--interval", type=int, default=50, help="the interval to report")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.process_time if args.threads == 1 else time.perf_counter
    n = args.interval
    print(f"threads {args.threads}, {args.rounds} rounds of {args.steps} steps, watched run "
          f"every {args.every}; medians; overhead at --watch {n}")
    for name in args.tasks:
        plain: list[float] = []
        unwatched: list[float] = []
        watched: list[float] = []
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(args.rounds):
                order = [None, args.every] if r % 2 == 0 else [args.every, None]
                for every in order:
                    times = run(name, args.steps, every, clock, Path(tmp) / f"{r}-{every}")
                    if every is None:
                        plain += [t for _, t in times]
                    else:
                        for step, t in times:
                            due = step % every == 0 or step == args.steps
                            (watched if due else unwatched).append(t)
        t_p, t_u, t_w = (statistics.median(x) for x in (plain, unwatched, watched))
        overhead = (t_w - t_p + (n - 1) * (t_u - t_p)) / (n * t_p)
        print(f"{name:10s} step without watch {t_p * 1e3:8.1f} ms ({1 / t_p:6.2f} steps/s); "
              f"with: unwatched {t_u * 1e3:8.1f} ms, watched {t_w * 1e3:8.1f} ms "
              f"({t_w / t_p:5.2f}x); overhead at {n}: {overhead:+.1%} (watched steps alone: "
              f"{(t_w - t_p) / (n * t_p):+.1%})")


if __name__ == "__main__":
    main()
