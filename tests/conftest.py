"""Fixtures shared across test folders."""

import pytest
import torch
from torch._dynamo.utils import counters


@pytest.fixture
def fresh_dynamo():
    """Dynamo's caches and counters cleared before the test, and its caches after."""
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()
