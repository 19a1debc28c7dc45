"""A run's watch records in a few sentences: where the gradients grow, which layers learn
least, where the residual stream's scale grows, what the norms, attention heads and FFN units
do.

Each sentence reads numbers straight from the records (:meth:`addnorm.inspection.Watch.step`);
``FLAT`` is the one judgement: a gradient profile whose fitted last-to-first ratio stays within
it is called flat.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from addnorm.inspection.statistics import NEAR_ZERO

__all__ = ["FLAT", "depth_profile", "summarize"]

FLAT = 1.5  # a fitted last/first gradient ratio within [1 / FLAT, FLAT] is "flat"


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def depth_profile(record: dict, section: str = "grad_norm") -> tuple[float, float] | None:
    """The least-squares slope of ``ln(value)`` over the layers (per layer) and the fitted
    ratio of the last layer's value to the first's (``exp(slope * (n - 1))``); None without
    two layers with positive values."""
    values = [_number(record.get(section, {}).get(layer)) for layer in record["layers"]]
    points = [(i, math.log(v)) for i, v in enumerate(values) if v is not None and v > 0]
    if len(points) < 2:
        return None
    x_mean = statistics.fmean(x for x, _ in points)
    y_mean = statistics.fmean(y for _, y in points)
    slope = sum((x - x_mean) * (y - y_mean) for x, y in points) / sum(
        (x - x_mean) ** 2 for x, _ in points)
    return slope, math.exp(slope * (len(values) - 1))


def _profile_sentence(record: dict) -> str | None:
    found = depth_profile(record)
    if found is None:
        return None
    slope, ratio = found
    if ratio > FLAT:
        shape = "grows toward the output"
    elif ratio < 1 / FLAT:
        shape = "shrinks toward the output"
    else:
        shape = "is flat over depth"
    return (f"gradient norm at step {record['step']} {shape}: last layer / first layer "
            f"{ratio:.3g}x (fitted; slope of ln||g|| {slope:+.3f} per layer)")


def _median_over_steps(records: Sequence[dict], section: str, name: str) -> float | None:
    values = [_number(r.get(section, {}).get(name)) for r in records]
    numbers = [v for v in values if v is not None]
    return statistics.median(numbers) if numbers else None


def _learning(records: Sequence[dict]) -> list[str]:
    layers = records[-1]["layers"]
    ratios = {layer: _median_over_steps(records, "update_ratio", layer) for layer in layers}
    known = sorted((v, layer) for layer, v in ratios.items() if v is not None)
    if not known:
        return []
    typical = statistics.median(v for v, _ in known)
    least = ", ".join(f"{layer} {v:.3g}" for v, layer in known[:3])
    lines = [f"learns least (update ratio ||dw||/||w||, median over {len(records)} watched "
             f"steps): {least}; the median layer {typical:.3g}"]
    subs = {name for r in records for name in r.get("update_ratio", {})
            if any(name.startswith(layer + ".") for layer in layers)}
    sub_ratios = sorted((v, name) for name in subs
                        if (v := _median_over_steps(records, "update_ratio", name)) is not None)
    if sub_ratios:
        value, name = sub_ratios[0]
        lines.append(f"the sublayer that moves least: {name} {value:.3g}")
    return lines


def _scale(record: dict) -> list[str]:
    layers, residual = record["layers"], record.get("residual", {})
    rms = {layer: residual.get(layer, {}) for layer in layers}
    if not layers or any(_number(r.get("in")) is None or _number(r.get("out")) is None
                         for r in rms.values()):
        return []
    first, last = rms[layers[0]]["in"], rms[layers[-1]]["out"]
    growth = max(layers, key=lambda layer: rms[layer]["out"] / max(rms[layer]["in"], 1e-30))
    ratio = rms[growth]["out"] / max(rms[growth]["in"], 1e-30)
    return [f"residual stream RMS at step {record['step']}: {first:.3g} entering "
            f"{layers[0]}, {last:.3g} leaving {layers[-1]} ({last / first:.3g}x); it grows "
            f"most in {growth} ({ratio:.3g}x)"]


def _mean_of(entries: Sequence[dict], stat: str) -> float | None:
    numbers = [v for e in entries if (v := _number(e.get(stat))) is not None]
    return statistics.fmean(numbers) if numbers else None


def _batchnorm(record: dict) -> list[str]:
    """BatchNorm's gap to its running statistics and the two effects in its output; a record
    written before they were told apart has their sum only (``batch_noise``, the train/eval
    gap), and is told so."""
    batch = [e for e in record.get("norms", {}).values()
             if e.get("kind") == "batch" and "mean_gap" in e]
    gap = _mean_of(batch, "mean_gap")
    if not batch or gap is None:
        return []
    head = (f"BatchNorm at step {record['step']}: batch mean {gap:.3g} running stds from the "
            f"running mean (mean over {len(batch)} norms)")
    effect, lag = _mean_of(batch, "batch_effect"), _mean_of(batch, "running_lag")
    if effect is not None and lag is not None:
        return [f"{head}; in its output, the batch's own effect {effect:.3g} "
                f"(||y - y_full|| / ||y||, from half batches) and the running statistics' lag "
                f"{lag:.3g} on average (train/eval gap {_mean_of(batch, 'train_eval_gap'):.3g})"]
    old = _mean_of(batch, "batch_noise")
    if old is None:
        return [head]
    return [f"{head}; train/eval gap ||y - y_eval|| / ||y|| {old:.3g} on average (the "
            "batch's own effect and the running statistics' lag together: this record "
            "predates their separation)"]


def _norms(record: dict) -> list[str]:
    norms = record.get("norms", {})
    lines = _batchnorm(record)
    per_token = [e["scale_cv"] for e in norms.values()
                 if e.get("kind") in ("layer", "rms", "group") and _number(e.get("scale_cv"))
                 is not None]
    if per_token:
        lines.append(f"per-token norms at step {record['step']}: the scales they divide out "
                     f"spread by {statistics.fmean(per_token):.3g} (std / mean, mean over "
                     f"{len(per_token)} norms)")
    return lines


def _attention(record: dict) -> list[str]:
    heads = [(h, name, i) for name, values in record.get("attention_entropy", {}).items()
             for i, h in enumerate(values) if _number(h) is not None]
    if not heads:
        return []
    heads.sort()
    low, high = heads[0], heads[-1]
    return [f"attention at step {record['step']}: most focused head {low[1]} head {low[2] + 1} "
            f"({low[0]:.3g} nats), most spread {high[1]} head {high[2] + 1} ({high[0]:.3g} nats)"]


def _share_sentence(shares: dict[str, float], what: str, step: int) -> str:
    worst = max(shares, key=lambda n: shares[n])
    return (f"{what} at step {step}: {statistics.fmean(shares.values()):.1%} on average, "
            f"{shares[worst]:.1%} in {worst}")


def _ffn_units(record: dict) -> list[str]:
    units = record.get("ffn_units", {})
    near = {n: v for n, e in units.items() if (v := _number(e.get("near_zero"))) is not None}
    dead = {n: v for n, e in units.items() if (v := _number(e.get("dead"))) is not None}
    lines = []
    if near:
        kinds = sorted({str(units[n].get("activation")) for n in near})
        lines.append(_share_sentence(
            near, f"FFN units whose output stays near zero ({', '.join(kinds)}: within "
            f"{NEAR_ZERO:.0%} of the FFN's RMS output on every token)", record["step"]))
    if dead:
        lines.append(_share_sentence(
            dead, "dead ReLU units (no positive pre-activation on any token)", record["step"]))
    old = {n: v for n, v in record.get("dead_units", {}).items() if _number(v) is not None}
    if old:  # a record from before ffn_units, whatever the activation
        lines.append(_share_sentence(
            old, "FFN units with no positive pre-activation on any token (dead only for "
            "ReLU)", record["step"]))
    return lines


def summarize(records: Sequence[dict]) -> list[str]:
    """A few sentences on the records (each with its ``step``), first and last watched steps
    compared where it matters; empty for no records."""
    records = sorted(records, key=lambda r: r["step"])
    if not records:
        return []
    first, last = records[0], records[-1]
    lines = [f"{len(records)} watched steps, {first['step']} to {last['step']}, "
             f"{len(last['layers'])} layers"]
    for record in (first, last) if last is not first else (first,):
        sentence = _profile_sentence(record)
        if sentence:
            lines.append(sentence)
    lines += _learning(records) + _scale(first)
    if last is not first:
        lines += _scale(last)
    return lines + _norms(last) + _attention(last) + _ffn_units(last)
