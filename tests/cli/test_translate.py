"""``addnorm translate``: prints the model's greedy answer per input, reads stdin line by line
keeping blank lines aligned, flags answers that are not dates, names its range and formats in
--help, and streams (a closed pipe stops it quietly).

Provenance: the answers are the task's own ``predict`` on the same checkpoint.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import subprocess
import sys
import threading

from addnorm.cli.parser import main
from addnorm.tasks.trained import load_trained


def is_real_date(text: str) -> bool:
    try:
        return len(text) == 10 and 1900 <= dt.date.fromisoformat(text).year <= 2099
    except ValueError:
        return False


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
