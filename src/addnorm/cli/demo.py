"""``addnorm demo`` (``make demo``): train the default date translator, then show it at work.

It trains the ``translate`` task with its default settings (a 4-minute budget), prints a table
of held-out dates written in many languages with the model's answers, and the exact-match
accuracy on 2000 held-out test dates. The checkpoint, ``metrics.json`` and ``loss.png`` stay
in the run directory, so ``addnorm translate "21 Nov 2026"`` works afterwards.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import sys
from pathlib import Path

import torch

from addnorm.data.dates import dates_in_split, format_date
from addnorm.tasks.run import load_trained, train_run
from addnorm.tasks.translate import TranslateTask

__all__ = ["DEMO_FORMATS", "run_demo", "smoothed_loss_floor"]

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
    interrupted by Ctrl-C, after writing a checkpoint). ``max_minutes``, ``max_steps`` and
    ``eval_size`` override the task's defaults when given."""
    run_dir = Path(run_dir)
    task = TranslateTask()
    model_cfg = task.default_model_config()
    train_cfg = task.default_train_config()
    if max_minutes is not None:
        train_cfg = dataclasses.replace(train_cfg, max_minutes=max_minutes)
    if max_steps is not None:
        train_cfg = dataclasses.replace(train_cfg, max_steps=max_steps)
    if eval_size is not None:
        train_cfg = dataclasses.replace(train_cfg, eval_size=eval_size)
    print("addnorm demo: date normalization as translation, on the encoder-decoder Transformer")
    print(
        f"  model: d_model {model_cfg.d_model}, {model_cfg.n_heads} heads, "
        f"{model_cfg.n_encoder_layers}+{model_cfg.n_decoder_layers} layers, d_ff "
        f"{model_cfg.d_ff}, {model_cfg.norm_position}-LN, {model_cfg.position_encoding} positions; "
        "character vocabularies"
    )
    print(
        f"  training: up to {train_cfg.max_steps} steps or {train_cfg.max_minutes:g} minutes "
        f"on {device} ({torch.get_num_threads()} threads), batch {train_cfg.batch_size}, "
        f"AdamW lr {train_cfg.lr:g} ({train_cfg.schedule})",
        flush=True,
    )
    summary = train_run(
        "translate", model_cfg, train_cfg, run_dir, device=device, progress=progress
    )
    if summary.stopped_by == "interrupt":
        print(
            f"interrupted at step {summary.step}; checkpoint written to {summary.checkpoint} "
            f"(continue with: addnorm train translate --out {run_dir} --resume)",
            file=sys.stderr,
        )
        return 130
    floor = smoothed_loss_floor(train_cfg.label_smoothing, task.tgt_tok.vocab_size)
    print(
        f"  trained {summary.step} steps in {summary.elapsed_s:.0f} s "
        f"(stopped by {summary.stopped_by}), final training loss "
        f"{summary.metrics['train_loss']:.4f} (label smoothing {train_cfg.label_smoothing:g} "
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
