"""What bad data raises, and how a note about a user's data is said.

Errors (the CLI turns each into one line): :class:`DataError` (a ``ValueError``: the data
cannot be used, the command's exit status 2), :class:`DataChangedError` (a ``DataError``: the
files differ from a run's record of them) and :class:`DataReadError` (an ``OSError``: a file
that fails or changes while it is read, exit status 1). Messages start with the path they are
about.

Notes (:func:`data_note`): what a data set's reading leaves out without refusing it (links
skipped, a header row skipped, an empty class folder) is said on the ``addnorm.data.notes``
logger, each message once per process (a run lists its data more than once: planning, sizing
and training).
"""

from __future__ import annotations

import logging

__all__ = ["DataChangedError", "DataError", "DataReadError", "data_note"]


class DataError(ValueError):
    """Data that cannot be used as given (missing, empty, not text, malformed, too small);
    the message starts with the path and says what is wrong."""


class DataChangedError(DataError):
    """Files that differ from the record a run made of them; the message names the changes."""


class DataReadError(OSError):
    """A file that fails, or changes, while it is read; the message names the file."""


class _Once(logging.Filter):
    """Lets each message through once: planning, sizing and training a run each list its
    data, and a note about it is worth one line."""

    def __init__(self) -> None:
        super().__init__()
        self._said: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message in self._said:
            return False
        self._said.add(message)
        return True


_notes = logging.getLogger("addnorm.data.notes")
_notes.addFilter(_Once())


def data_note(message: str) -> None:
    """Say ``message`` about a user's data (what its reading left out) as one logged line,
    ``addnorm: note: <message>``, once per process."""
    _notes.warning("addnorm: note: %s", message)
