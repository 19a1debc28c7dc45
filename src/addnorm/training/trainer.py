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

Ctrl-C and SIGTERM: while ``fit`` runs (in the main thread), SIGINT and SIGTERM only set a
flag; the current step finishes, a checkpoint is written and ``fit`` returns with
``stopped_by == "interrupt"`` (SIGINT) or ``"terminate"`` (SIGTERM). A second signal of either
kind raises ``KeyboardInterrupt`` at once (handled as below; ``stopped_by`` still names the
first). A ``KeyboardInterrupt`` raised by other means is handled by where it lands, which the
trainer tracks as a phase:

- ``"forward"`` (drawing batches, forward, backward): the weights are untouched, so the data
  order and random state go back to the step's start and a checkpoint of the previous step is
  written;
- ``"update"`` (the optimizer step and the EMA update): the weights may be half-updated, so no
  checkpoint is written; ``fit`` returns the newest periodic checkpoint (or re-raises the
  interrupt if there is none);
- ``"idle"`` (between steps, logging, saving): the step is complete, so a checkpoint of it is
  written with the current data and random state.

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
import copy
import dataclasses
import math
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, cast

import torch
from torch import nn
from tqdm.auto import tqdm

from addnorm.data.batches import RankShard
from addnorm.training import distributed
from addnorm.training.checkpoint import (
    LoadedCheckpoint,
    list_checkpoints,
    save_checkpoint,
)
from addnorm.training.config import TrainConfig
from addnorm.training.ema import EMA
from addnorm.training.metrics import MetricsLog
from addnorm.training.schedules import LRSchedule
from addnorm.training.state import (
    capture_rng,
    check_optimizer_parts,
    optimizer_from_parts,
    optimizer_to_parts,
    restore_rng,
)
from addnorm.utils.files import CheckpointError

__all__ = [
    "STOP_SIGNALS",
    "BatchSource",
    "Probe",
    "Trainer",
    "TrainResult",
    "check_checkpoint_fits",
    "make_optimizer",
]

# The signals that stop training cleanly, and the ``stopped_by`` each gives.
STOP_SIGNALS = {signal.SIGINT: "interrupt", signal.SIGTERM: "terminate"}

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
class Probe:
    """A cheap look at quality during training: every ``every`` steps (but the last, which the
    run's own evaluation scores), ``score`` is called with a scratch copy of the weights a
    finished run is scored with (the EMA's when the run keeps one), in eval mode and without
    gradients; its numbers go into that step's
    ``metrics.jsonl`` record, so a resumed run keeps them. Single-process runs only; the
    time it takes is left out of the records' training time (``elapsed_s``)."""

    every: int
    score: Callable[[nn.Module], dict[str, float]]


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


def make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on biases, norm gains or scalars).

    torch's fused AdamW (one kernel for every parameter) on CPU and CUDA, FSDP's sharded
    parameters included: the default loop launches several small kernels per parameter,
    whose overhead dominates the update of a small model's many small tensors. Other
    devices: the default.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    fused = all(p.device.type in ("cpu", "cuda") for p in params) or None  # None: default
    return torch.optim.AdamW(
        groups, lr=config.lr, betas=(config.beta1, config.beta2), fused=fused
    )


def check_checkpoint_fits(
    model: nn.Module,
    config: TrainConfig,
    checkpoint: LoadedCheckpoint,
    *,
    optimizer: torch.optim.Optimizer | None = None,
) -> None:
    """Raise ``CheckpointError`` naming the file and the tensor of ``checkpoint`` that does not
    fit ``model`` trained with ``config`` (its weights, EMA and optimizer state: names and
    shapes), loading nothing. ``model`` may live on the meta device (the CLI checks a resume
    so before it builds anything); ``optimizer``: the one in use (default: a fresh
    ``make_optimizer``, whose parameter order is the same)."""
    own = {  # (sharded: DTensors, whose shapes are the whole tensors')
        name.replace("_checkpoint_wrapped_module.", ""): value
        for name, value in model.state_dict().items()
    }
    for stem in ("model", "ema") if config.ema_decay > 0 else ("model",):
        if stem not in checkpoint.tensors:
            raise CheckpointError(f"{checkpoint.path} has no {stem}.safetensors")
        with _refusing(checkpoint.path / f"{stem}.safetensors"):
            _check_shapes(stem, own, checkpoint.tensors[stem])
    with _refusing(checkpoint.path / "optimizer.safetensors"):
        check_optimizer_parts(
            optimizer or make_optimizer(model, config),
            checkpoint.tensors["optimizer"],
            checkpoint.state["optimizer"],
        )


@contextlib.contextmanager
def _refusing(path: Path):
    """Turn what loading a checkpoint's part raises (a tensor that does not fit, an entry that
    is missing or of the wrong type) into one ``CheckpointError`` line naming ``path``."""
    try:
        yield
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if isinstance(err, KeyError):
            reason = f"no entry {reason}"
        raise CheckpointError(f"{path} does not fit this run: {reason}") from None


def _check_shapes(
    what: str, expected: dict[str, torch.Tensor], got: dict[str, torch.Tensor]
) -> None:
    """Raise ValueError naming the first tensor of ``got`` whose shape (or presence) differs
    from ``expected``'s (``load_state_dict`` alone would broadcast an EMA copy)."""
    missing = sorted(set(expected) - set(got))
    unexpected = sorted(set(got) - set(expected))
    if missing or unexpected:
        raise ValueError(
            f"{what} tensors differ: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    for name, tensor in got.items():
        if tensor.shape != expected[name].shape:
            raise ValueError(
                f"{what} tensor {name!r} has shape {tuple(tensor.shape)}, expected "
                f"{tuple(expected[name].shape)}"
            )


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
        progress: show a tqdm progress bar on stderr (rank 0 only).
        probe: a :class:`Probe` of quality along the way (ignored with several processes).

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
        progress: bool = False,
        probe: Probe | None = None,
    ) -> None:
        if not isinstance(config, TrainConfig):
            raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
        self.model, self.loss_fn, self.config = model, loss_fn, config
        self.batches: BatchSource = batches
        if distributed.is_distributed():
            self.batches = RankShard(
                batches, rank=distributed.rank(), world_size=distributed.world_size()
            )
        self.run_dir = Path(run_dir)
        self.schedule = schedule
        self.run_info = run_info or {}
        self.progress = progress and distributed.is_main()
        self.probe = None if distributed.is_distributed() else probe
        self._probe_model: nn.Module | None = None  # the scratch copy, built at the first probe
        self._probe_s = 0.0  # time spent probing in this invocation (left out of elapsed_s)
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
        self.elapsed_s = 0.0
        self._resumed_from: int | None = None
        self._stop_requested: str | None = None  # set by a stop signal: see STOP_SIGNALS
        self._phase = "idle"  # "forward", "update" or "idle": see the module docstring

    def load(self, checkpoint: LoadedCheckpoint) -> None:
        """Continue from ``checkpoint``: weights, optimizer, EMA, step, RNG and data order.

        Raises ``CheckpointError`` naming the file (and the tensor or entry) whose contents do
        not fit this trainer (a tensor of another shape, a missing entry), before training; the
        manifest's hashes catch damage, this catches a checkpoint resealed after editing, or
        one of another model. The shapes are checked before anything is loaded."""
        check_checkpoint_fits(self.model, self.config, checkpoint, optimizer=self.optimizer)
        tensors = checkpoint.tensors
        with _refusing(checkpoint.path / "model.safetensors"):
            distributed.load_full_model_state(self.model, tensors["model"])
        with _refusing(checkpoint.path / "optimizer.safetensors"):
            optimizer_from_parts(
                self._optimizer_view,  # type: ignore[arg-type]  # an optimizer's state interface
                tensors["optimizer"],
                checkpoint.state["optimizer"],
            )
        if self.ema is not None:
            with _refusing(checkpoint.path / "ema.safetensors"):
                self.ema.load_state_dict(tensors["ema"])
        with _refusing(checkpoint.path / "state.json"):
            self.batches.load_state_dict(checkpoint.state["data"])
        with _refusing(checkpoint.path / "rng.safetensors"):
            restore_rng(tensors["rng"], checkpoint.state["rng"])
        self.step = checkpoint.step
        self.elapsed_s = float(checkpoint.state.get("elapsed_s", 0.0))
        self._resumed_from = checkpoint.step

    def fit(self) -> TrainResult:
        """Train until ``max_steps`` or ``max_minutes`` (whichever ends first), Ctrl-C or
        SIGTERM."""
        log = None
        if distributed.is_main():
            log = MetricsLog(self.run_dir / "metrics.jsonl", resume_from_step=self._resumed_from)
        self._stop_requested = None
        previous_handlers = self._catch_stop_signals()
        bar = tqdm(
            total=self.config.max_steps,
            initial=self.step,
            disable=not self.progress,
            unit="step",
            dynamic_ncols=True,
        )
        start, loss, stopped_by = time.monotonic(), None, "max_steps"
        self._probe_s = 0.0
        window = {"tokens": 0, "time": time.monotonic()}
        compile_s = None
        self._phase = "idle"
        try:
            while self.step < self.config.max_steps:
                stop = self._stop_requested
                if stop is None and self._out_of_time(start):
                    stop = "max_minutes"
                stop = distributed.agree_on_stop(stop)
                if stop is not None:
                    stopped_by = stop
                    break
                boundary = self._snapshot()
                self._phase = "forward"
                step_start = time.monotonic()
                loss, tokens = self._train_step()  # sets "update", then "idle"
                if self.config.compile and compile_s is None:
                    compile_s = time.monotonic() - step_start
                window["tokens"] += tokens
                bar.update(1)
                probing = (  # not at the last step: the run's own evaluation scores that one
                    self.probe is not None and self.step % self.probe.every == 0
                    and self.step < self.config.max_steps
                )
                logged = self.step % self.config.log_every == 0
                if logged or probing or self.step == self.config.max_steps:
                    scores = self._run_probe(window) if probing else {}
                    self._log(log, bar, loss, window, start, scores)
                if self.config.checkpoint_every and self.step % self.config.checkpoint_every == 0:
                    self.save(elapsed_now=time.monotonic() - start - self._probe_s)
        except KeyboardInterrupt:
            stopped_by = self._stop_requested or "interrupt"
            if self._phase == "update":
                return self._abandon_half_step(start, stopped_by)
            if self._phase == "forward":
                self.batches.load_state_dict(boundary[0])
                restore_rng(*boundary[1])
        finally:
            bar.close()
            for signum, handler in previous_handlers.items():
                signal.signal(signum, handler)
            self._phase = "idle"
        self.elapsed_s += time.monotonic() - start - self._probe_s
        path = self.save()
        return TrainResult(self.step, loss, path, stopped_by, self.elapsed_s, compile_s)

    def _abandon_half_step(self, start: float, stopped_by: str) -> TrainResult:
        """After an interrupt inside the optimizer/EMA update: keep the newest checkpoint on
        disk (writing the half-updated weights would break exact resume)."""
        self.elapsed_s += time.monotonic() - start - self._probe_s
        saved = list_checkpoints(self.run_dir)
        if not saved:
            raise KeyboardInterrupt(
                "interrupted inside an optimizer update before any checkpoint was written"
            )
        step = int(saved[-1].name.removeprefix("step-"))
        return TrainResult(step, None, saved[-1], stopped_by, self.elapsed_s)

    def save(self, *, elapsed_now: float = 0.0) -> Path:
        """Write a checkpoint of the current step (atomically; see ``checkpoint.py``). With
        several processes every rank calls it (a sharded model is gathered) and rank 0 writes;
        the others return the path rank 0 writes."""
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
            "train_config": self.config.to_dict(),
            "schedule": dataclasses.asdict(self.schedule),
            "optimizer": opt_skeleton,
            "data": self.batches.state_dict(),
            "rng": rng_json,
        }
        return save_checkpoint(
            self.run_dir, self.step, tensors, state, keep=self.config.keep_checkpoints
        )

    def _train_step(self) -> tuple[float, int]:
        """One optimizer step over ``grad_accum`` micro-batches; returns (mean loss, tokens)."""
        cfg = self.config
        lr = self.schedule(self.step + 1)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        self._seed_other_ranks()
        total, tokens = 0.0, 0
        for i in range(cfg.grad_accum):
            batch = {k: v.to(self.device) for k, v in self.batches.next_batch().items()}
            with self._sync_gradients(i == cfg.grad_accum - 1):
                with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=cfg.bf16):
                    loss, n_tokens = self.loss_fn(self.forward_model, batch)
                    # this rank's share of the global batch's mean (1 with one process)
                    loss = loss * distributed.global_mean_weight(n_tokens)
                (loss / cfg.grad_accum).backward()
            total += loss.item()
            tokens += n_tokens
        total, tokens_all = distributed.all_reduce_sum([total, float(tokens)])
        mean_loss, tokens = total / distributed.world_size() / cfg.grad_accum, int(tokens_all)
        if not math.isfinite(mean_loss):
            raise FloatingPointError(
                f"training loss is {mean_loss} at step {self.step + 1}; try a lower lr ({lr:.3g})"
            )
        if cfg.grad_clip > 0:
            nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self._phase = "update"
        self.optimizer.step()
        if self.ema is not None:
            self.ema.update(self.model, self.step)  # the update's number: steps before it
        self.step += 1
        self._phase = "idle"
        return mean_loss, tokens

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

    @torch.no_grad()
    def _run_probe(self, window: dict) -> dict[str, float]:
        """The probe's numbers for the current weights (see :class:`Probe`), timed apart (its
        time is left out of ``elapsed_s`` and of the log window's throughput)."""
        assert self.probe is not None
        began = time.monotonic()
        if self._probe_model is None:
            self._probe_model = copy.deepcopy(self.model)
        scratch = self._probe_model
        if self.ema is not None:
            self.ema.copy_to(scratch)
        else:
            scratch.load_state_dict(self.model.state_dict())
        scores = self.probe.score(scratch.eval())
        spent = time.monotonic() - began
        self._probe_s += spent
        window["time"] += spent
        return {f"probe_{name}": float(value) for name, value in scores.items()}

    def _log(
        self, log: MetricsLog | None, bar, loss: float, window: dict, start: float,
        scores: dict[str, float],
    ) -> None:
        if log is None:
            return
        now = time.monotonic()
        tokens_per_s = window["tokens"] / max(now - window["time"], 1e-9)
        lr = self.schedule(self.step)
        log.write(
            {
                "step": self.step,
                "loss": loss,
                "lr": lr,
                "tokens_per_s": tokens_per_s,
                "elapsed_s": self.elapsed_s + now - start - self._probe_s,
                **scores,
            }
        )
        bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_s:.0f}")
        window["tokens"], window["time"] = 0, now

    def _out_of_time(self, start: float) -> bool:
        limit = self.config.max_minutes
        return limit is not None and time.monotonic() - start >= 60.0 * limit

    def _snapshot(self) -> tuple[dict, tuple[dict, dict]]:
        """The data order and RNG states at a step boundary (restored on a mid-step Ctrl-C)."""
        return self.batches.state_dict(), capture_rng()

    def _catch_stop_signals(self) -> dict:
        """While fitting, the first SIGINT or SIGTERM asks for a clean stop; returns the old
        handlers (those Python can put back) by signal."""
        if threading.current_thread() is not threading.main_thread():
            return {}

        def request_stop(signum, frame):
            if self._stop_requested is not None:
                raise KeyboardInterrupt
            self._stop_requested = STOP_SIGNALS[signal.Signals(signum)]

        previous = {signum: signal.signal(signum, request_stop) for signum in STOP_SIGNALS}
        return {signum: handler for signum, handler in previous.items() if handler is not None}
