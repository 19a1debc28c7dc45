"""The ``addnorm bench`` command (``addnorm.cli.bench``): its JSON and its refusals. Tiny
sizes, one round: speed itself is never asserted here. The suites it runs are tested in
tests/bench/."""

from __future__ import annotations

import json

import pytest

from addnorm.bench import BenchSettings, to_json
from addnorm.bench.harness import from_json
from addnorm.cli.parser import main


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """One torch thread (tests/conftest.py), as every bench test has: nothing here is timed."""


TINY = BenchSettings(size="test", rounds=1, min_seconds=0.0)


JSON_KEYS = {"machine", "peak_flops", "rows", "checks", "notes", "errors"}


def test_cli_writes_well_formed_json(tmp_path, capsys):
    pytest.importorskip("diffusers")
    out = tmp_path / "bench.json"
    code = main(["bench", "--only", "timestep", "--rounds", "1", "--json", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    assert set(data) == JSON_KEYS
    assert data["machine"]["command"] == "addnorm bench --only timestep --rounds 1"
    for row in data["rows"]:
        assert row["rate"] > 0 and row["unit"] == "calls/s"
    assert data == json.loads(json.dumps(to_json(from_json(data))))  # nothing lost
    printed = capsys.readouterr().out
    assert "timestep embedding" in printed
    assert "torch.utils.benchmark.Compare" in printed and "Times are in" in printed


@pytest.mark.parametrize("argv", [["bench", "--only", "nope"], ["bench", "--rounds", "0"],
                                  ["bench", "--threads", "100000"]])
def test_cli_refuses_bad_arguments_with_exit_code_2(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("addnorm bench: error:")
