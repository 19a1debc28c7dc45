"""A sharded (FSDP2) model's checkpoint as ``torch.distributed.checkpoint`` (DCP) shards.

Every rank writes its part, its own ``shard-0000R-model-00001-of-00001.safetensors``
(``HuggingFaceStorageWriter`` with ``save_distributed``: safetensors files whose JSON header
says where each piece lies in its tensor), under the names ``<part>.<tensor>``
(``model.encoder.norm.weight``, ``optimizer.3.exp_avg``). DCP's own ``FileSystemWriter`` would
keep its metadata (and by default the tensors) as pickles; this layout has none, and it is
read back through ``HuggingFaceStorageReader``, which takes the pieces' places from the
headers (JSON) and the data through ``safetensors``: nothing is ever unpickled. Reading puts
every tensor together whole in one process (DCP's loader), so a sharded checkpoint loads at
any world size, and a whole one into a sharded model. The directory, its manifest and the
atomic publish are :mod:`addnorm.training.checkpoint`'s.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import cast

import torch
from safetensors import SafetensorError

from addnorm.utils.files import CheckpointError

__all__ = [
    "SHARD_FILE",
    "agree_on_directory",
    "is_shard_write_error",
    "read_shards",
    "shard_rank",
    "write_shards",
]

SHARD_FILE = re.compile(r"^shard-\d{5}-model-\d{5}-of-\d{5}\.safetensors$")


def shard_rank() -> int:
    """This process's rank (0 without a process group): rank 0 writes what is not a shard."""
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def agree_on_directory(tmp: Path | None) -> Path | None:
    """Rank 0's temporary directory for the checkpoint being written (None: it could not
    make one), on every rank."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return tmp
    box = [str(tmp) if tmp is not None else None]
    dist.broadcast_object_list(box, src=0)
    return None if box[0] is None else Path(box[0])


def _flatten(tensors: Mapping[str, Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """``{part: {name: t}}`` as ``{"part.name": t}`` (DCP's names), each a copy of its own:
    safetensors refuses tensors that share memory (a tied embedding and output layer)."""
    return {
        f"{stem}.{name}": value.detach().clone()
        for stem, group in tensors.items() for name, value in group.items()
    }


def write_shards(tmp: Path, tensors) -> None:
    """Every rank's part of ``tensors`` into ``tmp`` through DCP (a collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter

    writer = HuggingFaceStorageWriter(str(tmp), save_distributed=True)
    alone = not (torch.distributed.is_available() and torch.distributed.is_initialized())
    dcp.save(_flatten(tensors), storage_writer=writer, no_dist=alone)


def is_shard_write_error(err: BaseException) -> bool:
    """Whether ``err`` is DCP's report of a rank's failed write (it wraps the rank's error)."""
    from torch.distributed.checkpoint.api import CheckpointException

    return isinstance(err, CheckpointException)


def read_shards(path: Path, shards: list[str]) -> dict[str, dict[str, torch.Tensor]]:
    """The tensors of a sharded checkpoint, each put together whole on the CPU by DCP's
    loader in this process alone, by part (``{"model": {...}, "optimizer": {...}}``). Each
    tensor's pieces must fill it exactly (so nothing is allocated beyond the data on disk)."""
    import warnings

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    where = f"{path} ({', '.join(shards)})"
    try:
        metadata = HuggingFaceStorageReader(str(path)).read_metadata()
        whole: dict[str, torch.Tensor] = {}
        for fqn, item in metadata.state_dict_metadata.items():
            entry = cast(TensorStorageMetadata, item)  # the reader makes tensors only
            size = tuple(int(d) for d in entry.size)
            pieces = sum(math.prod(int(d) for d in chunk.sizes) for chunk in entry.chunks)
            if pieces != math.prod(size) or any(d < 0 for d in size):
                raise ValueError(f"the pieces of {fqn!r} ({pieces} values) do not fill its "
                                 f"shape {size}")
            if "." not in fqn:
                raise ValueError(f"tensor {fqn!r} names no part (<part>.<name>)")
            whole[fqn] = torch.empty(size, dtype=entry.properties.dtype)
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(whole, storage_reader=HuggingFaceStorageReader(str(path)), no_dist=True)
    except (SafetensorError, OSError, ValueError, KeyError, TypeError, RuntimeError,
            AssertionError) as err:
        raise CheckpointError(f"cannot read the shards of {where}: {err}") from None
    tensors: dict[str, dict[str, torch.Tensor]] = {}
    for fqn, value in whole.items():
        stem, name = fqn.split(".", 1)
        tensors.setdefault(stem, {})[name] = value
    return tensors
