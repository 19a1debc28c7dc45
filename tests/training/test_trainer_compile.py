"""``TrainConfig.compile``: the trainer runs the forward through ``torch.compile``.

Provenance of expected values: the eager trainer with the same seed is the reference (a
compiled graph computes the same function, up to float rounding of fused kernels); the model
object, and so the checkpoint's keys, are the same with and without compiling.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from tolerances import FLOAT32_MODEL

import addnorm


def _train_twice(train_tiny_lm, dtype: torch.dtype = torch.float32):
    """Two steps of a tiny LM, eager and with ``compile=True``: (results, checkpoints)."""
    cfg = dataclasses.replace(
        addnorm.PRESETS["lm-tiny"], vocab_size=64, d_model=32, n_heads=2, d_ff=64, n_layers=1,
        dropout=0.0,
    )
    results, saved = {}, {}
    for switch in (False, True):
        model, trainer, results[switch], saved[switch] = train_tiny_lm(
            cfg, str(switch), steps=2, compile=switch, dtype=dtype
        )
        assert trainer.model is model
    return results, saved


def _check_same_training(results, saved, *, check_weights: bool, loss_rtol: float) -> None:
    eager, compiled = results[False], results[True]
    assert eager.loss is not None and compiled.loss is not None
    assert abs(compiled.loss - eager.loss) <= loss_rtol * abs(eager.loss)
    assert eager.compile_s is None and compiled.compile_s is not None and compiled.compile_s > 0
    plain, other = saved[False].tensors["model"], saved[True].tensors["model"]
    assert list(other) == list(plain)  # no "_orig_mod." prefix
    if not check_weights:
        return
    x = torch.cat([v.flatten() for v in plain.values()])
    y = torch.cat([other[k].flatten() for k in plain])
    # float64 (see TRAJECTORY_RTOL in test_distributed.py): rounding noise g ~ 1e-16 on the
    # key bias, whose true gradient is zero, becomes Adam steps of at most lr * g / eps =
    # 1e-2 * 1.1e-16 / 1e-8 = 1.1e-10 per element and step; far less relative to all weights.
    assert float((x - y).norm() / x.norm()) < 1e-9


def test_compiled_training_plumbing_matches_eager(train_tiny_lm, monkeypatch):
    """The fast variant: dynamo captures the forward (``eager`` backend, no code generation);
    the trainer trains through the compiled callable."""
    calls = []
    compile_fn = torch.compile

    def traced(model, **kwargs):
        calls.append(model)
        return compile_fn(model, backend="eager", **kwargs)

    monkeypatch.setattr(torch, "compile", traced)
    # float64: the same function, so the loss agrees to rounding (FLOAT64_EXACT's rtol).
    results, saved = _train_twice(train_tiny_lm, torch.float64)
    _check_same_training(results, saved, check_weights=True, loss_rtol=1e-12)
    assert len(calls) == 1


@pytest.mark.slow
def test_one_compiled_step_gives_the_eager_loss_and_checkpoint_keys(train_tiny_lm):
    """With inductor, torch.compile's default (30-70 s on 2 CPU cores). Its fused kernels
    round differently, and the attention's key bias, whose true gradient is zero, then moves
    by Adam-scaled rounding noise, so the weights are compared through the second step's
    loss, which they produce."""
    # float32: the loss of two float32 evaluations of one small model (a mean of log-softmax
    # terms, not amplified): FLOAT32_MODEL's rtol.
    _check_same_training(*_train_twice(train_tiny_lm), check_weights=False,
                         loss_rtol=FLOAT32_MODEL["rtol"])
