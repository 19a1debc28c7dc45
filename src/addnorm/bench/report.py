"""The report of ``addnorm bench``: what a run measured (:class:`Row`, :class:`Check`,
:class:`Report`, with each row's ratio to the fastest reference of its case as the median of
per-round ratios), as JSON (:func:`to_json`, :func:`from_json`), as Markdown tables
(:func:`format_table`) and as ``torch.utils.benchmark.Compare`` (:func:`format_compare`).
:mod:`addnorm.bench.harness` times the rows and re-exports these names.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Collection, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from torch.utils import benchmark

from addnorm.bench.measure import format_bytes

__all__ = [
    "DERIVED",
    "Check",
    "Report",
    "Row",
    "format_compare",
    "format_table",
    "from_json",
    "to_json",
]


@dataclass(frozen=True)
class Row:
    """One implementation's times on one case: ``samples``, seconds per call, one per
    interleaved round; ``seconds`` is their median.

    ``per_call``: units of work per call (tokens, steps, images), so rate = per_call / seconds.
    ``flops``: floating-point operations per call (how each case counts them is in its
    module), or None; ``gemm_fraction`` is the achieved FLOP rate over the same-run matrix
    multiply's rate. ``twin``: the reference of the same case that this row is to be read
    against (the same weights and the same way of running: eager against eager, compiled
    against compiled), or None; where a case has several references the table shows the
    ratio to it too. ``peak_memory``: bytes the implementation holds at its peak (CUDA only;
    see :func:`addnorm.bench.measure.peak_memory`). ``compile_seconds``: the first call's
    time minus a warm call's, for compiled implementations. ``steps``: sequential steps per
    call (decoding: the new tokens), reported as milliseconds per step.
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
    peak_memory: int | None = None
    compile_seconds: float | None = None
    steps: int | None = None

    @property
    def seconds(self) -> float:
        return statistics.median(self.samples)

    @property
    def rate(self) -> float:
        return self.per_call / self.seconds

    @property
    def tflops(self) -> float | None:
        """Achieved TFLOP/s (10^12 floating-point operations per second), or None."""
        return None if self.flops is None else self.flops / self.seconds / 1e12

    @property
    def ms_per_step(self) -> float | None:
        return None if self.steps is None else 1e3 * self.seconds / self.steps


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
    compile times), the machine, the same-run matrix-multiply rate (FLOP/s) that rows'
    ``gemm_fraction`` is a share of, and the errors of groups that failed in a run that
    went on (``run_bench(keep_going=True)``)."""

    rows: list[Row] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=dict)
    peak_flops: float | None = None
    errors: list[str] = field(default_factory=list)
    measurements: list[benchmark.Measurement] = field(default_factory=list, repr=False)

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

    def add_rows(
        self, group: str, case: str, times: Mapping[str, tuple[float, ...]], *,
        per_call: float, unit: str, references: Collection[str], flops: float | None = None,
        twins: Mapping[str, str] | None = None, memory: Mapping[str, int | None] | None = None,
        compile_seconds: Mapping[str, float] | None = None, steps: int | None = None,
    ) -> None:
        """One row per implementation timed by :func:`interleaved` (``times``);
        ``references`` names the reference implementations among them. With ``flops`` and a
        measured :attr:`peak_flops`, each row's share of it is the median over the rounds."""
        twins, memory, compile_seconds = twins or {}, memory or {}, compile_seconds or {}
        for impl, samples in times.items():
            fraction = None
            if flops is not None and self.peak_flops:
                fraction = statistics.median(flops / s for s in samples) / self.peak_flops
            self.rows.append(Row(
                group, case, impl, samples, per_call, unit, reference=impl in references,
                flops=flops, gemm_fraction=fraction, twin=twins.get(impl),
                peak_memory=memory.get(impl), compile_seconds=compile_seconds.get(impl),
                steps=steps,
            ))

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



def to_json(report: Report) -> dict[str, Any]:
    """The report as plain JSON data, each row with its rate, ratios, TFLOP/s and ms/step."""
    rows = [
        {**asdict(row), "seconds": row.seconds, "rate": row.rate,
         "ratio_to_best_reference": report.ratio(row),
         "ratio_range": report.ratio_range(row), "ratio_to_twin": report.twin_ratio(row),
         "tflops": row.tflops, "ms_per_step": row.ms_per_step}
        for row in report.rows
    ]
    checks = [{**asdict(check), "passed": check.passed} for check in report.checks]
    return {"machine": report.machine, "peak_flops": report.peak_flops, "rows": rows,
            "checks": checks, "notes": report.notes, "errors": report.errors}


# JSON row fields that a Row computes rather than holds.
DERIVED = ("seconds", "rate", "ratio_to_best_reference", "ratio_range", "ratio_to_twin",
           "tflops", "ms_per_step")


def from_json(data: dict[str, Any]) -> Report:
    """The report that :func:`to_json` wrote (its measurements left out), so that a JSON file
    prints as a table again (``benchmarks/bench_table.py``)."""
    rows = []
    for row in data["rows"]:
        fields: dict[str, Any] = {k: v for k, v in row.items() if k not in DERIVED}
        rows.append(Row(**{**fields, "samples": tuple(fields["samples"])}))
    checks = [Check(**{k: v for k, v in c.items() if k != "passed"}) for c in data["checks"]]
    return Report(rows=rows, checks=checks, notes=list(data["notes"]),
                  machine=dict(data["machine"]), peak_flops=data.get("peak_flops"),
                  errors=list(data.get("errors", [])))


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


def _machine_lines(m: Mapping[str, Any]) -> list[str]:
    lines = [f"Machine: {m['cpu']} ({m['cpu_capability']}), {m['threads']} threads, "
             f"Python {m['python']}"]
    if "gpu" in m:
        lines.append(f"Device: {m['gpu']} (CUDA {m['cuda']})")
    versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v)
    return lines + [f"Versions: {versions}", f"Command: {m['command']}", ""]


def format_table(report: Report) -> str:
    """A Markdown table per group: rate, ratio to the best reference with the 25-75% range
    of its per-round ratios (and the ratio to the twin where a case has several
    references), and where a group has them: ms per step, TFLOP/s, share of the same-run
    GEMM rate, peak memory, compile time."""
    lines: list[str] = _machine_lines(report.machine) if report.machine else []
    if report.peak_flops:
        lines += [f"Same-run matrix multiply (the peak rows' shares refer to): "
                  f"{report.peak_flops / 1e12:.3g} TFLOP/s", ""]
    groups = list(dict.fromkeys(row.group for row in report.rows))
    for group in groups:
        rows = [r for r in report.rows if r.group == group]
        twins = any(r.twin is not None for r in rows) and _several_references(rows)
        columns: list[tuple[str, Callable[[Row], str]]] = [
            ("rate", lambda r: f"{_format_rate(r.rate)} {r.unit}"),
            ("vs best ref", lambda r: _format_ratio(report.ratio(r), report.ratio_range(r))),
        ]
        optional: list[tuple[str, Callable[[Row], str], bool]] = [
            ("vs twin", lambda r: _format_ratio(report.twin_ratio(r)), twins),
            ("ms/step", lambda r: f"{r.ms_per_step:.3g}" if r.ms_per_step else "",
             any(r.steps for r in rows)),
            ("TFLOP/s", lambda r: f"{r.tflops:.3g}" if r.tflops is not None else "",
             any(r.flops is not None for r in rows) and report.peak_flops is not None),
            ("of GEMM", lambda r: "" if r.gemm_fraction is None
             else f"{100 * r.gemm_fraction:.0f}%", True),
            ("peak memory", lambda r: format_bytes(r.peak_memory),
             any(r.peak_memory is not None for r in rows)),
            ("compile", lambda r: "" if r.compile_seconds is None
             else f"{r.compile_seconds:.0f} s", any(r.compile_seconds is not None for r in rows)),
        ]
        columns += [(head, cell) for head, cell, shown in optional if shown]
        lines += [f"### {group}", "",
                  "| case | implementation | " + " | ".join(h for h, _ in columns) + " |",
                  "|---|---|" + "---:|" * len(columns)]
        for row in rows:
            impl = row.impl + (" (ref)" if row.reference else "")
            impl += f" [{row.note}]" if row.note else ""
            cells = " | ".join(cell(row) for _, cell in columns)
            lines.append(f"| {row.case} | {impl} | {cells} |")
        lines.append("")
    if report.checks:
        lines += ["### correctness (same weights)", ""]
        for check in report.checks:
            verdict = "ok" if check.passed else "FAILED"
            lines.append(f"- {check.group}: {check.name}: max |diff| {check.max_error:.2e} "
                         f"(tolerance {check.tolerance:.1e}) {verdict}")
        lines.append("")
    if report.notes:
        lines += ["### notes", ""] + [f"- {note}" for note in report.notes] + [""]
    if report.errors:
        lines += ["### errors", ""] + [f"- {e.splitlines()[0]}" for e in report.errors] + [""]
    return "\n".join(lines)


def format_compare(report: Report) -> str:
    """``torch.utils.benchmark.Compare`` of every sample of the run: per-call times, one table
    per group, a row per case and a column per implementation (all rounds pooled)."""
    if not report.measurements:
        return ""
    compare = benchmark.Compare(report.measurements)
    compare.trim_significant_figures()
    return str(compare)
