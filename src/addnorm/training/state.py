"""Training state as (tensors, JSON) pairs, so checkpoints never need pickle.

- Optimizer: ``optimizer.state_dict()`` split into its tensors (``"<param id>.<name>"``, e.g.
  ``"3.exp_avg"``) and a JSON skeleton that says where each tensor goes.
- Random number generators: the torch CPU (and CUDA) generator states are uint8 tensors;
  Python's ``random`` and NumPy's global states are JSON.
"""

from __future__ import annotations

import random

import numpy as np
import torch

__all__ = [
    "capture_rng",
    "optimizer_from_parts",
    "optimizer_to_parts",
    "restore_rng",
    "seed_everything",
]


def optimizer_to_parts(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """Split ``optimizer.state_dict()`` into a snapshot of its tensors and a JSON skeleton."""
    full = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    skeleton_state: dict[str, dict] = {}
    for param_id, param_state in full["state"].items():
        entry = {}
        for name, value in param_state.items():
            if isinstance(value, torch.Tensor):
                key = f"{param_id}.{name}"
                tensors[key] = value.detach().clone()
                entry[name] = {"tensor": key}
            else:
                entry[name] = {"value": value}
        skeleton_state[str(param_id)] = entry
    return tensors, {"state": skeleton_state, "param_groups": full["param_groups"]}


def optimizer_from_parts(
    optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], skeleton: dict
) -> None:
    """Load state written by ``optimizer_to_parts`` into ``optimizer``.

    JSON turns tuples (AdamW's ``betas``) into lists; they are turned back into the type the
    optimizer's own param groups use.
    """
    state = {}
    for param_id, entry in skeleton["state"].items():
        state[int(param_id)] = {
            name: tensors[item["tensor"]] if "tensor" in item else item["value"]
            for name, item in entry.items()
        }
    if len(skeleton["param_groups"]) != len(optimizer.param_groups):
        raise ValueError(
            f"checkpoint has {len(skeleton['param_groups'])} param groups, "
            f"the optimizer {len(optimizer.param_groups)}"
        )
    groups = []
    for saved, current in zip(skeleton["param_groups"], optimizer.param_groups, strict=True):
        group = dict(saved)
        for key, value in current.items():
            if isinstance(value, tuple) and isinstance(group.get(key), list):
                group[key] = tuple(group[key])
        groups.append(group)
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def seed_everything(seed: int) -> None:
    """Seed torch (CPU and CUDA), Python's ``random`` and NumPy's global generator."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def capture_rng() -> tuple[dict[str, torch.Tensor], dict]:
    """The global generators' states: torch ones as tensors, Python and NumPy as JSON."""
    tensors = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, cuda_state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"torch_cuda_{i}"] = cuda_state
    version, internal, gauss = random.getstate()
    numpy_state = np.random.get_state(legacy=True)
    if not isinstance(numpy_state, tuple):  # legacy=True gives the MT19937 tuple
        raise TypeError(f"NumPy's global generator is not MT19937: {type(numpy_state)}")
    kind, keys, pos, has_gauss, cached = numpy_state
    json_state = {
        "python": {"version": version, "internal": list(internal), "gauss_next": gauss},
        "numpy": {
            "kind": kind,
            "keys": keys.tolist(),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
    }
    return tensors, json_state


def restore_rng(tensors: dict[str, torch.Tensor], json_state: dict) -> None:
    """Set the global generators back to states saved by ``capture_rng``."""
    torch.set_rng_state(tensors["torch_cpu"])
    cuda = sorted(k for k in tensors if k.startswith("torch_cuda_"))
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([tensors[k] for k in cuda])
    py = json_state["python"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss_next"]))
    npy = json_state["numpy"]
    np.random.set_state(
        (
            npy["kind"],
            np.asarray(npy["keys"], dtype=np.uint32),
            npy["pos"],
            npy["has_gauss"],
            npy["cached_gaussian"],
        )
    )
