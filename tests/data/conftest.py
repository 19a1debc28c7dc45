"""Fixtures of the token corpus's tests and its tokenize pass's."""

from __future__ import annotations

import pytest
from user_text import write_texts


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """The token cache in the test's own folder (``$ADDNORM_CACHE``)."""
    monkeypatch.setenv("ADDNORM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def corpus_dir(tmp_path):
    """A folder of two text files (:func:`user_text.write_texts`)."""
    return write_texts(tmp_path)
