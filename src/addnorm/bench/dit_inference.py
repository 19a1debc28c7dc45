"""GPU case: DiT-XL/2 inference (one forward, 32 x 32 x 4 latents), batch 64, against
diffusers' ``DiTTransformer2DModel`` holding the same weights; eval mode, no gradients, bf16
weights (or float32 with ``--fp32``); images/s. Checks: the output in float32, and in bf16
against the float32 output no further than diffusers' bf16 output is
(:mod:`addnorm.bench.tolerances`)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from addnorm.bench.dit_training import DIT_TINY, dit_batch
from addnorm.bench.flops import dit_flops
from addnorm.bench.harness import BenchSettings, Check, Report, time_case
from addnorm.bench.measure import peak_memory, state_bytes
from addnorm.bench.pairs import dit_pair
from addnorm.bench.references import optional_module
from addnorm.bench.tolerances import FP32_OUTPUT, bf16_bound, relative_error
from addnorm.dit.config import DIT_PRESETS

__all__ = ["run_dit_inference"]

GROUP = "DiT inference"


def run_dit_inference(settings: BenchSettings, report: Report, log: Callable[[str], None]
                      ) -> None:
    """Images/s of one DiT-XL/2 forward, addnorm and diffusers, same weights."""
    if optional_module("diffusers", report.notes) is None:
        report.notes.append(f"{GROUP}: skipped, its reference (diffusers) is missing")
        return
    name, cfg, batch = ("DiT-tiny", DIT_TINY, 2) if settings.size == "test" \
        else ("DiT-XL/2", DIT_PRESETS["DiT-XL/2"], 64)
    device = settings.torch_device
    ours, theirs = dit_pair(cfg, device)
    x, t, y = dit_batch(ours.cfg, batch, device)
    case = f"{name} B={batch}, {settings.precision}"
    log(f"{GROUP}: {case}")

    @torch.no_grad()
    def ours_fn() -> torch.Tensor:
        return ours(x, t, y)  # (B, C_out, I, I)

    @torch.no_grad()
    def theirs_fn() -> torch.Tensor:
        return theirs(x, timestep=t, class_labels=y).sample  # (B, C_out, I, I)

    fns = {"addnorm": ours_fn, "diffusers": theirs_fn}
    models: dict[str, nn.Module] = {"addnorm": ours, "diffusers": theirs}
    exact = theirs_fn()
    report.checks.append(Check(GROUP, f"{name}: addnorm vs diffusers, same weights, float32 "
                               "output (relative)", relative_error(ours_fn(), exact),
                               FP32_OUTPUT))
    if settings.precision == "bf16":
        ours.to(torch.bfloat16), theirs.to(torch.bfloat16)
        x = x.to(torch.bfloat16)
        errors = {impl: relative_error(fn(), exact) for impl, fn in fns.items()}
        report.checks.append(Check(
            GROUP, f"{name}: addnorm bf16 output vs the float32 one (relative), at most twice "
            "diffusers' bf16 error", errors["addnorm"], bf16_bound([errors["diffusers"]], 1.0)))
    times = time_case(fns, settings, report, GROUP, case)
    memory = {impl: peak_memory(fn, device, state_bytes(models[impl])) for impl, fn in fns.items()}
    report.add_rows(GROUP, case, times, per_call=batch, unit="images/s",
                    references={"diffusers"}, flops=dit_flops(ours, batch, training=False),
                    memory=memory)
