"""What a finished run writes and says: its ``RunSummary``, the loss curve, and, unless a
signal stopped it, ``metrics.json`` (the held-out figures: ``test_exact_match`` for translate,
``val_bpc`` for lm, ``class_agreement`` and its companions for dit, the headline's key under
``"metric"``; ``"weights"``: ``"ema"`` when the run kept an EMA of its weights
(``ema_decay > 0``) and was scored with it, else ``"raw"``; ``"samples"``: a few held-out
predictions for translate, text continuations for lm, one generated digit per class for dit;
``"checkpoint"``: ``"best"`` when the figures are of the run's best checkpoint, else ``"last"``,
with ``"checkpoint_step"``; ``"validation"``, in a run that scored its validation split while
training: the best step and score, the last evaluation's; see :mod:`addnorm.training.best`),
the quality figure, the watch figure, and the same for a tracker (``log_finish``).
:func:`addnorm.tasks.run.train_run` calls these on rank 0 once training has ended.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from addnorm.inspection.figure import plot_watch
from addnorm.tasks.task import AnyTask, TaskConfig
from addnorm.training import distributed
from addnorm.training.best_runner import BestRunner
from addnorm.training.budget import Replan
from addnorm.training.logger import Logger, read_png
from addnorm.training.metrics import draw_samples, plot_loss_curve, plot_quality
from addnorm.training.stopping import STOP_SIGNALS
from addnorm.training.trainer import Trainer
from addnorm.training.trainer_io import TrainResult
from addnorm.training.watch import WATCH_FIGURE, WATCH_FILE, read_watch
from addnorm.utils.files import write_file_atomic

__all__ = ["RunSummary", "best_checkpoint", "finish_run", "log_finish"]


@dataclass(frozen=True)
class RunSummary:
    """What ``train_run`` did.

    Attributes:
        run_dir, checkpoint: where the run and its last checkpoint are.
        step, stopped_by, elapsed_s: as in ``TrainResult``.
        metrics: the held-out figures (empty if a signal stopped the run: ``stopped_by`` is
            "interrupt" or "terminate").
        loss_png: the loss curve, or None if nothing was logged.
        replan: how the run was fitted to its time budget while it trained (``TrainResult``'s),
            None if it was not.
        best: the best checkpoint (``keep_best``), whose weights ``metrics`` scores; None
            without one.
    """

    run_dir: Path
    checkpoint: Path
    step: int
    stopped_by: str
    elapsed_s: float
    metrics: dict
    loss_png: Path | None
    replan: Replan | None = None
    best: Path | None = None


def finish_run(
    task: AnyTask,
    model: nn.Module,
    trainer: Trainer,
    result: TrainResult,
    task_cfg: TaskConfig,
    run_dir: Path,
    best: Path | None = None,
) -> RunSummary:
    """Plot the loss curve and, unless a signal stopped the run, score ``model`` (a plain copy
    of the trained or EMA weights: the ``best`` checkpoint's, when the run kept one) into
    metrics.json."""
    png = None
    jsonl = run_dir / "metrics.jsonl"
    if jsonl.is_file() and jsonl.stat().st_size > 0:
        png = plot_loss_curve(
            run_dir / "metrics.jsonl", run_dir / "loss.png", title=task.name,
            ylabel=task.loss_label,
        )
    watched = read_watch(run_dir / WATCH_FILE)
    if watched:
        plot_watch(watched, run_dir / WATCH_FIGURE, title=task.name)
    metrics: dict = {}
    if result.stopped_by not in STOP_SIGNALS.values():
        metrics = {
            "task": task.name,
            "metric": task.metric,
            "step": result.step,
            "train_loss": result.loss,
            "stopped_by": result.stopped_by,
            "elapsed_s": result.elapsed_s,
            "weights": "raw" if trainer.ema is None else "ema",
            "world_size": distributed.world_size(),
        }
        if result.compile_s is not None:
            metrics["compile_s"] = result.compile_s
        metrics.update(_validation_figures(trainer, result, best))
        metrics.update(task.evaluate_run(model, task_cfg))
        metrics["samples"] = task.run_samples(model)
        final = (result.elapsed_s, float(metrics[task.metric]))
        quality = plot_quality(
            jsonl, run_dir / "quality.png", metric=task.metric,
            final=final, ylabel=task.loss_label, title=f"{task.name}: where quality arrives",
        ) if jsonl.is_file() else None
        if quality is not None:
            metrics["quality_figure"] = quality.name
        text = json.dumps(metrics, indent=1)
        write_file_atomic(run_dir / "metrics.json", lambda tmp: tmp.write_text(text, "utf-8"))
    return RunSummary(
        run_dir, result.checkpoint, result.step, result.stopped_by, result.elapsed_s, metrics, png,
        result.replan, best,
    )


def best_checkpoint(trainer: Trainer) -> Path | None:
    """The best checkpoint the trainer kept (``keep_best``), or None."""
    return trainer.probe.best_checkpoint if isinstance(trainer.probe, BestRunner) else None


def _validation_figures(trainer: Trainer, result: TrainResult, best: Path | None
                        ) -> dict[str, Any]:
    """What ``metrics.json`` says of the evaluations on the validation split: which
    checkpoint its figures score (``"checkpoint"``: "best" or "last", and its step,
    ``"checkpoint_step"``) and, in a run that evaluated, ``"validation"``: the metric, its
    direction, the best step and score, the last evaluation's step and score, the evaluations
    since the best, ``every`` (``eval_every``) and ``patience``."""
    runner = trainer.probe if isinstance(trainer.probe, BestRunner) else None
    figures: dict[str, Any] = {
        "checkpoint": "last" if best is None else "best",
        "checkpoint_step": result.step if runner is None or best is None else runner.record.step,
    }
    if runner is not None:
        figures["validation"] = {**runner.record.to_dict(), "every": runner.keeper.every,
                                 "patience": runner.keeper.patience}
    return figures


def log_finish(logger: Logger, task: AnyTask, summary: RunSummary, run_dir: Path) -> None:
    """A finished run for ``logger``, at its last step: the held-out figures (numbers) under
    ``final/<name>``, and as images the samples (``samples``), the loss curve
    (``figures/loss``) and the quality figure (``figures/quality``) when drawn."""
    step, metrics = summary.step, summary.metrics
    numbers = {
        f"final/{name}": float(value) for name, value in metrics.items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    }
    if numbers:
        logger.log_scalars(step, numbers)
    if metrics.get("samples"):
        logger.log_image(step, "samples", draw_samples(
            metrics["samples"], title=f"{task.name}: samples at step {step}"
        ))
    figures = {"figures/loss": summary.loss_png}
    if "quality_figure" in metrics:
        figures["figures/quality"] = run_dir / metrics["quality_figure"]
    for tag, png in figures.items():
        if png is not None and Path(png).is_file():
            logger.log_image(step, tag, read_png(png))
    logger.flush()
