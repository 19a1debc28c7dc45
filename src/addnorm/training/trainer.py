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
``stopping`` (Ctrl-C, SIGTERM and the time cap, agreed between ranks: ``stopped_by``),
``step_boundary`` (what an interrupt inside a step keeps), ``probes`` (quality along the
way), ``callbacks`` (the progress bar, ``metrics.jsonl``, and hooks for a caller's own code at
each step and record), ``logger`` (TensorBoard or any tracker: ``loggers``), ``clock``
(training time, probes left out), ``optimizer``, ``ema`` (torch's ``AveragedModel``),
``schedules`` (torch's lr schedulers), ``resume`` (whether a checkpoint fits before it is
loaded) and ``watch`` (per-layer measurements on every few steps, ``watch=``).

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

import contextlib
import dataclasses
import math
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, cast

import torch
from torch import nn

from addnorm.data.batches import RankShard
from addnorm.training import distributed
from addnorm.training.callbacks import Callback, MetricsFile, ProgressBar
from addnorm.training.checkpoint import LoadedCheckpoint, list_checkpoints, save_checkpoint
from addnorm.training.clock import TrainingClock
from addnorm.training.config import TrainConfig
from addnorm.training.ema import make_ema, saved_n_averaged
from addnorm.training.logger import Logger, LoggerCallback
from addnorm.training.metrics import loss_window_from_state
from addnorm.training.optimizer import gradient_norm, make_optimizer
from addnorm.training.probes import Probe, ProbeRunner
from addnorm.training.resume import check_checkpoint_fits, refusing
from addnorm.training.schedules import (
    ScheduleConfig,
    SchedulerFactory,
    check_scheduler_state,
    make_scheduler,
    replay_schedule,
)
from addnorm.training.state import (
    capture_rng,
    optimizer_from_parts,
    optimizer_to_parts,
    restore_rng,
)
from addnorm.training.step_boundary import StepBoundary
from addnorm.training.stopping import STOP_SIGNALS, StopRequests
from addnorm.training.watch import WATCH_FILE, WatchCallback, logger_sink
from addnorm.utils.memory import describe_out_of_memory, is_out_of_memory

__all__ = [  # (Probe, STOP_SIGNALS, make_optimizer, check_checkpoint_fits: from their modules)
    "STOP_SIGNALS",
    "BatchSource",
    "LossFn",
    "Probe",
    "Trainer",
    "TrainResult",
    "check_checkpoint_fits",
    "make_optimizer",
]

LossFn = Callable[[nn.Module, dict[str, torch.Tensor]], tuple[torch.Tensor, int]]


class BatchSource(Protocol):
    """Where training batches come from; its JSON state is the data order."""

    def next_batch(self) -> dict[str, torch.Tensor]:
        """The next training batch (CPU tensors)."""
        ...

    def state_dict(self) -> dict:
        """The data order as JSON."""
        ...

    def load_state_dict(self, state: dict) -> None:
        """Continue the data order saved by ``state_dict``."""
        ...


@dataclass(frozen=True)
class TrainResult:
    """How ``Trainer.fit`` ended.

    Attributes:
        step: optimizer steps done in total.
        loss: the last step's training loss (None if no step ran).
        checkpoint: the checkpoint written at the end.
        stopped_by: "max_steps", "max_minutes", "interrupt" (SIGINT, Ctrl-C) or "terminate"
            (SIGTERM).
        elapsed_s: training time of all invocations together, in seconds.
        compile_s: with ``config.compile``, the first step's time in this invocation (it
            includes compiling the forward and backward); else None.
    """

    step: int
    loss: float | None
    checkpoint: Path
    stopped_by: str
    elapsed_s: float
    compile_s: float | None = None


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
    ) -> None:
        if not isinstance(config, TrainConfig):
            raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
        self.extra_config = dict(extra_config or {})
        clash = sorted(set(self.extra_config) & set(config.to_dict()))
        if clash:
            raise ValueError(f"extra_config must not repeat TrainConfig fields, got {clash}")
        self.model, self.loss_fn, self.config = model, loss_fn, config
        self.batches: BatchSource = batches
        if distributed.is_distributed():
            self.batches = RankShard(
                batches, rank=distributed.rank(), world_size=distributed.world_size()
            )
        self.run_dir = Path(run_dir)
        self.schedule = schedule
        self.run_info = run_info or {}
        main = distributed.is_main()
        self.callbacks: list[Callback] = [
            *([ProgressBar()] if progress and main else []),
            *([MetricsFile(self.run_dir / "metrics.jsonl")] if main and metrics_file else []),
            *([WatchCallback(watch, self.run_dir / WATCH_FILE,
                             sinks=[logger_sink(logger) for logger in loggers])]
              if watch is not None else []),
            *([LoggerCallback(logger) for logger in loggers] if main else []),
            *callbacks,
        ]
        self.probe = None if distributed.is_distributed() or probe is None else ProbeRunner(probe)
        self.device = next(model.parameters()).device
        self.ema = (  # before sharding (a sharded module cannot be copied), then sharded alike
            make_ema(model, config.ema_decay, warmup=config.ema_warmup) if config.ema_decay > 0
            else None
        )
        self.forward_model = distributed.prepare_model(
            model, activation_checkpointing=config.activation_checkpointing, fsdp=config.fsdp
        )
        if self.ema is not None and config.fsdp:
            distributed.shard(self.ema.module)
        if config.compile:  # the module stays the same object: its state dict keys do too
            self.forward_model = cast(nn.Module, torch.compile(self.forward_model))
        self.optimizer = make_optimizer(model, config)
        self._optimizer_view = distributed.OptimizerView(model, self.optimizer)
        self.scheduler = make_scheduler(schedule, self.optimizer)
        self.step = 0
        self.elapsed_s = 0.0  # training time of the invocations before this ``fit``
        self.resumed_from: int | None = None  # the checkpoint's step, after ``load``
        self._boundary = StepBoundary()
        self._clock = TrainingClock()
        self._window = (0, 0.0)  # tokens, and training seconds, since the last record
        self._step_lr, self._grad_norm = 0.0, torch.zeros(())  # the last step's
        self._losses = (0.0, 0)  # the steps' losses summed since the last record, and count
        self._fit_from_step = 0  # the step ``fit`` began at

    @property
    def step_lr(self) -> float:
        """The learning rate the last step took (the scheduler's, read before its update)."""
        return self._step_lr

    def load(self, checkpoint: LoadedCheckpoint) -> None:
        """Continue from ``checkpoint``: weights, optimizer, lr scheduler, EMA, step, RNG and
        data order (a checkpoint of any world size, sharded or whole).

        Raises ``CheckpointError`` naming the file (and the tensor or entry) whose contents do
        not fit this trainer (a tensor of another shape, a missing entry), before training; the
        manifest's hashes catch damage, this catches a checkpoint resealed after editing, or
        one of another model. The shapes are checked before anything is loaded."""
        check_checkpoint_fits(self.model, self.config, checkpoint, optimizer=self.optimizer)
        tensors = checkpoint.tensors
        with refusing(checkpoint.path / "model.safetensors"):
            distributed.load_full_model_state(self.model, tensors["model"])
        with refusing(checkpoint.path / "optimizer.safetensors"):
            optimizer_from_parts(
                self._optimizer_view,  # type: ignore[arg-type]  # an optimizer's state interface
                tensors["optimizer"],
                checkpoint.state["optimizer"],
            )
        with refusing(checkpoint.path / "state.json"):
            self._load_schedule(checkpoint)
        if self.ema is not None:
            with refusing(checkpoint.path / "ema.safetensors"):
                distributed.load_full_model_state(self.ema.module, tensors["ema"])
            with refusing(checkpoint.path / "state.json"):
                self.ema.n_averaged.fill_(saved_n_averaged(checkpoint.state, checkpoint.step))
        with refusing(checkpoint.path / "state.json"):
            self.batches.load_state_dict(checkpoint.state["data"])
        with refusing(checkpoint.path / "rng.safetensors"):
            restore_rng(tensors["rng"], checkpoint.state["rng"])
        with refusing(checkpoint.path / "state.json"):
            self._losses = loss_window_from_state(checkpoint.state.get("loss_window"))
        self.step = checkpoint.step
        self.elapsed_s = float(checkpoint.state.get("elapsed_s", 0.0))
        self.resumed_from = checkpoint.step

    def fit(self) -> TrainResult:
        """Train until ``max_steps`` or ``max_minutes`` (whichever ends first), Ctrl-C or
        SIGTERM (:mod:`~addnorm.training.stopping`); an interrupt inside a step keeps what
        :mod:`~addnorm.training.step_boundary` says. Ends with a checkpoint of the last step."""
        loss, compile_s = None, None
        self._fit_from_step = self.step  # a non-finite loss before any update: the weights
        with StopRequests(self.config.max_minutes) as stops:
            self._clock.start()
            self._window = (0, 0.0)
            try:
                self._call("on_fit_start")
                while self.step < self.config.max_steps and not stops.agreed():
                    self._boundary.enter(self.batches)
                    began = time.monotonic()
                    loss, tokens = self._train_step()
                    if self.config.compile and compile_s is None:
                        compile_s = time.monotonic() - began
                    self._after_step(loss, tokens)
            except KeyboardInterrupt:
                stops.interrupted()
                if self._boundary.phase == "update":
                    return self._keep_newest_checkpoint(stops.stopped_by)
                self._boundary.rewind(self.batches)
            except (MemoryError, RuntimeError) as err:
                if not is_out_of_memory(err):
                    raise
                raise MemoryError(self._out_of_memory(err)) from None
            finally:
                self._boundary.phase = "idle"
                self._call("on_fit_end")
        self.elapsed_s += self._clock.seconds()
        path = self.save()
        return TrainResult(self.step, loss, path, stops.stopped_by, self.elapsed_s, compile_s)

    def save(self, *, elapsed_now: float = 0.0) -> Path:
        """Write a checkpoint of the current step (atomically; see ``checkpoint.py``), with
        ``elapsed_now`` seconds of this ``fit`` added to the training time. With several
        processes every rank calls it: a sharded (FSDP2) model's ranks each write their part
        (``torch.distributed.checkpoint``), a replicated one's rank 0 writes; every rank
        returns the path."""
        sharded = distributed.is_fsdp(self.model)
        opt_tensors, opt_skeleton = optimizer_to_parts(
            self.optimizer if sharded  # its state as this rank's shards (DTensors)
            else self._optimizer_view  # type: ignore[arg-type]  # an optimizer's interface
        )
        rng_tensors, rng_json = capture_rng()
        model_state = distributed.model_state(self.model, whole=not sharded)
        tensors = {"model": model_state, "optimizer": opt_tensors}
        if distributed.is_main():  # the other ranks' generators follow (seed, step, rank)
            tensors["rng"] = rng_tensors
        if self.ema is not None:
            tensors["ema"] = distributed.model_state(self.ema.module, whole=not sharded)
        if not distributed.is_main() and not sharded:
            return self.run_dir / "checkpoints" / f"step-{self.step:08d}"
        state = {
            "step": self.step,
            "elapsed_s": self.elapsed_s + elapsed_now,
            "run": self.run_info,
            "train_config": {**self.config.to_dict(), **self.extra_config},
            "schedule": (
                dataclasses.asdict(self.schedule) if isinstance(self.schedule, ScheduleConfig)
                else None
            ),
            "scheduler": self.scheduler.state_dict(),
            "optimizer": opt_skeleton,
            "data": self.batches.state_dict(),
            "rng": rng_json,
            "loss_window": {"sum": self._losses[0], "steps": self._losses[1]},
        }
        if self.ema is not None:
            state["ema"] = {"n_averaged": int(self.ema.n_averaged)}
        return save_checkpoint(
            self.run_dir, self.step, tensors, state, keep=self.config.keep_checkpoints,
            sharded=sharded,
        )

    def scored_weights(self) -> dict[str, torch.Tensor]:
        """The weights a finished run is scored with (the EMA's when it keeps one), whole.
        With several processes every rank calls it (a sharded model is gathered)."""
        return distributed.full_model_state(self.model if self.ema is None else self.ema.module)

    def _train_step(self) -> tuple[float, int]:
        """One optimizer step over ``grad_accum`` micro-batches; returns (mean loss, tokens)."""
        lr = self._step_lr = self.optimizer.param_groups[0]["lr"]  # the scheduler's, for it
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        self._seed_other_ranks()
        self._call("on_step_start")
        mean_loss, tokens = self._gradients()
        if not math.isfinite(mean_loss):
            raise FloatingPointError(self._non_finite_loss(mean_loss, lr))
        self._grad_norm = gradient_norm(self.model, self.config.grad_clip)
        self._call("on_before_update")
        self._boundary.phase = "update"
        self.optimizer.step()
        if self.ema is not None:
            self.ema.update_parameters(self.model)
        self.scheduler.step()  # the next step's lr
        self.step += 1
        self._boundary.phase = "idle"
        return mean_loss, tokens

    def _out_of_memory(self, err: BaseException) -> str:
        """An allocation that failed inside ``fit`` (past the estimates made before it, which
        cannot see what other processes take meanwhile), in one line: the step, what could
        not be allocated and the checkpoint kept (none is written for a step that failed)."""
        newest = list_checkpoints(self.run_dir)
        kept = f"{newest[-1]} is kept" if newest else "no checkpoint was written yet"
        return (f"out of memory at step {self.step + 1} ({describe_out_of_memory(err)}); "
                f"{kept}: train with a smaller batch_size or model, or free memory")

    def _non_finite_loss(self, loss: float, lr: float) -> str:
        """What a non-finite loss says: after updates of this ``fit``, the step size (lr); on
        its first step, before any update, the weights it started from (a resumed
        checkpoint's, which the lr cannot have broken), with the worst of them named."""
        where = f"training loss is {loss} at step {self.step + 1}"
        if self.step > self._fit_from_step:
            return f"{where}; try a lower lr ({lr:.3g})"
        worst, name = 0.0, ""
        for key, tensor in self.model.state_dict().items():
            local = tensor.to_local() if hasattr(tensor, "to_local") else tensor  # (sharded)
            if local.is_floating_point() and local.numel():
                top = float(local.detach().abs().max())
                if not top <= worst:  # NaN wins too
                    worst, name = top, key
                if math.isnan(worst):
                    break
        largest = (f"NaN in {name}" if math.isnan(worst)
                   else f"largest |weight| {worst:.3g}, in {name}")
        if self.resumed_from is None:
            return (f"{where}, before any update: the initial weights or the first batch give a "
                    f"non-finite loss ({largest}), not the lr")
        return (f"{where}, before any update of this run: the weights of its checkpoint "
                f"step-{self.resumed_from:08d} (in {self.run_dir / 'checkpoints'}) give a "
                f"non-finite loss ({largest}); they are broken, not the lr: continue from an "
                "earlier checkpoint or train afresh")

    def _gradients(self) -> tuple[float, int]:
        """Forward and backward over the step's micro-batches, gradients accumulated (and
        averaged over the ranks); returns the global mean loss and the tokens it covered."""
        accum = self.config.grad_accum
        total, tokens = 0.0, 0
        for i in range(accum):
            batch = {k: v.to(self.device) for k, v in self.batches.next_batch().items()}
            with self._sync_gradients(i == accum - 1):
                with torch.autocast(
                    self.device.type, dtype=torch.bfloat16, enabled=self.config.bf16
                ):
                    loss, n_tokens = self.loss_fn(self.forward_model, batch)
                    # this rank's share of the global batch's mean (1 with one process)
                    loss = loss * distributed.global_mean_weight(n_tokens)
                (loss / accum).backward()
            total += loss.item()
            tokens += n_tokens
        total, tokens_all = distributed.all_reduce_sum([total, float(tokens)])
        return total / distributed.world_size() / accum, int(tokens_all)

    def _after_step(self, loss: float, tokens: int) -> None:
        """Between steps: the callbacks, the probe and the metrics record when due, and the
        periodic checkpoint."""
        cfg = self.config
        self._window = (self._window[0] + tokens, self._window[1])
        total, steps = self._losses[0] + loss, self._losses[1] + 1
        probing = self.probe is not None and self.probe.due(self.step, cfg.max_steps)
        due = probing or self.step % cfg.log_every == 0 or self.step == cfg.max_steps
        # A record closes the loss window at its step, written or not (an interrupt in
        # on_step_end drops it): a resumed run's windows then match the uninterrupted run's.
        self._losses = (0.0, 0) if due else (total, steps)
        self._call("on_step_end", loss, tokens)
        if due:
            self._log(total / steps, self._run_probe() if probing else {})
        if cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0:
            self.save(elapsed_now=self._clock.seconds())

    def _run_probe(self) -> dict[str, float]:
        """The probe's scores, its time set aside (see :mod:`~addnorm.training.probes`)."""
        assert self.probe is not None
        with self._clock.set_aside():
            return self.probe(self.model, self.ema)

    def _log(self, loss: float, scores: dict[str, float]) -> None:
        """Make this step's metrics record and hand it to the callbacks' ``on_log``;
        ``loss`` is the mean of the steps' losses since the record before (a resumed run's
        sum carried over in its checkpoint's ``loss_window``, so the records are the same)."""
        now = self._clock.seconds()
        tokens, since = self._window
        record = {
            "step": self.step,
            "loss": loss,
            "lr": self._step_lr,
            "grad_norm": _as_float(self._grad_norm),
            "tokens_per_s": tokens / max(now - since, 1e-9),
            "elapsed_s": self.elapsed_s + now,
            **scores,
        }
        self._call("on_log", record)
        self._window = (0, now)

    def _call(self, hook: str, *args: object) -> None:
        """Call ``hook`` of every callback with the trainer and ``args``."""
        for callback in self.callbacks:
            getattr(callback, hook)(self, *args)

    def _keep_newest_checkpoint(self, stopped_by: str) -> TrainResult:
        """After an interrupt inside the optimizer/EMA update: keep the newest checkpoint on
        disk (writing the half-updated weights would break exact resume)."""
        self.elapsed_s += self._clock.seconds()
        saved = list_checkpoints(self.run_dir)
        if not saved:
            raise KeyboardInterrupt(
                "interrupted inside an optimizer update before any checkpoint was written"
            )
        step = int(saved[-1].name.removeprefix("step-"))
        return TrainResult(step, None, saved[-1], stopped_by, self.elapsed_s)

    def _sync_gradients(self, last_micro_batch: bool):
        """DDP all-reduces gradients only on the last micro-batch of an accumulated step."""
        no_sync = getattr(self.forward_model, "no_sync", None)
        if last_micro_batch or no_sync is None:
            return contextlib.nullcontext()
        return no_sync()

    def _seed_other_ranks(self) -> None:
        """Ranks other than 0 draw dropout from a generator seeded by (seed, step, rank): the
        ranks' draws differ, and a resumed run repeats them (rank 0 keeps the global
        generator, which checkpoints save)."""
        if distributed.rank() > 0:
            draws = random.Random(f"{self.config.seed}/{self.step}/{distributed.rank()}")
            torch.manual_seed(draws.getrandbits(63))

    def _load_schedule(self, checkpoint: LoadedCheckpoint) -> None:
        """The scheduler's state from ``checkpoint`` (after the optimizer's: its groups hold
        the lr the scheduler goes on from). A checkpoint written before the schedules were
        torch's has none: its schedule is rebuilt and stepped to the checkpoint's step."""
        saved = checkpoint.state.get("scheduler")
        if saved is None:
            self.scheduler = replay_schedule(
                lambda: make_scheduler(self.schedule, self.optimizer), self.optimizer,
                checkpoint.step,
            )
            return
        check_scheduler_state(self.scheduler, saved, where="scheduler")
        self.scheduler.load_state_dict(saved)


def _as_float(value: torch.Tensor) -> float:
    """A (possibly replicated ``DTensor``) scalar as a Python float."""
    from torch.distributed.tensor import DTensor

    if isinstance(value, DTensor):
        value = value.full_tensor()
    return float(value)
