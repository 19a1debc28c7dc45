"""`addnorm explain`: NAME, all, --list, no NAME (= all --quick), and the files written."""

from __future__ import annotations

import json

from addnorm.cli import main
from addnorm.experiments import EXPERIMENTS, Outcome
from addnorm.experiments.outcome import new_figure

PNG = b"\x89PNG\r\n\x1a\n"


def test_list_prints_every_name_and_runs_nothing(tmp_path, capsys):
    assert main(["explain", "--list", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out] == list(EXPERIMENTS)
    assert not (tmp_path / "index.html").exists()


def test_one_experiment_writes_its_files_headline_and_the_page(tmp_path, capsys):
    assert main(["explain", "norm-examples", "--quick", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "[1/1] norm-examples" in out and "supported" in out
    # SPEC 3 worked example in the headline: BatchNorm row 0 is [-1.2247, -1.2247].
    assert "[-1.2247, -1.2247]" in out
    folder = tmp_path / "norm-examples"
    assert (folder / "figure.png").read_bytes()[:8] == PNG
    record = json.loads((folder / "result.json").read_text())
    assert record["supported"] is True and record["quick"] is True
    page = (tmp_path / "index.html").read_text()
    assert page.count("data:image/png;base64,") == 1  # the others: "not run"
    assert "Not run yet" in page
    assert "SPEC" not in page and "seed post 003" in page  # stands alone


def test_no_name_runs_every_experiment_quickly(tmp_path, capsys, monkeypatch):
    import addnorm.cli.explain as explain

    seen = []

    def fake(name):
        def run(*, quick: bool = False):
            seen.append((name, quick))
            undecided = name == "length-extrapolation"
            return Outcome(name=name, claim="c", method="m", headline="h",
                           supported=None if undecided else True, numbers={},
                           figure=new_figure(1, 1), quick=quick,
                           undecided_because="too few steps" if undecided else "")
        return run

    monkeypatch.setattr(explain, "EXPERIMENTS", {name: fake(name) for name in EXPERIMENTS})
    assert main(["explain", "--out", str(tmp_path)]) == 0
    assert seen == [(name, True) for name in EXPERIMENTS]
    out = capsys.readouterr().out
    assert f"[{len(EXPERIMENTS)}/{len(EXPERIMENTS)}]" in out
    assert "length-extrapolation" in out and "undecided: too few steps" in out
    n = len(EXPERIMENTS)
    assert f"{n - 1}/{n} claims supported, 0 not supported, 0 mixed, 1 undecided (quick run" in out
    verdicts = json.loads((tmp_path / "verdicts.json").read_text())
    assert verdicts["counts"] == {"supported": n - 1, "not supported": 0, "mixed": 0,
                                  "undecided": 1}
    assert list(verdicts["experiments"]) == list(EXPERIMENTS)


def test_an_unknown_name_exits_2(tmp_path, capsys):
    assert main(["explain", "no-such-claim", "--out", str(tmp_path)]) == 2
    assert "no-such-claim" in capsys.readouterr().err


def test_another_reading_is_printed_with_its_own_verdict(tmp_path, capsys, monkeypatch):
    import addnorm.cli.explain as explain
    from addnorm.experiments.outcome import Reading

    def fake(*, quick: bool = False):
        stronger = Reading(claim="a stronger reading", supported=False, headline="0.35 < 0.5")
        return Outcome(name="length-extrapolation", claim="c", method="m", headline="h",
                       supported=True, numbers={}, figure=new_figure(1, 1), quick=quick,
                       also=(stronger,))

    monkeypatch.setattr(explain, "EXPERIMENTS", {"length-extrapolation": fake})
    assert main(["explain", "length-extrapolation", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "length-extrapolation" in out and "supported" in out
    assert "also tested (not supported): a stronger reading" in out and "0.35 < 0.5" in out
    assert "1/1 claims supported, 0 not supported, 0 mixed" in out  # the seed's claim alone
    record = json.loads((tmp_path / "length-extrapolation" / "result.json").read_text())
    assert record["also"][0]["verdict"] == "not supported"


def test_a_mixed_claim_is_counted_apart_with_each_condition_and_the_sensitivity(
        tmp_path, capsys, monkeypatch):
    import addnorm.cli.explain as explain
    from addnorm.experiments.outcome import Condition, Sensitivity

    def fake(*, quick: bool = False):
        conditions = (Condition(name="lr 0.1", supported=False, headline="rougher"),
                      Condition(name="lr 0.3", supported=True, headline="smoother"))
        sensitivity = Sensitivity(setting="the line", values=(0.1, 0.3), used=0.1,
                                  rows=(("BatchNorm", ("mixed", "supported")),))
        return Outcome(name="loss-landscape", claim="c", method="m", headline="h",
                       supported=False, numbers={}, figure=new_figure(1, 1), quick=quick,
                       conditions=conditions, sensitivity=sensitivity)

    monkeypatch.setattr(explain, "EXPERIMENTS", {"loss-landscape": fake})
    assert main(["explain", "loss-landscape", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "loss-landscape" in out and ": mixed" in out
    assert "lr 0.1: not supported" in out and "lr 0.3: supported" in out
    assert "BatchNorm: 0.1 mixed, 0.3 supported" in out
    assert "0/1 claims supported, 0 not supported, 1 mixed, 0 undecided" in out
    record = json.loads((tmp_path / "loss-landscape" / "result.json").read_text())
    assert record["verdict"] == "mixed" and record["supported"] is False


def test_explain_calls_the_leads_run_explain_with_out(tmp_path, monkeypatch):
    import addnorm.cli.explain

    seen = []
    monkeypatch.setattr(
        addnorm.cli.explain, "run_explain", lambda out, *a, **k: seen.append(out) or 0
    )
    assert main(["explain", "--out", str(tmp_path)]) == 0
    assert seen == [tmp_path]
