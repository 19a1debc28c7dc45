"""addnorm.bench.references: a reference library that is not installed is skipped with a note."""

from __future__ import annotations

from addnorm.bench.references import optional_module


def test_a_missing_reference_is_skipped_with_a_note():
    notes: list[str] = []
    assert optional_module("addnorm_no_such_reference", notes) is None
    assert len(notes) == 1 and "addnorm_no_such_reference skipped" in notes[0]
