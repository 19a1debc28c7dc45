"""Which parts of a model the watch measures, and the names it reports them under.

Found from the module tree alone, so any model built of addnorm's parts is mapped, a user's
own included:

- a *layer* is a module (not the root) with an :class:`~addnorm.residual.AddNorm` among its
  direct children (``EncoderLayer``, ``DecoderLayer``), or with both a
  :class:`~addnorm.attention.MultiHeadAttention` and a :class:`~addnorm.feedforward.FeedForward`
  (``DiTBlock``, whose residual adds are written out); layers are listed in the order the
  model registers them, which is the order a token passes through them;
- a *sublayer* is a direct child of a layer that holds parameters (``self_attn``, ``ff``,
  ``attn_add_norm``: its norm's weights, ``adaLN_modulation``);
- every other parameter is reported under the module that owns it (``embed.tokens``,
  ``blocks.norm``, ``to_logits``).

Names are the modules' paths in the model, with the wrappers of activation checkpointing,
``torch.compile`` and FSDP left out, so they read as the model's state-dict keys do.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from addnorm.attention import MultiHeadAttention
from addnorm.feedforward import FeedForward
from addnorm.residual import AddNorm

__all__ = ["ModelMap", "clean_name"]

# Path components that wrappers insert and state dicts leave out.
_WRAPPERS = ("_checkpoint_wrapped_module", "_orig_mod", "_fsdp_wrapped_module")


def clean_name(name: str) -> str:
    """A module or parameter path without the wrappers' components."""
    return ".".join(part for part in name.split(".") if part not in _WRAPPERS)


def _is_layer(module: nn.Module) -> bool:
    children = list(module.children())
    if any(isinstance(child, AddNorm) for child in children):
        return True
    return any(isinstance(c, MultiHeadAttention) for c in children) and any(
        isinstance(c, FeedForward) for c in children
    )


@dataclass(frozen=True)
class ModelMap:
    """A model's layers and the groups its parameters are reported in.

    Attributes:
        names: each module's clean path, by ``id`` (the root is ``""``).
        layers: the layers' paths, input side first.
        params: ``(name, parameter)`` of every parameter (a tied one once).
        groups: each reported name and the indices into ``params`` it sums over: every
            layer, every sublayer, every other owning module, and ``"total"``; with
            ``per_parameter``, every parameter by its own name as well.
    """

    names: dict[int, str]
    layers: tuple[str, ...]
    params: tuple[tuple[str, nn.Parameter], ...]
    groups: dict[str, tuple[int, ...]]

    @classmethod
    def of(cls, model: nn.Module, *, per_parameter: bool = False) -> ModelMap:
        """Map ``model`` (see the module docstring)."""
        names = {id(module): clean_name(name) for name, module in model.named_modules()}
        layers = tuple(
            clean_name(name) for name, module in model.named_modules()
            if module is not model and _is_layer(module)
        )
        params = tuple((clean_name(name), p) for name, p in model.named_parameters())
        groups: dict[str, list[int]] = {}
        for index, (name, _) in enumerate(params):
            for group in _groups_of(name, layers, per_parameter):
                groups.setdefault(group, []).append(index)
        groups["total"] = list(range(len(params)))
        return cls(names, layers, params, {k: tuple(v) for k, v in groups.items()})


def _groups_of(name: str, layers: tuple[str, ...], per_parameter: bool) -> list[str]:
    """The reported names a parameter counts in: its layer and sublayer, or its owner."""
    owner = name.rpartition(".")[0]
    layer = next((p for p in layers if owner == p or owner.startswith(p + ".")), None)
    if layer is None:
        groups = [owner or name]
    else:
        rest = name[len(layer) + 1 :]
        sublayer = rest.split(".")[0] if "." in rest else None
        groups = [layer] + ([f"{layer}.{sublayer}"] if sublayer else [])
    return [*groups, name] if per_parameter and name not in groups else groups
