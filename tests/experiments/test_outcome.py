"""Writing an experiment: figure.png, strict result.json, and the self-contained page."""

import json
import math

from addnorm.experiments import EXPERIMENTS, Outcome, write_index, write_outcome
from addnorm.experiments.outcome import new_figure

PNG = b"\x89PNG\r\n\x1a\n"


def _outcome(supported: bool) -> Outcome:
    fig = new_figure(2, 2)
    fig.subplots().plot([0, 1], [1, 0])
    return Outcome(name="toy", claim="c <b>", method="m", headline="h", supported=supported,
                   numbers={"loss": [1.0, math.nan], "inf": math.inf}, figure=fig)


def test_write_outcome_writes_a_png_and_strict_json(tmp_path):
    folder = write_outcome(_outcome(True), tmp_path)
    assert (folder / "figure.png").read_bytes()[:8] == PNG
    record = json.loads((folder / "result.json").read_text())
    assert record["supported"] is True and record["claim"] == "c <b>"
    assert record["numbers"] == {"loss": [1.0, None], "inf": None}  # no NaN in the JSON


def test_index_embeds_figures_and_says_plainly_when_a_claim_failed(tmp_path):
    write_outcome(_outcome(False), tmp_path)
    page = write_index(tmp_path, ["toy", "absent"]).read_text()
    assert "data:image/png;base64," in page  # embedded: opens with no server
    assert "src=\"toy" not in page and "http" not in page  # nothing fetched
    assert "NOT supported" in page
    assert "c &lt;b&gt;" in page  # escaped
    assert "Not run yet" in page


def test_experiment_names_are_cli_names():
    assert all(name == name.lower() and " " not in name for name in EXPERIMENTS)
    assert "all" not in EXPERIMENTS
