"""``addnorm demo`` (``make demo``): train the two main jobs with their defaults and show them.

1. The date translator (encoder-decoder Transformer): the ``translate`` task's default run
   (its step budget and time cap, ``TranslateTask.default_train_config()``), a table of
   held-out dates written in many languages with the model's answers, and the exact-match
   accuracy on the held-out test dates.
2. The Diffusion Transformer: the ``dit`` task's default run on scikit-learn's digits (its
   budgets, ``DiTTask.default_train_config()``), its class agreement, and a grid of samples,
   one row per class.

``demo --help`` states both budgets, read from those configs. Each job times a short warm-up
and prints its plan first (:mod:`addnorm.tasks.budget`): on an idle machine the task's steps
as they are (the run is the same, bit for bit), on a slow or busy one the steps that fit the
time budget, with the learning-rate schedule fitted to them, so the run ends with its schedule
complete rather than cut; a machine that turns out slower still is re-planned once in
training (:mod:`addnorm.training.budget`). Where the time cap, the last resort, stops training
anyway, the demo says so on stderr, with the steps that ran, before the results
(:mod:`addnorm.cli.time_cap`).

Checkpoints, ``metrics.json`` and ``loss.png`` stay in the run directories, so
``addnorm translate "21 Nov 2026"`` and ``addnorm sample --out grid.png`` work afterwards.
Each run replaces the previous addnorm run in its directory (proven by its
``addnorm-run.json``, deleting only that run's files) and refuses a non-empty directory
without one (``RunDirError``, exit code 2); SIGTERM stops it with exit code 143.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import random
import sys
from pathlib import Path
from typing import cast

import torch

from addnorm.cli.checks import UsageError, apply_runtime_flags, check_out_dir, out_dir
from addnorm.cli.exits import EXIT_OK, SIGNAL_STOPS, exit_on_sigterm, report_signal_stop
from addnorm.cli.shared_flags import add_runtime_flags
from addnorm.cli.time_cap import UNDERTRAINED_SHARE, replan_text, warn_if_cut_short
from addnorm.data.dates import dates_in_split, format_date
from addnorm.tasks.run import train_run
from addnorm.tasks.trained import load_trained
from addnorm.tasks.translate import TranslateTask
from addnorm.training.config import TrainConfig

__all__ = ["DEMO_FORMATS", "add_parser", "run", "run_demo", "run_dit_demo", "smoothed_loss_floor"]

# One row of the table per format: English, European, ISO, Korean, Japanese, Chinese.
DEMO_FORMATS = (
    "en_dmy",
    "en_mdy_short",
    "en_weekday_mdy",
    "de_weekday",
    "fr",
    "es_weekday",
    "iso_slash",
    "iso_basic",
    "ko",
    "ko_weekday",
    "ja_weekday",
    "zh_weekday",
)


def add_parser(subparsers) -> None:
    """Register ``addnorm demo``; its help states the budgets of the tasks' default configs."""
    from addnorm.tasks.dit import DiTTask

    translate_cfg = TranslateTask.default_train_config()
    dit_cfg = DiTTask.default_train_config()
    demo = subparsers.add_parser(
        "demo", help="train the date translator and the digits DiT, and show them at work",
        description="Train the date translator ("
        f"{_budget(translate_cfg)}), then the digits DiT ({_budget(dit_cfg)}), with "
        "the tasks' default settings, and show what each learned. Each job times a short "
        "warm-up and prints its plan: the task's steps where they fit the time budget, else "
        "the steps that do, with the learning-rate schedule fitted to them (re-planned once "
        "in training if the machine turns out slower); the time cap stays as the last "
        f"resort, and one that stops a job before {UNDERTRAINED_SHARE:.0%} of its planned "
        "steps is reported as a warning.",
    )
    demo.add_argument(
        "--out", type=out_dir, default=Path("runs/translate"),
        help="the translator's run folder (default runs/translate); the demo replaces its own "
        "previous run there and refuses a folder holding anything else",
    )
    demo.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="the translator's time budget, in minutes of training (default: the task's, "
        f"{translate_cfg.max_minutes:g}; its step budget is {translate_cfg.max_steps})",
    )
    demo.add_argument(
        "--dit-out", type=out_dir, default=Path("runs/dit"),
        help="the DiT's run folder (default runs/dit); replaced as --out is",
    )
    demo.add_argument(
        "--dit-max-minutes",
        type=float,
        default=None,
        help="the DiT's time budget, in minutes of training (default: the task's, "
        f"{dit_cfg.max_minutes:g}; its step budget is {dit_cfg.max_steps})",
    )
    demo.add_argument("--no-dit", action="store_true", help="only the date translator")
    add_runtime_flags(demo)


@exit_on_sigterm
def run(args: argparse.Namespace) -> int:
    """Handle ``addnorm demo``: check both run folders, then train and show each job."""
    from addnorm.training.run_dir import RunDirError, check_fresh_run_dir, check_unlocked

    device = apply_runtime_flags(args)
    check_out_dir(args.out)
    check_out_dir(args.dit_out, "--dit-out")
    for flag, minutes in (("--max-minutes", args.max_minutes),
                          ("--dit-max-minutes", args.dit_max_minutes)):
        if minutes is not None and not 0 < minutes < float("inf"):  # NaN fails both
            raise UsageError(f"{flag} must be finite and > 0, got {minutes}")
    progress = not args.quiet and sys.stderr.isatty()
    try:  # both folders before the first training, which takes minutes
        for out in (args.out,) if args.no_dit else (args.out, args.dit_out):
            check_unlocked(out)
            check_fresh_run_dir(out, overwrite=True)  # the demo replaces its own runs
        code = run_demo(args.out, max_minutes=args.max_minutes, device=device, progress=progress)
        if code != EXIT_OK or args.no_dit:
            return code
        return run_dit_demo(
            args.dit_out, max_minutes=args.dit_max_minutes, device=device, progress=progress
        )
    except RunDirError as err:
        raise UsageError(str(err)) from None


def demo_examples(seed: int = 0) -> list[tuple[str, str]]:
    """(input, answer) pairs: a random test-split date in each of ``DEMO_FORMATS``."""
    rng = random.Random(seed)
    dates = dates_in_split("test")
    return [
        (format_date(d, fmt), d.isoformat())
        for fmt, d in zip(DEMO_FORMATS, rng.sample(dates, len(DEMO_FORMATS)), strict=True)
    ]


def run_demo(
    run_dir: str | os.PathLike = "runs/translate",
    *,
    max_minutes: float | None = None,
    max_steps: int | None = None,
    eval_size: int | None = None,
    device: str = "cpu",
    progress: bool = True,
) -> int:
    """Train, then print the table and the held-out accuracy; returns an exit code (130 if
    interrupted by Ctrl-C, 143 if stopped by SIGTERM, after writing a checkpoint).
    ``max_minutes``, ``max_steps`` and ``eval_size`` override the task's defaults when given.
    Raises ``RunDirError`` if ``run_dir`` holds files of no addnorm run or another writer."""
    run_dir = Path(run_dir)
    task = TranslateTask()
    model_cfg = task.default_model_config()
    train_cfg = _with_overrides(task.default_train_config(), max_minutes, max_steps)
    task_cfg = _with_overrides(task.default_task_config(), eval_size=eval_size)
    print("addnorm demo: date normalization as translation, on the encoder-decoder Transformer")
    print(
        f"  model: d_model {model_cfg.d_model}, {model_cfg.n_heads} heads, "
        f"{model_cfg.n_encoder_layers}+{model_cfg.n_decoder_layers} layers, d_ff "
        f"{model_cfg.d_ff}, {model_cfg.norm_position}-LN, {model_cfg.position_encoding} positions"
        f"{', unpadded encoder' if model_cfg.unpad else ''}; character vocabularies"
    )
    model_cfg, train_cfg, planned = _planned(task, model_cfg, train_cfg, task_cfg, device,
                                             max_steps)
    print(
        f"  training on {device} ({torch.get_num_threads()} threads): batch "
        f"{train_cfg.batch_size}, AdamW lr {train_cfg.lr:g} ({train_cfg.schedule})"
        + _plan_text(planned),
        flush=True,
    )
    summary = train_run(
        "translate", model_cfg, train_cfg, run_dir, task_cfg=task_cfg, overwrite=True,
        device=device, progress=progress,
    )
    if summary.stopped_by in SIGNAL_STOPS:
        return report_signal_stop(summary, "translate")
    if summary.replan is not None:
        print(f"  {replan_text(summary.replan)}")
    warn_if_cut_short(summary, train_cfg, prefix="addnorm demo")
    floor = smoothed_loss_floor(task_cfg.label_smoothing, task.tgt_tok.vocab_size)
    print(
        f"  trained {summary.step} steps in {summary.elapsed_s:.0f} s "
        f"(stopped by {summary.stopped_by}), final training loss "
        f"{_loss(summary.metrics['train_loss'])} (label smoothing {task_cfg.label_smoothing:g} "
        f"puts its floor at {floor:.4f})\n"
    )
    _, model, _ = load_trained(summary.checkpoint, device=device)
    _print_table(task, model)
    metrics = summary.metrics
    print(
        f"\n  held-out exact match: {100 * metrics['test_exact_match']:.2f}% of "
        f"{metrics['n_test']} test dates (validation: "
        f"{100 * metrics['val_exact_match']:.2f}% of {metrics['n_val']}); no test date "
        "was seen in training, in any format"
    )
    print(
        f"  checkpoint: {summary.checkpoint}\n  loss curve: {summary.loss_png}\n"
        f"  metrics:    {run_dir / 'metrics.json'}"
    )
    print(f'  try: addnorm translate "Saturday, 21 November 2026" --checkpoint {run_dir}')
    return 0


def run_dit_demo(
    run_dir: str | os.PathLike = "runs/dit",
    *,
    max_minutes: float | None = None,
    max_steps: int | None = None,
    eval_size: int | None = None,
    device: str = "cpu",
    progress: bool = True,
) -> int:
    """Train the digits DiT, then print its scores and write a sample grid; returns an exit
    code (130 if interrupted, 143 if terminated). The overrides and the run directory's rules
    are as for :func:`run_demo`."""
    from addnorm.cli.grid import save_digit_grid
    from addnorm.dit import DiT
    from addnorm.tasks.dit import DiTTask
    from addnorm.tasks.dit_evaluation import SampleSettings

    run_dir = Path(run_dir)
    task = DiTTask()
    model_cfg = task.prepare(task.default_model_config())
    train_cfg = _with_overrides(task.default_train_config(), max_minutes, max_steps)
    task_cfg = _with_overrides(task.default_task_config(), eval_size=eval_size)
    model_cfg, train_cfg, planned = _planned(task, model_cfg, train_cfg, task_cfg, device,
                                             max_steps)
    settings = SampleSettings()
    print("\naddnorm demo: a class-conditional Diffusion Transformer on 8x8 digits")
    print(
        f"  model: DiT, d_model {model_cfg.d_model}, {model_cfg.n_layers} adaLN-Zero blocks, "
        f"{model_cfg.n_heads} heads, patch {model_cfg.patch_size} ({model_cfg.grid_size ** 2} "
        f"tokens), {sum(p.numel() for p in task.build_model(model_cfg).parameters()):,} "
        f"parameters; {task.n_steps}-step {task.schedule} diffusion, {task.prediction}-"
        f"prediction" + ("" if task.min_snr_gamma is None
                         else f", Min-SNR-{task.min_snr_gamma:g} loss weights")
    )
    print(
        f"  training on {device}: batch {train_cfg.batch_size}, AdamW lr {train_cfg.lr:g}, "
        + _ema_text(train_cfg) + _plan_text(planned),
        flush=True,
    )
    summary = train_run(
        "dit", model_cfg, train_cfg, run_dir, task_cfg=task_cfg, overwrite=True, device=device,
        progress=progress,
    )
    if summary.stopped_by in SIGNAL_STOPS:
        return report_signal_stop(summary, "dit")
    if summary.replan is not None:
        print(f"  {replan_text(summary.replan, '--dit-max-minutes')}")
    warn_if_cut_short(summary, train_cfg, prefix="addnorm demo", flag="--dit-max-minutes")
    m = summary.metrics
    print(
        f"  trained {summary.step} steps in {summary.elapsed_s:.0f} s (stopped by "
        f"{summary.stopped_by}); samples: {settings.method.upper()} {settings.steps} steps, "
        f"guidance {settings.guidance:g}"
    )
    print(
        f"  class agreement: {100 * m['class_agreement']:.1f}% of {task_cfg.eval_size} samples "
        f"are labelled as their requested class by a classifier with "
        f"{100 * m['judge_test_accuracy']:.1f}% held-out accuracy on real digits; "
        f"{100 * m['class_agreement_independent']:.1f}% by an independent one (3 nearest "
        f"neighbours, {100 * m['independent_test_accuracy']:.1f}%)"
    )
    print(
        f"  Fréchet distance to real digits: {m['frechet_distance']:.3f} (real vs real: "
        f"{m['frechet_distance_real']:.3f}); nearest training image: "
        f"{m['nearest_train_distance']:.1f} (real test digits: "
        f"{m['nearest_train_distance_real']:.1f}; far lower would mean copying)"
    )
    _, model, _ = load_trained(summary.checkpoint, device=device)
    labels = torch.arange(10).repeat(3)  # three of each class, 0-9 along each row
    generator = torch.Generator(device=device).manual_seed(0)
    pixels = task.sample(cast(DiT, model), labels, settings, generator=generator)
    grid = save_digit_grid(
        pixels, labels, run_dir / "samples.png",
        title=f"DiT samples: {settings.method.upper()} {settings.steps} steps, "
        f"guidance {settings.guidance:g}",
    )
    quality = f"\n  quality:    {run_dir / m['quality_figure']}" if "quality_figure" in m else ""
    print(
        f"  sample grid: {grid}\n  checkpoint: {summary.checkpoint}\n"
        f"  loss curve: {summary.loss_png}{quality}\n  metrics:    {run_dir / 'metrics.json'}"
    )
    print(f"  try: addnorm sample --class 7 --n 10 --checkpoint {run_dir} --out sevens.png")
    return 0


def _planned(task, model_cfg, train_cfg, task_cfg, device: str, max_steps: int | None):
    """The job's configs fitted to its time budget after a measured warm-up, and the plan
    (:func:`addnorm.tasks.budget.budget_plan`; ``max_steps`` given keeps its steps)."""
    from addnorm.tasks.budget import budget_plan

    given = () if max_steps is None else ("max_steps",)
    return budget_plan(task, model_cfg, train_cfg, task_cfg, device, given=given)


def _plan_text(planned) -> str:
    """The plan's lines after the model's, indented under the demo's training line."""
    return "".join(f"\n    {line}" for line in planned.lines()[1:])


def _budget(train_cfg) -> str:
    """A config's training budget in words: ``600 steps in a 4-minute budget``."""
    cap = ("" if train_cfg.max_minutes is None
           else f" in a {train_cfg.max_minutes:g}-minute budget")
    return f"{train_cfg.max_steps} steps{cap}"


def _loss(value: float | None) -> str:
    """A training loss for the report: none when the time budget ended before the first step."""
    return "none (no step in the time budget)" if value is None else f"{value:.4f}"


def _with_overrides(cfg, max_minutes=None, max_steps=None, *, eval_size=None):
    """``cfg`` (a train or task config) with the demo's command-line overrides that were
    given."""
    changes = {"max_minutes": max_minutes, "max_steps": max_steps, "eval_size": eval_size}
    return dataclasses.replace(cfg, **{k: v for k, v in changes.items() if v is not None})


def smoothed_loss_floor(smoothing: float, n_classes: int) -> float:
    """The least label-smoothed cross-entropy: the entropy of the smoothed target, which puts
    ``1 - smoothing + smoothing / n_classes`` on the answer and ``smoothing / n_classes`` on
    each other class (the target F.cross_entropy uses)."""
    on, off = 1.0 - smoothing + smoothing / n_classes, smoothing / n_classes
    return -on * math.log(on) - (n_classes - 1) * (off * math.log(off) if off > 0 else 0.0)


def _print_table(task: TranslateTask, model) -> None:
    """The demo's table: held-out inputs, the model's answers, the right answers."""
    examples = demo_examples()
    predictions = task.predict(model, [source for source, _ in examples])
    width = max(len(source) for source, _ in examples) + 2
    print(f"  {'input (held-out dates)':<{width}}{'prediction':<13}{'answer':<13}")
    for (source, answer), prediction in zip(examples, predictions, strict=True):
        mark = "ok" if prediction == answer else "WRONG"
        print(f"  {source:<{_pad(source, width)}}{prediction:<13}{answer:<13}{mark}")


def _pad(text: str, width: int) -> int:
    """Column width for ``text`` so that wide (CJK, Hangul) characters still line up."""
    wide = sum(1 for c in text if ord(c) >= 0x1100)
    return max(width - wide, len(text) + 1)


def _ema_text(train_cfg: TrainConfig) -> str:
    """The EMA as the run applies it: with warm-up, the decay after the last step (the
    warm-up's ``(1 + n) / (10 + n)`` stays below the configured decay for short runs)."""
    if train_cfg.ema_decay == 0:
        return "no EMA"
    if not train_cfg.ema_warmup:
        return f"EMA {train_cfg.ema_decay:g}"
    last = train_cfg.max_steps - 1  # the last update's n, counted from 0
    reached = min(train_cfg.ema_decay, (1 + last) / (10 + last))
    return f"EMA {train_cfg.ema_decay:g} with warm-up ({reached:.3g} at the last step)"
