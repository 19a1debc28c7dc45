"""The tests mirror the modules: ``tests/<pkg>/test_<module>.py`` for every module
``src/addnorm/<pkg>/<module>.py`` with behaviour of its own (``tests/test_<module>.py`` for a
top-level module).

EXEMPT names the modules with no behaviour of their own, each with the reason. PENDING names
the modules whose tests still live elsewhere, each with the files that test them today: a
module leaves PENDING when its mirror file exists (the test below then insists on it).
"""

from __future__ import annotations

from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "addnorm"
TESTS = Path(__file__).resolve().parent

EXEMPT = {
    "_version.py": "the version string alone (tests/pretrained/test_mixin.py checks that "
                   "config.json records it)",
}

# Tested in the named files for now (each with a comment naming them): none today.
PENDING: set[str] = set()


def modules() -> list[str]:
    """Every module of the package, relative to src/addnorm, but the packages' own files."""
    return sorted(
        path.relative_to(SRC).as_posix()
        for path in SRC.rglob("*.py")
        if path.name not in ("__init__.py", "__main__.py")
    )


def mirror(module: str) -> Path:
    path = Path(module)
    return TESTS / path.parent / f"test_{path.name}"


def test_every_module_has_its_mirror_test_file_or_a_reason():
    missing = [m for m in modules() if not mirror(m).is_file()]
    unexplained = sorted(set(missing) - set(EXEMPT) - PENDING)
    assert unexplained == [], f"modules without tests/<pkg>/test_<module>.py: {unexplained}"


def test_exempt_and_pending_name_only_modules_that_exist_and_still_lack_a_mirror():
    every = set(modules())
    assert set(EXEMPT) <= every and PENDING <= every, sorted((set(EXEMPT) | PENDING) - every)
    mirrored = sorted(m for m in (set(EXEMPT) | PENDING) if mirror(m).is_file())
    assert mirrored == [], f"these have their mirror now: drop them from EXEMPT/PENDING: {mirrored}"
    assert not set(EXEMPT) & PENDING
    assert all(reason.strip() for reason in EXEMPT.values())
