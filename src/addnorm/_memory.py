"""The memory a device has in all: a bound no single request can exceed.

Sizes that follow from arguments (a position table's rows, a decoding cache's positions) are
compared with it before anything is allocated, so a request that can never fit is refused
with a ValueError naming the argument, instead of failing inside the allocator (or, on Linux,
being granted and then killed). It is the total, not what is free now: a refusal depends on
the machine alone, never on what other processes hold, and every refused request was
impossible. Requests below it may still fail in the allocator when memory is in use.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

__all__ = ["check_fits", "device_memory"]


def device_memory(device: torch.device | str) -> int | None:
    """Bytes of memory ``device`` has in all; None where it cannot be told (``meta``, ``mps``).

    CPU: physical memory, or the cgroup v2 limit where lower. CUDA: the device's total, read
    only once CUDA is initialized (a tensor on the device implies it is), so that asking
    never creates a CUDA context.
    """
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_initialized():
            return None
        return int(torch.cuda.get_device_properties(device).total_memory)
    if device.type != "cpu":
        return None
    found = [n for n in (_physical_memory(), _cgroup_limit()) if n is not None]
    return min(found) if found else None


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _cgroup_limit() -> int | None:
    try:
        limit = (Path("/sys/fs/cgroup") / "memory.max").read_text().strip()
    except OSError:
        return None
    return int(limit) if limit.isdigit() else None  # "max": no limit


def check_fits(what: str, n_bytes: int, device: torch.device | str) -> None:
    """Raise ValueError when ``n_bytes`` (a lower bound of what ``what`` allocates) exceeds
    the memory ``device`` has (:func:`device_memory`); ``what`` names the argument. Nothing is
    checked while a graph is captured (no host call may run there)."""
    if torch.compiler.is_compiling():
        return
    limit = device_memory(device)
    if limit is not None and n_bytes > limit:
        raise ValueError(
            f"{what} needs at least {n_bytes:,} bytes, more than the {limit:,} bytes of memory "
            f"the device ({torch.device(device)}) has"
        )
