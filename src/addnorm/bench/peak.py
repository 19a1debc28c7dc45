"""The same-run matrix-multiply rate that the GPU suite's TFLOP/s are a share of.

On CUDA, an 8192 x 8192 x 8192 ``torch.mm`` in bf16 (float32 with ``--fp32``: TF32 stays as
torch leaves it, off); on the CPU, 1024^3 in float32 (128^3 at the test size). Timed like
every case (``blocked_autorange`` in the run's rounds); the median rate becomes
``Report.peak_flops`` and a row of its own.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

from addnorm.bench.harness import BenchSettings, Report, gemm, time_case

__all__ = ["measure_peak"]

GROUP = "matrix multiply"


def measure_peak(settings: BenchSettings, report: Report, log: Callable[[str], None]) -> None:
    """Time the matrix multiply; set ``report.peak_flops`` and add its row."""
    device = settings.torch_device
    if device.type == "cuda":
        n = 8192
        dtype = torch.bfloat16 if settings.precision == "bf16" else torch.float32
    else:
        n, dtype = (128 if settings.size == "test" else 1024), torch.float32
    case = f"{n}x{n}x{n} {str(dtype).removeprefix('torch.')}"
    log(f"{GROUP}: {case}")
    fn, flops = gemm(n, n, n, dtype=dtype, device=device)
    times = time_case({"torch.mm": fn}, settings, report, GROUP, case)
    report.peak_flops = statistics.median(flops / s for s in times["torch.mm"])
    report.add_rows(GROUP, case, times, per_call=flops / 1e12, unit="TFLOP/s", references=(),
                    flops=flops)
