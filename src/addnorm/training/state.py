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
    "check_optimizer_parts",
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

    Raises ValueError, naming the tensor or entry, before anything is loaded if the parts do not
    fit ``optimizer``: another number of groups or of parameters in a group, a state entry for
    a parameter that is not there, a tensor that is missing, or one whose shape is not its
    parameter's (``step``: a scalar). torch would load a wrong shape and fail, or broadcast,
    only inside a later step.
    """
    state = _checked_state(optimizer, tensors, skeleton)
    groups = []
    for saved, current in zip(skeleton["param_groups"], optimizer.param_groups, strict=True):
        group = dict(saved)
        for key, value in current.items():
            if isinstance(value, tuple) and isinstance(group.get(key), list):
                group[key] = tuple(group[key])
        groups.append(group)
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def check_optimizer_parts(
    optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], skeleton: dict
) -> None:
    """Raise ValueError (naming the tensor or entry) unless ``optimizer_from_parts`` would
    load these parts into ``optimizer``; loads nothing (``optimizer``'s parameters may live on
    the meta device: only their shapes are read)."""
    _checked_state(optimizer, tensors, skeleton)


def _checked_state(
    optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], skeleton: dict
) -> dict[int, dict]:
    """The optimizer state the parts describe, by parameter id, after checking every entry."""
    params = _saved_params(optimizer, skeleton)
    state_skeleton = skeleton.get("state")
    if not isinstance(state_skeleton, dict):
        raise ValueError("the optimizer skeleton's 'state' must be an object")
    return {
        int(param_id): _param_state(param_id, entry, params, tensors)
        for param_id, entry in state_skeleton.items()
    }


def _saved_params(optimizer: torch.optim.Optimizer, skeleton: dict) -> dict[str, torch.Tensor]:
    """The optimizer's parameters by the ids the skeleton's groups give them (torch pairs a
    saved group's ids with the current group's parameters by position)."""
    saved_groups = skeleton.get("param_groups") if isinstance(skeleton, dict) else None
    if not isinstance(saved_groups, list) or not all(isinstance(g, dict) for g in saved_groups):
        raise ValueError("the optimizer skeleton's 'param_groups' must be a list of objects")
    if len(saved_groups) != len(optimizer.param_groups):
        raise ValueError(
            f"checkpoint has {len(saved_groups)} param groups, "
            f"the optimizer {len(optimizer.param_groups)}"
        )
    params = {}
    pairs = zip(saved_groups, optimizer.param_groups, strict=True)
    for number, (saved, current) in enumerate(pairs):
        ids = saved.get("params")
        if not isinstance(ids, list) or not all(type(i) is int for i in ids):
            raise ValueError(f"param group {number}'s 'params' must be a list of ints")
        if len(ids) != len(current["params"]):
            raise ValueError(
                f"param group {number} has {len(ids)} parameters in the checkpoint, "
                f"{len(current['params'])} in the optimizer"
            )
        for saved_id, param in zip(ids, current["params"], strict=True):
            params[str(saved_id)] = param
    return params


def _param_state(
    param_id: str, entry: object, params: dict[str, torch.Tensor], tensors: dict[str, torch.Tensor]
) -> dict:
    """One parameter's optimizer state from its skeleton ``entry``, each tensor checked against
    the parameter's shape (``step`` against a scalar's)."""
    if param_id not in params:
        raise ValueError(f"optimizer state for parameter {param_id}, which no param group has")
    if not isinstance(entry, dict):
        raise ValueError(f"optimizer state of parameter {param_id} must be an object")
    param, state = params[param_id], {}
    for name, item in entry.items():
        if not isinstance(item, dict) or not ({"tensor"} == set(item) or {"value"} == set(item)):
            raise ValueError(
                f'optimizer state {param_id}.{name} must be {{"tensor": key}} or {{"value": v}}'
            )
        if "value" in item:
            state[name] = item["value"]
            continue
        key = item["tensor"]
        if not isinstance(key, str) or key not in tensors:
            raise ValueError(f"optimizer tensor {key!r} ({param_id}.{name}) is missing")
        tensor = tensors[key]
        expected = torch.Size([]) if name == "step" else param.shape
        if tensor.shape != expected:
            raise ValueError(
                f"optimizer tensor {key!r} has shape {tuple(tensor.shape)}, expected "
                f"{tuple(expected)} (" + ("a scalar" if name == "step" else "its parameter's")
                + ")"
            )
        if name != "step" and param.is_floating_point():
            _check_moment(key, tensor)
        state[name] = tensor
    return state


def _check_moment(key: str, tensor: torch.Tensor) -> None:
    """A floating parameter's state (Adam's moments) is floating and finite: an integer one
    would be rounded at every update, and NaN or inf would spread into the weights at the
    first step of the resumed run (read once, on loading)."""
    if not tensor.is_floating_point():
        raise ValueError(
            f"optimizer tensor {key!r} has dtype {tensor.dtype}; the state of a floating "
            "parameter must be floating point"
        )
    if tensor.device.type != "meta" and not bool(torch.isfinite(tensor).all()):
        bad = tensor[~torch.isfinite(tensor)][0].item()
        raise ValueError(f"optimizer tensor {key!r} holds {bad}; its values must be finite")


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
