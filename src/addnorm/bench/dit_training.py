"""GPU cases: DiT training steps against diffusers' ``DiTTransformer2DModel``, same weights.

- ``dit-train``: DiT-XL/2 (675M parameters, 32 x 32 x 4 latents, 256 tokens), batch 32,
  eager and, with ``--compile`` (the default on CUDA), compiled, both libraries.
- ``dit-b-train``: DiT-B/2, batch 64, compiled (eager without ``--compile``), both libraries.

The loss is the mean squared error of the whole output (noise and variance channels) against
a fixed random target, the same for both; addnorm's model with its loss compiles with
``fullgraph=True``, diffusers' as its users compile it. The step protocol (bf16 autocast,
fused AdamW, checks, memory) is :mod:`addnorm.bench.training_step`; its check batch has every
label the null class, which label dropout leaves as it is, so that the training-mode losses
of the two libraries (each drawing its own dropout) are comparable. Also checked: the
float32 outputs of both in eval mode, with real labels.

Shapes legend: B batch, C channels, C_out output channels, I latent side.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from addnorm.bench.flops import dit_flops
from addnorm.bench.harness import BenchSettings, Check, Report
from addnorm.bench.pairs import dit_pair
from addnorm.bench.references import optional_module
from addnorm.bench.tolerances import FP32_OUTPUT, relative_error
from addnorm.bench.training_step import TrainImpl, adamw, run_training_case
from addnorm.dit.config import DIT_PRESETS, DiTConfig

__all__ = ["DIT_TINY", "dit_batch", "run_dit_b_training", "run_dit_xl_training"]

GROUP = "DiT training step"
# DiT's shape (4 latent channels, learned variance, 1000 classes) at a smoke-test size.
DIT_TINY = DiTConfig(input_size=8, patch_size=2, in_channels=4, d_model=32, n_layers=2,
                     n_heads=4, n_classes=10)


def dit_batch(cfg: DiTConfig, batch: int, device: torch.device
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Latents (B, C, I, I), timesteps (B,) in [0, 1000) and labels (B,), seed 0."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, cfg.in_channels, cfg.input_size, cfg.input_size, generator=gen)
    t = torch.randint(0, 1000, (batch,), generator=gen)
    y = torch.randint(0, cfg.n_classes, (batch,), generator=gen)
    return x.to(device), t.to(device), y.to(device)


def _ours_loss(model: nn.Module, target: torch.Tensor) -> Callable[..., torch.Tensor]:
    def loss(x: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(model(x, t, y).float(), target)
    return loss


def _theirs_loss(model: nn.Module, target: torch.Tensor) -> Callable[..., torch.Tensor]:
    def loss(x: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(model(x, timestep=t, class_labels=y).sample.float(), target)
    return loss


def _run(name: str, cfg: DiTConfig, batch: int, *, eager: bool, settings: BenchSettings,
         report: Report, log: Callable[[str], None]) -> None:
    if optional_module("diffusers", report.notes) is None:
        report.notes.append(f"{GROUP}: {name} skipped, its reference (diffusers) is missing")
        return
    device = settings.torch_device
    ours, theirs = dit_pair(cfg, device)
    x, t, y = dit_batch(ours.cfg, batch, device)
    null = torch.full_like(y, ours.cfg.n_classes)  # the null class: label dropout keeps it
    gen = torch.Generator().manual_seed(1)
    target = torch.randn(batch, ours.cfg.out_channels, cfg.input_size, cfg.input_size,
                         generator=gen).to(device)
    case = f"{name} B={batch}, {settings.precision}"
    log(f"{GROUP}: {case}")
    with torch.no_grad():  # eval mode: no label dropout
        error = relative_error(ours(x[:2], t[:2], y[:2]),
                               theirs(x[:2], timestep=t[:2], class_labels=y[:2]).sample)
        ours.train()
        exact = _ours_loss(ours, target)(x, t, null).item()
    report.checks.append(Check(GROUP, f"{name}: addnorm vs diffusers, same weights, float32 "
                               "output (relative)", error, FP32_OUTPUT))
    ours_opt, theirs_opt = adamw(ours), adamw(theirs)
    impls: list[TrainImpl] = []
    if eager or not settings.compile:
        impls += [TrainImpl("addnorm", ours, _ours_loss(ours, target), ours_opt,
                            twin="diffusers"),
                  TrainImpl("diffusers", theirs, _theirs_loss(theirs, target), theirs_opt,
                            reference=True)]
    if settings.compile:
        impls += [
            TrainImpl("addnorm compiled", ours,
                      torch.compile(_ours_loss(ours, target), fullgraph=True), ours_opt,
                      compiled=True, twin="diffusers compiled"),
            TrainImpl("diffusers compiled", theirs,
                      torch.compile(_theirs_loss(theirs, target)), theirs_opt, compiled=True,
                      reference=True),
        ]
    run_training_case(
        GROUP, case, impls, check_batch=(x, t, null), timed_batch=(x, t, y), exact=exact,
        per_call=batch, unit="images/s", flops=dit_flops(ours, batch, training=True),
        settings=settings, report=report, log=log,
    )


def run_dit_xl_training(settings: BenchSettings, report: Report, log: Callable[[str], None]
                        ) -> None:
    """DiT-XL/2 at batch 32, eager and compiled, against diffusers."""
    if settings.size == "test":
        _run("DiT-tiny", DIT_TINY, 2, eager=True, settings=settings, report=report, log=log)
    else:
        _run("DiT-XL/2", DIT_PRESETS["DiT-XL/2"], 32, eager=True, settings=settings,
             report=report, log=log)


def run_dit_b_training(settings: BenchSettings, report: Report, log: Callable[[str], None]
                       ) -> None:
    """DiT-B/2 at batch 64, compiled, against diffusers compiled."""
    if settings.size == "test":
        cfg = dataclasses.replace(DIT_TINY, n_layers=1)
        _run("DiT-tiny (1 layer)", cfg, 2, eager=False, settings=settings, report=report, log=log)
    else:
        _run("DiT-B/2", DIT_PRESETS["DiT-B/2"], 64, eager=False, settings=settings,
             report=report, log=log)
