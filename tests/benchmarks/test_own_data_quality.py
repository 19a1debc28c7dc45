"""benchmarks/own_data_quality.py's own logic: the user's command it runs, the row it reads from
a run's ``metrics.json`` and the README table's min-max cells (restated by hand here). No run
is trained and no timing is asserted."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "own_data_quality.py"
_spec = importlib.util.spec_from_file_location("own_data_quality", SCRIPT)
assert _spec is not None and _spec.loader is not None
odq = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(odq)


def test_the_command_is_the_users_with_a_seed_and_a_folder(tmp_path):
    argv = odq.command("pairs", "pairs.tsv", 2, tmp_path / "run", [])
    assert argv == ["addnorm", "train", "translate", "--data", "pairs.tsv", "--seed", "2",
                    "--out", str(tmp_path / "run")]
    assert odq.command("text", "a/*.py", 0, tmp_path, ["--max-minutes", "1"])[2:4] == [
        "lm", "--data"]


def test_a_row_is_read_from_the_runs_metrics(tmp_path):
    (tmp_path / "metrics.json").write_text(json.dumps({
        "step": 120, "stopped_by": "max_steps", "elapsed_s": 61.26, "checkpoint": "best",
        "test_exact_match": 0.9, "test_token_error_rate": 0.05, "loss": 1.0}))
    argv = odq.command("pairs", "p.tsv", 0, tmp_path, [])
    row = odq.result("pairs", 0, argv, ["model: ..."], 70.04, (1.0, 2.0))
    assert row["scores"] == {"test_exact_match": 0.9, "test_token_error_rate": 0.05}
    assert (row["step"], row["elapsed_s"], row["wall_s"], row["checkpoint"]) == (
        120, 61.3, 70.0, "best")
    assert row["command"] == f"addnorm train translate --data p.tsv --seed 0 --out {tmp_path}"


def test_the_table_gives_each_kinds_min_max_over_its_seeds():
    def run(kind, seed, step, minutes, scores, loads):
        return {"kind": kind, "seed": seed, "step": step, "elapsed_s": minutes * 60,
                "scores": scores, "load_before": loads[0], "load_after": loads[1]}

    record = {"runs": [
        run("text", 0, 900, 4.5, {"val_bpc": 2.41234}, (1.0, 2.0)),
        run("text", 1, 950, 4.6, {"val_bpc": 2.30001}, (0.5, 1.24)),
        run("pairs", 0, 600, 1.0, {"test_exact_match": 0.99}, (3.0, 3.0)),
    ]}
    assert odq.table(record).splitlines()[2:] == [
        "| text | 2 | 900-950 | 4.5-4.6 | val_bpc 2.3000-2.4123 | 0.5-2.0 |",
        "| pairs | 1 | 600 | 1.0 | test_exact_match 0.9900 | 3.0 |",
    ]
