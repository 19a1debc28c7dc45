"""The ``addnorm`` command given what a careless or hostile user might: bytes that are not
text, lines far past the model's limit, a closed stdin, sizes no machine can hold, JSON nested
a hundred thousand deep, a manifest that leaves a file out, seeds past 2**64.

Each case must end in a clear one-line error (exit 2 for flags, 1 for inputs and
checkpoints), or in a bounded answer; never a traceback or a hang.

Provenance: translations of the good lines are compared with the task's ``predict`` on the
same checkpoint; limits in the messages are the run's own ``max_len`` and the estimate's
fixed memory limit (``available_memory`` is pinned to 16 GB here).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import shutil
import subprocess
import sys

import pytest
import torch

from addnorm.cli.parser import main
from addnorm.cli.translate_input import stdin_inputs
from addnorm.tasks.trained import load_trained
from addnorm.training.checkpoint import find_checkpoint
from addnorm.training.config import TrainConfig
from addnorm.training.state import seed_everything
from addnorm.utils import memory as _memory
from addnorm.utils.files import MAX_JSON_DEPTH

TINY = [
    "--preset", "tiny", "--d-model", "32", "--n-heads", "2", "--d-ff", "64",
    "--n-encoder-layers", "1", "--n-decoder-layers", "1", "--batch-size", "4",
    "--eval-size", "4", "--log-every", "1", "--quiet",
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("hostile") / "translate"
    assert main(["train", "translate", *TINY, "--max-steps", "2", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def trained(run):
    task, model, _ = load_trained(run)
    return task, model


def translate_stdin(run, data: bytes, monkeypatch, capsys) -> tuple[int, list[str], list[str]]:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))
    code = main(["translate", "--checkpoint", str(run)])
    out, err = capsys.readouterr()
    return code, out.split("\n")[:-1], err.splitlines()


def test_undecodable_lines_are_refused_by_number_and_the_others_translated(
    run, trained, monkeypatch, capsys
):
    task, model = trained
    data = b"21 Nov 2026\n\xff\xfe garbage\n2026-11-21\n"
    code, out, err = translate_stdin(run, data, monkeypatch, capsys)
    assert code == 1
    assert out == [*task.predict(model, ["21 Nov 2026"]), "", *task.predict(model, ["2026-11-21"])]
    refused = [line for line in err if "error" in line]
    assert len(refused) == 1 and "line 2: not UTF-8" in refused[0]


def test_characters_outside_the_vocabulary_are_refused_not_mapped_to_unk(
    run, monkeypatch, capsys
):
    code, out, err = translate_stdin(run, b"21 Nov\x00 2026\n\x1b[2J\n", monkeypatch, capsys)
    assert code == 1 and out == ["", ""]
    assert "line 1:" in err[0] and "U+0000" in err[0] and "position 7" in err[0]
    assert "line 2:" in err[1] and "U+001B" in err[1]


def test_an_over_long_line_is_refused_with_the_limit_and_its_batch_is_unaffected(
    run, trained, monkeypatch, capsys
):
    task, model = trained
    limit = model.cfg.max_len
    data = b"21 Nov 2026\n" + b"7" * 20_000 + b"\n2026-11-21\n"
    code, out, err = translate_stdin(run, data, monkeypatch, capsys)
    assert code == 1
    assert out == [*task.predict(model, ["21 Nov 2026"]), "", *task.predict(model, ["2026-11-21"])]
    refused = [line for line in err if "error" in line]  # (the 2-step model's answers
    assert len(refused) == 1  # are flagged as not dates: warnings)
    assert "line 2: over" in refused[0] and f"at most {limit}" in refused[0]


def test_a_long_argument_and_a_control_character_argument_are_refused_too(run, capsys):
    assert main(["translate", "1" * 300, "a\tb", "--checkpoint", str(run)]) == 1
    out, err = capsys.readouterr()
    assert out == "\n\n"
    assert "argument 1: 300 characters" in err and "argument 2:" in err and "U+0009" in err


class _Recording(io.BytesIO):
    """A byte stream that remembers how much each ``readline`` asked for."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.asked: list[int] = []

    def readline(self, size: int | None = -1) -> bytes:
        self.asked.append(-1 if size is None else size)
        return super().readline(size)


def test_a_line_of_ten_million_bytes_is_skipped_in_blocks_never_read_whole():
    stream = _Recording(b"x" * 10_000_000 + b"\n21 Nov 2026\n")
    items = list(stdin_inputs(stream, frozenset("x0123456789 Nov"), 256))
    assert [item.problem is None for item in items] == [False, True]
    assert items[1].text == "21 Nov 2026" and items[1].where == "line 2"
    assert "10000001 bytes" in items[0].problem  # the whole line was skipped, and counted
    assert all(0 < size <= 1 << 16 for size in stream.asked)


def test_random_binary_input_gets_one_answer_line_per_input_line_and_exit_1(
    run, monkeypatch, capsys
):
    data = random.Random(14).randbytes(20_000)
    code, out, err = translate_stdin(run, data, monkeypatch, capsys)
    assert code == 1
    assert len(out) == data.count(b"\n") + (not data.endswith(b"\n"))
    assert not any("Traceback" in line for line in err)


def test_closed_stdin_exits_2_with_one_line(run):
    done = subprocess.run(
        ["sh", "-c", 'exec "$0" -m addnorm translate --checkpoint "$1" <&-', sys.executable,
         str(run)],
        capture_output=True, timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.decode().splitlines() == [
        "addnorm translate: error: no dates given and stdin is closed; pass dates as "
        "arguments or lines"
    ]


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--d-ff", "100000000000"], "--d-ff 100000000000"),
        (["--d-model", "65536", "--n-heads", "1"], "--d-model 65536"),
        (["--position-encoding", "learned", "--max-len", "100000000"], "--max-len 100000000"),
        (["--batch-size", "1000000000"], "--batch-size 1000000000"),
        (["--n-encoder-layers", "100000"], "--n-encoder-layers 100000"),
        (["--eval-size", "100000000"], "--eval-size 100000000"),
    ],
)
def test_sizes_that_cannot_fit_exit_2_naming_the_flag_before_allocating(
    argv, named, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(_memory, "available_memory", lambda device="cpu": 16_000_000_000)
    out = tmp_path / "run"
    assert main(["train", "translate", *argv, "--max-steps", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"addnorm train: error: {named}:")
    assert not out.exists()


def test_a_memory_refusal_names_the_estimate_and_the_limit(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(_memory, "available_memory", lambda device="cpu": 16_000_000_000)
    argv = ["train", "translate", "--d-ff", "100000000000", "--out", str(tmp_path / "r")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "TB of memory" in err and "more than the 16 GB available on cpu" in err


@pytest.mark.parametrize("seed", [2**64, -1])
def test_seeds_outside_0_to_2_64_exit_2(seed, tmp_path, capsys):
    argv = ["train", "translate", "--seed", str(seed), "--out", str(tmp_path / "r")]
    assert main(argv) == 2
    assert "seed" in capsys.readouterr().err
    assert main(["generate", "--prompt", "x", "--seed", str(seed)]) == 2
    assert "--seed" in capsys.readouterr().err


def test_the_largest_seed_seeds_every_generator():
    seed = TrainConfig(seed=2**64 - 1).seed
    seed_everything(seed)  # torch, NumPy and Python's random all take it
    assert torch.initial_seed() == seed


def deep(n: int) -> str:
    return '{"model": ' * n + "{}" + "}" * n


# 50,000 levels: far past the interpreter's recursion limit, within --config's 1 MiB (11 bytes
# a level; a larger config is refused for its size, see test_hostile_run_files.py).
@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 50_000])
def test_a_deeply_nested_config_exits_2_with_one_line(depth, tmp_path, capsys):
    config = tmp_path / "deep.json"
    config.write_text(deep(depth))
    argv = ["train", "translate", "--config", str(config), "--out", str(tmp_path / "r")]
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and f"nested deeper than {MAX_JSON_DEPTH} levels" in err[0]


def copy_checkpoint(run, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    return find_checkpoint(copy)


def reseal(checkpoint) -> None:
    """Rewrite the manifest's sizes and hashes for the files it lists (a careful forger)."""
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    for name in manifest["files"]:
        data = (checkpoint / name).read_bytes()
        manifest["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))


def test_a_deeply_nested_state_or_manifest_exits_1_with_one_line(run, tmp_path, capsys):
    checkpoint = copy_checkpoint(run, tmp_path)
    (checkpoint / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    assert main(["info", str(checkpoint)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "manifest.json" in err[0] and "nested deeper" in err[0]
    shutil.rmtree(checkpoint.parent.parent)
    checkpoint = copy_checkpoint(run, tmp_path)
    state = json.loads((checkpoint / "state.json").read_text())
    state["run"]["task_data"] = json.loads(deep(200))
    (checkpoint / "state.json").write_text(json.dumps(state))
    reseal(checkpoint)
    assert main(["info", str(checkpoint)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "state.json" in err[0] and "nested deeper" in err[0]


def test_a_state_json_asking_for_sizes_that_cannot_fit_exits_1(run, tmp_path, capsys):
    checkpoint = copy_checkpoint(run, tmp_path)
    state = json.loads((checkpoint / "state.json").read_text())
    state["run"]["model_config"]["d_ff"] = 100_000_000_000
    (checkpoint / "state.json").write_text(json.dumps(state))
    reseal(checkpoint)
    assert main(["translate", "21 Nov 2026", "--checkpoint", str(checkpoint)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "state.json" in err[0] and "more than the" in err[0]


@pytest.mark.parametrize("drop", ["model.safetensors", "optimizer.safetensors"])
def test_a_manifest_must_list_every_file_that_is_read(drop, run, tmp_path, capsys):
    checkpoint = copy_checkpoint(run, tmp_path)
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    del manifest["files"][drop]
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))
    assert main(["info", str(checkpoint)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and f"does not list {drop}" in err[0]


def peak_rss_translating(run, n_lines: int, line: bytes) -> tuple[int, int]:
    """(exit code, peak resident memory in bytes) of ``addnorm translate`` fed ``n_lines``
    copies of ``line`` on stdin, its answers thrown away."""
    process = subprocess.Popen(
        [sys.executable, "-m", "addnorm", "translate", "--checkpoint", str(run)],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    assert process.stdin is not None
    for _ in range(n_lines // 1000):
        process.stdin.write(line * 1000)
    process.stdin.close()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode, usage.ru_maxrss * 1024  # Linux reports kilobytes


@pytest.mark.slow
def test_translating_100000_lines_streams_in_bounded_memory(run):
    # Held in memory, 90,000 more lines of 26 characters would take about 8 MB as Python
    # strings (twice that with their answers); streamed per batch, the peak stays put (in our
    # runs: 249.0 MB at 10,000 lines, 250.3 MB at 100,000).
    line = b"Saturday, 21 November 2026\n"
    code_small, small = peak_rss_translating(run, 10_000, line)
    code_large, large = peak_rss_translating(run, 100_000, line)
    assert code_small == code_large == 1  # (the 2-step model's answers are not dates)
    assert large - small < 5_000_000, f"peak RSS {small / 1e6:.1f} MB -> {large / 1e6:.1f} MB"


def test_deeply_nested_run_files_are_treated_as_absent_not_a_traceback(run, tmp_path, capsys):
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    (copy / "metrics.json").write_text("[" * 100_000 + "]" * 100_000)
    assert main(["info", str(copy)]) == 0
    assert json.loads(capsys.readouterr().out)["metrics"] is None
    (copy / "addnorm-run.json").write_text("[" * 100_000 + "]" * 100_000)
    argv = ["train", "translate", *TINY, "--max-steps", "1", "--out", str(copy)]
    assert main(argv) == 2  # no longer proven an addnorm run: refused, one line
    assert len(capsys.readouterr().err.splitlines()) == 1
