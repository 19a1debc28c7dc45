"""The ``addnorm`` command on runs and surroundings that are broken in ways no flag can fix:
weights of NaN, inf or 1e30 (resealed, so the manifest's hashes pass), a ``state.json``
without its ``train_config``, a closed stdout, a process memory limit (``ulimit -v``) the
machine's free memory does not show, and an allocation that fails during training.

Each case must end in one line on stderr and exit 1 (a file that cannot be used, an output
that cannot be written, memory that runs out) or 2 (a flag asking for more memory than the
process may have), never a traceback; what the run had written stays as it was.

Provenance: the exit codes and the one-line rule of ``addnorm.cli.parser``; the files before
and after (hashes); the memory limit set on the child process itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from addnorm.cli.parser import main
from addnorm.tasks.lm import LMTask
from addnorm.tasks.translate import TranslateTask
from addnorm.utils import memory

TRANSLATE = [
    "--preset", "tiny", "--d-model", "32", "--n-heads", "2", "--d-ff", "64",
    "--n-encoder-layers", "1", "--n-decoder-layers", "1", "--batch-size", "4",
    "--eval-size", "4", "--quiet", "--device", "cpu", "--threads", "1",
]
LM = [
    "--preset", "lm-tiny", "--d-model", "32", "--n-heads", "2", "--d-ff", "64",
    "--n-layers", "1", "--batch-size", "2", "--seq-len", "16", "--eval-size", "2", "--quiet",
    "--device", "cpu", "--threads", "1",
]
SRC = str(Path(__file__).resolve().parents[2] / "src")


def skip_evaluation(patch) -> None:
    """Skip the held-out scoring and samples at the end of a run (not what is tested)."""
    for task in (TranslateTask, LMTask):
        scores = {task.metric: 0.0}
        patch.setattr(task, "evaluate_run", lambda self, model, cfg, scores=scores: scores)
        patch.setattr(task, "run_samples", lambda self, model: [])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A translate run (checkpoints of steps 1 and 2) and an lm run (step 1)."""
    root = tmp_path_factory.mktemp("broken")
    with pytest.MonkeyPatch.context() as patch:
        skip_evaluation(patch)
        assert main(["train", "translate", *TRANSLATE, "--max-steps", "2",
                     "--checkpoint-every", "1", "--out", str(root / "translate")]) == 0
        assert main(["train", "lm", *LM, "--max-steps", "1", "--out", str(root / "lm")]) == 0
    return root


def reseal(checkpoint: Path) -> None:
    """Rewrite the manifest's sizes and hashes for the files it lists (a careful forger)."""
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    for name in manifest["files"]:
        data = (checkpoint / name).read_bytes()
        manifest["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))


def poisoned(run: Path, target: Path, value: float) -> Path:
    """A copy of ``run`` whose weights (raw and EMA) all hold ``value``, resealed."""
    shutil.copytree(run, target)
    for checkpoint in (target / "checkpoints").iterdir():
        for name in ("model.safetensors", "ema.safetensors"):
            if (checkpoint / name).exists():
                tensors = load_file(checkpoint / name)
                save_file({k: torch.full_like(v, value) if v.is_floating_point() else v
                           for k, v in tensors.items()}, checkpoint / name)
        reseal(checkpoint)
    return target


def hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def one_error_line(capsys, command: str) -> str:
    """The one error line on stderr (``train`` announces its run on the line before)."""
    err = capsys.readouterr().err.splitlines()
    if command == "train" and err and err[0].startswith("training "):
        err = err[1:]
    assert len(err) == 1 and err[0].startswith(f"addnorm {command}: error: "), err
    return err[0]


@pytest.mark.parametrize(("value", "says"), [
    (float("nan"), r"its weights hold NaN \(src_embed"),
    (float("inf"), r"its weights hold inf \(src_embed"),
    (1e30, r"its model's output on a probe batch is not finite \(largest \|weight\| 1e\+30"),
])
def test_translate_of_broken_weights_exits_1_naming_the_checkpoint(
    runs, tmp_path, capsys, value, says
):
    broken = poisoned(runs / "translate", tmp_path / "run", value)
    assert main(["translate", "--checkpoint", str(broken), "21 Nov 2026"]) == 1
    line = one_error_line(capsys, "translate")
    assert f"{broken}/checkpoints/step-00000002" in line
    assert re.search(says, line) and "checkpoint is broken" in line


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1e30])
def test_generate_of_broken_weights_exits_1_naming_the_checkpoint(runs, tmp_path, capsys, value):
    broken = poisoned(runs / "lm", tmp_path / "run", value)
    code = main(["generate", "--checkpoint", str(broken), "--prompt", "def ",
                 "--max-new-tokens", "3", "--device", "cpu"])
    assert code == 1
    line = one_error_line(capsys, "generate")
    assert f"{broken}/checkpoints/step-00000001" in line and "checkpoint is broken" in line


@pytest.mark.parametrize(("value", "worst"), [(float("nan"), "NaN in"), (1e30, "1e+30")])
def test_resuming_broken_weights_blames_the_checkpoint_not_the_lr(
    runs, tmp_path, capsys, monkeypatch, value, worst
):
    """The loss of the first step is taken before any update, so no lr made it non-finite;
    nothing is written (the broken checkpoint stays as it was, and no new one appears)."""
    skip_evaluation(monkeypatch)
    broken = poisoned(runs / "translate", tmp_path / "run", value)
    before = hashes(broken / "checkpoints")
    code = main(["train", "translate", "--resume", "--out", str(broken), "--max-steps", "4",
                 "--quiet", "--threads", "1"])
    assert code == 1
    line = one_error_line(capsys, "train")
    assert "at step 3, before any update of this run" in line and "try a lower lr" not in line
    assert "step-00000002" in line and worst in line and "not the lr" in line
    assert hashes(broken / "checkpoints") == before


def test_resuming_a_state_without_train_config_exits_1_naming_the_file(
    runs, tmp_path, capsys
):
    run = tmp_path / "run"
    shutil.copytree(runs / "translate", run)
    for checkpoint in (run / "checkpoints").iterdir():
        state = json.loads((checkpoint / "state.json").read_text())
        del state["train_config"]
        (checkpoint / "state.json").write_text(json.dumps(state))
        reseal(checkpoint)
    code = main(["train", "translate", "--resume", "--out", str(run), "--quiet"])
    assert code == 1
    line = one_error_line(capsys, "train")
    assert "step-00000002/state.json has no 'train_config' object" in line


def test_resuming_a_train_config_with_a_bad_value_exits_1_naming_the_file(
    runs, tmp_path, capsys
):
    run = tmp_path / "run"
    shutil.copytree(runs / "translate", run)
    for checkpoint in (run / "checkpoints").iterdir():
        state = json.loads((checkpoint / "state.json").read_text())
        state["train_config"]["lr"] = "fast"
        (checkpoint / "state.json").write_text(json.dumps(state))
        reseal(checkpoint)
    assert main(["train", "translate", "--resume", "--out", str(run), "--quiet"]) == 1
    line = one_error_line(capsys, "train")
    assert "step-00000002/state.json: train_config: lr" in line


@pytest.mark.parametrize("command", ["translate", "generate"])
def test_a_closed_stdout_exits_1_with_one_line_before_loading(runs, monkeypatch, capsys,
                                                              command):
    """Python sets sys.stdout to None when descriptor 1 was closed (``>&-``)."""
    argv = (["translate", "--checkpoint", str(runs / "translate"), "21 Nov 2026"]
            if command == "translate" else
            ["generate", "--checkpoint", str(runs / "lm"), "--prompt", "a"])
    monkeypatch.setattr(sys, "stdout", None)
    assert main(argv) == 1
    assert "stdout is closed" in one_error_line(capsys, command)


def test_translate_with_descriptor_1_closed_exits_1_with_one_line(runs):
    result = subprocess.run(
        [sys.executable, "-m", "addnorm", "translate", "--checkpoint",
         str(runs / "translate"), "21 Nov 2026"],
        env={**os.environ, "PYTHONPATH": SRC}, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: os.close(1), timeout=120,
    )
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "addnorm translate: error: stdout is closed, so the dates would be lost; run the "
        "command with its output open (e.g. > FILE)"
    ]


def limited(address_space: int):
    """A preexec_fn setting the child's address-space limit (``ulimit -v``)."""
    import resource

    return lambda: resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))


ADDRESS_SPACE = 2_500_000_000  # bytes: torch loads (~1 GB of mappings); 512 x 256 tokens don't


def test_available_memory_counts_the_address_space_limit():
    """The limit less what the process maps already (VmSize), whatever the machine has free."""
    probe = ("from addnorm.utils.memory import available_memory, device_memory;"
             "print(available_memory(), device_memory('cpu'))")
    result = subprocess.run(
        [sys.executable, "-c", probe], env={**os.environ, "PYTHONPATH": SRC},
        capture_output=True, text=True, preexec_fn=limited(ADDRESS_SPACE), timeout=120,
        check=True,
    )
    available, total = map(int, result.stdout.split())
    assert total == min(ADDRESS_SPACE, *(n for n in (
        memory._physical_memory(), memory._cgroup_limit()) if n is not None))
    assert 0 < available < ADDRESS_SPACE - 100_000_000  # the interpreter and torch are mapped


def test_a_run_past_the_address_space_limit_is_refused_naming_the_flag(tmp_path):
    """Under ``ulimit -v`` the estimate sees the limit: exit 2 naming --batch-size, before
    anything is allocated (it was an allocator traceback mid-step)."""
    result = subprocess.run(
        [sys.executable, "-m", "addnorm", "train", "lm", "--preset", "lm-tiny",
         "--batch-size", "512", "--seq-len", "256", "--max-steps", "1", "--quiet",
         "--threads", "1", "--out", str(tmp_path / "lm")],
        env={**os.environ, "PYTHONPATH": SRC}, capture_output=True, text=True,
        preexec_fn=limited(ADDRESS_SPACE), timeout=300,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("addnorm train: error: --batch-size 512: ")
    assert "more than the" in lines[0] and "available on cpu" in lines[0]


def test_an_allocation_that_fails_during_training_exits_1_keeping_the_checkpoint(
    tmp_path, capsys, monkeypatch
):
    """What the estimates cannot see (another process taking memory meanwhile): the
    allocator's error at step 3, after the checkpoints of steps 1 and 2, is one line naming
    the step and the checkpoint kept; the checkpoints are untouched and none is added."""
    skip_evaluation(monkeypatch)
    run = tmp_path / "run"
    loss_fn = LMTask.loss_fn

    def failing_at_step_3(self, task_cfg):
        inner = loss_fn(self, task_cfg)
        calls = []

        def loss(model, batch):
            calls.append(1)
            if len(calls) == 3:
                raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. "
                                   "DefaultCPUAllocator: can't allocate memory: you tried to "
                                   "allocate 536870912 bytes. Error code 12")
            return inner(model, batch)

        return loss

    monkeypatch.setattr(LMTask, "loss_fn", failing_at_step_3)
    code = main(["train", "lm", *LM, "--max-steps", "5", "--checkpoint-every", "1",
                 "--max-minutes", "none",  # no measured warm-up: the calls are the run's
                 "--out", str(run)])
    assert code == 1
    line = one_error_line(capsys, "train")
    assert line == (
        f"addnorm train: error: out of memory at step 3 (could not allocate 537 MB); "
        f"{run}/checkpoints/step-00000002 is kept: train with a smaller batch_size or model, "
        "or free memory"
    )
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "step-00000001", "step-00000002"
    ]
