"""Writing an experiment: figure.png and strict result.json, its four verdicts (supported, not
supported, mixed, undecided), the verdict under each condition and the verdicts at other
values of a threshold (the page: test_page.py; verdicts.json: test_record.py)."""

import json
import re

import pytest
from toy_outcomes import PNG, toy_conditions, toy_outcome

from addnorm.experiments import (
    _MODULES,
    EXPERIMENTS,
    Outcome,
    write_index,
    write_outcome,
)
from addnorm.experiments.outcome import (
    Reading,
    Sensitivity,
    combine,
    verdict_of,
)


def test_write_outcome_writes_a_png_and_strict_json(tmp_path):
    folder = write_outcome(toy_outcome(True), tmp_path)
    assert (folder / "figure.png").read_bytes()[:8] == PNG
    record = json.loads((folder / "result.json").read_text())
    assert record["supported"] is True and record["claim"] == "c <b>"
    assert record["verdict"] == "supported" and record["seeds"] == ["001", "003"]
    assert record["numbers"] == {"loss": [1.0, None], "inf": None}  # no NaN in the JSON


def test_an_undecided_run_is_null_in_the_json_and_says_why_on_the_page(tmp_path):
    outcome = toy_outcome(None, because="10 steps <learn> nothing")
    assert outcome.verdict == "undecided"
    record = json.loads((write_outcome(outcome, tmp_path) / "result.json").read_text())
    assert record["supported"] is None and record["verdict"] == "undecided"
    assert record["undecided_because"] == "10 steps <learn> nothing"
    page = write_index(tmp_path, ["toy"]).read_text()
    assert 'class="verdict undecided"' in page and "10 steps &lt;learn&gt; nothing" in page
    assert 'class="verdict failed"' not in page and 'class="verdict held"' not in page


def test_undecided_needs_a_reason_and_only_undecided_has_one():
    with pytest.raises(ValueError, match="undecided_because"):
        toy_outcome(None)
    with pytest.raises(ValueError, match="undecided_because"):
        toy_outcome(True, because="why")
    with pytest.raises(TypeError, match="True, False or None"):
        toy_outcome(1)  # type: ignore[arg-type]


def test_every_experiment_names_the_seed_posts_its_claim_comes_from():
    for module in _MODULES:
        assert module.SEEDS and all(re.fullmatch(r"00[0-4]", s) for s in module.SEEDS)
        assert module.CLAIM.endswith(".") and "SPEC" not in module.CLAIM


def test_experiment_names_are_cli_names():
    assert all(name == name.lower() and " " not in name for name in EXPERIMENTS)
    assert "all" not in EXPERIMENTS


def test_another_reading_keeps_its_own_verdict_in_the_json_and_on_the_page(tmp_path):
    outcome = toy_outcome(True)
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


@pytest.mark.parametrize(("supported", "expected"), [
    ((True, True), (True, "supported")),
    ((False, False), (False, "not supported")),
    ((True, False), (False, "mixed")),
    ((True, None), (True, "supported")),  # the undecided condition is listed, not counted
    ((False, None), (False, "not supported")),
    ((None, None), (None, "undecided")),
])
def test_conditions_combine_into_one_verdict_and_mixed_where_they_disagree(supported, expected):
    conditions = toy_conditions(*supported)
    combined, because = combine(conditions)
    assert (combined, verdict_of(conditions)) == expected
    assert bool(because) == (combined is None)
    outcome = toy_outcome(combined, because)
    outcome = Outcome(**{**outcome.__dict__, "conditions": conditions})
    assert outcome.verdict == expected[1]


def test_all_undecided_conditions_give_their_reasons():
    assert combine(toy_conditions(None, None)) == (None, "lr 0: why 0; lr 1: why 1")
    with pytest.raises(ValueError, match="at least one"):
        combine(())


def test_a_verdict_that_is_not_what_its_conditions_decide_is_refused():
    with pytest.raises(ValueError, match="not what the conditions decide"):
        Outcome(**{**toy_outcome(True).__dict__, "conditions": toy_conditions(True, False)})
    with pytest.raises(ValueError, match="not what the conditions decide"):
        Reading(claim="c", supported=False, headline="h", conditions=toy_conditions(True, None))


def test_a_mixed_outcome_is_false_in_the_json_with_each_condition_and_marked_on_the_page(
        tmp_path):
    outcome = Outcome(**{**toy_outcome(False).__dict__, "conditions": toy_conditions(False, True)})
    assert outcome.verdict == "mixed"
    record = json.loads((write_outcome(outcome, tmp_path) / "result.json").read_text())
    # Backward compatible: a reader of "supported" alone sees a claim that did not hold
    # across the conditions; "verdict" and "conditions" say where it did.
    assert record["supported"] is False and record["verdict"] == "mixed"
    assert [(c["name"], c["verdict"]) for c in record["conditions"]] == [
        ("lr 0", "not supported"), ("lr 1", "supported")]
    page = write_index(tmp_path, ["toy"]).read_text()
    assert 'class="verdict mixed"' in page and "By condition" in page
    assert "lr 0 NOT supported" in page and "lr 1 held" in page and "h1 &lt;x&gt;" in page
    assert "Mixed: the numbers support the claim under some" in page


def _sensitivity(first: str = "supported") -> Sensitivity:
    return Sensitivity(setting="a <threshold>", values=(0.0, 0.5), used=0.5,
                       rows=(("claim", ("not supported", first)),),
                       notes=("compares a", "compares b"))


def test_a_sensitivity_table_shows_each_value_and_must_agree_with_the_verdict(tmp_path):
    outcome = Outcome(**{**toy_outcome(True).__dict__, "sensitivity": _sensitivity()})
    record = json.loads((write_outcome(outcome, tmp_path) / "result.json").read_text())
    assert record["sensitivity"]["rows"] == [
        {"label": "claim", "verdicts": ["not supported", "supported"]}]
    page = write_index(tmp_path, ["toy"]).read_text()
    assert "a &lt;threshold&gt;" in page and "0.5 (the rule)" in page
    assert '<span class="verdict failed">NOT supported</span>' in page
    assert "compares b" in page
    with pytest.raises(ValueError, match="sensitivity's verdicts"):
        Outcome(**{**toy_outcome(True).__dict__, "sensitivity": _sensitivity("mixed")})


def test_a_sensitivity_needs_one_known_verdict_per_value():
    with pytest.raises(ValueError, match="used"):
        Sensitivity(setting="s", values=(0.0,), used=1.0, rows=())
    with pytest.raises(ValueError, match="one verdict of"):
        Sensitivity(setting="s", values=(0.0, 1.0), used=1.0, rows=(("r", ("supported",)),))
    with pytest.raises(ValueError, match="one verdict of"):
        Sensitivity(setting="s", values=(1.0,), used=1.0, rows=(("r", ("held",)),))
    with pytest.raises(ValueError, match="notes"):
        Sensitivity(setting="s", values=(1.0,), used=1.0, rows=(), notes=("a", "b"))
