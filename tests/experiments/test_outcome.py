"""Writing an experiment: figure.png, strict result.json, and the self-contained page, with
its three verdicts (supported, not supported, undecided)."""

import json
import math
import re

import pytest

from addnorm.experiments import _MODULES, EXPERIMENTS, Outcome, write_index, write_outcome
from addnorm.experiments.outcome import Reading, new_figure

PNG = b"\x89PNG\r\n\x1a\n"


def _outcome(supported: bool | None, because: str = "") -> Outcome:
    fig = new_figure(2, 2)
    fig.subplots().plot([0, 1], [1, 0])
    return Outcome(name="toy", claim="c <b>", method="m", headline="h", supported=supported,
                   numbers={"loss": [1.0, math.nan], "inf": math.inf}, figure=fig,
                   seeds=("001", "003"), undecided_because=because)


def test_write_outcome_writes_a_png_and_strict_json(tmp_path):
    folder = write_outcome(_outcome(True), tmp_path)
    assert (folder / "figure.png").read_bytes()[:8] == PNG
    record = json.loads((folder / "result.json").read_text())
    assert record["supported"] is True and record["claim"] == "c <b>"
    assert record["verdict"] == "supported" and record["seeds"] == ["001", "003"]
    assert record["numbers"] == {"loss": [1.0, None], "inf": None}  # no NaN in the JSON


def test_index_embeds_figures_and_says_plainly_when_a_claim_failed(tmp_path):
    write_outcome(_outcome(False), tmp_path)
    page = write_index(tmp_path, ["toy", "absent"]).read_text()
    assert "data:image/png;base64," in page  # embedded: opens with no server
    assert "src=\"toy" not in page and "http" not in page  # nothing fetched
    assert "NOT supported" in page
    assert "c &lt;b&gt;" in page  # escaped
    assert "Not run yet" in page


def test_an_undecided_run_is_null_in_the_json_and_says_why_on_the_page(tmp_path):
    outcome = _outcome(None, because="10 steps <learn> nothing")
    assert outcome.verdict == "undecided"
    record = json.loads((write_outcome(outcome, tmp_path) / "result.json").read_text())
    assert record["supported"] is None and record["verdict"] == "undecided"
    assert record["undecided_because"] == "10 steps <learn> nothing"
    page = write_index(tmp_path, ["toy"]).read_text()
    assert 'class="verdict undecided"' in page and "10 steps &lt;learn&gt; nothing" in page
    assert 'class="verdict failed"' not in page and 'class="verdict held"' not in page


def test_undecided_needs_a_reason_and_only_undecided_has_one():
    with pytest.raises(ValueError, match="undecided_because"):
        _outcome(None)
    with pytest.raises(ValueError, match="undecided_because"):
        _outcome(True, because="why")
    with pytest.raises(TypeError, match="True, False or None"):
        _outcome(1)  # type: ignore[arg-type]


def test_the_page_stands_alone_for_a_pip_user(tmp_path):
    write_outcome(_outcome(True), tmp_path)
    page = write_index(tmp_path, ["toy"]).read_text()
    assert "SPEC" not in page  # no file a pip user does not have
    assert "five blog posts" in page and "seed posts 001 and 003" in page


def test_every_experiment_names_the_seed_posts_its_claim_comes_from():
    for module in _MODULES:
        assert module.SEEDS and all(re.fullmatch(r"00[0-4]", s) for s in module.SEEDS)
        assert module.CLAIM.endswith(".") and "SPEC" not in module.CLAIM


def test_experiment_names_are_cli_names():
    assert all(name == name.lower() and " " not in name for name in EXPERIMENTS)
    assert "all" not in EXPERIMENTS


def test_another_reading_keeps_its_own_verdict_in_the_json_and_on_the_page(tmp_path):
    outcome = _outcome(True)
    outcome.also = (Reading(claim="stronger <claim>", supported=False, headline="0.35 < 0.5"),
                    Reading(claim="other", supported=None, headline="h2", undecided_because="w"))
    record = json.loads((write_outcome(outcome, tmp_path) / "result.json").read_text())
    assert record["verdict"] == "supported"  # the seed's claim, not folded with the others
    assert [r["verdict"] for r in record["also"]] == ["not supported", "undecided"]
    assert record["also"][1]["undecided_because"] == "w"
    page = write_index(tmp_path, ["toy"]).read_text()
    assert "Also tested" in page and "stronger &lt;claim&gt;" in page
    assert "reading NOT supported" in page and "claim held" in page


def test_a_reading_checks_its_verdict_like_an_outcome():
    with pytest.raises(ValueError, match="undecided_because"):
        Reading(claim="c", supported=None, headline="h")
    with pytest.raises(TypeError, match="True, False or None"):
        Reading(claim="c", supported="yes", headline="h")  # type: ignore[arg-type]
