"""A small, generic trainer: AdamW, a step-indexed lr schedule, clipping, accumulation,
optional bf16 autocast, an EMA of the weights, budgets, exact resume and atomic checkpoints.

It trains any ``nn.Module`` given a loss function and a source of batches:

- ``loss_fn(model, batch) -> (loss, n_tokens)``: the mean loss of one micro-batch (a scalar
  tensor) and how many target tokens it covered (for tokens/s).
- ``batches``: an object with ``next_batch() -> dict[str, Tensor]`` (CPU tensors) and
  ``state_dict()`` / ``load_state_dict(state)`` whose state is JSON (the data order).

Resuming restores the weights, the optimizer, the EMA, the step, every global random number
generator and the data order, so on the same machine and thread count a resumed run's loss
curve equals the uninterrupted run's bit for bit.

``fit`` is the loop; what happens around it lives beside it, one concern a module:
``stopping`` (Ctrl-C, SIGTERM and the time cap, agreed between ranks: ``stopped_by``),
``step_boundary`` (what an interrupt inside a step keeps), ``probes`` (quality along the
way), ``callbacks`` (the progress bar, ``metrics.jsonl``, and hooks for a caller's own code at
each step and record), ``clock`` (training time, probes left out), ``optimizer``, ``ema``,
``schedules``, ``resume`` (whether a checkpoint fits before it is loaded) and ``watch`` (per-layer
measurements on every few steps, ``watch=``).

Several processes (``torchrun``; see ``distributed.py``): each rank trains on its share of the
global batch, its loss weighted so that DDP's gradient average is the global batch's mean
gradient; stops are agreed between ranks, and only rank 0 writes checkpoints and metrics and
shows progress. ``config.fsdp`` shards the model with FSDP2 instead; checkpoints are whole
state dicts either way. ``config.activation_checkpointing`` recomputes each layer in the
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
from addnorm.training.ema import EMA
from addnorm.training.optimizer import make_optimizer
from addnorm.training.probes import Probe, ProbeRunner
from addnorm.training.resume import check_checkpoint_fits, refusing
from addnorm.training.schedules import LRSchedule
from addnorm.training.state import (
    capture_rng,
    optimizer_from_parts,
    optimizer_to_parts,
    restore_rng,
)
from addnorm.training.step_boundary import StepBoundary
from addnorm.training.stopping import STOP_SIGNALS, StopRequests
from addnorm.training.watch import WATCH_FILE, WatchCallback

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
        schedule: the learning rate of each step.
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
            into ``watch.jsonl`` (:mod:`~addnorm.training.watch`); None: no watch, no hooks.

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
        schedule: LRSchedule,
        run_info: dict | None = None,
        extra_config: dict | None = None,
        progress: bool = False,
        probe: Probe | None = None,
        callbacks: Sequence[Callback] = (),
        watch: int | None = None,
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
        self.callbacks: list[Callback] = [
            *([ProgressBar()] if progress and distributed.is_main() else []),
            *([MetricsFile(self.run_dir / "metrics.jsonl")] if distributed.is_main() else []),
            *([WatchCallback(watch, self.run_dir / WATCH_FILE)] if watch is not None else []),
            *callbacks,
        ]
        self.probe = None if distributed.is_distributed() or probe is None else ProbeRunner(probe)
        self.device = next(model.parameters()).device
        self.forward_model = distributed.prepare_model(
            model, activation_checkpointing=config.activation_checkpointing, fsdp=config.fsdp
        )
        if config.compile:  # the module stays the same object: its state dict keys do too
            self.forward_model = cast(nn.Module, torch.compile(self.forward_model))
        self.optimizer = make_optimizer(model, config)
        self._optimizer_view = distributed.OptimizerView(model, self.optimizer)
        self.ema = (
            EMA(model, config.ema_decay, warmup=config.ema_warmup) if config.ema_decay > 0
            else None
        )
        self.step = 0
        self.elapsed_s = 0.0  # training time of the invocations before this ``fit``
        self.resumed_from: int | None = None  # the checkpoint's step, after ``load``
        self._boundary = StepBoundary()
        self._clock = TrainingClock()
        self._window = (0, 0.0)  # tokens, and training seconds, since the last record

    def load(self, checkpoint: LoadedCheckpoint) -> None:
        """Continue from ``checkpoint``: weights, optimizer, EMA, step, RNG and data order.

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
        if self.ema is not None:
            with refusing(checkpoint.path / "ema.safetensors"):
                self.ema.load_state_dict(tensors["ema"])
        with refusing(checkpoint.path / "state.json"):
            self.batches.load_state_dict(checkpoint.state["data"])
        with refusing(checkpoint.path / "rng.safetensors"):
            restore_rng(tensors["rng"], checkpoint.state["rng"])
        self.step = checkpoint.step
        self.elapsed_s = float(checkpoint.state.get("elapsed_s", 0.0))
        self.resumed_from = checkpoint.step

    def fit(self) -> TrainResult:
        """Train until ``max_steps`` or ``max_minutes`` (whichever ends first), Ctrl-C or
        SIGTERM (:mod:`~addnorm.training.stopping`); an interrupt inside a step keeps what
        :mod:`~addnorm.training.step_boundary` says. Ends with a checkpoint of the last step."""
        loss, compile_s = None, None
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
            finally:
                self._boundary.phase = "idle"
                self._call("on_fit_end")
        self.elapsed_s += self._clock.seconds()
        path = self.save()
        return TrainResult(self.step, loss, path, stops.stopped_by, self.elapsed_s, compile_s)

    def save(self, *, elapsed_now: float = 0.0) -> Path:
        """Write a checkpoint of the current step (atomically; see ``checkpoint.py``), with
        ``elapsed_now`` seconds of this ``fit`` added to the training time. With several
        processes every rank calls it (a sharded model is gathered) and rank 0 writes; the
        others return the path rank 0 writes."""
        opt_tensors, opt_skeleton = optimizer_to_parts(
            self._optimizer_view  # type: ignore[arg-type]  # an optimizer's state interface
        )
        rng_tensors, rng_json = capture_rng()
        tensors = {
            "model": distributed.full_model_state(self.model),
            "optimizer": opt_tensors,
            "rng": rng_tensors,
        }
        if self.ema is not None:
            tensors["ema"] = distributed.full_tensors(self.ema.state_dict())
        if not distributed.is_main():
            return self.run_dir / "checkpoints" / f"step-{self.step:08d}"
        state = {
            "step": self.step,
            "elapsed_s": self.elapsed_s + elapsed_now,
            "run": self.run_info,
            "train_config": {**self.config.to_dict(), **self.extra_config},
            "schedule": dataclasses.asdict(self.schedule),
            "optimizer": opt_skeleton,
            "data": self.batches.state_dict(),
            "rng": rng_json,
        }
        return save_checkpoint(
            self.run_dir, self.step, tensors, state, keep=self.config.keep_checkpoints
        )

    def scored_weights(self) -> dict[str, torch.Tensor]:
        """The weights a finished run is scored with (the EMA's when it keeps one), whole.
        With several processes every rank calls it (a sharded model is gathered)."""
        if self.ema is not None:
            return distributed.full_tensors(self.ema.state_dict())
        return distributed.full_model_state(self.model)

    def _train_step(self) -> tuple[float, int]:
        """One optimizer step over ``grad_accum`` micro-batches; returns (mean loss, tokens)."""
        lr = self.schedule(self.step + 1)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        self._seed_other_ranks()
        self._call("on_step_start")
        mean_loss, tokens = self._gradients()
        if not math.isfinite(mean_loss):
            raise FloatingPointError(
                f"training loss is {mean_loss} at step {self.step + 1}; try a lower lr ({lr:.3g})"
            )
        if self.config.grad_clip > 0:
            nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        self._call("on_before_update")
        self._boundary.phase = "update"
        self.optimizer.step()
        if self.ema is not None:
            self.ema.update(self.model, self.step)  # the update's number: steps before it
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
        self._call("on_step_end", loss, tokens)
        probing = self.probe is not None and self.probe.due(self.step, cfg.max_steps)
        if probing or self.step % cfg.log_every == 0 or self.step == cfg.max_steps:
            self._log(loss, self._run_probe() if probing else {})
        if cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0:
            self.save(elapsed_now=self._clock.seconds())

    def _run_probe(self) -> dict[str, float]:
        """The probe's scores, its time set aside (see :mod:`~addnorm.training.probes`)."""
        assert self.probe is not None
        with self._clock.set_aside():
            return self.probe(self.model, self.ema)

    def _log(self, loss: float, scores: dict[str, float]) -> None:
        """Make this step's metrics record and hand it to the callbacks' ``on_log``."""
        now = self._clock.seconds()
        tokens, since = self._window
        record = {
            "step": self.step,
            "loss": loss,
            "lr": self.schedule(self.step),
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
