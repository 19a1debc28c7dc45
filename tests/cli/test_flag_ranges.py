"""Every value a flag of ``addnorm`` takes works, and every other one is refused at the door:
exit 2, one line on stderr naming the flag, before any work.

The values are drawn from the whole space a user can type: any float (NaN, the infinities,
subnormals, -0.0), any integer up to 2**70, and junk text (newlines, NUL, the empty string).
Flags are given as ``--flag=VALUE`` so that values starting with ``-`` reach the flag.

Nothing here trains or loads a model per example: the first call after the checks (the
trainer's ``train_run``, the checkpoint loader, the benchmark runner, the demo) is replaced
by one that records what it was given and stops. "Accepted" therefore means: the checks let
the value through to the work. The provenance of each expected range is the documented one:
``TrainConfig``'s, the task configs', ``TransformerConfig``'s / ``LMConfig``'s /
``DiTConfig``'s docstrings and checks, the help of each flag; the memory limit is pinned to
16 GB (as in ``test_hostile_input.py``), so the size estimates refuse the same values on every
machine.
One test per command runs the real work on tiny runs for drawn values, to show that an
accepted value also completes (exit 0, finite output) or fails with its documented exit 1.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import event, given
from hypothesis import strategies as st
from properties import examples

import addnorm.bench
import addnorm.cli.demo
import addnorm.tasks.run
import addnorm.tasks.trained
from addnorm.cli.parser import main
from addnorm.tasks.run import TASKS
from addnorm.training import sizes
from addnorm.utils import memory as _memory

MEMORY = 16_000_000_000  # the pinned memory limit (bytes)

BASE = {
    "translate": ["--max-steps=1", "--eval-size=1", "--batch-size=2", "--d-model=8",
                  "--n-heads=1", "--d-ff=8", "--n-encoder-layers=1", "--n-decoder-layers=1",
                  "--quiet"],
    "lm": ["--max-steps=1", "--eval-size=1", "--batch-size=2", "--d-model=8", "--n-heads=1",
           "--d-ff=8", "--n-layers=1", "--seq-len=8", "--quiet"],
    "dit": ["--preset=DiT-digits-tiny", "--max-steps=1", "--eval-size=1", "--batch-size=2",
            "--d-model=8", "--n-heads=1", "--n-layers=1", "--quiet"],
}


def _in(lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False):
    def check(value: float) -> bool:
        above = value > lo if lo_open else value >= lo
        below = value < hi if hi_open else value <= hi
        return math.isfinite(value) and above and below
    return check


# The documented range of every numeric field that has a flag (TrainConfig's attributes, the
# model configs' checks; layers per stack: _memory.MAX_LAYERS).
UNIT = _in(0, 1, hi_open=True)  # probabilities and decay rates, [0, 1)
AT_LEAST_0, AT_LEAST_1 = _in(0, math.inf, hi_open=True), _in(1, math.inf, hi_open=True)
LAYERS = _in(1, _memory.MAX_LAYERS)
RANGES = {
    "max_steps": AT_LEAST_1, "batch_size": AT_LEAST_1, "grad_accum": AT_LEAST_1,
    "warmup": AT_LEAST_0, "seed": _in(0, 2**64 - 1), "checkpoint_every": AT_LEAST_0,
    "keep_checkpoints": AT_LEAST_1, "log_every": AT_LEAST_1, "seq_len": AT_LEAST_1,
    "eval_every": AT_LEAST_1, "patience": AT_LEAST_1,
    "eval_size": AT_LEAST_1, "max_minutes": _in(0, math.inf, lo_open=True, hi_open=True),
    "epochs": _in(0, math.inf, lo_open=True, hi_open=True),
    "min_snr_gamma": _in(0, math.inf, lo_open=True, hi_open=True),
    "lr": _in(0, 1, lo_open=True), "final_lr_fraction": _in(0, 1),
    "weight_decay": AT_LEAST_0, "beta1": UNIT, "beta2": UNIT, "label_smoothing": UNIT,
    "grad_clip": AT_LEAST_0, "ema_decay": UNIT,
    "d_model": AT_LEAST_1, "n_heads": AT_LEAST_1, "d_ff": AT_LEAST_1, "max_len": AT_LEAST_1,
    "n_layers": LAYERS, "n_encoder_layers": LAYERS, "n_decoder_layers": LAYERS,
    "dropout": UNIT, "norm_eps": AT_LEAST_0, "position_base": _in(1, math.inf, lo_open=True,
                                                                  hi_open=True),
    "patch_size": AT_LEAST_1, "mlp_ratio": _in(0, math.inf, lo_open=True, hi_open=True),
    "class_dropout": UNIT, "d_freq": _in(2, math.inf, hi_open=True), "ff_norm_eps": AT_LEAST_0,
    "timestep_downscale_freq_shift": _in(-math.inf, math.inf, lo_open=True, hi_open=True),
}


def _numeric_flags(task: str) -> list[str]:
    """The numeric fields of the task's model, train and task configs that have a flag."""
    task_cls = TASKS[task]
    fields = [
        *(f for f in dataclasses.fields(task_cls.default_model_config())
          if f.name not in task_cls.owned_fields),
        *dataclasses.fields(task_cls.default_train_config()),
        *dataclasses.fields(task_cls.default_task_config()),
    ]
    kinds = ("int", "float", "float | None", "int | None")
    return [f.name for f in fields if str(f.type) in kinds]


TRAIN_FLAGS = [(task, name) for task in BASE for name in _numeric_flags(task)]

# Any float, any integer far past int64, or junk text; rendered as a user would type it.
VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.sampled_from(["0", "-0.0", "1e-320", "1e308", "-1", "nan", "-inf", "", "abc", "1\n2"]),
    st.text(max_size=12),
)


class Reached(Exception):
    """Raised by the stand-in of the first piece of work: the checks let the value through."""


def _stop(*args, **kwargs):
    raise Reached(args, kwargs)


def _refused_naming(code: int, err: str, flag: str) -> None:
    lines = err.splitlines()
    assert code == 2, (code, err)
    assert len(lines) == 1, lines
    assert lines[0].startswith("addnorm ") and ": error: " in lines[0], lines[0]
    assert flag in lines[0], (flag, lines[0])


def _run(argv: list[str], capsys) -> tuple[int | Reached, str]:
    capsys.readouterr()
    try:
        code: int | Reached = main(argv)
    except Reached as reached:
        code = reached
    return code, capsys.readouterr().err


@pytest.fixture
def pinned_memory():
    """A known memory, and a measured warm-up that takes no time (the plan then keeps the
    steps given: what a flag set reaches the config as it was typed)."""
    from addnorm.tasks import budget

    with mock.patch.object(_memory, "available_memory", lambda device="cpu": MEMORY), \
            mock.patch.object(budget, "measure_pace", lambda *args: budget.Pace(0.0, 1.0)):
        yield


@examples(60)
@given(case=st.sampled_from(TRAIN_FLAGS), value=VALUES)
def test_train_numeric_flags_are_in_range_or_refused_naming_the_flag(
    case, value, tmp_path_factory, capsys, pinned_memory
):
    task, name = case
    flag = "--" + name.replace("_", "-")
    out = tmp_path_factory.mktemp("flag") / "run"
    with mock.patch.object(addnorm.tasks.run, "train_run", _stop):
        code, err = _run(["train", task, *BASE[task], f"{flag}={value}", "--out", str(out)],
                         capsys)
    event("refused" if not isinstance(code, Reached) else "accepted")
    if not isinstance(code, Reached):
        _refused_naming(code, err, flag)
        return
    _task, model_cfg, train_cfg, _out = code.args[0]
    task_cfg = code.args[1]["task_cfg"]
    cfg = next(c for c in (train_cfg, task_cfg, model_cfg)
               if name in {f.name for f in dataclasses.fields(c)})
    got = getattr(cfg, name)
    if got is None:  # "none" for an optional field (max_minutes: no time limit)
        assert value.strip().lower() == "none", (name, value)
        return
    assert got == type(got)(value), (name, value, got)  # the flag reached the config
    assert RANGES[name](got), (name, got)
    if name == "weight_decay":
        assert train_cfg.lr * got <= 1  # TrainConfig: AdamW's per-step factor stays >= 0
    model = TASKS[task].from_config(code.args[1]["task_cfg"]).prepare(model_cfg)
    assert sizes.inference_bytes(model, batch_size=1, length=1) <= MEMORY  # the estimate


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--mlp-ratio=1e308"], "--mlp-ratio"),  # d_ff = int(inf) overflowed: a traceback
        (["--lr=1e30"], "--lr"),  # weights overflowed to NaN in evaluation: a traceback
        (["--weight-decay=1e308"], "--weight-decay"),
        (["--d-freq=2147483648"], "--d-freq"),  # blamed "these settings"
    ],
)
def test_train_values_that_once_crashed_after_starting_are_refused(
    argv, flag, tmp_path, capsys, pinned_memory
):
    with mock.patch.object(addnorm.tasks.run, "train_run", _stop):
        code, err = _run(["train", "dit", *BASE["dit"], *argv, "--out", str(tmp_path / "r")],
                         capsys)
    _refused_naming(code, err, flag)


# ----------------------------------------------------------------- generate, on a tiny lm run


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ranges") / "lm"
    assert main(["train", "lm", *BASE["lm"], "--out", str(out)]) == 0
    return out


GENERATE = {"max-new-tokens": "--max-new-tokens", "temperature": "--temperature",
            "top-k": "--top-k", "top-p": "--top-p", "seed": "--seed", "threads": "--threads"}


@examples(40)
@given(name=st.sampled_from(sorted(GENERATE)), value=VALUES)
def test_generate_flags_are_checked_before_the_checkpoint_is_read(name, value, capsys):
    flag = GENERATE[name]
    threads = torch.get_num_threads()
    try:
        with mock.patch.object(addnorm.tasks.trained, "load_trained", _stop):
            code, err = _run(["generate", "--prompt=ab", f"{flag}={value}"], capsys)
    finally:
        torch.set_num_threads(threads)
    if not isinstance(code, Reached):
        _refused_naming(code, err, flag)
        return
    # the documented ranges (the flags' help, GenerationConfig)
    number = float(value) if name in ("temperature", "top-p") else int(value)
    limits = {
        "max-new-tokens": _in(1, math.inf, hi_open=True),
        "temperature": _in(0, torch.finfo(torch.float32).max),
        "top-k": _in(1, math.inf, hi_open=True), "top-p": _in(0, 1, lo_open=True),
        "seed": _in(0, 2**64 - 1), "threads": _in(0, os.cpu_count() or 1),
    }
    assert limits[name](number), (name, number)


ANY_FLOAT = st.floats(allow_nan=True, allow_infinity=True)
ANY_INT = st.integers(min_value=-(2**70), max_value=2**70)


@examples(15)
@given(
    temperature=ANY_FLOAT | st.floats(0, 10),
    top_k=st.none() | ANY_INT | st.integers(1, 300),
    top_p=st.none() | ANY_FLOAT | st.floats(0, 1),
)
def test_generate_runs_every_accepted_setting_to_a_finished_text(
    temperature, top_k, top_p, lm_run, capsys
):
    argv = ["generate", "--checkpoint", str(lm_run), "--prompt=ab", "--max-new-tokens=2",
            f"--temperature={temperature!r}"]
    argv += [] if top_k is None else [f"--top-k={top_k}"]
    argv += [] if top_p is None else [f"--top-p={top_p!r}"]
    code, err = _run(argv, capsys)
    event(f"exit {code}")
    if code == 2:  # the first flag out of range is named
        assert len(err.splitlines()) == 1, err
        assert any(f in err for f in ("--temperature", "--top-k", "--top-p")), err
        return
    assert code == 0, (code, err)


# --------------------------------------------------------------------- sample, on a tiny dit


@pytest.fixture(scope="module")
def dit_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ranges") / "dit"
    assert main(["train", "dit", *BASE["dit"], "--out", str(out)]) == 0
    return out


@examples(20)
@given(
    steps=ANY_INT | st.integers(min_value=1, max_value=4),
    guidance=ANY_FLOAT | st.floats(0, 10),
    digit=ANY_INT | st.integers(0, 9),
)
def test_sample_draws_finite_digits_or_refuses_naming_the_flag(
    steps, guidance, digit, dit_run, tmp_path_factory, capsys
):
    folder = tmp_path_factory.mktemp("sample")
    argv = ["sample", "--checkpoint", str(dit_run), "--n=1", f"--steps={steps}",
            f"--guidance={guidance!r}", f"--class={digit}", "--quiet",
            "--out", str(folder / "grid.png"), "--save-array", str(folder / "x.npy")]
    code, err = _run(argv, capsys)
    event(f"exit {code}")
    if code == 2:
        assert len(err.splitlines()) == 1, err
        named = [f for f in ("--steps", "--guidance", "--class") if f in err]
        assert named, err
        assert not (folder / "grid.png").exists()
        return
    if code == 1:  # documented: a guidance so large that the samples overflow
        assert len(err.splitlines()) == 1 and "--guidance" in err, err
        assert not (folder / "grid.png").exists() and not (folder / "x.npy").exists()
        return
    assert code == 0, (code, err)
    assert 1 <= steps <= 1000 and 0 <= digit <= 9 and math.isfinite(guidance) and guidance >= 0
    assert np.isfinite(np.load(folder / "x.npy")).all()


@pytest.mark.parametrize("name", ["dir.png", "fifo.png"])
def test_sample_refuses_an_output_it_could_not_write_before_sampling(name, tmp_path, capsys):
    target = tmp_path / name
    target.mkdir() if name.startswith("dir") else os.mkfifo(target)
    with mock.patch.object(addnorm.tasks.trained, "load_trained", _stop):
        code, err = _run(["sample", "--out", str(target)], capsys)
    _refused_naming(code, err, "--out")


# ------------------------------------------------------------------- translate, bench, demo


@examples(20)
@given(value=VALUES)
def test_translate_threads_is_checked_before_the_checkpoint_is_read(value, capsys):
    threads = torch.get_num_threads()
    try:
        with mock.patch.object(addnorm.tasks.trained, "load_trained", _stop):
            code, err = _run(["translate", "x", f"--threads={value}"], capsys)
    finally:
        torch.set_num_threads(threads)
    if not isinstance(code, Reached):
        _refused_naming(code, err, "--threads")
        return
    assert 0 <= int(value) <= (os.cpu_count() or 1)


@examples(25)
@given(flag=st.sampled_from(["--rounds", "--threads"]), value=VALUES)
def test_bench_rounds_and_threads_are_in_range_or_refused(flag, value, capsys):
    threads = torch.get_num_threads()
    try:
        with mock.patch.object(addnorm.bench, "run_bench", _stop):
            code, err = _run(["bench", "--quick", f"{flag}={value}"], capsys)
    finally:
        torch.set_num_threads(threads)
    if not isinstance(code, Reached):
        _refused_naming(code, err, flag)
        return
    settings = code.args[0][0]
    assert 1 <= settings.rounds <= 1000  # MAX_ROUNDS, the flag's help
    assert 0 <= int(value) <= (os.cpu_count() or 1) if flag == "--threads" else True


@pytest.mark.parametrize("target", ["dir", "fifo", "missing/x.json"])
def test_bench_json_is_checked_before_the_benchmark_runs(target, tmp_path, capsys):
    path = tmp_path / target
    if target == "dir":
        path.mkdir()
    elif target == "fifo":
        os.mkfifo(path)
    with mock.patch.object(addnorm.bench, "run_bench", _stop):
        code, err = _run(["bench", "--quick", "--json", str(path)], capsys)
    _refused_naming(code, err, "--json")


@examples(20)
@given(flag=st.sampled_from(["--max-minutes", "--dit-max-minutes"]), value=VALUES)
def test_demo_minutes_are_finite_and_positive_or_refused(flag, value, tmp_path_factory, capsys):
    folder = tmp_path_factory.mktemp("demo")
    argv = ["demo", "--out", str(folder / "t"), "--dit-out", str(folder / "d"),
            f"{flag}={value}", "--quiet"]
    with mock.patch.object(addnorm.cli.demo, "run_demo", _stop):
        code, err = _run(argv, capsys)
    if not isinstance(code, Reached):
        _refused_naming(code, err, flag)
        return
    minutes = float(value)
    assert math.isfinite(minutes) and minutes > 0


def test_a_line_break_in_a_path_stays_on_one_line_of_stderr(tmp_path, capsys):
    code, err = _run(["info", str(tmp_path / "a\nb")], capsys)
    assert code == 1 and len(err.splitlines()) == 1 and "a\\nb" in err, err


def test_a_demo_whose_time_ends_before_the_first_step_reports_it(tmp_path, capsys):
    """--max-minutes 1e-320 (a subnormal, > 0) ends training before its first step; the
    report once formatted the missing loss and crashed after the run."""
    argv = ["demo", "--out", str(tmp_path / "t"), "--no-dit", "--max-minutes=1e-320", "--quiet"]
    code, err = _run(argv, capsys)
    assert code == 0, err
    assert Path(tmp_path / "t" / "metrics.json").exists()
