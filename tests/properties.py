"""Hypothesis settings of every property test in tests/: one mechanism, two modes.

- The default run (``make test``): each property runs the number of examples its test names
  (``@examples(25)``; 25 for a test that names none), derandomized, so every machine and CI
  draw the same examples and the suite is deterministic and quick.
- ``pytest -m fuzz``: every property test in tests/ is selected (it gets the ``fuzz`` marker
  at collection) and runs ``FUZZ_FACTOR`` times its examples, freshly random each run.

Neither writes a hypothesis example database (``database=None``: nothing in the repository).
``tests/conftest.py`` switches the mode before any test module is imported.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

FUZZ_FACTOR = 40
_COMMON = {
    "database": None,
    "deadline": None,
    "suppress_health_check": [
        HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture,
    ],
}
settings.register_profile("bounded", max_examples=25, derandomize=True, **_COMMON)
settings.register_profile("fuzz", max_examples=25 * FUZZ_FACTOR, **_COMMON)
_fuzz = False


def set_fuzz(on: bool) -> None:
    """Choose the mode (called once, by tests/conftest.py's ``pytest_configure``)."""
    global _fuzz
    _fuzz = on
    settings.load_profile("fuzz" if on else "bounded")


def examples(n: int) -> settings:
    """Settings for a property drawn ``n`` times in the default run (the same draws on every
    machine) and ``FUZZ_FACTOR * n`` random times under ``-m fuzz``."""
    if _fuzz:
        return settings(max_examples=FUZZ_FACTOR * n, derandomize=False, **_COMMON)
    return settings(max_examples=n, derandomize=True, **_COMMON)
