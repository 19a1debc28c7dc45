"""``verdicts.json``: every experiment's verdicts in one small file, beside ``index.html``.

Written from each ``OUT/NAME/result.json`` present (experiments not run yet are absent)::

    {"machine": "AMD EPYC; avx512_bf16 avx512bw ...",
     "counts": {"supported": 12, "not supported": 1, "mixed": 1, "undecided": 0},
     "experiments": {NAME: {"claim": ..., "quick": false, "verdict": "mixed",
                            "headline": ..., "conditions": {"lr 0.1": "not supported", ...},
                            "also": [{"claim": ..., "verdict": ..., "headline": ...,
                                      "conditions": {...}}]}}}

``counts`` counts the seed's claims alone, as the summary line of ``addnorm explain`` does.
``machine`` names the CPU that wrote the file (:func:`machine`): where a number comes from
training, the last digits can move from one CPU's rounding to another's, and a chaotic run
(loss-landscape's plain net at lr 0.3) moves more than that; the verdicts should not.
The README's and docs/experiments.md's verdicts are checked against a copy of the last full
and quick runs' files (docs/explain-full.json, docs/explain-quick.json).
"""

from __future__ import annotations

import json
import platform
import re
from pathlib import Path
from typing import Any

from addnorm.experiments.outcome import VERDICT_NAMES

__all__ = ["machine", "write_verdicts"]


def machine() -> str:
    """This machine's CPU: its model name and AVX-512 extensions (what sets the rounding of
    float32 kernels apart), from ``/proc/cpuinfo`` where there is one."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return platform.processor() or platform.machine()
    model = re.search(r"model name\s*:\s*(.*)", text)
    name = model.group(1).strip() if model else (platform.processor() or platform.machine())
    extensions = sorted(set(re.findall(r"\b(avx512[a-z_0-9]*)", text)))
    return f"{name}; {' '.join(extensions) or 'no AVX-512'}"


def write_verdicts(out_dir: Path, names: list[str]) -> Path:
    """Write ``out_dir/verdicts.json`` from the results of ``names`` present there."""
    experiments = {}
    for name in names:
        path = out_dir / name / "result.json"
        if path.is_file():
            experiments[name] = _entry(json.loads(path.read_text(encoding="utf-8")))
    counts = dict.fromkeys(VERDICT_NAMES, 0)
    for entry in experiments.values():
        counts[entry["verdict"]] += 1
    path = out_dir / "verdicts.json"
    text = json.dumps({"machine": machine(), "counts": counts, "experiments": experiments},
                      indent=1, ensure_ascii=False)
    path.write_text(text + "\n", encoding="utf-8")
    return path


def _entry(record: dict[str, Any]) -> dict[str, Any]:
    return {
        "claim": record["claim"], "quick": record["quick"], "verdict": record["verdict"],
        "headline": record["headline"], "conditions": _conditions(record),
        "also": [{"claim": reading["claim"], "verdict": reading["verdict"],
                  "headline": reading["headline"], "conditions": _conditions(reading)}
                 for reading in record.get("also") or []],
    }


def _conditions(record: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["verdict"] for c in record.get("conditions") or []}
