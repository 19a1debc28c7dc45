"""addnorm side by side with torch.nn, x-transformers, timm, transformers and diffusers.

A thin entry point to ``addnorm bench`` (the harness lives in ``addnorm.bench``, so the
command works from an installed package); it takes the same arguments. Not part of pytest.

    .venv/bin/python benchmarks/bench.py --quick
    .venv/bin/python benchmarks/bench.py --only decoding --compile --json bench.json

``benchmarks/compiled_decoding.py`` keeps the compiled-vs-eager study of one model (left-padded
prompts, graph count).
"""

from __future__ import annotations

import sys

from addnorm.cli.parser import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
