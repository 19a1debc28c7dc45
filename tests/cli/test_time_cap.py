"""A time cap that stops training far short of ``max_steps`` is reported, with the steps that
ran, by ``train`` and the demo (a loaded machine once gave untrained demo results silently).

Provenance: a cap of 1e-320 minutes (a positive subnormal) holds no step at any pace, so the
plan fits the run to one step (``fitting_steps``' floor) and the cap ends training before it:
the step counts (0 of 1 planned) are known exactly; the threshold cases are arithmetic on
``UNDERTRAINED_SHARE``.
"""

from __future__ import annotations

from addnorm.cli.parser import main
from addnorm.cli.time_cap import (
    UNDERTRAINED_SHARE,
    replan_text,
    time_cap_note,
    time_cap_warning,
)
from addnorm.training.budget import Replan

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


def test_a_cap_after_half_the_planned_steps_is_a_note_and_a_re_plan_is_one_line():
    share = int(UNDERTRAINED_SHARE * 214)
    note = time_cap_note(step=share, max_steps=214, stopped_by="max_minutes",
                         flag="--max-minutes")
    assert note is not None and f"step {share} of the 214 planned" in note
    assert time_cap_note(step=share - 1, max_steps=214, stopped_by="max_minutes",
                         flag="--max-minutes") is None  # the warning's case
    assert time_cap_note(step=214, max_steps=214, stopped_by="max_steps",
                         flag="--max-minutes") is None
    text = replan_text(Replan(at_step=11, step_s=1.26, elapsed_s=14.0, budget_s=300.0,
                              planned_steps=500, steps=214, warmup=21))
    assert text == ("re-planned after step 11: 1.26 s a step here, so 214 of the 500 planned "
                    "steps fit the 5-minute budget (--max-minutes); the warm-up ends at step "
                    "21 and the schedule with the last step")
    up = replan_text(Replan(at_step=20, step_s=0.31, elapsed_s=9.0, budget_s=300.0,
                            planned_steps=79, steps=842, warmup=8))
    assert up == ("re-planned up after step 20: 0.31 s a step here, faster than planned, so "
                  "842 steps, not the 79 planned, fill the 5-minute budget (--max-minutes); "
                  "the warm-up ends at step 8 and the schedule with the last step")


def test_train_warns_when_its_time_cap_stops_it_short(tmp_path, capsys):
    argv = ["train", "translate", *TINY_TRANSLATE, "--max-steps", "8", "--max-minutes",
            "1e-320", "--out", str(tmp_path / "run")]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "addnorm train translate: warning:" in captured.err
    # The plan fits the 8 steps to the budget first: one step; the cap stops it before that.
    assert "fitted to the budget from 8" in captured.err
    assert "after 0 of 1 steps (0%)" in captured.err and "undertrained" in captured.err
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
    assert "fitted to the budget from 600" in captured.out  # the task's own step budget
    assert "after 0 of 1 steps" in captured.err  # of the planned ones
    assert "--max-minutes" in captured.err
    assert "held-out exact match" in captured.out  # the results still follow
