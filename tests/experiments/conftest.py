"""Experiments train tiny models: one thread, as `addnorm explain` runs them (faster on a
loaded machine, and the same numbers whatever the core count)."""

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
