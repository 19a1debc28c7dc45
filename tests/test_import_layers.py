"""Dependencies point down at run time too: ``import addnorm`` loads the models, not the trainer
or the tasks; ``addnorm.load``, which opens training runs, brings them in when first used.

Provenance: ``sys.modules`` of a fresh interpreter (what was imported is there, by definition).
The static graph, deferred imports included, is checked by ``../shared/tools/import-graph.py``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import addnorm
from addnorm.tasks.loading import load

ABOVE_THE_MODELS = ("addnorm.training", "addnorm.tasks", "addnorm.cli", "addnorm.bench",
                    "addnorm.experiments")


def _modules_after(code: str) -> list[str]:
    script = f"import sys\n{code}\nprint('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True).stdout
    return out.split()


def test_import_addnorm_loads_nothing_above_the_models():
    loaded = _modules_after("import addnorm")
    assert "addnorm.transformer.lm" in loaded and "addnorm.pretrained.mixin" in loaded
    assert [m for m in loaded if m.startswith(ABOVE_THE_MODELS)] == []


def test_addnorm_load_is_the_tasks_loader_imported_on_first_use():
    loaded = _modules_after("import addnorm\naddnorm.load")
    assert "addnorm.tasks.loading" in loaded and "addnorm.tasks.trained" in loaded
    assert addnorm.load is load
    assert "load" in dir(addnorm) and "load" in addnorm.__all__


def test_the_dit_family_imports_nothing_of_the_transformer_family():
    """``addnorm.dit`` and what it imports, with the top-level package's own ``__init__`` (which
    loads every family by design) left out: a bare package object stands in for it."""
    root = Path(addnorm.__file__).parent
    loaded = _modules_after(
        "import types\n"
        "pkg = types.ModuleType('addnorm')\n"
        f"pkg.__path__ = [{str(root)!r}]\n"
        "sys.modules['addnorm'] = pkg\n"
        "import addnorm.dit"
    )
    assert "addnorm.dit.config" in loaded and "addnorm.config_base" in loaded
    assert [m for m in loaded if m.split(".")[:2] == ["addnorm", "transformer"]] == []
