"""Hypothesis settings of the fuzzing suite: one mechanism, two profiles.

- ``bounded`` (the default run): 25 examples per property, derandomized (the same examples on
  every machine), so the suite is deterministic in CI and takes seconds.
- ``fuzz`` (``pytest -m fuzz tests/fuzz``): 1000 random examples per property; a new run
  explores new inputs.

Neither writes a hypothesis example database (``database=None``: nothing in the repository).
The tests here carry no marker; with ``-m fuzz`` selected they are given the ``fuzz`` marker
before pytest filters by markers, so the same tests run in both modes.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

_COMMON = {
    "database": None,
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}
settings.register_profile("bounded", max_examples=25, derandomize=True, **_COMMON)
settings.register_profile("fuzz", max_examples=1000, **_COMMON)


def _fuzz_selected(config: pytest.Config) -> bool:
    expression = config.getoption("markexpr", "") or ""
    return "fuzz" in expression and "not fuzz" not in expression


def pytest_configure(config: pytest.Config) -> None:
    settings.load_profile("fuzz" if _fuzz_selected(config) else "bounded")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _fuzz_selected(config):
        for item in items:
            if "tests/fuzz/" in item.nodeid.replace("\\", "/") or "fuzz/" in item.nodeid:
                item.add_marker(pytest.mark.fuzz)
