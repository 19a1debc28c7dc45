"""Memory: what a device has in all (:func:`device_memory`), what it can still give now
(:func:`available_memory`), byte counts in words (:func:`format_bytes`), and ``MAX_LAYERS``.

``device_memory`` is a bound no single request can exceed. Sizes that follow from arguments
(a position table's rows, a decoding cache's positions) are compared with it before anything
is allocated, so a request that can never fit is refused with a ValueError naming the
argument, instead of failing inside the allocator (or, on Linux, being granted and then
killed). It is the total, not what is free now: a refusal depends on the machine alone, never
on what other processes hold, and every refused request was impossible. Requests below it may
still fail in the allocator when memory is in use.

``available_memory`` is what is free now; loading a model (``addnorm.pretrained.mixin``) and the
estimates made before training (``addnorm.training.sizes``, the CLI) compare with it, since
they would allocate at once.

On the CPU both count the process's own limits as well as the machine's: the address space
(``RLIMIT_AS``, ``ulimit -v``) and the data segment (``RLIMIT_DATA``, ``ulimit -d``; heap and
private mappings since Linux 4.7), each less what the process already uses (``VmSize``,
``VmData``). An allocation past them fails whatever memory the machine has free.
:func:`is_out_of_memory` tells an allocator's refusal from other errors.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

__all__ = [
    "MAX_LAYERS",
    "available_memory",
    "check_fits",
    "describe_out_of_memory",
    "device_memory",
    "format_bytes",
    "is_out_of_memory",
]

# Layers per stack above this are refused outright (loading, training, the CLI's flags):
# building 10**5 layers takes minutes even where memory would allow it, and no model of this
# package needs more.
MAX_LAYERS = 1024


def device_memory(device: torch.device | str) -> int | None:
    """Bytes of memory ``device`` has in all; None where it cannot be told (``meta``, ``mps``).

    CPU: physical memory, or the cgroup v2 limit or the process's address-space and data
    limits (``ulimit -v``, ``ulimit -d``) where lower. CUDA: the device's total, read only
    once CUDA is initialized (a tensor on the device implies it is), so that asking never
    creates a CUDA context.
    """
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_initialized():
            return None
        return int(torch.cuda.get_device_properties(device).total_memory)
    if device.type != "cpu":
        return None
    limits = [limit for limit, _used in _process_limits()]
    found = [n for n in (_physical_memory(), _cgroup_limit(), *limits) if n is not None]
    return min(found) if found else None


def _process_limits() -> list[tuple[int, int | None]]:
    """``(limit, bytes in use)`` of the process's address space (``RLIMIT_AS`` against
    ``VmSize``) and data segment (``RLIMIT_DATA`` against ``VmData``), those that are set."""
    try:
        import resource
    except ImportError:  # not a Unix
        return []
    status = _proc_status()
    found = []
    for which, field in ((resource.RLIMIT_AS, "VmSize"), (resource.RLIMIT_DATA, "VmData")):
        try:
            soft, _hard = resource.getrlimit(which)
        except (ValueError, OSError):
            continue
        if soft != resource.RLIM_INFINITY and soft >= 0:
            found.append((int(soft), status.get(field)))
    return found


def _proc_status() -> dict[str, int]:
    """The byte counts of ``/proc/self/status`` (``VmSize``, ``VmData``, ...); {} elsewhere."""
    counts = {}
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                name, _, value = line.partition(":")
                parts = value.split()
                if len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
                    counts[name] = int(parts[0]) * 1024
    except OSError:
        pass
    return counts


def _process_available() -> int | None:
    """What the process's own limits (``ulimit -v``, ``ulimit -d``) leave it; None when none
    is set, or what it uses cannot be read."""
    free = [max(limit - used, 0) for limit, used in _process_limits() if used is not None]
    return min(free) if free else None


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


def available_memory(device: torch.device | str = "cpu") -> int | None:
    """Bytes the process can still allocate on ``device``; None where it cannot be told.

    CPU: the least of ``MemAvailable`` (``/proc/meminfo``), the cgroup v2 limit minus its use,
    the free pages (``sysconf``), and the process's address-space and data limits minus
    what it uses (``ulimit -v``, ``ulimit -d``). CUDA: ``torch.cuda.mem_get_info``'s free
    bytes.
    """
    device = torch.device(device)
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type != "cpu":
        return None
    found = [n for n in (_meminfo_available(), _cgroup_available(), _sysconf_available(),
                         _process_available()) if n is not None]
    return min(found) if found else None


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_available() -> int | None:
    """The cgroup v2 limit of this process's group minus its use, if it has one."""
    root = Path("/sys/fs/cgroup")
    try:
        limit = (root / "memory.max").read_text().strip()
        used = int((root / "memory.current").read_text().strip())
    except (OSError, ValueError):
        return None
    if not limit.isdigit():  # "max": no limit
        return None
    return max(int(limit) - used, 0)


def _sysconf_available() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def format_bytes(n_bytes: float) -> str:
    """``n_bytes`` in the largest unit that keeps it >= 1: ``"3.2 GB"``, ``"4.1e+03 TB"``."""
    for unit in ("B", "kB", "MB", "GB"):
        if n_bytes < 1000:
            return f"{n_bytes:.3g} {unit}"
        n_bytes /= 1000
    return f"{n_bytes:.3g} TB"


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


def is_out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` is an allocator's refusal: ``MemoryError`` (Python's), torch's
    ``OutOfMemoryError`` (CUDA's), or the ``RuntimeError`` of torch's CPU allocator ("can't
    allocate memory")."""
    if isinstance(err, MemoryError | torch.OutOfMemoryError):
        return True
    return isinstance(err, RuntimeError) and bool(
        re.search(r"can't allocate memory|out of memory|std::bad_alloc", str(err))
    )


def describe_out_of_memory(err: BaseException) -> str:
    """``"could not allocate 537 MB"`` from an allocator's message, else its first line."""
    text = str(err)
    found = re.search(r"tried to allocate (\d+) bytes", text)
    if found:
        return f"could not allocate {format_bytes(int(found.group(1)))}"
    found = re.search(r"Tried to allocate ([\d.]+ \w+)", text)  # CUDA's
    if found:
        return f"could not allocate {found.group(1)}"
    first = text.strip().splitlines()[0] if text.strip() else type(err).__name__
    return first if len(first) <= 200 else first[:197] + "..."
