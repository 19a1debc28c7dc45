"""One ``addnorm bench`` run: the chosen case groups in order, into one :class:`Report`."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from addnorm.bench.decoding import run_decoding
from addnorm.bench.dit import run_dit, run_timestep
from addnorm.bench.encoder_layer import run_encoder_layer
from addnorm.bench.harness import BenchSettings, Report, machine_info
from addnorm.bench.padded_batch import run_padded_batch
from addnorm.bench.small_models import run_small_models
from addnorm.utils.checks import check_choice

__all__ = ["GROUPS", "run_bench"]

Group = Callable[[BenchSettings, Report, Callable[[str], None]], None]

GROUPS: dict[str, Group] = {
    "encoder": run_encoder_layer,
    "padded": run_padded_batch,
    "small": run_small_models,
    "decoding": run_decoding,
    "dit": run_dit,
    "timestep": run_timestep,
}


def run_bench(
    settings: BenchSettings,
    groups: Sequence[str] | None = None,
    *,
    command: str = "addnorm bench",
    log: Callable[[str], None] | None = None,
) -> Report:
    """Run ``groups`` (default: all, in the order of :data:`GROUPS`); ``log`` gets one line per
    case as it starts (the CLI prints them to stderr; the library prints nothing)."""
    names = list(GROUPS) if groups is None else [check_choice("group", g, GROUPS) for g in groups]
    report = Report(machine=machine_info(command))
    for name in names:
        GROUPS[name](settings, report, log or (lambda line: None))
    return report
