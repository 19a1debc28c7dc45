"""The optional reference libraries: imported on demand; a missing one is skipped with a note."""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["optional_module"]

INSTALL_HINT = "pip install 'addnorm[bench]'"


def optional_module(name: str, notes: list[str]) -> ModuleType | None:
    """Import ``name``, or append a note saying why it is skipped and return None.

    Any failure counts (a reference that is installed but broken, such as a library built
    for another torch, raises more than ImportError), so one bad reference never stops a run.
    """
    try:
        return importlib.import_module(name)
    except ImportError as err:
        notes.append(f"{name} skipped: not installed ({INSTALL_HINT}): {err}")
    except Exception as err:  # noqa: BLE001  (a broken install: report it, run the rest)
        first_line = (str(err).splitlines() or [""])[0]
        notes.append(f"{name} skipped: it failed to import: {type(err).__name__}: {first_line}")
    return None
