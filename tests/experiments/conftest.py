"""Experiments train tiny models: one thread, as `addnorm explain` runs them (faster on a
loaded machine, and the same numbers whatever the core count)."""

import pytest


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every experiment test on one torch thread (tests/conftest.py's one_thread)."""
