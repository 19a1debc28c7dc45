"""``index.html``: every experiment's figure with its claim, method, outcome and verdict.

The page is one self-contained file: figures are embedded as base64 PNG data URLs and the
style sheet is inline, so it opens from disk in a browser with no server and no network. It
also stands alone in what it says: each claim is stated in full with the seed documents it
comes from, and the page says what those are; it points to no file a reader may not have.
Verdicts: supported, NOT supported, mixed (decided under several conditions, which disagree;
each condition's verdict follows under "By condition"), or undecided (the run could not tell,
and why). Where a verdict rests on a setting of the decision rule, "Sensitivity" gives the
verdicts the same runs yield at other values of it. A claim is stated as its seed post states
it; another reading the run also tests (a stronger restatement, or what would make the claim
true) follows under "Also tested", with its own verdict.
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

from addnorm.experiments.outcome import MIXED

__all__ = ["write_index"]

# The style of each verdict's badge.
_CLASS = {"supported": "held", "not supported": "failed", MIXED: "mixed", "undecided": "undecided"}
_SHOWN = {"not supported": "NOT supported"}

_STYLE = """
body { font-family: sans-serif; max-width: 1400px; margin: 2em auto; padding: 0 1em;
       color: #222; line-height: 1.45; }
section { border-top: 1px solid #ccc; padding: 1em 0; }
img { max-width: 100%; border: 1px solid #ddd; }
.verdict { font-weight: bold; padding: 0.1em 0.5em; border-radius: 0.3em; }
.held { background: #d8f0d8; color: #155d15; }
.failed { background: #f8d8d8; color: #8a1010; }
.undecided { background: #fbeec8; color: #6b4a00; }
.mixed { background: #e4dcf4; color: #46237a; }
.missing { background: #eee; color: #555; }
.also { margin: 0.3em 0; }
dt { font-weight: bold; float: left; width: 8em; }
dd { margin-left: 9em; }
table.summary { border-collapse: collapse; }
table.summary td, table.summary th { border: 1px solid #ccc; padding: 0.2em 0.6em; }
table.sensitivity { border-collapse: collapse; margin: 0.3em 0; }
table.sensitivity td, table.sensitivity th { border: 1px solid #ddd; padding: 0.2em 0.5em; }
"""


def write_index(out_dir: Path, names: list[str]) -> Path:
    """Write ``out_dir/index.html`` from each ``out_dir/NAME/result.json`` and figure.

    Experiments in ``names`` that have not been run yet are listed as such.
    """
    records = [_load(out_dir / name) for name in names]
    rows, sections = [], []
    for name, record in zip(names, records, strict=True):
        verdict = _verdict(record)
        others = " ".join(_badge(r, "", "reading") for r in (record or {}).get("also") or [])
        rows.append(f'<tr><td><a href="#{name}">{name}</a></td><td>{verdict}</td>'
                    f"<td>{others}</td></tr>")
        sections.append(_section(name, record, out_dir / name / "figure.png", verdict))
    body = (
        "<h1>addnorm explain: the seed documents' claims, run</h1>"
        "<p>addnorm grew from five blog posts (in Korean, numbered 000 to 004) that explain "
        "the Transformer part by part on the way to the Diffusion Transformer: positional "
        "encoding, normalization, the feed-forward network, Add &amp; Norm, the diffusion "
        "timestep embedding. Each section below states one claim those posts make, in full "
        "and as the post states it, with the posts it comes from; what was run to test it "
        "with the addnorm library; "
        "what came out; and the verdict, decided by the code from the numbers, not by hand: "
        "<em>supported</em>, <em>NOT supported</em>, <em>mixed</em> where a claim decided "
        "under several conditions (learning rates) holds under some and not others, or "
        "<em>undecided</em> where the run "
        "cannot tell (a quick run trains for a few steps only; the full run, "
        "<code>addnorm explain NAME</code> without <code>--quick</code>, decides). "
        "Where a verdict rests on a threshold of the decision rule, its section shows the "
        "verdicts the same runs give at other values of it. "
        "Where addnorm also tests another reading of a claim (a stronger restatement, or what "
        "would make it true), it follows under <em>Also tested</em> with its own verdict. "
        "A verdict that rests on training compares several seeds, and counts a difference "
        "only when it exceeds their spread. "
        "Numbers are in each <code>NAME/result.json</code>.</p>"
        '<table class="summary"><tr><th>experiment</th><th>the seed\'s claim</th>'
        "<th>other readings also tested</th></tr>"
        + "".join(rows) + "</table>" + "".join(sections)
    )
    page = (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        "<title>addnorm explain</title>"
        f"<style>{_STYLE}</style></head><body>{body}</body></html>\n"
    )
    path = out_dir / "index.html"
    path.write_text(page, encoding="utf-8")
    return path


def _load(folder: Path) -> dict | None:
    path = folder / "result.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def _verdict(record: dict | None) -> str:
    if record is None:
        return '<span class="verdict missing">not run</span>'
    return _badge(record, " (quick run)" if record.get("quick") else "")


def _badge(record: dict, quick: str, noun: str = "claim") -> str:
    """The verdict of a result, reading or condition record; one written before ``mixed``
    existed has no such verdict and reads as before."""
    return _verdict_badge(record.get("verdict"), record["supported"], quick, noun)


def _verdict_badge(verdict: str | None, supported: bool | None, quick: str = "",
                   noun: str = "claim") -> str:
    if verdict == MIXED:
        return (f'<span class="verdict mixed">{noun} mixed: held under some conditions, not '
                f"others{quick}</span>")
    if supported is None:
        return f'<span class="verdict undecided">undecided: this run cannot tell{quick}</span>'
    if supported:
        return f'<span class="verdict held">{noun} held{quick}</span>'
    return f'<span class="verdict failed">{noun} NOT supported by this run{quick}</span>'


def _conditions(record: dict) -> str:
    """Each condition's verdict and what came out under it."""
    items = []
    for condition in record.get("conditions") or []:
        why = condition.get("undecided_because") or ""
        items.append(
            f'<div class="also">{_badge(condition, "", html.escape(condition["name"]))} '
            f"{html.escape(condition['headline'])}"
            + (f" <em>Undecided:</em> {html.escape(why)}" if why else "") + "</div>"
        )
    return "".join(items)


def _sensitivity(record: dict) -> str:
    """The "Sensitivity" entry: the verdicts of the same runs at each value of a setting."""
    sensitivity = record.get("sensitivity")
    if not sensitivity:
        return ""
    values, used = sensitivity["values"], sensitivity["used"]
    head = "".join(f"<th>{value:.3g}{' (the rule)' if value == used else ''}</th>"
                   for value in values)
    rows = "".join(
        f"<tr><td>{html.escape(row['label'])}</td>"
        + "".join(f'<td><span class="verdict {_CLASS[v]}">{_SHOWN.get(v, v)}</span></td>'
                  for v in row["verdicts"]) + "</tr>"
        for row in sensitivity["rows"])
    notes = sensitivity.get("notes") or []
    if notes:
        rows += ("<tr><td>what it compares</td>"
                 + "".join(f"<td>{html.escape(note)}</td>" for note in notes) + "</tr>")
    return (f"<dt>Sensitivity</dt><dd>The verdicts of the same runs as "
            f"{html.escape(sensitivity['setting'])} varies:"
            f'<table class="sensitivity"><tr><th></th>{head}</tr>{rows}</table></dd>')


def _also(record: dict) -> str:
    """The "Also tested" entry: each other reading with its verdict, headline and reason."""
    readings = record.get("also") or []
    if not readings:
        return ""
    items = []
    for reading in readings:
        why = reading.get("undecided_because") or ""
        items.append(
            f'<div class="also">{_badge(reading, "", "reading")} '
            f"{html.escape(reading['claim'])} <em>Came out:</em> "
            f"{html.escape(reading['headline'])}"
            + (f" <em>Undecided:</em> {html.escape(why)}" if why else "")
            + _conditions(reading) + "</div>"
        )
    return f"<dt>Also tested</dt><dd>{''.join(items)}</dd>"


def _by_condition(record: dict) -> str:
    conditions = _conditions(record)
    return f"<dt>By condition</dt><dd>{conditions}</dd>" if conditions else ""


def _judgement(record: dict) -> str:
    """The Verdict entry: what the verdict means for this claim, in a sentence."""
    if record.get("verdict") == MIXED:
        return ("Mixed: the numbers support the claim under some of the conditions tested and "
                "do NOT support it under others; see By condition.")
    if record["supported"] is None:
        why = record.get("undecided_because") or "its evidence is insufficient"
        return f"Undecided: this run cannot decide the claim: {why}"
    if record["supported"]:
        return "The numbers support the claim."
    return "The numbers do NOT support the claim in this run; see the figure and result.json."


def _source(record: dict) -> str:
    """Where the claim comes from: ``seed posts 001 and 003``."""
    seeds = list(record.get("seeds") or [])
    if not seeds:
        return "the seed posts"
    named = seeds[0] if len(seeds) == 1 else f"{', '.join(seeds[:-1])} and {seeds[-1]}"
    return f"seed post{'s' if len(seeds) > 1 else ''} {named}"


def _section(name: str, record: dict | None, figure: Path, verdict: str) -> str:
    title = f'<section id="{name}"><h2>{html.escape(name)} {verdict}</h2>'
    if record is None:
        return title + f"<p>Not run yet: <code>addnorm explain {name}</code>.</p></section>"
    claim = f"{record['claim']} (from {_source(record)})"
    items = "".join(
        f"<dt>{label}</dt><dd>{html.escape(str(text))}</dd>"
        for label, text in (("Claim", claim), ("What was run", record["method"]),
                            ("What came out", record["headline"]),
                            ("Verdict", _judgement(record)))
    ) + _by_condition(record) + _sensitivity(record) + _also(record)
    image = ""
    if figure.is_file():
        data = base64.b64encode(figure.read_bytes()).decode("ascii")
        image = f'<img alt="{html.escape(name)} figure" src="data:image/png;base64,{data}">'
    return f"{title}<dl>{items}</dl>{image}</section>"
