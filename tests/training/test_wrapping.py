"""addnorm.training.wrapping: the EMA, the parallel form and the compiled forward of a model,
in one order, and which of them runs the forward.

Provenance: identities. The EMA starts at the model's weights (``make_ema``'s definition),
the module and its state dict keys stay the model's, ``eager`` selects the uncompiled form;
the compiled form is a stand-in recorded by a patched ``torch.compile`` (what is compiled is
the question, not dynamo). The DDP and FSDP2 forms need a process group:
``test_distributed.py`` trains through them.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn

from addnorm.training.config import TrainConfig
from addnorm.training.wrapping import WrappedModel, wrap_model


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


class Compiled(nn.Module):
    """What the patched ``torch.compile`` returns: the module it was given, as ``_orig_mod``."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self._orig_mod = module

    def forward(self, x):
        return self._orig_mod(x)


def test_by_default_the_model_itself_runs_and_is_scored():
    model = _model()
    keys = list(model.state_dict())
    wrapped = wrap_model(model, TrainConfig(ema_decay=0.0))
    assert wrapped.parallel is model and wrapped.forward_model is model
    assert wrapped.ema is None and wrapped.compiled is None and wrapped.scored is model
    assert list(model.state_dict()) == keys
    assert isinstance(wrapped.sync_gradients(False), contextlib.nullcontext)


def test_the_ema_starts_at_the_weights_and_is_what_a_run_is_scored_with():
    model = _model()
    wrapped = wrap_model(model, TrainConfig(ema_decay=0.9))
    assert wrapped.ema is not None and wrapped.scored is wrapped.ema.module
    for name, value in model.state_dict().items():
        assert torch.equal(wrapped.ema.module.state_dict()[name], value)
    assert int(wrapped.ema.n_averaged) == 1


def test_compile_wraps_the_parallel_form_and_eager_runs_that_form(monkeypatch):
    compiled = []
    monkeypatch.setattr(torch, "compile", lambda m: compiled.append(m) or Compiled(m))
    model = _model()
    keys = list(model.state_dict())
    wrapped = wrap_model(model, TrainConfig(compile=True, ema_decay=0.0))
    assert compiled == [model]  # the parallel form (the model itself, in one process)
    assert isinstance(wrapped.forward_model, Compiled)
    wrapped.eager = True
    assert wrapped.forward_model is model
    wrapped.eager = False
    assert wrapped.forward_model is wrapped.compiled
    assert list(model.state_dict()) == keys  # checkpoints keep the plain keys


def test_gradients_are_held_back_on_all_but_the_last_micro_batch():
    held = []

    class Parallel(nn.Linear):
        @contextlib.contextmanager
        def no_sync(self):
            held.append(True)
            yield

    parallel = Parallel(2, 2)
    wrapped = WrappedModel(parallel, parallel)
    with wrapped.sync_gradients(False):
        pass
    with wrapped.sync_gradients(True):
        pass
    assert held == [True]


def test_fsdp_without_a_process_group_is_refused():
    with pytest.raises(ValueError, match="fsdp needs a process group"):
        wrap_model(_model(), TrainConfig(fsdp=True))
