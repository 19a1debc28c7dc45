"""The last full run's verdicts (docs/explain-full.json, made on the machine its ``machine``
names) against a fresh full run on whatever CPU runs the suite, for every experiment cheap
enough to repeat: a verdict that moved with a CPU's rounding would show here, which checking
the stored file alone cannot. loss-landscape, whose plain net is chaotic, has its own such
tests (tests/experiments/test_loss_landscape.py: fresh, and with every initial weight one ulp
off); length-extrapolation and postln-vs-preln, a minute or more each, are left out.

Slow (about two minutes on one core): ``pytest -m slow tests/experiments/test_fresh_verdicts.py``.
"""

import json
from pathlib import Path

import pytest

from addnorm.experiments import EXPERIMENTS

RECORD = Path(__file__).resolve().parents[2] / "docs" / "explain-full.json"
LEFT_OUT = ("length-extrapolation", "postln-vs-preln", "loss-landscape")


def verdicts(entry: dict) -> dict:
    """What a verdicts.json entry decides: the claim's verdict and its conditions', and each
    reading's."""
    return {"verdict": entry["verdict"], "conditions": entry["conditions"],
            "also": [(r["verdict"], r["conditions"]) for r in entry["also"]]}


def fresh(name: str) -> dict:
    outcome = EXPERIMENTS[name](quick=False)
    return verdicts({
        "verdict": outcome.verdict,
        "conditions": {c.name: c.verdict for c in outcome.conditions},
        "also": [{"verdict": r.verdict, "conditions": {c.name: c.verdict for c in r.conditions}}
                 for r in outcome.also],
    })


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in EXPERIMENTS if n not in LEFT_OUT])
def test_a_fresh_full_run_gives_the_recorded_verdicts(name):
    recorded = json.loads(RECORD.read_text(encoding="utf-8"))["experiments"][name]
    assert fresh(name) == verdicts(recorded)
