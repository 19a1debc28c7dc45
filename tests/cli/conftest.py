"""Fixtures of the command's tests: a tiny translate run and a tiny lm run, trained once per
test module through ``addnorm.cli.parser.main`` (their flags: tests/cli_runs.py)."""

from __future__ import annotations

import pytest
from cli_runs import TINY_LM, TINY_TRANSLATE

from addnorm.cli.parser import main


@pytest.fixture(scope="module")
def translate_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "translate"
    assert main(["train", "translate", *TINY_TRANSLATE, "--max-steps", "3", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "lm"
    assert main(["train", "lm", *TINY_LM, "--max-steps", "2", "--out", str(out)]) == 0
    return out
