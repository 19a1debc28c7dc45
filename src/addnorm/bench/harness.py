"""Interleaved timing, the same-run GEMM rate, and the report (table and JSON) of ``addnorm bench``.

Implementations of one case are timed in rounds, A B C A B C ..., so that drift of the machine
(other processes, clock changes, a warming cache) hits all of them alike; each keeps the
median of its per-call times. Speed is reported as a rate (tokens/s, steps/s, ...) and as a
ratio to the fastest *reference* of the same case (> 1: faster than every reference).
"""

from __future__ import annotations

import math
import platform
import statistics
import sys
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import asdict, dataclass, field
from importlib import metadata
from typing import Any, TypeVar

import torch

from addnorm.utils.checks import check_choice, check_int

__all__ = [
    "SIZES",
    "BenchSettings",
    "Check",
    "Report",
    "Row",
    "cpu_has_bf16",
    "gemm",
    "interleaved",
    "machine_info",
    "to_json",
    "format_table",
]

SIZES = ("full", "quick", "test")  # test: tiny models, for the test suite only


@dataclass(frozen=True)
class BenchSettings:
    """What one ``addnorm bench`` run measures and how long it times each case.

    Attributes:
        size: ``"full"``, ``"quick"`` (fewer cases and rounds) or ``"test"`` (tiny models).
        rounds: interleaved rounds per case (the median of this many calls is kept).
        min_seconds: each timed sample repeats a call until it lasts at least this long.
        compile: add ``torch.compile`` variants (compile time reported).
        bf16: add bf16-autocast variants to the small-model and DiT cases.
    """

    size: str = "full"
    rounds: int = 7
    min_seconds: float = 0.05
    compile: bool = False
    bf16: bool = False

    def __post_init__(self) -> None:
        check_choice("size", self.size, SIZES)
        check_int("rounds", self.rounds, min_value=1)
        if not self.min_seconds >= 0:
            raise ValueError(f"min_seconds must be >= 0, got {self.min_seconds}")


@dataclass(frozen=True)
class Row:
    """One implementation's times on one case: ``samples``, seconds per call, one per
    interleaved round; ``seconds`` is their median.

    ``per_call``: units of work per call (tokens, steps, images), so rate = per_call / seconds.
    ``flops``: floating-point operations per call, or None; ``gemm_fraction`` is the achieved
    FLOP rate over the same-run ``torch.mm`` rate. ``twin``: the reference of the same case
    that holds this row's weights (the same architecture), or None; where a case has several
    references the table shows the ratio to it too (a pre-LN layer against torch.nn's pre-LN
    as well as against the fastest reference, which may be post-LN).
    """

    group: str
    case: str
    impl: str
    samples: tuple[float, ...]
    per_call: float
    unit: str
    reference: bool
    flops: float | None = None
    gemm_fraction: float | None = None
    note: str = ""
    twin: str | None = None

    @property
    def seconds(self) -> float:
        return statistics.median(self.samples)

    @property
    def rate(self) -> float:
        return self.per_call / self.seconds


@dataclass(frozen=True)
class Check:
    """A correctness check run next to the timings: addnorm against a reference with the
    same weights (``max_error`` <= ``tolerance``), or identical tokens (tolerance 0)."""

    group: str
    name: str
    max_error: float
    tolerance: float

    @property
    def passed(self) -> bool:
        return self.max_error <= self.tolerance


@dataclass
class Report:
    """Everything one run measured: timings, correctness checks, notes (skipped references,
    compile times), and the machine."""

    rows: list[Row] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=dict)

    def _best_reference(self, row: Row) -> Row | None:
        """The fastest reference of ``row``'s case (by median), or None without one."""
        case = (row.group, row.case)
        refs = [r for r in self.rows if r.reference and (r.group, r.case) == case]
        return max(refs, key=lambda r: r.rate) if refs else None

    def _round_ratios(self, row: Row, best: Row) -> list[float]:
        """``row``'s rate over ``best``'s in each interleaved round (both timed in the same
        rounds), or over the medians when their rounds do not pair up."""
        if len(row.samples) != len(best.samples):
            return [row.rate / best.rate]
        return [(row.per_call / mine) / (best.per_call / theirs)
                for mine, theirs in zip(row.samples, best.samples, strict=True)]

    def add_rows(self, group: str, case: str, times: Mapping[str, tuple[float, ...]], *,
                 per_call: float, unit: str, references: Collection[str]) -> None:
        """One row per implementation timed by :func:`interleaved` (``times``);
        ``references`` names the reference implementations among them."""
        for impl, samples in times.items():
            self.rows.append(Row(group, case, impl, samples, per_call, unit,
                                 reference=impl in references))

    def ratio(self, row: Row) -> float | None:
        """``row``'s rate over the fastest reference of its case, the median of the per-round
        ratios (a drift between rounds hits both sides of a round alike), or None without a
        reference."""
        best = self._best_reference(row)
        return None if best is None else statistics.median(self._round_ratios(row, best))

    def ratio_range(self, row: Row) -> tuple[float, float] | None:
        """The 25th and 75th percentiles of ``row``'s per-round ratios to the fastest
        reference of its case: how much the ratio moved within the run. None for that
        reference itself, or with fewer than two rounds."""
        best = self._best_reference(row)
        if best is None or best is row:
            return None
        ratios = self._round_ratios(row, best)
        if len(ratios) < 2:
            return None
        low, _, high = statistics.quantiles(ratios, n=4, method="inclusive")
        return low, high

    def twin_ratio(self, row: Row) -> float | None:
        """``row``'s rate over its twin's (the same-weights reference), the median of the
        per-round ratios, or None without one."""
        case = (row.group, row.case, row.twin)
        twins = [r for r in self.rows if (r.group, r.case, r.impl) == case]
        return statistics.median(self._round_ratios(row, twins[0])) if twins else None


def _timed(fn: Callable[[], object], repeats: int) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def interleaved(
    fns: Mapping[str, Callable[[], object]], *, rounds: int, min_seconds: float, warmup: int = 1
) -> dict[str, tuple[float, ...]]:
    """Seconds per call of each function, one sample per interleaved round (A B C A B C).

    Each function is warmed up ``warmup`` times, then its call count per sample is chosen
    so that one sample lasts at least ``min_seconds``.
    """
    repeats = {}
    for name, fn in fns.items():
        for _ in range(warmup):
            fn()
        once = _timed(fn, 1)
        repeats[name] = max(1, math.ceil(min_seconds / max(once, 1e-9)))
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            samples[name].append(_timed(fn, repeats[name]))
    return {name: tuple(times) for name, times in samples.items()}


Call = TypeVar("Call", bound=Callable[[], object])


def compiled_first_call(fn: Call, report: Report, what: str) -> Call:
    """``fn``, after calling it once and noting how long that first (compiling) call took."""
    start = time.perf_counter()
    fn()
    report.notes.append(f"{what}: compiling took {time.perf_counter() - start:.1f} s (first call)")
    return fn


def gemm(m: int, k: int, n: int, *, dtype: torch.dtype) -> tuple[Callable[[], object], float]:
    """A ``torch.mm`` of (m, k) by (k, n) to time with the others, and its FLOP count."""
    a = torch.randn(m, k).to(dtype)
    b = torch.randn(k, n).to(dtype)
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


def machine_info(command: str) -> dict[str, Any]:
    """The machine, library versions and the command that repeats the run."""
    dists = ("torch", "addnorm", "x-transformers", "timm", "transformers", "diffusers")
    return {
        "cpu": _cpu_name(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "bf16_instructions": cpu_has_bf16(),
        "threads": torch.get_num_threads(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "versions": {dist: _version(dist) for dist in dists},
        "command": command,
    }


def to_json(report: Report) -> dict[str, Any]:
    """The report as plain JSON data, each row with its rate and ratio."""
    rows = [
        {**asdict(row), "seconds": row.seconds, "rate": row.rate,
         "ratio_to_best_reference": report.ratio(row),
         "ratio_range": report.ratio_range(row), "ratio_to_twin": report.twin_ratio(row)}
        for row in report.rows
    ]
    checks = [{**asdict(check), "passed": check.passed} for check in report.checks]
    return {"machine": report.machine, "rows": rows, "checks": checks, "notes": report.notes}


def _format_rate(rate: float) -> str:
    return f"{rate:,.0f}" if rate >= 100 else f"{rate:#.3g}"


def _format_ratio(ratio: float | None, spread: tuple[float, float] | None = None) -> str:
    if ratio is None:
        return ""
    return f"{ratio:.2f}x" + ("" if spread is None else f" ({spread[0]:.2f}-{spread[1]:.2f})")


def _several_references(rows: list[Row]) -> bool:
    """Whether some case of these rows has more than one reference."""
    cases = [r.case for r in rows if r.reference]
    return len(cases) != len(set(cases))


def format_table(report: Report) -> str:
    """A Markdown table per group: rate, ratio to the best reference with the 25-75% range
    of its per-round ratios (and the ratio to the twin where a case has several
    references), share of the GEMM rate."""
    lines: list[str] = []
    m = report.machine
    if m:
        lines.append(f"Machine: {m['cpu']} ({m['cpu_capability']}), {m['threads']} threads, "
                     f"Python {m['python']}")
        versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v)
        lines += [f"Versions: {versions}", f"Command: {m['command']}", ""]
    groups = list(dict.fromkeys(row.group for row in report.rows))
    for group in groups:
        rows = [r for r in report.rows if r.group == group]
        twins = any(r.twin is not None for r in rows) and _several_references(rows)
        twin_head, twin_rule = (" vs twin |", "---:|") if twins else ("", "")
        lines += [f"### {group}", "",
                  f"| case | implementation | rate | vs best ref |{twin_head} of GEMM |",
                  f"|---|---|---:|---:|{twin_rule}---:|"]
        for row in rows:
            gemm = "" if row.gemm_fraction is None else f"{100 * row.gemm_fraction:.0f}%"
            impl = row.impl + (" (ref)" if row.reference else "")
            impl += f" [{row.note}]" if row.note else ""
            rate = f"{_format_rate(row.rate)} {row.unit}"
            twin = f" {_format_ratio(report.twin_ratio(row))} |" if twins else ""
            ratio = _format_ratio(report.ratio(row), report.ratio_range(row))
            lines.append(f"| {row.case} | {impl} | {rate} | {ratio} |{twin} {gemm} |")
        lines.append("")
    if report.checks:
        lines += ["### correctness (same weights)", ""]
        for check in report.checks:
            verdict = "ok" if check.passed else "FAILED"
            lines.append(f"- {check.group}: {check.name}: max |diff| {check.max_error:.2e} "
                         f"(tolerance {check.tolerance:.0e}) {verdict}")
        lines.append("")
    if report.notes:
        lines += ["### notes", ""] + [f"- {note}" for note in report.notes] + [""]
    return "\n".join(lines)
