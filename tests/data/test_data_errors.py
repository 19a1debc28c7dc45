"""What bad data raises (the CLI's exit status follows the class) and the notes about a user's
data, said once each.

Provenance: the classes' bases are the contract the CLI relies on (a ``ValueError`` is a
usage error, exit 2; an ``OSError`` a failure, exit 1); the note is counted in the records
the logging system hands on.
"""

from __future__ import annotations

import logging

from addnorm.data.data_errors import DataChangedError, DataError, DataReadError, data_note


def test_the_error_classes_are_the_kinds_the_cli_maps_to_exit_codes():
    assert issubclass(DataError, ValueError) and issubclass(DataChangedError, DataError)
    assert issubclass(DataReadError, OSError) and not issubclass(DataReadError, ValueError)


def test_a_note_is_one_line_said_once_per_message(caplog, tmp_path):
    with caplog.at_level(logging.WARNING, logger="addnorm.data.notes"):
        for _ in range(3):
            data_note(f"{tmp_path}: skipped 1 link leading outside it")
        data_note(f"{tmp_path}: another note")
    assert [r.getMessage() for r in caplog.records] == [
        f"addnorm: note: {tmp_path}: skipped 1 link leading outside it",
        f"addnorm: note: {tmp_path}: another note",
    ]
