"""Interleaved timing, the same-run GEMM rate and the machine of ``addnorm bench`` (the report,
its table and JSON: :mod:`addnorm.bench.report`, whose names are re-exported here).

Implementations of one case are timed in rounds, A B C A B C ..., so that drift of the machine
(other processes, clock changes, a warming cache) hits all of them alike. Each sample is one
``torch.utils.benchmark.Timer.blocked_autorange`` of one implementation (the median of its
blocks, each block timed between two device synchronisations); each implementation keeps the
median of its per-round samples. Speed is reported as a rate (tokens/s, steps/s, ...) and as
a ratio to the fastest *reference* of the same case (> 1: faster than every reference). The
measurements themselves are kept for ``torch.utils.benchmark.Compare`` (:func:`format_compare`).
"""

from __future__ import annotations

import gc
import platform
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any, TypeVar

import torch
from torch.utils import benchmark

from addnorm.bench.report import (
    Check,
    Report,
    Row,
    format_compare,
    format_table,
    from_json,
    to_json,
)
from addnorm.utils.checks import check_choice, check_int

__all__ = [
    "PRECISIONS",
    "SIZES",
    "BenchSettings",
    "Check",
    "Report",
    "Row",
    "cpu_has_bf16",
    "format_compare",
    "format_table",
    "from_json",
    "gemm",
    "interleaved",
    "machine_info",
    "time_case",
    "to_json",
]

SIZES = ("full", "quick", "test")  # test: tiny models, for the test suite and smoke runs
PRECISIONS = ("bf16", "fp32")  # of the GPU cases: bf16 autocast / weights, or float32


@dataclass(frozen=True)
class BenchSettings:
    """What one ``addnorm bench`` run measures and how long it times each case.

    Attributes:
        size: ``"full"``, ``"quick"`` (fewer cases and rounds) or ``"test"`` (tiny models).
        rounds: interleaved rounds per case (the median of this many samples is kept).
        min_seconds: each sample (one ``blocked_autorange``) runs blocks of calls until they
            add up to at least this long.
        compile: add ``torch.compile`` variants (compile time reported).
        bf16: add bf16-autocast variants to the CPU suite's small-model and DiT cases.
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``, where the models and data live.
        precision: the GPU suite's: ``"bf16"`` (training under bf16 autocast, inference and
            decoding with bf16 weights) or ``"fp32"``.
        profile_dir: where the GPU suite writes ``torch.profiler`` summaries, or None.
    """

    size: str = "full"
    rounds: int = 7
    min_seconds: float = 0.05
    compile: bool = False
    bf16: bool = False
    device: str = "cpu"
    precision: str = "bf16"
    profile_dir: str | None = None

    def __post_init__(self) -> None:
        check_choice("size", self.size, SIZES)
        check_choice("precision", self.precision, PRECISIONS)
        check_int("rounds", self.rounds, min_value=1)
        if not self.min_seconds >= 0:
            raise ValueError(f"min_seconds must be >= 0, got {self.min_seconds}")
        torch.device(self.device)  # a malformed name raises here, naming it

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device)


def interleaved(
    fns: Mapping[str, Callable[[], object]], *, rounds: int, min_seconds: float,
    warmup: int = 1, label: str = "", sub_label: str = "",
    record: list[benchmark.Measurement] | None = None,
) -> dict[str, tuple[float, ...]]:
    """Seconds per call of each function, one sample per interleaved round (A B C A B C).

    Each function is called ``warmup`` times first. A sample is
    ``Timer.blocked_autorange(min_run_time=min_seconds)`` (``torch.utils.benchmark``), run at
    the current torch thread count and with the garbage collector on: blocks of calls sized
    so that the timer's overhead is negligible, each timed between device synchronisations;
    the sample is the median per-call time of its blocks. The measurements are appended to
    ``record`` (labelled ``label``, ``sub_label`` and the function's name) for
    :func:`format_compare`.
    """
    threads = torch.get_num_threads()
    timers = {  # setup: Python's garbage collector stays on, as in use (timeit turns it off)
        name: benchmark.Timer("fn()", setup="gc.enable()", globals={"fn": fn, "gc": gc},
                              label=label, sub_label=sub_label, description=name,
                              num_threads=threads)
        for name, fn in fns.items()
    }
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, timer in timers.items():
            measurement = timer.blocked_autorange(min_run_time=min_seconds)
            samples[name].append(measurement.median)
            if record is not None:
                record.append(measurement)
    return {name: tuple(times) for name, times in samples.items()}


def time_case(
    fns: Mapping[str, Callable[[], object]], settings: BenchSettings, report: Report, group: str,
    case: str, *, warmup: int = 1,
) -> dict[str, tuple[float, ...]]:
    """:func:`interleaved` with the run's rounds and sample length, its measurements kept in
    ``report`` under ``group`` and ``case``."""
    return interleaved(fns, rounds=settings.rounds, min_seconds=settings.min_seconds,
                       warmup=warmup, label=group, sub_label=case, record=report.measurements)


Call = TypeVar("Call", bound=Callable[[], object])


def compiled_first_call(fn: Call, report: Report, what: str) -> Call:
    """``fn``, after calling it once and noting how long that first (compiling) call took."""
    start = time.perf_counter()
    fn()
    report.notes.append(f"{what}: compiling took {time.perf_counter() - start:.1f} s (first call)")
    return fn


def gemm(
    m: int, k: int, n: int, *, dtype: torch.dtype, device: torch.device | str = "cpu"
) -> tuple[Callable[[], object], float]:
    """A ``torch.mm`` of (m, k) by (k, n) to time with the others, and its FLOP count."""
    a = torch.randn(m, k, device=device).to(dtype)
    b = torch.randn(k, n, device=device).to(dtype)
    return (lambda: torch.mm(a, b)), 2.0 * m * k * n


def cpu_has_bf16() -> bool:
    """Whether the CPU has bf16 instructions (AVX-512 BF16 or AMX), as oneDNN sees them."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a build without oneDNN
        return False


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(command: str, device: str = "cpu") -> dict[str, Any]:
    """The machine, library versions and the command that repeats the run."""
    dists = ("torch", "addnorm", "x-transformers", "timm", "transformers", "diffusers")
    info: dict[str, Any] = {
        "cpu": _cpu_name(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "bf16_instructions": cpu_has_bf16(),
        "threads": torch.get_num_threads(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "versions": {dist: _version(dist) for dist in dists},
        "command": command,
        "device": device,
    }
    if torch.device(device).type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
        info["cuda"] = torch.version.cuda
    return info
