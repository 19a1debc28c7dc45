"""``addnorm bench --profile DIR``: where the time and the memory of a timed call go.

For each profiled call (the GPT-2 training steps, compiled where the run compiles, and one
greedy generation), after one warm call, ``torch.profiler`` records two calls and
``DIR/summary.txt`` gets:

- the top 30 operators and kernels by self device time (self CPU time on the CPU), from
  ``key_averages()``;
- the top 30 by memory they allocate themselves (``self_device_memory_usage``), which names
  the tensors a graph materialises (masks, float32 copies of logits, saved activations);
- the memory it holds: parameters, gradients, optimizer state, and the peak of one call
  (:func:`addnorm.bench.measure.peak_memory`); the difference is activations and
  temporaries.

Chrome traces (``chrome://tracing`` or Perfetto) go to ``DIR/traces/``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from addnorm.bench.harness import BenchSettings
from addnorm.bench.measure import format_bytes, peak_memory, state_parts, synchronize

__all__ = ["Profiled", "profile_calls"]

ROWS = 30
CALLS = 2


@dataclass(frozen=True)
class Profiled:
    """A call to profile, the model it runs and its optimizer (None for inference)."""

    name: str
    fn: Callable[[], object]
    model: nn.Module
    optimizer: torch.optim.Optimizer | None = None


def _memory_lines(item: Profiled, device: torch.device) -> list[str]:
    parts = state_parts(item.model, item.optimizer)
    resident = sum(parts.values())
    peak = peak_memory(item.fn, device, resident)
    lines = ["memory held between calls: "
             + ", ".join(f"{what} {format_bytes(n)}" for what, n in parts.items())]
    if peak is None:
        lines.append("peak of one call: measured on CUDA only")
    else:
        lines.append(f"peak of one call {format_bytes(peak)}, of which activations and "
                     f"temporaries {format_bytes(peak - resident)}")
    return lines


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_").lower()


def profile_calls(title: str, items: Sequence[Profiled], settings: BenchSettings,
                  log: Callable[[str], None]) -> None:
    """Profile each call (see the module docstring); append to ``summary.txt`` in
    ``settings.profile_dir`` and write a Chrome trace per call to its ``traces/``."""
    assert settings.profile_dir is not None
    device = settings.torch_device
    folder = Path(settings.profile_dir)
    (folder / "traces").mkdir(parents=True, exist_ok=True)
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    time_key = "self_device_time_total" if cuda else "self_cpu_time_total"
    memory_key = "self_device_memory_usage" if cuda else "self_cpu_memory_usage"
    for item in items:
        log(f"profile: {title}: {item.name}")
        item.fn()  # warm
        synchronize(device)
        with profile(activities=activities, profile_memory=True) as prof:
            for _ in range(CALLS):
                item.fn()
            synchronize(device)
        averages = prof.key_averages()
        slug = _slug(f"{title} {item.name}")
        prof.export_chrome_trace(str(folder / "traces" / f"{slug}.json"))
        text = [f"===== {title}: {item.name} ({CALLS} calls) =====",
                *_memory_lines(item, device), "",
                f"top {ROWS} by {time_key}:",
                averages.table(sort_by=time_key, row_limit=ROWS), "",
                f"top {ROWS} by {memory_key}:",
                averages.table(sort_by=memory_key, row_limit=ROWS), "", ""]
        with open(folder / "summary.txt", "a", encoding="utf-8") as summary:
            summary.write("\n".join(text))
