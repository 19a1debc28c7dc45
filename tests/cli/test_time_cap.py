"""A time cap that stops training far short of ``max_steps`` is reported, with the steps that
ran, by ``train`` and the demo (a loaded machine once gave untrained demo results silently).

Provenance: a cap of 1e-320 minutes (a positive subnormal) ends training before its first
step, so the step count (0 of ``max_steps``) is known exactly; the threshold cases are
arithmetic on ``UNDERTRAINED_SHARE``.
"""

from __future__ import annotations

from addnorm.cli.parser import main
from addnorm.cli.time_cap import UNDERTRAINED_SHARE, time_cap_warning

TINY_TRANSLATE = ["--preset", "tiny", "--d-model", "32", "--n-heads", "2", "--d-ff", "64",
                  "--n-encoder-layers", "1", "--n-decoder-layers", "1", "--batch-size", "4",
                  "--eval-size", "4", "--quiet"]


def test_a_time_cap_before_half_the_steps_is_an_undertrained_warning():
    text = time_cap_warning(step=137, max_steps=600, max_minutes=4.0, stopped_by="max_minutes",
                            flag="--max-minutes")
    assert text is not None
    assert "4-minute time cap" in text and "137 of 600 steps (23%)" in text
    assert "undertrained" in text and "--max-minutes" in text


def test_no_warning_when_the_steps_ran_out_or_the_cap_came_late():
    share = int(UNDERTRAINED_SHARE * 600)
    late = time_cap_warning(step=share, max_steps=600, max_minutes=4.0,
                            stopped_by="max_minutes", flag="--max-minutes")
    done = time_cap_warning(step=600, max_steps=600, max_minutes=4.0, stopped_by="max_steps",
                            flag="--max-minutes")
    assert late is None and done is None


def test_train_warns_when_its_time_cap_stops_it_short(tmp_path, capsys):
    argv = ["train", "translate", *TINY_TRANSLATE, "--max-steps", "8", "--max-minutes",
            "1e-320", "--out", str(tmp_path / "run")]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "addnorm train translate: warning:" in captured.err
    assert "after 0 of 8 steps (0%)" in captured.err and "undertrained" in captured.err
    assert "stopped by max_minutes" in captured.out


def test_train_says_nothing_when_it_ran_its_steps(tmp_path, capsys):
    argv = ["train", "translate", *TINY_TRANSLATE, "--max-steps", "2", "--out",
            str(tmp_path / "run")]
    assert main(argv) == 0
    assert "undertrained" not in capsys.readouterr().err


def test_the_demo_warns_before_printing_undertrained_results(tmp_path, capsys):
    from addnorm.cli.demo import run_demo

    code = run_demo(tmp_path / "demo", max_minutes=1e-320, eval_size=4, progress=False)
    assert code == 0
    captured = capsys.readouterr()
    assert "addnorm demo: warning:" in captured.err and "undertrained" in captured.err
    assert "of 600 steps" in captured.err  # the task's own step budget
    assert "--max-minutes" in captured.err
    assert "held-out exact match" in captured.out  # the results still follow
