"""``addnorm train lm|translate|dit --data ... --max-minutes N`` prints its plan before it
starts (the model sized from the data, the steps that fill the budget, the time expected from
a measured warm-up) and trains it; ``--epochs`` counts its steps from the data.

Provenance: the printed numbers are compared with the run's own checkpoint (its model config
and planned ``max_steps``) and with the data's size; the epochs' steps are ceil(epochs *
examples / batch) on the pairs the test writes and the held-out split the run records. The
budgets are tiny so the runs are seconds long; no assertion reads the wall clock.
"""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from image_folders import write_folder

from addnorm.cli.parser import main
from addnorm.training.checkpoint import load_checkpoint

WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ADDNORM_CACHE", str(tmp_path / "cache"))


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny forwards run many times slower when threads oversubscribe the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _data(tmp_path, task: str) -> tuple[str, list[str]]:
    """A small data set of ``task``'s kind and the task's flags for a quick run."""
    if task == "lm":
        path = tmp_path / "notes.txt"
        path.write_text("".join(f"note {i}: {WORDS[i % 10]} and {WORDS[i * 7 % 10]}\n"
                                for i in range(400)), encoding="utf-8")
        return str(path), ["--seq-len", "32", "--batch-size", "8", "--eval-size", "4"]
    if task == "translate":
        path = tmp_path / "pairs.tsv"
        path.write_text("".join(f"{WORDS[i // 10]} {WORDS[i % 10]}\t{i}\n" for i in range(100)),
                        encoding="utf-8")
        return str(path), ["--batch-size", "8", "--eval-size", "8"]
    write_folder(tmp_path / "pics", {"ants": 6, "bees": 6, "wasps": 6}, size=8)
    return str(tmp_path / "pics"), ["--batch-size", "4", "--eval-size", "6"]


@pytest.mark.parametrize("task", ["lm", "translate", "dit"])
def test_a_run_on_your_data_prints_its_plan_then_trains_it(task, tmp_path, capsys):
    data, flags = _data(tmp_path, task)
    out = tmp_path / "run"
    argv = ["train", task, "--data", data, *flags, "--max-minutes", "0.02", "--quiet",
            "--out", str(out)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    model = re.search(r"model: ([\d,]+) parameters \(d_model (\d+), .*sized from the data "
                      r"and the budget", captured.err)
    steps = re.search(r"steps: ([\d,]+) of (\d+) examples \(([\d.e+-]+) epochs of ([\d,]+) ",
                      captured.err)
    expected = re.search(r"expected: .* of training here, in a 0.02-minute budget \(([\d.e+-]+)"
                         r" s a step", captured.err)
    assert model and steps and expected, captured.err
    assert "as many as fit the budget" in captured.err
    saved = load_checkpoint(out)
    planned = int(steps.group(1).replace(",", ""))
    # the plan, or the steps a re-plan in training printed: more (up: the machine faster than
    # its warm-up; these steps fill the budget) or fewer (down) (training/budget.py); on a
    # busy machine the time cap may still end the run before its last planned step
    train_config = saved.state["train_config"]
    assert train_config["fill_budget"] is True
    up = re.search(r"re-planned up after step \d+: .* so (\d+) steps, not the (\d+) planned",
                   captured.out)
    down = re.search(r"re-planned after step \d+: .* so (\d+) of the (\d+) planned",
                     captured.out)
    if up:
        assert int(up.group(2)) == planned < int(up.group(1)) == train_config["max_steps"]
    elif down:
        assert int(down.group(2)) == planned > int(down.group(1)) == train_config["max_steps"]
    else:
        assert train_config["max_steps"] == planned
    assert saved.step <= train_config["max_steps"]
    assert saved.state["run"]["model_config"]["d_model"] == int(model.group(2))
    assert f"trained {saved.step} steps" in captured.out
    data_json = json.loads((out / "data.json").read_text())
    assert data_json  # the run on your data keeps its record


def test_epochs_set_the_steps_from_the_data(tmp_path, capsys):
    data, flags = _data(tmp_path, "translate")
    out = tmp_path / "run"
    assert main(["train", "translate", "--data", data, *flags, "--epochs", "2",
                 "--max-minutes", "none", "--quiet", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    found = re.search(r"steps: ([\d,]+) of 8 examples \(([\d.]+) epochs of (\d+) examples\)",
                      captured.err)
    assert found and "from --epochs" in captured.err, captured.err
    steps, pairs = int(found.group(1)), int(found.group(3))
    assert pairs == json.loads((out / "data.json").read_text())["split"]["train_pairs"]
    assert steps == math.ceil(2 * pairs / 8) and load_checkpoint(out).step == steps
    assert float(found.group(2)) == pytest.approx(steps * 8 / pairs, rel=1e-2)
    assert main(["train", "translate", "--data", data, *flags, "--epochs", "2", "--max-steps",
                 "5", "--quiet", "--out", str(tmp_path / "both")]) == 2
    assert "--epochs (2) and --max-steps (5) both set the steps" in capsys.readouterr().err
    assert main(["train", "translate", "--data", data, *flags, "--fill-budget", "--max-steps",
                 "5", "--quiet", "--out", str(tmp_path / "fill")]) == 2
    assert "--fill-budget and --max-steps both set the steps" in capsys.readouterr().err
