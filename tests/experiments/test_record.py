"""verdicts.json: every experiment's verdicts in one file, the seed's claims counted."""

import json

from toy_outcomes import toy_conditions, toy_outcome

from addnorm.experiments import Outcome, write_outcome, write_verdicts
from addnorm.experiments.outcome import Reading


def test_verdicts_json_counts_the_seeds_claims_and_lists_every_verdict(tmp_path):
    mixed = Outcome(**{**toy_outcome(False).__dict__, "conditions": toy_conditions(False, True)})
    mixed.also = (Reading(claim="r", supported=None, headline="h", undecided_because="w"),)
    write_outcome(mixed, tmp_path)
    record = json.loads(write_verdicts(tmp_path, ["toy", "absent"]).read_text())
    assert record["counts"] == {"supported": 0, "not supported": 0, "mixed": 1,
                                "undecided": 0}
    assert record["experiments"] == {"toy": {
        "claim": "c <b>", "quick": False, "verdict": "mixed", "headline": "h",
        "conditions": {"lr 0": "not supported", "lr 1": "supported"},
        "also": [{"claim": "r", "verdict": "undecided", "headline": "h", "conditions": {}}]}}


def test_verdicts_json_names_the_machine_from_its_cpu_description(tmp_path):
    # The file's own machine() against /proc/cpuinfo read here with a plain split.
    from pathlib import Path

    from addnorm.experiments.record import machine

    write_outcome(toy_outcome(True), tmp_path)
    record = json.loads(write_verdicts(tmp_path, ["toy"]).read_text())
    assert record["machine"] == machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        lines = cpuinfo.read_text().splitlines()
        model = next(line.split(":", 1)[1].strip() for line in lines
                     if line.startswith("model name"))
        flags = next(line.split(":", 1)[1].split() for line in lines if line.startswith("flags"))
        avx = sorted({f for f in flags if f.startswith("avx512")})
        assert record["machine"] == f"{model}; {' '.join(avx) or 'no AVX-512'}"
