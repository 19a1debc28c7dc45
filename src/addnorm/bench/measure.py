"""What the GPU suite measures beside the rate: device synchronisation, the first (compiling)
call's time, the memory an implementation holds at its peak, and the precision context.

Peak memory (CUDA only) is what a process running that implementation alone would hold at
its peak: the bytes its model, gradients and optimizer state hold before the call (its
``state``), plus the most the caching allocator held during one call above what it held
before it (``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``). The other
implementations of a case stay resident during the call and are counted by neither term.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator

import torch
from torch import nn

__all__ = [
    "autocast",
    "dynamo_counts",
    "format_bytes",
    "peak_memory",
    "seconds",
    "state_bytes",
    "state_parts",
    "synchronize",
    "tensor_bytes",
]


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seconds(fn: Callable[[], object], device: torch.device) -> float:
    """Wall-clock seconds of one call of ``fn``, the device's queued work included."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def dynamo_counts() -> tuple[int, int]:
    """(graphs compiled, graph breaks) so far in this process, from dynamo's counters: the
    difference around a first compiled call says how many graphs it made."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of these tensors, each storage once (a tied weight counts once)."""
    sizes = {t.data_ptr(): t.numel() * t.element_size() for t in tensors}
    return sum(sizes.values())


def state_parts(model: nn.Module, optimizer: torch.optim.Optimizer | None = None
                ) -> dict[str, int]:
    """Bytes of ``model``'s parameters and buffers, of their gradients where present, and of
    the optimizer's state tensors."""
    state = [v for s in (optimizer.state.values() if optimizer is not None else ())
             for v in s.values() if isinstance(v, torch.Tensor)]
    return {
        "parameters and buffers": tensor_bytes([*model.parameters(), *model.buffers()]),
        "gradients": tensor_bytes([p.grad for p in model.parameters() if p.grad is not None]),
        "optimizer state": tensor_bytes(state),
    }


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> int:
    """All of :func:`state_parts`: what the model holds between calls."""
    return sum(state_parts(model, optimizer).values())


def format_bytes(n: int | None) -> str:
    """``n`` bytes in GiB, or MiB below one GiB; empty for None."""
    if n is None:
        return ""
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def peak_memory(fn: Callable[[], object], device: torch.device, state: int) -> int | None:
    """The bytes one call of ``fn`` holds at its peak, ``state`` (its model's resident
    bytes, :func:`state_bytes`) included; None off CUDA (see the module docstring)."""
    if device.type != "cuda":
        return None
    synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    synchronize(device)
    return state + torch.cuda.max_memory_allocated(device) - before


@contextlib.contextmanager
def autocast(device: torch.device, enabled: bool) -> Iterator[None]:
    """bf16 autocast on ``device`` when ``enabled``, else nothing."""
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled):
        yield
