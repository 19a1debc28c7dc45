"""``addnorm generate``: continues the prompt as the library does; with ``--stop TEXT`` the
output is cut before the first stop string; ``--compile`` prints the eager text. (A prompt
longer than the context: test_generate_long_prompt.py.)

Provenance: the task's own ``sample`` on the same checkpoint; sampling with a fixed seed draws
the same tokens until a row stops, so a run with stop strings must print the run without them,
cut where ``str.find`` first meets one of them in the continuation.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from addnorm.cli.parser import main
from addnorm.tasks.lm import LMTask
from addnorm.tasks.trained import load_trained
from addnorm.training.checkpoint import save_checkpoint

PROMPT = "def "


@pytest.fixture(scope="module")
def lm_checkpoint(tmp_path_factory):
    """An lm run's checkpoint with random weights, as the trainer writes one."""
    run_dir = tmp_path_factory.mktemp("lm-stop")
    task = LMTask()
    cfg = dataclasses.replace(
        task.prepare(task.default_model_config()), d_model=32, n_heads=2, n_layers=1, d_ff=64
    )
    torch.manual_seed(0)
    state = task.build_model(cfg).state_dict()
    run = {"task": "lm", "model_config": cfg.to_dict(), "task_data": task.to_dict()}
    save_checkpoint(run_dir, 1, {"model": state}, {"run": run})
    return run_dir


def _generate(capsys, checkpoint, *stops: str) -> tuple[int, str, str]:
    argv = ["generate", "--prompt", PROMPT, "--max-new-tokens", "30", "--seed", "3",
            "--checkpoint", str(checkpoint)]
    for stop in stops:
        argv += ["--stop", stop]
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_the_output_is_cut_before_the_first_stop_string(lm_checkpoint, capsys):
    code, full, _ = _generate(capsys, lm_checkpoint)
    assert code == 0
    continuation = full.removesuffix("\n").removeprefix(PROMPT)
    assert len(continuation) >= 24  # 30 tokens; decode drops special ones
    late, early = continuation[20:23], continuation[6:8]
    for stops in [(late,), (late, early)]:
        code, out, _ = _generate(capsys, lm_checkpoint, *stops)
        cut = min(continuation.find(s) for s in stops)
        assert code == 0 and 0 < cut < len(continuation)
        assert out == PROMPT + continuation[:cut] + "\n"


def test_a_stop_string_never_produced_changes_nothing(lm_checkpoint, capsys):
    _, full, _ = _generate(capsys, lm_checkpoint)
    code, out, _ = _generate(capsys, lm_checkpoint, "\x00never\x00")
    assert (code, out) == (0, full)


def test_an_empty_stop_string_exits_2_with_one_line(lm_checkpoint, capsys):
    code, out, err = _generate(capsys, lm_checkpoint, "")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "--stop" in err


def test_compile_prints_the_eager_text_and_the_compile_time(lm_checkpoint, capsys, monkeypatch):
    # dynamo captures the step and runs it uncompiled (backend "eager"): the same tokens as
    # eager decoding by construction of the static cache (tests/transformer/test_compile.py
    # checks inductor's); here: the flag reaches generate, and the time goes to stderr.
    import functools

    import torch._dynamo

    torch._dynamo.reset()
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    argv = ["generate", "--prompt", PROMPT, "--max-new-tokens", "20", "--temperature", "0",
            "--checkpoint", str(lm_checkpoint)]
    assert main(argv) == 0
    eager = capsys.readouterr()
    assert main([*argv, "--compile"]) == 0
    compiled = capsys.readouterr()
    assert compiled.out == eager.out and eager.err == ""
    assert compiled.err.startswith("compiling the decode step and generating took ")
    torch._dynamo.reset()


def test_generate_continues_the_prompt_like_the_library(lm_run, capsys):
    args = [
        "generate",
        "--prompt",
        "def ",
        "--max-new-tokens",
        "6",
        "--temperature",
        "0",
        "--checkpoint",
        str(lm_run),
    ]
    assert main(args) == 0
    task, model, _ = load_trained(lm_run)
    expected = task.sample(model, "def ", max_new_tokens=6, temperature=0)
    assert capsys.readouterr().out == expected + "\n"
    assert expected.startswith("def ")
