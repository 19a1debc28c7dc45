"""``addnorm.watch(model)``: what happens inside a model while it trains, as a plain dict per
step, from module hooks (every part is called through ``__call__``, so the hooks see every
sublayer of every forward).

    with addnorm.watch(model) as watch:
        for batch in batches:
            loss = loss_fn(model(batch["x"]), batch["y"])
            loss.backward()
            watch.before_update()        # the gradients, and the weights before the update
            optimizer.step()
            optimizer.zero_grad()
            record = watch.step()        # this step's measurements

A step's record (:meth:`Watch.step`), every name a module or parameter path in the model
(:mod:`addnorm.inspection.model_map`):

- ``layers``: the layers, input side first.
- ``grad_norm``: ``||g||`` of each layer's, sublayer's and other module's parameters, and
  ``"total"``, as the gradients stood at :meth:`Watch.before_update` (or at :meth:`Watch.step`
  when it was not called); ``update_ratio``: ``||w_after - w_before|| / ||w_before||`` of the
  same groups, when :meth:`Watch.before_update` kept the weights before the update.
- ``residual``: for each layer and each Add & Norm, the RMS of the residual stream entering
  (``in``) and leaving it (``out``).
- ``norms``: for each norm, its ``kind``, the RMS of its input and output (``in``, ``out``: an
  Add & Norm's stream before and after its norm) and what it divides out: LayerNorm, RMSNorm
  and GroupNorm the mean (``scale_mean``) and spread (``scale_cv``, std / mean) of their
  per-token (per sample and group) scales; BatchNorm in training mode its batch statistics
  against its running estimates (``mean_gap``: RMS over features of the batch mean's shift in
  running standard deviations; ``var_log_ratio``: RMS of ``ln(var_batch / var_running)``).
  In training mode every norm's ``train_eval_gap``, ``||y - y_eval|| / ||y||``: how far its
  output sits from what eval mode gives for the same input (BatchNorm: normalized with the
  running statistics; 0 for the norms whose statistics are the token's or the sample's own).
  For BatchNorm that gap holds two effects, reported apart: ``batch_effect``, the batch's own,
  ``||y - y_full|| / ||y||`` with ``y_full`` normalized by the full data's statistics,
  estimated from two halves of the batch (:func:`~addnorm.inspection.statistics.
  batch_effect_sums`; needs two samples); and ``running_lag``, the rest,
  ``sqrt(train_eval_gap^2 - batch_effect^2)`` (0 where that is negative): how far the running
  statistics trail the full data's, ``||y_full - y_eval|| / ||y||`` in expectation.
- ``attention_entropy``: per attention module, each head's mean entropy in nats over the
  real query rows (``ln S`` is uniform attention over S keys).
- ``ffn_units``: per FFN, its ``activation`` and the share of its units that are
  ``near_zero``: output within ``statistics.NEAR_ZERO`` (1%) of the RMS of all its units'
  outputs on every real token of the step (the output that enters ``w2``: SwiGLU's gated
  product); for ReLU also ``dead``: no positive pre-activation on any real token (output and
  gradient exactly 0). A GELU or SiLU unit is never dead in that sense, as a negative input
  still passes a small output and gradient; near zero is the term for every activation.

Cost and scope: hooks exist only while the watch is attached (:meth:`Watch.attach`, the
``with`` block); they measure only inside the model's own forward (not the recomputation of
activation checkpointing in the backward pass) and compute everything without gradients and
without autocast, in float32. Attention weights are recomputed from the arguments each
attention module received (:meth:`~addnorm.attention.MultiHeadAttention.forward_with_weights`,
no dropout drawn, so the random stream stays that of an unwatched step); that costs about
one more attention per layer and (B, H, L, S) floats at a time. A step reads its numbers back
to the host once. Under ``torchrun`` every process must call :meth:`Watch.step` together:
the sums are reduced over the processes (the gradients of sharded FSDP parameters summed,
those DDP keeps whole taken once).

``torch.compile``: hooks added to a compiled module never run inside its graph, so the watch
refuses a compiled wrapper (``model._orig_mod`` is the module to watch, run eagerly on the
watched steps; the trainer's watch does this).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from addnorm.attention import AttentionMask, MultiHeadAttention
from addnorm.feedforward import FeedForward
from addnorm.inspection import statistics as stats
from addnorm.inspection.model_map import ModelMap
from addnorm.norms import BatchNorm, GroupNorm, LayerNorm, RMSNorm
from addnorm.residual import AddNorm
from addnorm.utils.checks import check_bool

__all__ = ["Watch", "norm_kind", "watch"]

_Key = tuple[str, str, str]  # (section, path, statistic)


def norm_kind(module: nn.Module) -> str | None:
    """``"layer"``, ``"rms"``, ``"batch"`` or ``"group"`` for a norm the watch measures
    (addnorm's and torch's last-dim ones), else None."""
    if isinstance(module, BatchNorm):
        return "batch"
    if isinstance(module, LayerNorm | nn.LayerNorm):
        return "layer"
    if isinstance(module, RMSNorm | nn.RMSNorm):
        return "rms"
    if isinstance(module, GroupNorm):
        return "group"
    return None


class Watch:
    """Per-layer measurements of ``model`` while it trains (see the module docstring).

    Args:
        model: the module to watch (not a ``torch.compile`` wrapper).
        activations: measure the forward (residual RMS, norms, attention, FFN units); False
            leaves gradients and updates only, and registers no hook at all.
        attention: recompute the attention weights for their entropy.
        per_parameter: also report ``grad_norm`` and ``update_ratio`` of every parameter
            by its own name.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        activations: bool = True,
        attention: bool = True,
        per_parameter: bool = False,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
        if isinstance(getattr(model, "_orig_mod", None), nn.Module):
            raise ValueError(
                "watch the module itself, not its torch.compile wrapper: hooks do not run "
                "inside a compiled graph (pass model._orig_mod and run watched steps eagerly)"
            )
        self.activations = check_bool("activations", activations)
        self.attention = check_bool("attention", attention)
        check_bool("per_parameter", per_parameter)
        self.model = model
        self.map = ModelMap.of(model, per_parameter=per_parameter)
        self._handles: list[Any] = []
        self._in_forward = False
        self._padding: torch.Tensor | None = None  # the current layer's query padding
        self._running: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._eval_outputs: dict[str, torch.Tensor] = {}
        self._sums: dict[_Key, torch.Tensor] = {}
        self._kinds: dict[str, str] = {}
        self._activations: dict[str, str] = {}
        self._grads: list[torch.Tensor | None] | None = None
        self._before: list[torch.Tensor] | None = None

    # -- hooks on and off ------------------------------------------------------------------

    @property
    def attached(self) -> bool:
        """Whether the hooks are registered."""
        return bool(self._handles)

    def attach(self) -> None:
        """Register the hooks (nothing if already attached, or without ``activations``)."""
        if self.attached or not self.activations:
            return
        add = self._handles.append
        add(self.model.register_forward_pre_hook(self._enter_forward))
        add(self.model.register_forward_hook(self._leave_forward, always_call=True))
        for module in self.model.modules():
            for handle in self._hooks_of(self.map.names[id(module)], module):
                add(handle)

    def detach(self) -> None:
        """Remove every hook; the step's sums so far are kept."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._in_forward, self._padding = False, None

    def __enter__(self) -> Watch:
        self.attach()
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()

    def reset(self) -> None:
        """Forget what this step measured so far."""
        self._sums.clear()
        self._running.clear()
        self._eval_outputs.clear()
        self._grads = self._before = None

    def _hooks_of(self, path: str, module: nn.Module) -> Iterator[Any]:
        pre, post = module.register_forward_pre_hook, module.register_forward_hook
        if path in self.map.layers:
            yield pre(partial(self._layer_in, path), with_kwargs=True)
            yield post(partial(self._layer_out, path), with_kwargs=True)
        if isinstance(module, AddNorm):
            yield pre(partial(self._add_norm_in, path), with_kwargs=True)
            yield post(partial(self._add_norm_out, path), with_kwargs=True)
        kind = norm_kind(module)
        if kind is not None:
            self._kinds[path] = kind
            yield pre(partial(self._norm_in, path, kind), with_kwargs=True)
            yield post(partial(self._norm_out, path, kind), with_kwargs=True)
        if isinstance(module, MultiHeadAttention) and self.attention:
            yield post(partial(self._attention_out, path), with_kwargs=True)
        if isinstance(module, FeedForward):
            self._activations[path] = str(getattr(module, "activation",
                                                  type(module.act).__name__.lower()))
            if isinstance(module.act, nn.ReLU):
                yield module.act.register_forward_pre_hook(partial(self._relu_units, path))
            yield module.w2.register_forward_pre_hook(partial(self._unit_outputs, path))

    # -- the hooks ---------------------------------------------------------------------------

    def _enter_forward(self, module: nn.Module, args: tuple) -> None:
        self._in_forward = True

    def _leave_forward(self, module: nn.Module, args: tuple, output: object) -> None:
        self._in_forward, self._padding = False, None

    def _add(self, key: tuple[str, str], sums: dict[str, torch.Tensor]) -> None:
        """Add a call's sums to the step's (a ``max_...`` statistic: keep the larger)."""
        for stat, value in sums.items():
            full = (*key, stat)
            if full not in self._sums:
                self._sums[full] = value
            elif _is_max(stat):
                self._sums[full] = torch.maximum(self._sums[full], value)
            else:
                self._sums[full] = self._sums[full] + value

    def _layer_in(self, path: str, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if not self._in_forward:
            return
        mask = kwargs.get("mask")
        if mask is None:
            mask = next((a for a in args[1:] if isinstance(a, AttentionMask)), None)
        self._padding = _query_padding(mask)
        self._stream(("residual", path), "in", args[0] if args else kwargs.get("x"), None)

    def _layer_out(self, path: str, module: nn.Module, args, kwargs, output) -> None:
        self._stream(("residual", path), "out", output, None)
        self._padding = None

    def _add_norm_in(self, path: str, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self._stream(("residual", path), "in", args[0], _padding_argument(args, kwargs, 2))

    def _add_norm_out(self, path: str, module: nn.Module, args, kwargs, output) -> None:
        self._stream(("residual", path), "out", output, _padding_argument(args, kwargs, 2))

    def _stream(
        self, key: tuple[str, str], side: str, x: object, padding: torch.Tensor | None
    ) -> None:
        """The RMS sums of the stream ``x`` entering (``side="in"``) or leaving a part."""
        if not self._in_forward or not isinstance(x, torch.Tensor):
            return
        padding = self._padding if padding is None else padding
        with torch.no_grad():
            sums = stats.rms_sums(x, stats.real_tokens(x, padding))
        self._add(key, {f"{side}_{k}": v for k, v in sums.items()})

    def _norm_in(self, path: str, kind: str, module: nn.Module, args, kwargs) -> None:
        """In training mode: the same input through the norm in eval mode (for
        ``train_eval_gap``), and a BatchNorm's running statistics before this call updates
        them."""
        if not self._in_forward or not module.training:
            return
        if kind == "batch":
            bn: Any = module
            self._running[path] = (bn.running_mean.detach().clone(),
                                   bn.running_var.detach().clone())
        self._in_forward = False  # this watch's hooks stay out of the eval call
        try:
            with torch.no_grad(), _eval_mode(module):
                self._eval_outputs[path] = module(*args, **kwargs)
        finally:
            self._in_forward = True

    def _norm_out(self, path: str, kind: str, module: nn.Module, args, kwargs, output) -> None:
        if not self._in_forward or not isinstance(output, torch.Tensor):
            return
        x = args[0] if args else kwargs["x"]
        padding = _padding_argument(args, kwargs, 1)
        real = stats.real_tokens(x, self._padding if padding is None else padding)
        norm: Any = module
        eps = norm.eps if norm.eps is not None else torch.finfo(x.dtype).eps
        key = ("norms", path)
        with torch.no_grad():
            self._add(key, {f"in_{k}": v for k, v in stats.rms_sums(x, real).items()})
            self._add(key, {f"out_{k}": v for k, v in stats.rms_sums(output, real).items()})
            y_eval = self._eval_outputs.pop(path, None)
            if y_eval is not None:
                train_eval = stats.train_eval_sums(output, y_eval, real)
                self._add(key, train_eval)
                if kind == "batch":
                    self._add(key, stats.batch_effect_sums(
                        x, real, weight=norm.weight.detach(), eps=eps, train_eval=train_eval))
            running = self._running.pop(path, None)
            if running is not None:
                self._add(key, stats.batchnorm_sums(
                    x, real, running_mean=running[0], running_var=running[1], eps=eps))
            elif kind != "batch":
                groups = norm.n_groups if kind == "group" else 1
                self._add(key, stats.scale_sums(kind, x, real, eps, groups))

    def _attention_out(self, path: str, module: nn.Module, args, kwargs, output) -> None:
        if not self._in_forward or kwargs.get("cache") is not None or not args:
            return
        attention: Any = module
        dtype = attention.in_proj.weight.dtype
        x, memory = args[0], args[1] if len(args) > 1 else kwargs.get("memory")
        given = ("mask", "padding_mask", "attend_mask", "causal", "positions")
        call = {k: kwargs[k] for k in given if k in kwargs}
        with torch.no_grad(), _no_autocast(x.device.type), _without_dropout(module):
            _, weights = attention.forward_with_weights(
                x.to(dtype), None if memory is None else memory.to(dtype), **call
            )  # (B, H, L, S)
            real = _query_rows(call, memory is None, weights.shape[0], weights.shape[2])
            self._add(("attention", path), stats.entropy_sums(weights, real))

    def _relu_units(self, path: str, module: nn.Module, args: tuple) -> None:
        """A ReLU FFN's pre-activations: which units are positive on some real token."""
        if not self._in_forward or not args:
            return
        h = args[0]
        with torch.no_grad():
            self._add(("ffn", path), stats.active_counts(h, stats.real_tokens(h, self._padding)))

    def _unit_outputs(self, path: str, module: nn.Module, args: tuple) -> None:
        """What each FFN unit passes on (``w2``'s input): its largest magnitude, and the
        RMS over all units."""
        if not self._in_forward or not args:
            return
        out = args[0]
        with torch.no_grad():
            self._add(("ffn", path), stats.unit_output_sums(
                out, stats.real_tokens(out, self._padding)))

    # -- the step ----------------------------------------------------------------------------

    def before_update(self) -> None:
        """Read the gradients as they are now, and keep the weights for the update ratio."""
        params = [p for _, p in self.map.params]
        with torch.no_grad():
            self._grads = [None if p.grad is None else _norm(_local(p.grad)) for p in params]
            self._before = [_local(p.detach()).clone() for p in params]

    def step(self) -> dict:
        """This step's record (see the module docstring); the watch then starts a new step.
        Under ``torchrun``, a collective: every process must call it."""
        params = [p for _, p in self.map.params]
        with torch.no_grad():
            grads = self._grads
            if grads is None:
                grads = [None if p.grad is None else _norm(_local(p.grad)) for p in params]
            updates = None
            if self._before is not None:
                updates = [
                    (_norm(_local(p.detach()) - old), _norm(old))
                    for p, old in zip(params, self._before, strict=True)
                ]
        record = _Assembly(self, grads, updates).record()
        self.reset()
        return record


class _Assembly:
    """One step's sums flattened, reduced over the processes in one collective, read back
    once, and divided into the record."""

    def __init__(
        self,
        watch: Watch,
        grads: list[torch.Tensor | None],
        updates: list[tuple[torch.Tensor, torch.Tensor]] | None,
    ) -> None:
        self.watch = watch
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        self.world = world
        entries: list[tuple[_Key, torch.Tensor]] = list(watch._sums.items())
        for index, ((_, p), g) in enumerate(zip(watch.map.params, grads, strict=True)):
            share = 1.0 if _is_sharded(p) else 1.0 / world  # a whole copy on every process
            measured = {"grad": g} if updates is None else {
                "grad": g, "update": updates[index][0], "weight": updates[index][1]}
            for section, norm in measured.items():
                if norm is not None:
                    square = norm.to(stats.WIDE).square() * share
                    entries.append(((section, str(index), "sq"), square))
        self.values = _reduced(entries, world)

    def get(self, section: str, path: str, stat: str) -> Any:
        return self.values.get((section, path, stat))

    def record(self) -> dict:
        out: dict[str, Any] = {"layers": list(self.watch.map.layers)}
        out["grad_norm"] = self._groups("grad", None)
        if any(key[0] == "update" for key in self.values):
            out["update_ratio"] = self._groups("update", "weight")
        sections = {
            "residual": self._residual,
            "norms": self._norm,
            "attention_entropy": self._attention,
            "ffn_units": self._ffn_units,
        }
        source = {"residual": "residual", "norms": "norms", "attention_entropy": "attention",
                  "ffn_units": "ffn"}
        for name, finish in sections.items():
            paths = dict.fromkeys(p for s, p, _ in self.values if s == source[name])
            found = {path: finish(path) for path in paths}
            if found:
                out[name] = found
        return out

    def _groups(self, section: str, over: str | None) -> dict[str, float | None]:
        result: dict[str, float | None] = {}
        for group, members in self.watch.map.groups.items():
            top = [self.get(section, str(i), "sq") for i in members]
            if all(v is None for v in top):
                continue
            size = math.sqrt(sum(v for v in top if v is not None))
            if over is None:
                result[group] = _finite(size)
                continue
            base = math.sqrt(sum(self.get(over, str(i), "sq") or 0.0 for i in members))
            result[group] = _finite(size / base) if base > 0 else None
        return result

    def _rms(self, section: str, path: str, side: str) -> float | None:
        sq, n = self.get(section, path, f"{side}_sq"), self.get(section, path, f"{side}_n")
        return _finite(math.sqrt(sq / n)) if sq is not None and n else None

    def _residual(self, path: str) -> dict:
        return {"in": self._rms("residual", path, "in"), "out": self._rms("residual", path, "out")}

    def _norm(self, path: str) -> dict:
        kind = self.watch._kinds[path]
        entry: dict[str, Any] = {"kind": kind, "in": self._rms("norms", path, "in"),
                                 "out": self._rms("norms", path, "out")}
        v = partial(self.get, "norms", path)
        if v("signal_sq"):
            entry["train_eval_gap"] = _finite(math.sqrt(v("gap_sq") / v("signal_sq")))
        if v("split_signal_sq"):
            effect_sq, gap_sq = v("effect_sq") / v("split_signal_sq"), v(
                "split_gap_sq") / v("split_signal_sq")
            entry["batch_effect"] = _finite(math.sqrt(effect_sq))
            entry["running_lag"] = _finite(math.sqrt(max(gap_sq - effect_sq, 0.0)))
        if kind == "batch" and v("features"):
            entry["mean_gap"] = _finite(math.sqrt(v("gap") / v("features")))
            entry["var_log_ratio"] = _finite(math.sqrt(v("log_var") / v("features")))
        elif kind != "batch" and v("n"):
            mean = v("s1") / v("n")
            variance = max(v("s2") / v("n") - mean * mean, 0.0)
            entry["scale_mean"] = _finite(mean)
            entry["scale_cv"] = _finite(math.sqrt(variance) / mean) if mean > 0 else None
        return entry

    def _attention(self, path: str) -> list[float | None]:
        entropy, rows = self.get("attention", path, "entropy"), self.get("attention", path, "rows")
        return [_finite(e / r) if r else None for e, r in zip(entropy, rows, strict=True)]

    def _ffn_units(self, path: str) -> dict:
        entry: dict[str, Any] = {"activation": self.watch._activations.get(path)}
        top, sq, n = (self.get("ffn", path, k) for k in ("max_abs", "sq", "n"))
        if n:
            band = stats.NEAR_ZERO * math.sqrt(sq / n)
            entry["near_zero"] = sum(1 for t in top if t <= band) / len(top)
        active, tokens = self.get("ffn", path, "active"), self.get("ffn", path, "tokens")
        if tokens:
            entry["dead"] = sum(1 for a in active if a == 0) / len(active)
        return entry


def _reduced(entries: list[tuple[_Key, torch.Tensor]], world: int) -> dict[_Key, Any]:
    """The entries summed over the processes (a ``max_...`` one: its maximum), read back once:
    a float per scalar entry, a list per vector one."""
    if not entries:
        return {}
    entries = sorted(entries, key=lambda e: _is_max(e[0][2]))  # the sums, then the maxima
    device = entries[0][1].device
    flat = torch.cat([t.reshape(-1).to(device=device, dtype=stats.WIDE) for _, t in entries])
    if world > 1:
        summed = sum(t.numel() for key, t in entries if not _is_max(key[2]))
        sums, maxima = flat.split([summed, flat.numel() - summed])  # views of flat
        for part, op in ((sums, dist.ReduceOp.SUM), (maxima, dist.ReduceOp.MAX)):
            if part.numel():
                dist.all_reduce(part, op=op)
    numbers = flat.tolist()
    values: dict[_Key, Any] = {}
    start = 0
    for key, tensor in entries:
        size = tensor.numel()
        values[key] = numbers[start] if tensor.ndim == 0 else numbers[start:start + size]
        start += size
    return values


def _is_max(stat: str) -> bool:
    """Whether a statistic combines over calls and processes by its maximum."""
    return stat.startswith("max_")


def _finite(value: float) -> float | None:
    """JSON has no inf or NaN: None stands for them."""
    return value if math.isfinite(value) else None


def _norm(t: torch.Tensor) -> torch.Tensor:
    """||t||, in float32 at least."""
    return torch.linalg.vector_norm(t, dtype=torch.promote_types(t.dtype, torch.float32))


def _local(t: torch.Tensor) -> torch.Tensor:
    """This process's part of a sharded tensor (a ``DTensor``), or the tensor itself."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def _is_sharded(p: nn.Parameter) -> bool:
    return callable(getattr(p, "to_local", None))


def _padding_argument(args: tuple, kwargs: dict, position: int) -> torch.Tensor | None:
    """A call's ``padding_mask``, given by name or at ``position``; None if it is not a
    bool tensor."""
    padding = kwargs.get("padding_mask", args[position] if len(args) > position else None)
    if isinstance(padding, torch.Tensor) and padding.dtype == torch.bool:
        return padding
    return None


def _query_padding(mask: object) -> torch.Tensor | None:
    """The query padding an :class:`AttentionMask` carries (packed queries: their layout)."""
    if not isinstance(mask, AttentionMask):
        return None
    if mask.packing is not None:
        return None  # packed queries are all real tokens
    return mask.query_padding


def _query_rows(call: dict, self_attention: bool, batch: int, length: int):
    """True = a real query row of the (B, H, L, S) weights, or None (every row)."""
    mask = call.get("mask")
    if isinstance(mask, AttentionMask):
        if mask.packing is not None:
            packing = mask.packing
            real = torch.zeros(packing.batch * packing.length, dtype=torch.bool,
                               device=packing.index.device)
            return real.index_fill(0, packing.index, True).view(packing.batch, packing.length)
        padding = mask.query_padding
    else:
        padding = call.get("padding_mask") if self_attention else None
    if padding is None or tuple(padding.shape) != (batch, length):
        return None
    return ~padding


@contextlib.contextmanager
def _no_autocast(device_type: str) -> Iterator[None]:
    with torch.autocast(device_type, enabled=False):
        yield


@contextlib.contextmanager
def _eval_mode(module: nn.Module) -> Iterator[None]:
    """``module`` and its children in eval mode, then back as they were."""
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


@contextlib.contextmanager
def _without_dropout(module: nn.Module) -> Iterator[None]:
    """``module`` (alone, not its children) in eval mode: no dropout, so no random draw."""
    training = module.training
    module.training = False
    try:
        yield
    finally:
        module.training = training


def watch(
    model: nn.Module,
    *,
    activations: bool = True,
    attention: bool = True,
    per_parameter: bool = False,
) -> Watch:
    """A :class:`Watch` of ``model``, to use as a context manager (hooks on inside the
    ``with`` block); see :mod:`addnorm.inspection.watcher` for what a step's record holds."""
    return Watch(model, activations=activations, attention=attention,
                 per_parameter=per_parameter)

