"""The flags of the tiny runs that the command's tests train (``addnorm train translate``
and ``addnorm train lm``: a few seconds each); tests/cli/conftest.py trains one of each per
test module (the ``translate_run`` and ``lm_run`` fixtures)."""

from __future__ import annotations

TINY_TRANSLATE = [
    "--preset",
    "tiny",
    "--d-model",
    "32",
    "--n-heads",
    "2",
    "--d-ff",
    "64",
    "--n-encoder-layers",
    "1",
    "--n-decoder-layers",
    "1",
    "--batch-size",
    "4",
    "--eval-size",
    "4",
    "--log-every",
    "1",
    "--quiet",
]


TINY_LM = [
    "--preset",
    "lm-tiny",
    "--d-model",
    "32",
    "--n-heads",
    "2",
    "--d-ff",
    "64",
    "--n-layers",
    "1",
    "--batch-size",
    "2",
    "--seq-len",
    "16",
    "--eval-size",
    "2",
    "--log-every",
    "1",
    "--quiet",
]


# The tiny translate run on one CPU thread (tests/cli/test_run_safety.py, test_exits.py).
TINY = [
    "--preset", "tiny", "--d-model", "32", "--n-heads", "2", "--d-ff", "64",
    "--n-encoder-layers", "1", "--n-decoder-layers", "1", "--batch-size", "4",
    "--eval-size", "4", "--log-every", "1", "--quiet", "--device", "cpu", "--threads", "1",
]
