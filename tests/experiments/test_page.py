"""The experiments' page, index.html: self-contained (figures embedded, no link out), each claim
with its verdict said plainly, an experiment not run yet listed as such."""

import json

from toy_outcomes import toy_outcome

from addnorm.experiments import write_index, write_outcome


def test_index_embeds_figures_and_says_plainly_when_a_claim_failed(tmp_path):
    write_outcome(toy_outcome(False), tmp_path)
    page = write_index(tmp_path, ["toy", "absent"]).read_text()
    assert "data:image/png;base64," in page  # embedded: opens with no server
    assert "src=\"toy" not in page and "http" not in page  # nothing fetched
    assert "NOT supported" in page
    assert "c &lt;b&gt;" in page  # escaped
    assert "Not run yet" in page


def test_the_page_stands_alone_for_a_pip_user(tmp_path):
    write_outcome(toy_outcome(True), tmp_path)
    page = write_index(tmp_path, ["toy"]).read_text()
    assert "SPEC" not in page  # no file a pip user does not have
    assert "five blog posts" in page and "seed posts 001 and 003" in page


def test_a_result_written_before_conditions_existed_still_shows(tmp_path):
    write_outcome(toy_outcome(False), tmp_path)
    path = tmp_path / "toy" / "result.json"
    record = json.loads(path.read_text())
    for key in ("conditions", "sensitivity"):
        del record[key]
    path.write_text(json.dumps(record))
    page = write_index(tmp_path, ["toy"]).read_text()
    assert "claim NOT supported by this run" in page and "By condition" not in page
