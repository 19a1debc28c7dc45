"""Data-parallel training on ``torch.distributed``: one process per device, started by
``torchrun``, plus per-layer activation checkpointing.

Launched by ``torchrun`` (which sets ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE``), each process
joins one process group (gloo on CPU, nccl on CUDA, one GPU per process: ``cuda:LOCAL_RANK``).
Without a process group every helper here is the single-process no-op, so a plain run behaves
as it always has.

Conventions a user can reason about:

- The batch size is the *global* batch. Every rank draws the same global batch a single
  process would (same seed, same data order) and keeps its slice of the rows
  (``data.batches.RankShard``).
- The loss is the mean over the global batch: each rank's mean loss is weighted by
  ``local_tokens * world / global_tokens`` (``global_mean_weight``), so DDP's gradient average
  is the single-process gradient, up to floating-point reduction order.
- Only rank 0 (``is_main``) writes metrics and plots and shows progress, and a replicated
  (DDP) model's checkpoints, in the single-process format; a sharded (FSDP2) model's
  checkpoints are written by every rank, each its own part (``torch.distributed.checkpoint``;
  see ``checkpoint.py``), and load at any world size.
- Ranks other than 0 draw dropout from a generator seeded by (seed, step, rank)
  (``seed_rank``): the ranks' draws differ, and a resumed run repeats them (rank 0 keeps the
  global generator, which checkpoints save).
- Stops (a signal, the time budget) are all-reduced (``agree_on_stop``), so every rank stops
  after the same step; collectives time out (``DEFAULT_TIMEOUT_S``) instead of hanging when a
  rank dies.

``prepare_model`` applies the trainer's switches to a model in place: activation
checkpointing of every layer (the classes its families name, ``layer_classes``), then FSDP2
sharding per layer and the root, or a ``DistributedDataParallel`` wrapper.
"""

from __future__ import annotations

import datetime
import functools
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    apply_activation_checkpointing,
    checkpoint_wrapper,
)

from addnorm.family import ModelFamily

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "OptimizerView",
    "STOP_CODES",
    "World",
    "agree_on_stop",
    "all_reduce_sum",
    "as_float",
    "barrier",
    "checkpoint_layers",
    "full_model_state",
    "global_mean_weight",
    "in_process_group",
    "init_distributed",
    "is_distributed",
    "is_fsdp",
    "is_main",
    "layer_classes",
    "load_full_model_state",
    "model_state",
    "prepare_model",
    "rank",
    "seed_rank",
    "shard",
    "shutdown",
    "world_from_env",
    "world_size",
]

# How long a collective waits for the other ranks before failing (a dead or stuck rank).
DEFAULT_TIMEOUT_S = 600.0
# Why training stops, as all-reduced codes (the largest wins, so every rank agrees).
STOP_CODES = {None: 0, "max_minutes": 1, "interrupt": 2, "terminate": 3}


@dataclass(frozen=True)
class World:
    """This process's place among the training processes: ``rank`` of ``size``, and its
    ``local_rank`` on its machine (which GPU it takes)."""

    rank: int = 0
    local_rank: int = 0
    size: int = 1


def world_from_env(environ: Mapping[str, str]) -> World | None:
    """The ``World`` that ``torchrun`` describes in ``environ`` (``RANK``, ``LOCAL_RANK``,
    ``WORLD_SIZE``), or None when the process was not started by a launcher."""
    if "WORLD_SIZE" not in environ or "RANK" not in environ:
        return None
    try:
        world = World(
            int(environ["RANK"]), int(environ.get("LOCAL_RANK", "0")), int(environ["WORLD_SIZE"])
        )
    except ValueError:
        raise ValueError(
            f"RANK ({environ['RANK']!r}), LOCAL_RANK ({environ.get('LOCAL_RANK')!r}) and "
            f"WORLD_SIZE ({environ['WORLD_SIZE']!r}) must be integers"
        ) from None
    if not 0 <= world.rank < world.size or world.local_rank < 0:
        raise ValueError(
            f"RANK ({world.rank}) must be in 0 .. WORLD_SIZE - 1 ({world.size - 1}) and "
            f"LOCAL_RANK ({world.local_rank}) >= 0"
        )
    return world


def init_distributed(
    world: World, device: str, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> str:
    """Join the process group of ``world`` (rendezvous from torchrun's ``MASTER_ADDR`` /
    ``MASTER_PORT``) and return this process's device: ``cuda:LOCAL_RANK`` when ``device`` is
    CUDA (backend nccl), else ``device`` (backend gloo)."""
    if device.startswith("cuda"):
        device = f"cuda:{world.local_rank}"
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        backend = "gloo"
    dist.init_process_group(backend, rank=world.rank, world_size=world.size,
                            timeout=datetime.timedelta(seconds=timeout_s))
    return device


def shutdown() -> None:
    """Leave the process group, if there is one."""
    if in_process_group():
        dist.destroy_process_group()


def in_process_group() -> bool:
    """Whether this process has joined a process group (torchrun, even with one process)."""
    return dist.is_available() and dist.is_initialized()


def is_distributed() -> bool:
    """Whether this process is one of several training processes."""
    return in_process_group() and dist.get_world_size() > 1


def rank() -> int:
    """This process's rank (0 without a process group)."""
    return dist.get_rank() if in_process_group() else 0


def world_size() -> int:
    """How many processes train together (1 without a process group)."""
    return dist.get_world_size() if in_process_group() else 1


def is_main() -> bool:
    """Whether this process writes files and output (rank 0, or the only process)."""
    return rank() == 0


def barrier() -> None:
    """Wait until every rank gets here (nothing without a process group)."""
    if is_distributed():
        dist.barrier()


def _reduce(values: list[float], op: dist.ReduceOp.RedOpType) -> list[float]:
    if not is_distributed():
        return list(values)
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=op)
    return tensor.tolist()


def all_reduce_sum(values: list[float]) -> list[float]:
    """The element-wise sums of ``values`` over all ranks (``values`` itself alone)."""
    return _reduce(values, dist.ReduceOp.SUM)


def global_mean_weight(local_count: int) -> float:
    """The factor that turns this rank's mean loss over ``local_count`` tokens into its share
    of the global mean, such that averaging the weighted losses (as DDP averages gradients)
    gives the mean over all ranks' tokens: ``local_count * world / global_count``."""
    if not is_distributed():
        return 1.0
    (total,) = all_reduce_sum([float(local_count)])
    return local_count * world_size() / max(total, 1.0)


def as_float(value: torch.Tensor) -> float:
    """A scalar tensor, or a replicated ``DTensor`` one (a sharded model's gradient norm), as
    a Python float (waiting for its device)."""
    from torch.distributed.tensor import DTensor

    if isinstance(value, DTensor):
        value = value.full_tensor()
    return float(value)


def agree_on_stop(reason: str | None) -> str | None:
    """The stop reason every rank agrees on: the strongest of the ranks' ``reason`` (see
    ``STOP_CODES``), so all ranks stop after the same step."""
    if not is_distributed():
        return reason
    (code,) = _reduce([float(STOP_CODES[reason])], dist.ReduceOp.MAX)
    return next(name for name, value in STOP_CODES.items() if value == int(code))


def seed_rank(seed: int, step: int) -> None:
    """Before step ``step + 1``, on a rank other than 0: seed torch's global generator from
    (``seed``, ``step``, rank), so the ranks draw different dropout and a resumed run draws
    the same again; nothing on rank 0 (or alone), whose generator checkpoints save."""
    if rank() > 0:
        draws = random.Random(f"{seed}/{step}/{rank()}")
        torch.manual_seed(draws.getrandbits(63))


def layer_classes(model: nn.Module) -> tuple[type[nn.Module], ...]:
    """The layer classes of ``model`` that are checkpointed and sharded one by one: those its
    model families name (``ModelFamily.layer_classes``; ``model`` itself or models in it)."""
    found: dict[type[nn.Module], None] = {}
    for module in model.modules():
        if isinstance(module, ModelFamily):
            found.update(dict.fromkeys(module.layer_classes))
    return tuple(found)


def checkpoint_layers(model: nn.Module) -> nn.Module:
    """Wrap every layer of ``model`` (in place) so that its activations are recomputed in the
    backward pass instead of stored (non-reentrant ``torch.utils.checkpoint``). The wrapper
    strips its own prefix from state dict keys, so checkpoints keep the plain keys."""
    classes = layer_classes(model)
    wrap = functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
    apply_activation_checkpointing(model, checkpoint_wrapper_fn=wrap,
                                   check_fn=lambda module: isinstance(module, classes))
    return model


def shard(model: nn.Module) -> None:
    """FSDP2: shard every layer's parameters over the ranks, then the remaining ones (in
    place; a trainer's EMA copy is sharded so too, like the model it follows)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device = next(model.parameters()).device
    mesh = init_device_mesh(device.type, (world_size(),))
    classes = layer_classes(model)
    wrapped = "_checkpoint_wrapped_module"  # a checkpointed layer is sharded with its wrapper
    for name, module in list(model.named_modules()):
        inner = getattr(module, wrapped, module)
        if isinstance(inner, classes) and module is not model and not name.endswith(wrapped):
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)


def prepare_model(
    model: nn.Module, *, activation_checkpointing: bool, fsdp: bool
) -> nn.Module:
    """Apply the training switches to ``model`` in place and return what runs its forward:
    the model itself alone or with FSDP2, a ``DistributedDataParallel`` wrapper with several
    processes. Build the optimizer after this (FSDP2 replaces the parameters)."""
    if activation_checkpointing:
        checkpoint_layers(model)
    if fsdp:
        if not in_process_group():
            raise ValueError("fsdp needs a process group: start the run with torchrun")
        shard(model)
        return model
    if is_distributed():
        from torch.nn.parallel import DistributedDataParallel

        device = next(model.parameters()).device
        ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)
    return model


def is_fsdp(model: nn.Module) -> bool:
    """Whether ``model`` is sharded with FSDP2."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _options(**kwargs):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kwargs)


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's state dict: gathered on rank 0 (on the CPU) when ``model`` is
    sharded (every rank must call it then; the others get an empty dict)."""
    if not is_fsdp(model):
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return cast(dict[str, torch.Tensor],
                get_model_state_dict(model, options=_options(cpu_offload=True)))


def model_state(model: nn.Module, *, whole: bool) -> dict[str, torch.Tensor]:
    """``model``'s state dict: whole (``full_model_state``: gathered on rank 0 when sharded)
    or, with ``whole=False``, as it lies: a sharded model's parameters as this rank's
    ``DTensor`` shards, keyed like the unsharded model's (no wrapper prefixes)."""
    if whole or not is_fsdp(model):
        return full_model_state(model) if whole else model.state_dict()
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return cast(dict[str, torch.Tensor], get_model_state_dict(model))


def load_full_model_state(model: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Load a whole (unsharded) state dict into ``model``, sharded or not."""
    if not is_fsdp(model):
        model.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    set_model_state_dict(model, dict(state), options=_options())


def _parameter_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The names of the optimizer's parameters in its own order (its state dict's ids)."""
    names = {
        id(p): name.replace("_checkpoint_wrapped_module.", "")
        for name, p in model.named_parameters()
    }
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


class OptimizerView:
    """An optimizer's state in the single-process layout (parameters by position) even when
    the model is sharded: ``state_dict()`` gathers it (on rank 0, every rank must call it),
    ``load_state_dict`` takes a whole one. Unsharded, it is the optimizer's own."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer
        self.param_groups = optimizer.param_groups

    def state_dict(self) -> dict:
        """The whole state, parameters keyed by position as ``optimizer.state_dict()``."""
        if not is_fsdp(self.model):
            return self.optimizer.state_dict()
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        full: dict[str, Any] = get_optimizer_state_dict(
            self.model, self.optimizer, options=_options(cpu_offload=True)
        )
        if not full:  # not rank 0
            return {"state": {}, "param_groups": []}
        index = {name: i for i, name in enumerate(_parameter_names(self.model, self.optimizer))}
        groups = [
            {**group, "params": [index[name] for name in group["params"]]}
            for group in full["param_groups"]
        ]
        state = {index[name]: value for name, value in full["state"].items()}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state: dict) -> None:
        """Load a whole state in the single-process layout."""
        if not is_fsdp(self.model):
            self.optimizer.load_state_dict(state)
            return
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        names = _parameter_names(self.model, self.optimizer)
        full: dict[str, Any] = {
            "state": {names[int(i)]: value for i, value in state["state"].items()},
            "param_groups": [
                {**group, "params": [names[int(i)] for i in group["params"]]}
                for group in state["param_groups"]
            ],
        }
        set_optimizer_state_dict(self.model, self.optimizer, full, options=_options())
