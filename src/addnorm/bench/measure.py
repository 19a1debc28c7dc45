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
from collections.abc import Callable, Iterator

import torch
from torch import nn

__all__ = [
    "autocast",
    "peak_memory",
    "seconds",
    "state_bytes",
    "synchronize",
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


def _tensor_bytes(tensors: Iterator[torch.Tensor]) -> int:
    seen: set[int] = set()
    total = 0
    for tensor in tensors:
        if tensor.data_ptr() not in seen:  # a tied weight counts once
            seen.add(tensor.data_ptr())
            total += tensor.numel() * tensor.element_size()
    return total


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> int:
    """Bytes of ``model``'s parameters and buffers, their gradients where present, and the
    optimizer's state tensors."""
    def tensors() -> Iterator[torch.Tensor]:
        yield from model.parameters()
        yield from model.buffers()
        yield from (p.grad for p in model.parameters() if p.grad is not None)
        if optimizer is not None:
            for state in optimizer.state.values():
                yield from (v for v in state.values() if isinstance(v, torch.Tensor))
    return _tensor_bytes(tensors())


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
