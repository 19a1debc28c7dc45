"""The ``addnorm`` command end to end, in-process through ``addnorm.cli.parser.main`` with tiny
settings, plus one subprocess smoke test of ``python -m addnorm``.

Provenance: the CLI's outputs are compared with the library calls they wrap (the task's
``predict`` / ``sample`` on the same checkpoint), with the run's own files (metrics,
checkpoint step), and a resumed run with the uninterrupted one (bit-exact losses).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import shutil
import subprocess
import sys
import threading

import pytest

from addnorm.cli.parser import main
from addnorm.tasks.run import load_trained
from addnorm.training.metrics import read_metrics

TINY_TRANSLATE = [
    "--preset",
    "tiny",
    "--d-model",
    "32",
    "--n-heads",
    "2",
    "--d-ff",
    "64",
    "--n-encoder-layers",
    "1",
    "--n-decoder-layers",
    "1",
    "--batch-size",
    "4",
    "--eval-size",
    "4",
    "--log-every",
    "1",
    "--quiet",
]
TINY_LM = [
    "--preset",
    "lm-tiny",
    "--d-model",
    "32",
    "--n-heads",
    "2",
    "--d-ff",
    "64",
    "--n-layers",
    "1",
    "--batch-size",
    "2",
    "--seq-len",
    "16",
    "--eval-size",
    "2",
    "--log-every",
    "1",
    "--quiet",
]


@pytest.fixture(scope="module")
def translate_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "translate"
    assert main(["train", "translate", *TINY_TRANSLATE, "--max-steps", "3", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "lm"
    assert main(["train", "lm", *TINY_LM, "--max-steps", "2", "--out", str(out)]) == 0
    return out


def test_python_dash_m_addnorm_help_lists_the_subcommands():
    done = subprocess.run(
        [sys.executable, "-m", "addnorm", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0
    for command in ("train", "translate", "generate", "info", "demo", "explain"):
        assert command in done.stdout


def test_train_writes_checkpoint_metrics_and_loss_curve(translate_run):
    metrics = json.loads((translate_run / "metrics.json").read_text())
    assert metrics["step"] == 3 and metrics["task"] == "translate"
    assert 0.0 <= metrics["test_exact_match"] <= 1.0 and metrics["n_test"] == 4
    assert [r["step"] for r in read_metrics(translate_run / "metrics.jsonl")] == [1, 2, 3]
    assert (translate_run / "loss.png").read_bytes()[:4] == b"\x89PNG"
    assert (translate_run / "checkpoints" / "step-00000003" / "manifest.json").is_file()


def is_real_date(text: str) -> bool:
    try:
        return len(text) == 10 and 1900 <= dt.date.fromisoformat(text).year <= 2099
    except ValueError:
        return False


def test_translate_prints_the_models_greedy_answer(translate_run, capsys):
    texts = ["21 Nov 2026", "2026년 11월 21일"]
    argv = ["translate", *texts, "--checkpoint", str(translate_run), "--device", "cpu"]
    code = main([*argv, "--threads", "1"])
    task, model, _ = load_trained(translate_run)
    expected = task.predict(model, texts)
    assert code == (0 if all(map(is_real_date, expected)) else 1)  # a 3-step model's answers
    assert capsys.readouterr().out.splitlines() == expected


def test_translate_reads_stdin_lines_keeping_blank_lines_aligned(
    translate_run, capsys, monkeypatch
):
    monkeypatch.setattr(sys, "stdin", io.StringIO("2026-11-21\n\nNov 21, 2026\n\n"))
    main(["translate", "--checkpoint", str(translate_run)])
    task, model, _ = load_trained(translate_run)
    first, second = task.predict(model, ["2026-11-21", "Nov 21, 2026"])
    assert capsys.readouterr().out.splitlines() == [first, "", second, ""]


def test_translate_flags_answers_that_are_not_dates_and_keeps_stdout_aligned(
    translate_run, capsys, monkeypatch
):
    from addnorm.tasks.translate import TranslateTask

    answers = {"a": "2026-02-30", "b": "2026-11-21", "c": "21-11-2026", "d": "2150-01-01"}
    monkeypatch.setattr(
        TranslateTask, "predict", lambda self, model, texts: [answers[t] for t in texts]
    )
    assert main(["translate", "a", "b", "c", "d", "--checkpoint", str(translate_run)]) == 1
    out, err = capsys.readouterr()
    assert out.splitlines() == list(answers.values())
    warnings = err.splitlines()
    assert len(warnings) == 3 and all("not a valid date" in w for w in warnings)
    assert ["'a'" in warnings[0], "'c'" in warnings[1], "'d'" in warnings[2]] == [True] * 3
    assert main(["translate", "b", "--checkpoint", str(translate_run)]) == 0
    assert capsys.readouterr().err == ""


def test_translate_help_names_the_supported_range_and_formats(capsys):
    from addnorm.data.dates import FORMATS, format_date

    assert main(["translate", "--help"]) == 0
    out = capsys.readouterr().out
    assert "1900-01-01 to 2099-12-31" in out
    for fmt in FORMATS:
        assert format_date(dt.date(2026, 11, 21), fmt) in out


def test_translate_streams_and_a_closed_pipe_stops_it_quietly(translate_run, tmp_path):
    # Like `yes "21 Nov 2026" | head -n 1000000 | addnorm translate | head -n 1`: the reader
    # takes the first line and goes away. Translating all the input would take minutes, so
    # the command ends within the timeout only if it prints each batch before reading the
    # next and stops at the closed pipe: exit 141, no traceback.
    with open(tmp_path / "stderr", "w+b") as stderr:  # warnings must not fill a pipe
        translator = subprocess.Popen(
            [sys.executable, "-m", "addnorm", "translate", "--checkpoint", str(translate_run)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
        assert translator.stdin is not None and translator.stdout is not None
        writer = threading.Thread(target=_feed_lines, args=(translator.stdin, 1_000_000))
        writer.start()
        try:
            first = translator.stdout.readline()
            translator.stdout.close()
            code = translator.wait(timeout=120)
        finally:
            translator.kill()  # a no-op once it has ended
            writer.join(timeout=60)
        stderr.seek(0)
        assert b"Traceback" not in stderr.read()
    assert first.endswith(b"\n") and code == 141


def _feed_lines(stdin, n_lines: int) -> None:
    """Write ``n_lines`` dates to ``stdin``, stopping quietly when its reader has gone."""
    try:
        for _ in range(n_lines // 1000):
            stdin.write(b"21 Nov 2026\n" * 1000)
    except BrokenPipeError:  # the translator ended
        pass
    finally:
        with contextlib.suppress(BrokenPipeError):
            stdin.close()


def test_info_prints_configs_step_and_metrics(translate_run, capsys):
    assert main(["info", str(translate_run)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["step"] == 3 and report["task"] == "translate"
    assert report["model_config"]["d_model"] == 32
    assert report["train_config"]["max_steps"] == 3
    assert report["metrics"] == json.loads((translate_run / "metrics.json").read_text())


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


def test_ctrl_c_checkpoints_exits_130_and_resume_continues_exactly(tmp_path, capsys, monkeypatch):
    from addnorm.training.trainer import Trainer

    base = [
        "train",
        "translate",
        *TINY_TRANSLATE,
        "--dropout",
        "0.1",
        "--warmup",
        "2",
        "--max-steps",
        "4",
    ]
    assert main([*base, "--out", str(tmp_path / "whole")]) == 0
    real_step = Trainer._train_step

    def step_then_interrupt(self):
        if self.step == 2:
            raise KeyboardInterrupt
        return real_step(self)

    split = tmp_path / "split"
    monkeypatch.setattr(Trainer, "_train_step", step_then_interrupt)
    assert main([*base, "--out", str(split)]) == 130
    err = capsys.readouterr().err
    assert "step-00000002" in err and "--resume" in err
    assert not (split / "metrics.json").exists()
    monkeypatch.setattr(Trainer, "_train_step", real_step)
    assert main(["train", "translate", "--resume", "--out", str(split), "--quiet"]) == 0
    # Same weights, optimizer, schedule, dropout RNG and data order: the same losses.
    assert read_metrics(split / "metrics.jsonl")[-1]["step"] == 4
    split_losses = [r["loss"] for r in read_metrics(split / "metrics.jsonl")]
    assert split_losses == [r["loss"] for r in read_metrics(tmp_path / "whole" / "metrics.jsonl")]


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        ([], "required"),
        (["train"], "required"),
        (["train", "translate", "--max-steps", "abc"], "--max-steps"),
        (["train", "translate", "--bogus"], "--bogus"),
        (["info"], "checkpoint"),
        (["translate", "x", "--weights", "best"], "--weights"),
        (["train", "translate", "--max-steps", "-1"], "--max-steps must be >= 1, got -1"),
        (["train", "translate", "--max-minutes", "0"], "--max-minutes"),
        (["train", "translate", "--lr", "fast"], "--lr"),
        (["train", "translate", "--norm-position", "middle"], "--norm-position"),
        (["train", "translate", "--d-model", "30", "--n-heads", "4"], "--d-model (30)"),
        (["train", "translate", "--schedule", "linear"], "--schedule"),
        (["train", "lm", "--position-encoding", "learned", "--max-len", "8", "--seq-len", "16"],
         "--seq-len (16) must be <= --max-len (8)"),
        (["train", "nope"], "nope"),
        (["train", "translate", "--resume", "--d-model", "64"], "--resume"),
        (["generate"], "--prompt"),
        (["translate", "x", "--device", "warp-drive"], "--device"),
        (["translate", "x", "--device", "meta"], "--device"),
        (["translate", "x", "--device", "cpu:3"], "--device"),
        (["translate", "x", "--device", "cuda:99"], "--device cuda:99"),
        (["generate", "--prompt", "a", "--threads", "100000"], "--threads"),
        (["train", "translate", "--threads", "-2"], "--threads"),
        (["train", "translate", "--threads", "100000"], "--threads"),
        (
            ["train", "translate", "--position-encoding", "learned", "--max-len", "5"],
            "--max-len (5)",
        ),
        (["train", "lm", "--seq-len", "100000000"], "validation split"),
        (["train", "translate", "--resume", "--overwrite"], "--overwrite"),
    ],
)
def test_bad_arguments_exit_2_with_one_line_naming_the_problem(argv, named, capsys, tmp_path):
    has_out = argv[:1] == ["train"] and len(argv) > 1
    assert main([*argv, "--out", str(tmp_path)] if has_out else argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    assert named in err[0] and err[0].startswith("addnorm")


def test_out_must_be_a_directory_path(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("")
    for out in (afile, afile / "below"):
        assert main(["train", "translate", *TINY_TRANSLATE, "--out", str(out)]) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and "--out" in err[0] and "not a directory" in err[0]
    assert afile.read_text() == ""


def test_an_os_error_exits_1_with_one_line(tmp_path, capsys, monkeypatch):
    import addnorm.cli.explain

    def denied(out, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(out))

    monkeypatch.setattr(addnorm.cli.explain, "run_explain", denied)
    assert main(["explain", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "Permission denied" in err[0]


def test_a_bad_device_leaves_the_previous_run_alone(translate_run, tmp_path, capsys):
    copy = tmp_path / "run"
    shutil.copytree(translate_run, copy)
    argv = ["train", "translate", *TINY_TRANSLATE, "--overwrite", "--out", str(copy)]
    assert main([*argv, "--device", "meta"]) == 2
    assert len(capsys.readouterr().err.splitlines()) == 1
    assert load_trained(copy)[2].step == 3


def test_training_into_a_previous_run_needs_resume_or_overwrite(translate_run, tmp_path, capsys):
    copy = tmp_path / "run"
    shutil.copytree(translate_run, copy)
    argv = ["train", "translate", *TINY_TRANSLATE, "--max-steps", "2", "--out", str(copy)]
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "--resume" in err[0] and "--overwrite" in err[0]
    assert load_trained(copy)[2].step == 3
    assert main([*argv, "--overwrite"]) == 0
    assert load_trained(copy)[2].step == 2


def test_resuming_the_other_tasks_run_exits_2_before_training(lm_run, tmp_path, capsys):
    copy = tmp_path / "lm"
    shutil.copytree(lm_run, copy)
    argv = ["train", "translate", "--resume", "--out", str(copy), "--max-steps", "8", "--quiet"]
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "'lm'" in err[0]
    assert [p.name for p in (copy / "checkpoints").iterdir()] == ["step-00000002"]
    assert json.loads((copy / "metrics.json").read_text()) == json.loads(
        (lm_run / "metrics.json").read_text()
    )


def test_lm_training_prints_and_stores_samples(tmp_path, capsys):
    out = tmp_path / "lm"
    assert main(["train", "lm", *TINY_LM, "--max-steps", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    samples = json.loads((out / "metrics.json").read_text())["samples"]
    assert len(samples) == 3
    for sample in samples:
        assert f"sample (prompt {sample['prompt']!r}):\n{sample['text']}" in printed


def test_the_noam_schedule_reaches_training_with_lr_as_its_peak(tmp_path):
    out = tmp_path / "noam"
    argv = ["train", "translate", *TINY_TRANSLATE, "--schedule", "noam", "--lr", "0.01"]
    assert main([*argv, "--warmup", "2", "--max-steps", "3", "--out", str(out)]) == 0
    lrs = [r["lr"] for r in read_metrics(out / "metrics.jsonl")]
    # lr * sqrt(warmup) * min(step^-0.5, step * warmup^-1.5) for steps 1, 2, 3
    expected = [0.01 * 2**0.5 * min(s**-0.5, s * 2**-1.5) for s in (1, 2, 3)]
    # Python floats through JSON (repr round-trips): a few roundings, FLOAT64_EXACT's rel.
    assert lrs == pytest.approx(expected, rel=1e-12)
    assert lrs[1] == pytest.approx(0.01, rel=1e-12)


@pytest.mark.parametrize(
    ("content", "named"),
    [
        (json.dumps({"model": {"d_model": 64, "heads": 3}}).encode(), "heads"),
        (json.dumps({"model": 5}).encode(), '"model" must be a JSON object, got a number'),
        (json.dumps({"train": [1]}).encode(), '"train" must be a JSON object, got an array'),
        (json.dumps([1, 2]).encode(), "expected a JSON object"),
        (json.dumps({"optimizer": {}}).encode(), "optimizer"),
        (json.dumps({"model": {"src_vocab_size": 10}}).encode(), "src_vocab_size are set by"),
        (json.dumps({"model": {"d_model": "64"}}).encode(), "d_model"),
        (json.dumps({"train": {"bf16": "yes"}}).encode(), "bf16"),
        (b"{oops", "not valid JSON"),
        (b'{"model": {"norm": "\xff"}}', "not UTF-8"),
    ],
)
def test_bad_config_file_exits_2_with_one_line(tmp_path, capsys, content, named):
    config = tmp_path / "cfg.json"
    config.write_bytes(content)
    argv = ["train", "translate", "--config", str(config), "--out", str(tmp_path / "run")]
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and named in err[0], err
    assert "cfg.json" in err[0] or named in ("d_model", "bf16")


def test_a_config_file_sets_model_and_train_fields(tmp_path):
    config = tmp_path / "cfg.json"
    config.write_text(json.dumps({"model": {"d_ff": 48}, "train": {"warmup": 1}}))
    out = tmp_path / "run"
    argv = ["train", "translate", *TINY_TRANSLATE, "--max-steps", "1", "--out", str(out)]
    assert main([*argv, "--config", str(config)]) == 0
    report = load_trained(out)[2].state
    assert report["run"]["model_config"]["d_ff"] == 64  # the flag wins over the file
    assert report["train_config"]["warmup"] == 1


def test_a_model_checkpoint_of_the_other_task_is_refused(lm_run, capsys):
    assert main(["translate", "x", "--checkpoint", str(lm_run)]) == 2
    assert "'lm'" in capsys.readouterr().err


def damaged_copy(run, tmp_path, name, content: bytes | None):
    copy = tmp_path / "damaged"
    shutil.copytree(run, copy)
    target = next((copy / "checkpoints").iterdir()) / name
    if content is None:
        target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
    else:
        target.write_bytes(content)
    return copy


@pytest.mark.parametrize(
    ("name", "content", "command"),
    [
        ("model.safetensors", None, "translate"),
        ("state.json", b"{oops", "translate"),
        ("manifest.json", b"[not json", "info"),
    ],
)
def test_damaged_checkpoints_exit_1_naming_the_file(
    translate_run, tmp_path, capsys, name, content, command
):
    copy = damaged_copy(translate_run, tmp_path, name, content)
    argv = (
        ["info", str(copy)] if command == "info" else ["translate", "x", "--checkpoint", str(copy)]
    )
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert name in err and "Traceback" not in err


def test_missing_checkpoint_exits_1_naming_the_path(tmp_path, capsys):
    assert main(["info", str(tmp_path / "absent")]) == 1
    assert "absent" in capsys.readouterr().err


def test_explain_calls_the_leads_run_explain_with_out(tmp_path, monkeypatch):
    import addnorm.cli.explain

    seen = []
    monkeypatch.setattr(
        addnorm.cli.explain, "run_explain", lambda out, *a, **k: seen.append(out) or 0
    )
    assert main(["explain", "--out", str(tmp_path)]) == 0
    assert seen == [tmp_path]


def test_demo_trains_then_prints_the_table_and_accuracy(tmp_path, capsys):
    from addnorm.cli.demo import DEMO_FORMATS, run_demo

    assert run_demo(tmp_path / "demo", max_steps=1, eval_size=4, progress=False) == 0
    capsys.readouterr()
    # The demo replaces its own run directory (make demo run twice works).
    assert run_demo(tmp_path / "demo", max_steps=2, eval_size=4, progress=False) == 0
    assert load_trained(tmp_path / "demo")[2].step == 2
    out = capsys.readouterr().out
    assert "held-out exact match" in out and "년" in out  # Korean row included
    table_rows = [line for line in out.splitlines() if line.rstrip().endswith(("ok", "WRONG"))]
    assert len(table_rows) == len(DEMO_FORMATS)
    assert (tmp_path / "demo" / "loss.png").exists()


def test_the_smoothed_loss_floor_is_what_cross_entropy_reaches_at_best():
    # Logits equal to the log of the smoothed target reach the floor; F.cross_entropy agrees.
    import math

    import torch
    import torch.nn.functional as F

    from addnorm.cli.demo import smoothed_loss_floor

    smoothing, n = 0.1, 15
    target = torch.full((n,), smoothing / n)
    target[3] += 1.0 - smoothing
    loss = F.cross_entropy(target.log()[None], torch.tensor([3]), label_smoothing=smoothing)
    # float32 cross-entropy over 15 classes against a float64 closed form: 15 u of the terms'
    # absolute sum (sum_bound, ~2x the loss) plus the target's rounding: ~2e-6 at worst.
    assert smoothed_loss_floor(smoothing, n) == pytest.approx(loss.item(), rel=1e-5)
    assert smoothed_loss_floor(0.0, n) == 0.0
    assert math.isfinite(smoothed_loss_floor(0.5, 2))
