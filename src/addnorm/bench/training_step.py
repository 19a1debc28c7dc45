"""One training-step case of the GPU suite, the same protocol for every model.

A step is ``zero_grad``, the loss under bf16 autocast (or in float32), ``backward`` and a
fused AdamW update. The implementations of a case (addnorm eager and compiled, the reference
eager and compiled) start from the same weights; the eager and compiled variants of one
model share its parameters and optimizer. In order:

1. The loss of every eager implementation on the check batch (no update), and the first step
   of every compiled one on it (its loss is computed before its update): compared with the
   float32 loss of the same weights, ``exact``, within :mod:`addnorm.bench.tolerances`'
   bounds (in bf16: at most twice as far as the worst reference, or one bf16 rounding).
2. The steps on the timed batch in interleaved rounds (:func:`addnorm.bench.harness.time_case`).
3. Each step's peak memory (:mod:`addnorm.bench.measure`), and the compile time: the first
   compiled step minus the median warm one.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from addnorm.bench.harness import BenchSettings, Check, Report, time_case
from addnorm.bench.measure import autocast, dynamo_counts, peak_memory, seconds, state_bytes
from addnorm.bench.tolerances import FP32_LOSS, bf16_bound

__all__ = ["TrainImpl", "adamw", "run_training_case"]

Batch = tuple[torch.Tensor, ...]
LossFn = Callable[..., torch.Tensor]


@dataclass
class TrainImpl:
    """One implementation: its name, the model whose weights it trains, its loss (compiled or
    not) called as ``loss(*batch)``, and its optimizer (shared by the eager and compiled
    variants of one model). ``twin``: the reference to read it against."""

    name: str
    model: nn.Module
    loss: LossFn
    optimizer: torch.optim.Optimizer
    compiled: bool = False
    reference: bool = False
    twin: str | None = None


def adamw(model: nn.Module) -> torch.optim.Optimizer:
    """torch's fused AdamW, what ``addnorm train`` uses."""
    return torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)


def _step(impl: TrainImpl, batch: Batch, device: torch.device, bf16: bool
          ) -> Callable[[], torch.Tensor]:
    def step() -> torch.Tensor:
        impl.optimizer.zero_grad(set_to_none=True)
        with autocast(device, bf16):
            loss = impl.loss(*batch)
        loss.backward()
        impl.optimizer.step()
        return loss.detach()
    return step


def _first_step(step: Callable[[], torch.Tensor], device: torch.device) -> tuple[float, float]:
    """Seconds and loss of the first call of a compiled step (which compiles it)."""
    loss: list[float] = []
    elapsed = seconds(lambda: loss.append(step().item()), device)
    return elapsed, loss[0]


def run_training_case(
    group: str, case: str, impls: Sequence[TrainImpl], *, check_batch: Batch,
    timed_batch: Batch, exact: float, per_call: float, unit: str, flops: float,
    settings: BenchSettings, report: Report, log: Callable[[str], None],
) -> dict[str, Callable[[], torch.Tensor]]:
    """Checks, times and measures ``impls`` (see the module docstring); appends rows and
    checks to ``report`` and returns the timed steps by name (for the profiler)."""
    device, bf16 = settings.torch_device, settings.precision == "bf16"
    for impl in impls:
        impl.model.train()
    losses: dict[str, float] = {}
    first: dict[str, float] = {}
    for impl in impls:
        if not impl.compiled:
            with torch.no_grad(), autocast(device, bf16):
                losses[impl.name] = impl.loss(*check_batch).item()
    for impl in impls:
        if impl.compiled:
            log(f"{group}: {case}: compiling {impl.name}")
            graphs, breaks = dynamo_counts()
            first[impl.name], losses[impl.name] = _first_step(
                _step(impl, check_batch, device, bf16), device)
            after = dynamo_counts()
            report.notes.append(f"{group} {case}: {impl.name}: {after[0] - graphs} graphs, "
                                f"{after[1] - breaks} graph breaks")
    _loss_checks(group, case, impls, losses, exact, bf16, report)
    log(f"{group}: {case}: timing")
    steps = {impl.name: _step(impl, timed_batch, device, bf16) for impl in impls}
    times = time_case(steps, settings, report, group, case)
    memory = {impl.name: peak_memory(steps[impl.name], device,
                                     state_bytes(impl.model, impl.optimizer))
              for impl in impls}
    compile_seconds = {name: max(0.0, t - statistics.median(times[name]))
                       for name, t in first.items()}
    report.add_rows(group, case, times, per_call=per_call, unit=unit,
                    references={impl.name for impl in impls if impl.reference}, flops=flops,
                    twins={impl.name: impl.twin for impl in impls if impl.twin},
                    memory=memory, compile_seconds=compile_seconds)
    return steps


def _loss_checks(group: str, case: str, impls: Sequence[TrainImpl], losses: dict[str, float],
                 exact: float, bf16: bool, report: Report) -> None:
    errors = {name: abs(loss - exact) for name, loss in losses.items()}
    reference_errors = [errors[impl.name] for impl in impls if impl.reference]
    tolerance = bf16_bound(reference_errors, exact) if bf16 else FP32_LOSS
    precision = "bf16 autocast" if bf16 else "float32"
    for impl in impls:
        report.checks.append(Check(
            group, f"{case}: {impl.name}: first loss ({precision}) vs the float32 loss "
            f"{exact:.4f} of the same weights", errors[impl.name], tolerance))
