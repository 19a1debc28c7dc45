"""``verdicts.json``: every experiment's verdicts in one small file, beside ``index.html``.

Written from each ``OUT/NAME/result.json`` present (experiments not run yet are absent)::

    {"counts": {"supported": 12, "not supported": 1, "mixed": 1, "undecided": 0},
     "experiments": {NAME: {"claim": ..., "quick": false, "verdict": "mixed",
                            "headline": ..., "conditions": {"lr 0.1": "not supported", ...},
                            "also": [{"claim": ..., "verdict": ..., "headline": ...,
                                      "conditions": {...}}]}}}

``counts`` counts the seed's claims alone, as the summary line of ``addnorm explain`` does.
The README's and docs/experiments.md's verdicts are checked against a copy of the last full
and quick runs' files (docs/explain-full.json, docs/explain-quick.json).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from addnorm.experiments.outcome import VERDICT_NAMES

__all__ = ["write_verdicts"]


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
    text = json.dumps({"counts": counts, "experiments": experiments}, indent=1,
                      ensure_ascii=False)
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
