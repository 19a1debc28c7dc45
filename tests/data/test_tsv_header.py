"""Whether a TSV file's first line is a header row: both fields column names (a header), one
role name beside one word (unclear: the user is asked), anything else a pair.

Provenance: the documented rule of ``header_verdict`` on lines from real files (a pandas
``to_csv(sep="\\t")`` header, OPUS-style language columns) and on pairs that must stay pairs
(sentences, numbers, a word pair).
"""

from __future__ import annotations

import pytest

from addnorm.data.tsv_header import HEADER_CHOICES, header_verdict


@pytest.mark.parametrize(
    ("line", "verdict"),
    [
        ("source\ttarget", "header"),
        ("Source\tTarget", "header"),
        ("src\ttgt", "header"),
        ("en\tde", "header"),
        ("English\tFrench", "header"),
        ("input\toutput", "header"),
        ("source\tziel", "unclear"),
        ("input\tEingabe", "unclear"),
        ("the cat sat\tdie Katze sass", None),
        ("21 Nov 2026\t2026-11-21", None),
        ("hello\tbonjour", None),
        ("source\tsource", None),
        ("source code\tQuellcode", None),
        ("a\tb\tc", None),
    ],
)
def test_a_first_line_is_a_header_only_when_its_fields_are_column_names(line, verdict):
    assert header_verdict(line.split("\t")) == verdict


def test_the_choices_are_auto_yes_no():
    assert HEADER_CHOICES == ("auto", "yes", "no")
