"""``addnorm bench``: addnorm side by side with the reference implementations, same run.

Case groups (one module each): ``encoder`` (one layer at D 512: the arithmetic), ``small``
(training steps of the date translator and the digits DiT: the overhead), ``decoding``
(greedy generation against Hugging Face GPT-2), ``dit`` (DiT forward and sampling against
diffusers), ``timestep`` (the sinusoidal timestep embedding). The references (torch.nn,
x-transformers, timm, transformers, diffusers) are optional; a missing one is skipped with a
note. Timing, ratios and the report live in :mod:`addnorm.bench.harness`.
"""

from addnorm.bench.harness import BenchSettings, Check, Report, Row, format_table, to_json
from addnorm.bench.run import GROUPS, run_bench

__all__ = [
    "GROUPS",
    "BenchSettings",
    "Check",
    "Report",
    "Row",
    "format_table",
    "run_bench",
    "to_json",
]
