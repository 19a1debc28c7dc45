"""The decode step and what every decoding loop does with its logits: the step function's
type (``StepFn``), the model's step compiled (``compiled_step``), its output checked
(``check_logits``: a float (B, V) tensor) and its values watched (``LogitWatch``: rows with
NaN, +inf or only -inf, reported at the one host read of a step). Greedy and sampling
(:mod:`addnorm.generation.loop`) and beam search (:mod:`addnorm.generation.beam_search`)
share them.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor

from addnorm.utils.checks import assert_in_graph, check_tensor

__all__ = [
    "CPU_STEP_OPTIONS",
    "LogitWatch",
    "StepFn",
    "check_logits",
    "compiled_step",
    "held_buffers",
    "step_compile_settings",
]

# tokens (B', 1), cache -> logits (B', V): feed one token per row; the cache grows by one.
StepFn = Callable[[Tensor, Any], Tensor]


def check_logits(name: str, logits: object, shape: tuple[int, int] | None = None) -> Tensor:
    """Logits must be a float (B, V) tensor with V >= 1; their values are :class:`LogitWatch`'s."""
    logits = check_tensor(name, logits, ndim=2, floating=True)
    if shape is not None and tuple(logits.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(logits.shape)}")
    if logits.shape[1] == 0:
        raise ValueError(f"{name} must have V >= 1 columns, got shape {tuple(logits.shape)}")
    return logits


# Why a row has no token to pick, given the row: the message of a rule that left it none.
Cause = Callable[[int], str]


class LogitWatch:
    """Rows whose logits have no finite maximum (NaN, +inf, or only -inf), noted at every step
    without a host sync and reported at the next value the loop reads back anyway.

    A decode step reads one value back to the host at most, the one that decides to stop
    (greedy and sampling: "has every row ended?", only when there is a stop rule; beam search:
    "is every row done?"). :meth:`note` keeps each step's bad rows on the device;
    :meth:`bad_rows` is read in the same transfer as the stop flag, and :meth:`check` reports
    the first bad row noted (the earliest note first: the model's logits before the rules
    that reshape them) wherever a value is read: at the stop check, before another error,
    and once after the loop. A bad row's logits are replaced where a kernel would fail on
    them (sampling), so decoding reaches that read-back.
    """

    def __init__(self) -> None:
        # name, step, max (B,), bad (B,), cause (None: the model's logits)
        self._noted: list[tuple[str, int, Tensor, Tensor, Cause | None]] = []

    def note(self, name: str, step: int, logits: Tensor, cause: Cause | None = None) -> Tensor:
        """Note a step's logits; returns the (B,) bool of its bad rows (no host sync).

        ``cause``: the message for a bad row of logits a rule reshaped (the model's, noted
        before, were fine, or that note reports first); None: the model's own logits.
        """
        row_max = logits.amax(dim=-1)  # (B,), NaN and +inf propagate
        bad = ~torch.isfinite(row_max)
        if torch.compiler.is_compiling():
            assert_in_graph(~bad.any(), f"{name} has a row with NaN, +inf or only -inf values")
        else:
            self._noted.append((name, step, row_max, bad, cause))
        return bad

    def bad_rows(self, like: Tensor) -> Tensor:
        """(B,) bool on ``like``'s device: the rows bad at any step noted since the last
        check (``like``: a (B,) bool, for the shape when nothing was noted)."""
        if not self._noted:
            return torch.zeros_like(like)
        if len(self._noted) == 1:
            return self._noted[0][3]
        return torch.stack([bad for _, _, _, bad, _ in self._noted]).any(dim=0)  # (n, B) -> (B,)

    def check(self, bad: bool | None = None) -> None:
        """Raise ValueError for the first bad row noted (``bad``: the flag already read, if
        it was); forget the noted steps."""
        if bad is None and self._noted:
            bad = bool(self.bad_rows(self._noted[0][3]).any())  # the host sync
        noted, self._noted = self._noted, []
        if not bad:
            return
        for name, step, row_max, rows, cause in noted:
            if bool(rows.any()):
                row = int(rows.nonzero()[0, 0])
                if cause is not None:
                    raise ValueError(cause(row))
                raise ValueError(_bad_logits_message(name, step, row, row_max[row].item()))


def _bad_logits_message(name: str, step: int, row: int, row_max: float) -> str:
    if math.isnan(row_max):
        return (
            f"the model produced NaN logits at step {step} ({name} row {row} has NaN); "
            "look for NaN or inf in its weights or inputs"
        )
    what = "+inf" if row_max > 0 else "only -inf"
    return (
        f"{name} row {row} has {what} logits at step {step}; every row needs at least one "
        "finite logit and no +inf or NaN"
    )


# Inductor settings of a decode step compiled for the CPU (on other devices: the defaults).
# - decompose_mm_pass: a one-row matmul (batch 1) becomes a fused multiply-and-sum kernel,
#   which streams the weights at memory speed; torch's own matrix-vector product falls well
#   short of it at a small model's widths. The projections are most of a decode step's
#   work, so this is most of what compiling gains (``addnorm bench --only decoding
#   --compile`` and benchmarks/compiled_decoding.py time the step both ways).
# - cpp_wrapper: the code that calls the step's kernels is C++ rather than Python.
CPU_STEP_OPTIONS: dict[str, Any] = {
    "post_grad_fusion_options": {"decompose_mm_pass": {}},
    "cpp_wrapper": True,
}


def step_compile_settings(device: torch.device) -> dict[str, Any]:
    """``torch.compile``'s keywords for a decode step on ``device``.

    CUDA: ``mode="reduce-overhead"``, CUDA graphs: a step is one graph replay, so its time is
    the kernels' and not the hundreds of launches (and the Python around them) that decode
    one token of a small model; the cache's state is written in place at fixed addresses
    (:meth:`~addnorm.cache.DecodingCache.step_state`, :func:`held_buffers`), which is what a
    replay needs. The CPU: :data:`CPU_STEP_OPTIONS`. Elsewhere: the defaults.
    """
    if device.type == "cuda":
        return {"mode": "reduce-overhead"}
    if device.type == "cpu":
        return {"options": CPU_STEP_OPTIONS}
    return {}


def compiled_step(step: StepFn) -> StepFn:
    """A model's ``step`` compiled with ``fullgraph=True``, for a cache in the static layout.

    Every step of a static cache has the same shapes and reads no Python count that changes,
    so the first call compiles one graph and every later step (and every later ``generate``
    with the same shapes) reuses it. ``torch.compile`` keeps its compiled code with the
    function, so building this wrapper per call costs nothing. The tokens are made
    contiguous first: beam search feeds views whose strides change, and a graph is
    specialised to its inputs' strides.

    Build one wrapper per ``generate`` call: its first call checks all of dynamo's guards
    (and compiles on a miss); its later calls, the same model, cache and shapes one step on,
    skip the guards that every cached graph shares (``skip_guard_eval_unsafe``): checked in
    Python at every call, they are a large share of a small model's compiled step, whose
    kernels are short. The settings are :func:`step_compile_settings`'. With CUDA graphs each
    call starts a new replay (``cudagraph_mark_step_begin``) and returns a copy of the
    logits, whose graph buffer the next replay rewrites.

    Shapes:
        tokens: (B, 1); returns: logits (B, V)
    """
    compiled: Callable[..., Tensor] | None = None  # built at the first call

    def contiguous_step(tokens: Tensor, cache: Any) -> Tensor:
        nonlocal compiled
        tokens = tokens.contiguous()
        settings = step_compile_settings(tokens.device)
        graphs = settings.get("mode") == "reduce-overhead"
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        if compiled is None:  # the first step: every guard checked, compiling on a miss
            compiled = torch.compile(step, fullgraph=True, **settings)
            logits = compiled(tokens, cache)
        else:
            with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
                logits = compiled(tokens, cache)
        return logits.clone() if graphs else logits

    return contiguous_step


class _Held:
    """The buffers a model's compiled decoding keeps between ``generate`` calls."""

    def __init__(self, tensors: list[Tensor]) -> None:
        self.tensors = tensors
        self.busy = False

    def fits(self, tensors: list[Tensor]) -> bool:
        return len(tensors) == len(self.tensors) and all(
            (a.shape, a.dtype, a.device) == (b.shape, b.dtype, b.device)
            for a, b in zip(tensors, self.tensors, strict=True)
        )


_HELD = "_addnorm_decoding_buffers"


@contextlib.contextmanager
def held_buffers(owner: object, cache: Any) -> Iterator[None]:
    """Run a compiled decoding with ``cache``'s in-place state (``cache.step_state()``) in
    buffers that ``owner`` (the model) keeps from one ``generate`` call to the next.

    CUDA graphs replay against the addresses they were recorded with: a fresh cache per call
    would record the step again at every call (and, past torch's limit of re-recordings,
    run it without graphs). So the first call's buffers are kept, as Hugging Face's static
    cache is; a later call with the same shapes copies its fresh cache (the prompt's keys
    and values) into them and decodes there. A call that finds them in use (another
    decoding of the same model still running) keeps its own. On CUDA the buffers are marked
    as static inputs of the compiled step (``torch._dynamo.mark_static_address``).
    """
    places = cache.step_state()
    tensors = [getattr(holder, name) for holder, name in places]
    held = getattr(owner, _HELD, None)
    if held is not None and held.busy:
        yield
        return
    if held is not None and held.fits(tensors):
        for (holder, name), fresh, kept in zip(places, tensors, held.tensors, strict=True):
            setattr(holder, name, kept.copy_(fresh))
    else:
        held = _Held(tensors)
        for t in tensors:
            if t.device.type == "cuda":
                torch._dynamo.mark_static_address(t, guard=False)
        setattr(owner, _HELD, held)
    held.busy = True
    try:
        yield
    finally:
        held.busy = False
