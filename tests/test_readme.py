"""The README's Python code blocks run as tests, so the documentation cannot drift."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_readme_has_python_examples():
    # Provenance: the README promises a runnable usage example; losing it should fail here.
    assert BLOCKS, "README.md has no ```python block to run"


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_python_block_runs(index):
    # The block's own assert statements state the expected values and their provenance.
    exec(compile(BLOCKS[index], f"README.md[python block {index}]", "exec"), {})


def test_readme_shows_the_two_setup_commands():
    text = README.read_text(encoding="utf-8")
    assert "make demo" in text and "make test" in text
