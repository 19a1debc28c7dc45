"""``docs/design.md`` names the code as it is: every file or folder it names exists, and every
module of ``src/addnorm`` is named there (by its path, or by its name in its package's row)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "addnorm"
DESIGN = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")

# `pkg/module.py`, `module.py` or `pkg/` (a folder), as the page writes paths below src/addnorm
PATH = re.compile(r"`((?:[a-z_0-9]+/)*(?:[a-z_0-9]+\.py|[a-z_0-9]+/))`")
# Paths the page names outside src/addnorm, relative to the repository or its parent.
OUTSIDE = ("tests/", "benchmarks/", "docs/", "../shared/")


def _rows() -> dict[str, str]:
    """The module map's rows: first column (without backticks) -> the row's text."""
    rows = {}
    for line in DESIGN.splitlines():
        cells = line.split("|")
        if len(cells) > 2 and cells[1].strip().startswith("`"):
            rows[cells[1].strip()] = line
    return rows


def test_every_path_the_page_names_exists():
    missing = []
    for path in sorted(set(PATH.findall(DESIGN))):
        if path.startswith(OUTSIDE):
            continue
        if not (ROOT / path if path.startswith("src/") else SRC / path).exists():
            missing.append(path)
    assert not missing, f"docs/design.md names paths that do not exist in src/addnorm: {missing}"


def test_every_module_is_named_on_the_page():
    rows = _rows()
    unnamed = []
    for file in sorted(SRC.rglob("*.py")):
        rel = file.relative_to(SRC).as_posix()
        if file.name == "__init__.py" or rel == "_version.py":
            continue
        if f"`{rel}`" in DESIGN:
            continue
        package = rel.rsplit("/", 1)[0] + "/" if "/" in rel else None
        row = next((text for first, text in rows.items()
                    if package is not None and f"`{package}`" in first), "")
        if re.search(rf"`{re.escape(file.stem)}`", row):
            continue
        unnamed.append(rel)
    assert not unnamed, f"modules docs/design.md does not name: {unnamed}"
