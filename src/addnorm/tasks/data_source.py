"""``DataSource``: what a task needs of its data, whichever data it is.

A task is handed one data object. Each task's own protocol extends this one with how its data
is sized, checked, batched and scored (``TextData`` in :mod:`addnorm.tasks.lm_data`,
``PairData`` in :mod:`addnorm.tasks.translate_data`, ``ImageData`` in
:mod:`addnorm.tasks.dit_data`), and each has two implementations: the bundled data its code
makes (``Bundled*``) and a user's files (``User*``, recorded in the run). So a task never
asks which it got, and the object built for a run is the one passed on: nothing is cached
elsewhere.
"""

from __future__ import annotations

import inspect
import json
from typing import Any, Protocol

from addnorm.data.fingerprint import DataRecord

__all__ = ["DataSource", "is_data_source", "record_files"]


class DataSource(Protocol):
    """The part of a task's data protocol every task shares."""

    @property
    def record(self) -> DataRecord | None:
        """The record of a user's files (what ``data.json`` and a checkpoint hold, so that a
        resumed run finds them unchanged); None for bundled data, which the code that makes
        it describes."""
        ...

    def train_size(self) -> int:
        """How much there is to train on, in the units the batches draw from: tokens of a
        text, pairs, images (the dates: distinct examples)."""
        ...

    def to_dict(self) -> dict:
        """Its part of the task's checkpoint data (JSON), read back by the task's
        ``from_dict``."""
        ...

    def run_files(self) -> dict[str, str]:
        """The files it keeps in the run folder (``WritesRunFiles``), name -> text."""
        ...


def record_files(record: DataRecord) -> dict[str, str]:
    """``{"data.json": ...}``: a user's data's record, indented JSON."""
    return {"data.json": json.dumps(record.to_dict(), indent=1) + "\n"}


def is_data_source(value: Any) -> bool:
    """Whether ``value`` is a data object already (it has :class:`DataSource`'s methods),
    found without reading any of its properties (which may open files)."""
    return all(callable(inspect.getattr_static(value, name, None))
               for name in ("train_size", "to_dict", "run_files"))
