"""Fixtures of the bench tests: one torch thread, and a quick stand-in for torch.compile."""

from __future__ import annotations

import functools

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """One torch thread (tests/conftest.py): nothing here is timed, and on a shared 2-core
    machine a parallel region of the tiny models' kernels can wait hundreds of milliseconds for
    its second thread (fused AdamW of 50k parameters: 0.7 s at 2 threads under load, 0.2 ms
    at 1)."""


@pytest.fixture
def quick_compile(monkeypatch):
    """``torch.compile`` with the aot_eager backend: dynamo and AOT autograd capture the same
    graphs (``fullgraph`` refusals included) and run them eagerly, without inductor's code
    generation, which takes minutes on 2 cores. Used by addnorm's compiled decoding and by
    Hugging Face's static-cache generation alike."""
    original = torch.compile

    def compile(model=None, **kwargs):
        kwargs = {k: v for k, v in kwargs.items() if k not in ("options", "mode", "backend")}
        if model is None:
            return functools.partial(original, backend="aot_eager", **kwargs)
        return original(model, backend="aot_eager", **kwargs)

    monkeypatch.setattr(torch, "compile", compile)
