"""``addnorm demo``: trains the two main jobs, then prints the table of answers and the
accuracy (budgets made tiny for the test).
"""

from __future__ import annotations

from addnorm.tasks.run import load_trained


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
