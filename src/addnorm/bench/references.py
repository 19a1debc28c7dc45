"""The optional reference libraries: imported on demand; a missing one is skipped with a note."""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["optional_module"]

INSTALL_HINT = "pip install 'addnorm[bench]'"
# References the bench extra leaves out, and how to add them. timm needs a torchvision built
# for the installed torch; the registry's torchvision beside a CPU torch fails to load and then
# breaks `import transformers`, so installing it is left to the user.
OWN_INSTALL = {
    "timm": "not in addnorm[bench]: pip install timm together with a torchvision built for "
    "this torch (for a CPU torch, from PyTorch's CPU wheel index)",
}


def optional_module(name: str, notes: list[str]) -> ModuleType | None:
    """Import ``name``, or append a note saying why it is skipped and return None.

    Any failure counts (a reference that is installed but broken, such as a library built
    for another torch, raises more than ImportError), so one bad reference never stops a run.
    """
    try:
        return importlib.import_module(name)
    except ImportError as err:
        hint = OWN_INSTALL.get(name.split(".")[0], INSTALL_HINT)
        notes.append(f"{name} skipped: not installed ({hint}): {err}")
    except Exception as err:  # noqa: BLE001  (a broken install: report it, run the rest)
        first_line = (str(err).splitlines() or [""])[0]
        notes.append(f"{name} skipped: it failed to import: {type(err).__name__}: {first_line}")
    return None
