"""Fixtures shared across test folders, and the hypothesis mode (tests/properties.py)."""

import pytest
import torch
from properties import set_fuzz
from torch._dynamo.utils import counters


def _fuzz_selected(config: pytest.Config) -> bool:
    expression = config.getoption("markexpr", "") or ""
    return "fuzz" in expression and "not fuzz" not in expression


def pytest_configure(config: pytest.Config) -> None:
    set_fuzz(_fuzz_selected(config))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``-m fuzz`` every property test (and all of tests/fuzz) carries the marker, so
    the marker filter that follows selects them."""
    if not _fuzz_selected(config):
        return
    for item in items:
        function = getattr(item, "function", None)
        if getattr(function, "is_hypothesis_test", False) or "fuzz/" in item.nodeid:
            item.add_marker(pytest.mark.fuzz)


@pytest.fixture
def fresh_dynamo():
    """Dynamo's caches and counters cleared before the test, and its caches after."""
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


@pytest.fixture
def one_thread():
    """One torch thread for the test: tiny models are not timed, and on a shared machine a
    parallel region can wait long for its second thread (tests/bench and tests/experiments use
    it for every test)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
