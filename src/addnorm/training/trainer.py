"""A small, generic trainer: AdamW, a torch lr scheduler, clipping, accumulation, optional
bf16 autocast, an EMA of the weights (torch's ``AveragedModel``), budgets, exact resume,
atomic checkpoints and trackers (``loggers``: TensorBoard, or any ``Logger``).

It trains any ``nn.Module`` given a loss function and a source of batches:

- ``loss_fn(model, batch) -> (loss, n_tokens)``: the mean loss of one micro-batch (a scalar
  tensor) and how many target tokens it covered (for tokens/s).
- ``batches``: an object with ``next_batch() -> dict[str, Tensor]`` (CPU tensors) and
  ``state_dict()`` / ``load_state_dict(state)`` whose state is JSON (the data order).

Resuming restores the weights, the optimizer, the lr scheduler, the EMA, the step, every
global random number generator and the data order, so on the same machine and thread count
a resumed run's loss curve equals the uninterrupted run's bit for bit.

``fit`` is the loop; what happens around it lives beside it, one concern a module:
``wrapping`` (the EMA copy, DDP or FSDP2, ``torch.compile``: :func:`wrap_model`),
``checkpoint_state`` (what a checkpoint holds, saved and loaded back), ``stopping`` (Ctrl-C,
SIGTERM and the time cap, agreed between ranks: ``stopped_by``), ``step_boundary`` (what an
interrupt inside a step keeps), ``step_errors`` (what a failed step says), ``probes``
(quality along the way), ``record_window`` (what a metrics record covers), ``callbacks``
(the progress bar, ``metrics.jsonl``, and hooks for a caller's own code at each step and
record, handed a ``trainer_state.TrainerState``, not the trainer), ``best`` (scores on the
validation split, the best checkpoint and early stopping: ``validation``), ``logger`` (TensorBoard
or any tracker: ``loggers``), ``clock`` (training time, probes left out), ``optimizer``,
``ema`` (torch's ``AveragedModel``), ``schedules`` (torch's lr schedulers), ``budget`` (a
fresh run's length fitted to ``max_minutes`` once its first steps are timed), ``resume``
(whether a checkpoint fits before it is loaded) and ``watch`` (per-layer measurements on
every few steps, ``watch=``).

Several processes (``torchrun``; see ``distributed.py``): each rank trains on its share of the
global batch, its loss weighted so that DDP's gradient average is the global batch's mean
gradient; stops are agreed between ranks, and only rank 0 writes checkpoints and metrics and
shows progress. ``config.fsdp`` shards the model with FSDP2 instead; its checkpoints are
sharded (``torch.distributed.checkpoint``, each rank writing its part; see ``checkpoint.py``)
and load at any world size. ``config.activation_checkpointing`` recomputes each layer in the
backward pass; ``config.compile`` runs the forward through ``torch.compile`` (the model object,
and so its checkpoint keys, stay the same; ``TrainResult.compile_s`` is the first step's time).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import nn
from torch.optim.lr_scheduler import LRScheduler
from torch.optim.swa_utils import AveragedModel

from addnorm.data.batches import RankShard
from addnorm.training import distributed
from addnorm.training.best import Validation, eval_interval
from addnorm.training.best_runner import BestRunner, probe_runner
from addnorm.training.budget import StepBudget
from addnorm.training.callbacks import Callback, MetricsFile, ProgressBar
from addnorm.training.checkpoint import LoadedCheckpoint
from addnorm.training.checkpoint_state import (
    Progress,
    TrainingParts,
    checked_extra_config,
    load_training,
    save_training,
)
from addnorm.training.clock import TrainingClock
from addnorm.training.config import TrainConfig
from addnorm.training.logger import Logger, LoggerCallback
from addnorm.training.optimizer import clip_factor, gradient_norm, make_optimizer
from addnorm.training.probes import Probe, ProbeRunner
from addnorm.training.record_window import RecordWindow
from addnorm.training.resume import check_checkpoint_fits
from addnorm.training.schedules import ScheduleConfig, SchedulerFactory, make_scheduler
from addnorm.training.step_boundary import StepBoundary
from addnorm.training.step_errors import non_finite_loss, out_of_memory
from addnorm.training.stopping import STOP_SIGNALS, StopRequests
from addnorm.training.trainer_io import BatchSource, LossFn, TrainResult
from addnorm.training.trainer_state import TrainerState
from addnorm.training.watch import WATCH_FILE, WatchCallback, logger_sink
from addnorm.training.wrapping import wrap_model
from addnorm.utils.memory import is_out_of_memory

# (BatchSource, LossFn, TrainResult, Probe, STOP_SIGNALS, make_optimizer, check_checkpoint_fits:
# from their modules)
__all__ = [
    "STOP_SIGNALS",
    "BatchSource",
    "LossFn",
    "Probe",
    "Trainer",
    "TrainResult",
    "check_checkpoint_fits",
    "make_optimizer",
    "time_steps",
]

class Trainer:
    """Trains ``model`` (already on its device) with ``loss_fn`` on ``batches``.

    Args:
        model: the module to train; batches are moved to the device of its parameters.
        loss_fn: ``(model, batch) -> (mean loss, n_tokens)``.
        batches: the batch source (see the module docstring).
        config: the trainer settings.
        run_dir: where checkpoints and ``metrics.jsonl`` go.
        schedule: the learning rate of each step: a :class:`ScheduleConfig` (saved in every
            checkpoint) or any ``optimizer -> torch.optim.lr_scheduler.LRScheduler`` maker;
            the scheduler (``self.scheduler``) steps after every optimizer step, and
            checkpoints keep its ``state_dict`` (as JSON: it must hold plain numbers).
        run_info: JSON saved in every checkpoint (what is needed to rebuild the model).
        extra_config: more settings (JSON) saved with ``config``'s in every checkpoint's
            ``train_config`` (a task's own: a resumed run reads them back from there); their
            names must differ from ``TrainConfig``'s fields.
        progress: show a tqdm progress bar on stderr (rank 0 only).
        probe: a :class:`~addnorm.training.probes.Probe` of quality along the way (ignored
            with several processes).
        callbacks: more :class:`~addnorm.training.callbacks.Callback` hooks, called after the
            trainer's own, in order.
        watch: measure inside the model every ``watch`` steps (and at the first and last)
            into ``watch.jsonl`` (:mod:`~addnorm.training.watch`) and, as ``watch/...``
            scalars, to ``loggers``; None: no watch, no hooks.
        loggers: :class:`~addnorm.training.logger.Logger` trackers (TensorBoard, W&B, ...)
            that get every metrics record (rank 0 only); their owner closes them.
        metrics_file: write ``metrics.jsonl`` (rank 0).
        clock: the seconds training time is read on (the budget's pace, the time cap); None:
            ``time.monotonic`` (a test's fake clock makes them deterministic).
        validation: keep the best, stop early (:func:`~addnorm.training.best_runner.probe_runner`).

    With a process group, ``model`` is wrapped for data parallelism (or sharded, with
    ``config.fsdp``) here, and ``batches`` gives each rank its share of the global batch.
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: LossFn,
        batches: BatchSource,
        config: TrainConfig,
        *,
        run_dir: str | os.PathLike,
        schedule: ScheduleConfig | SchedulerFactory,
        run_info: dict | None = None,
        extra_config: dict | None = None,
        progress: bool = False,
        probe: Probe | None = None,
        callbacks: Sequence[Callback] = (),
        watch: int | None = None,
        loggers: Sequence[Logger] = (),
        metrics_file: bool = True,
        clock: Callable[[], float] | None = None,
        validation: Validation | None = None,
    ) -> None:
        if not isinstance(config, TrainConfig):
            raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
        self.extra_config = checked_extra_config(config, extra_config or {})
        self.model, self.loss_fn, self.config = model, loss_fn, config
        self.batches: BatchSource = batches
        if distributed.is_distributed():
            self.batches = RankShard(
                batches, rank=distributed.rank(), world_size=distributed.world_size()
            )
        self.run_dir = Path(run_dir)
        self.schedule = schedule
        self.run_info = run_info or {}
        self.callbacks = [*_own_callbacks(self.run_dir, progress, metrics_file, watch, loggers),
                          *callbacks]
        self._clock = TrainingClock(clock)
        self.probe = probe_runner(probe, validation, config, run_dir, clock=self._clock,
                                  parts=self._parts)
        self.device = next(model.parameters()).device
        self.wrapped = wrap_model(model, config)  # the EMA, DDP or FSDP2, compile
        self.optimizer = make_optimizer(model, config)  # (after sharding: FSDP2's parameters)
        self.scheduler = make_scheduler(schedule, self.optimizer)
        self.step = 0
        self.elapsed_s = 0.0  # training time of the invocations before this ``fit``
        self.resumed_from: int | None = None  # the checkpoint's step, after ``load``
        self._boundary = StepBoundary()
        self._records = RecordWindow()  # the steps since the last metrics record
        self._step_lr = 0.0  # the last step's; its gradients' norm, and what clipping scaled
        self._grad_norm, self._clip_factor = torch.zeros(()), torch.ones(())  # them by
        self._fit_from_step = 0  # the step ``fit`` began at

    @property
    def ema(self) -> AveragedModel | None:
        """The average of the weights (``config.ema_decay`` > 0), or None."""
        return self.wrapped.ema

    @property
    def forward_model(self) -> nn.Module:
        """What runs the forward: the model, its DDP wrapper or its compiled form."""
        return self.wrapped.forward_model

    @property
    def step_lr(self) -> float:
        """The learning rate the last step took (the scheduler's, read before its update)."""
        return self._step_lr

    def load(self, checkpoint: LoadedCheckpoint) -> None:
        """Continue from ``checkpoint`` (weights, optimizer, lr scheduler, EMA, step, RNG, data
        order; any world size, sharded or whole: :func:`~.checkpoint_state.load_training`).
        Raises ``CheckpointError`` naming the file (and the tensor or entry) that does not
        fit, checked before anything is loaded."""
        progress, self.scheduler = load_training(self._parts(), checkpoint)
        self.step, self.elapsed_s = progress.step, progress.elapsed_s
        self._records.losses = progress.loss_window
        self.resumed_from = checkpoint.step

    def fit(self) -> TrainResult:
        """Train until ``max_steps`` (fitted to ``max_minutes``: :mod:`~addnorm.training.budget`),
        the time cap, Ctrl-C or SIGTERM (:mod:`~addnorm.training.stopping`); an interrupt inside
        a step keeps what :mod:`~addnorm.training.step_boundary` says. Ends with a checkpoint."""
        loss, compile_s = None, None
        self._fit_from_step = self.step  # a non-finite loss before any update: the weights
        self._budget = StepBudget.for_run(  # a resumed run keeps its plan
            self.config, self.schedule, fresh=self.step == 0 and self.resumed_from is None)
        with StopRequests(self.config.max_minutes, self.probe, clock=self._clock) as stops:
            self._clock.start()
            self._records.start()
            try:
                self._call("on_fit_start")
                while self.step < self.config.max_steps and not stops.agreed(self.step):
                    self._boundary.enter(self.batches)
                    began = time.monotonic()
                    loss, tokens = self._train_step()
                    if self.config.compile and compile_s is None:
                        compile_s = time.monotonic() - began
                    self._after_step(loss, tokens)
            except KeyboardInterrupt:
                stops.interrupted()
                if self._boundary.phase == "update":
                    self.elapsed_s += self._clock.seconds()
                    step, kept = self._boundary.kept_checkpoint(self.run_dir)
                    return TrainResult(step, None, kept, stops.stopped_by, self.elapsed_s)
                self._boundary.rewind(self.batches)
            except (MemoryError, RuntimeError) as err:
                if not is_out_of_memory(err):
                    raise
                raise MemoryError(
                    out_of_memory(err, step=self.step + 1, run_dir=self.run_dir)) from None
            finally:
                self._boundary.phase = "idle"
                self._call("on_fit_end")
        self.elapsed_s += self._clock.seconds()
        path = self.save()
        return TrainResult(self.step, loss, path, stops.stopped_by, self.elapsed_s, compile_s,
                           self._budget.replan if self._budget else None)

    def save(self, *, elapsed_now: float = 0.0) -> Path:
        """Write a checkpoint of the current step (atomically; see
        :mod:`~addnorm.training.checkpoint_state` for what it holds), with ``elapsed_now``
        seconds of this ``fit`` added to the training time. With several processes every
        rank calls it (a sharded model's ranks each write their part, a replicated one's rank
        0 writes); every rank returns the path."""
        progress = Progress(self.step, self.elapsed_s + elapsed_now, self._records.losses)
        return save_training(self._parts(), progress, self.run_dir)

    def scored_weights(self) -> dict[str, torch.Tensor]:
        """The weights a finished run is scored with (the EMA's when it keeps one), whole.
        With several processes every rank calls it (a sharded model is gathered)."""
        return distributed.full_model_state(self.wrapped.scored)

    def _train_step(self) -> tuple[float, int]:
        """One optimizer step over ``grad_accum`` micro-batches; returns (mean loss, tokens)."""
        lr = self._step_lr = self.optimizer.param_groups[0]["lr"]  # the scheduler's, for it
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        distributed.seed_rank(self.config.seed, self.step)
        self._call("on_step_start")
        mean_loss, tokens = self._gradients()
        if not math.isfinite(mean_loss):
            raise FloatingPointError(non_finite_loss(
                mean_loss, lr, step=self.step + 1, updated=self.step > self._fit_from_step,
                model=self.model, resumed_from=self.resumed_from, run_dir=self.run_dir))
        self._grad_norm = gradient_norm(self.model, self.config.grad_clip)  # (before clipping)
        self._clip_factor = clip_factor(self._grad_norm, self.config.grad_clip)
        self._call("on_before_update")
        self._boundary.phase = "update"
        self.optimizer.step()
        if self.wrapped.ema is not None:
            self.wrapped.ema.update_parameters(self.model)
        self.scheduler.step()  # the next step's lr
        self.step += 1
        self._boundary.phase = "idle"
        return mean_loss, tokens

    def _gradients(self) -> tuple[float, int]:
        """Forward and backward over the step's micro-batches, gradients accumulated (and
        averaged over the ranks); returns the global mean loss and the tokens it covered."""
        accum = self.config.grad_accum
        total, tokens = 0.0, 0
        for i in range(accum):
            batch = {k: v.to(self.device) for k, v in self.batches.next_batch().items()}
            with self.wrapped.sync_gradients(i == accum - 1):
                with torch.autocast(self.device.type, torch.bfloat16, enabled=self.config.bf16):
                    loss, n_tokens = self.loss_fn(self.wrapped.forward_model, batch)
                    # this rank's share of the global batch's mean (1 with one process)
                    loss = loss * distributed.global_mean_weight(n_tokens)
                (loss / accum).backward()
            total += loss.item()
            tokens += n_tokens
        total, tokens_all = distributed.all_reduce_sum([total, float(tokens)])
        return total / distributed.world_size() / accum, int(tokens_all)

    def _after_step(self, loss: float, tokens: int) -> None:
        """Between steps: the callbacks, the probe and the metrics record when due
        (:mod:`~addnorm.training.record_window`), and the periodic checkpoint."""
        cfg = self.config
        probing = self.probe is not None and self.probe.due(self.step, cfg.max_steps)
        due = probing or self.step % cfg.log_every == 0 or self.step == cfg.max_steps
        mean = self._records.add(loss, tokens, closes=due)  # (closed when due, written or not)
        self._call("on_step_end", loss, tokens)
        if due:
            scores = self._run_probe() if probing else {}
            now = self._clock.seconds()
            self._call("on_log", self._records.record(
                step=self.step, loss=mean, lr=self._step_lr, now=now, scores=scores,
                grad_norm=distributed.as_float(self._grad_norm), elapsed_before=self.elapsed_s))
            self._records.restart(now)
        if self._budget and (fitted := self._budget.after_step(  # (before the checkpoint)
                self.step, self._clock.seconds(), cfg, self.schedule, self.optimizer)):
            self.config, self.schedule, self.scheduler = _replanned(fitted, self.probe)
        if cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0:
            self.save(elapsed_now=self._clock.seconds())

    def _run_probe(self) -> dict[str, float]:
        """The probe's scores, its time set aside (see :mod:`~addnorm.training.probes`)."""
        assert self.probe is not None
        with self._clock.set_aside():
            return self.probe(self.model, self.wrapped.ema, self.step, self.config.max_steps)

    def _call(self, hook: str, *args: object) -> None:
        """Call ``hook`` of every callback with where training stands
        (:class:`~addnorm.training.trainer_state.TrainerState`) and ``args``."""
        state = TrainerState(
            self.step, self._step_lr, self.config, self.run_dir, self.resumed_from, self.model,
            self.optimizer, self.wrapped, self._grad_norm, self._clip_factor,
        )
        for callback in self.callbacks:
            getattr(callback, hook)(state, *args)

    def _parts(self) -> TrainingParts:
        """What a checkpoint keeps the state of, and the settings it records."""
        return TrainingParts(
            self.wrapped, self.optimizer, self.scheduler, self.batches, self.config,
            self.schedule, self.run_info, self.extra_config, self.probe,
        )


def time_steps(trainer: Trainer, steps: int) -> list[tuple[float, int]]:
    """Train ``steps`` steps of ``trainer`` outside ``fit`` (no callbacks, records or
    checkpoints) and return each one's seconds and targets: the measured warm-up a run is
    planned from (:mod:`addnorm.tasks.budget`), on a scratch trainer whose weights, optimizer
    and data order move on. With several processes every rank calls it."""
    timed = []
    for _ in range(steps):
        began = time.monotonic()
        _, tokens = trainer._train_step()
        timed.append((time.monotonic() - began, tokens))
    return timed


def _replanned(fitted: tuple[TrainConfig, ScheduleConfig, LRScheduler],
               probe: ProbeRunner | None) -> tuple[TrainConfig, ScheduleConfig, LRScheduler]:
    """A re-plan's ``fitted`` config, schedule and scheduler (``StepBudget.after_step``), the
    evaluations on the validation split without ``eval_every`` set to every tenth of the new
    plan, as a run resumed after the re-plan takes them
    (:func:`~addnorm.training.best.eval_interval`)."""
    if isinstance(probe, BestRunner) and fitted[0].eval_every is None:
        probe.keeper.every = eval_interval(fitted[0])
    return fitted


def _own_callbacks(run_dir: Path, progress: bool, metrics_file: bool, watch: int | None,
                   loggers: Sequence[Logger]) -> list[Callback]:
    """The trainer's own callbacks: the progress bar, ``metrics.jsonl`` and the loggers on
    rank 0, the watch on every rank."""
    main = distributed.is_main()
    return [
        *([ProgressBar()] if progress and main else []),
        *([MetricsFile(run_dir / "metrics.jsonl")] if main and metrics_file else []),
        *([WatchCallback(watch, run_dir / WATCH_FILE,
                         sinks=[logger_sink(logger) for logger in loggers])]
          if watch is not None else []),
        *([LoggerCallback(logger) for logger in loggers] if main else []),
    ]
