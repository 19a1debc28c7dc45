"""addnorm.training.probes: when a probe runs and what it scores.

Provenance: ``ProbeRunner.due`` restated from its contract (every ``every`` steps, not the
last); the scored weights compared with the EMA's and the live model's (identities).
"""

from __future__ import annotations

import torch
from torch import nn

from addnorm.training.ema import make_ema
from addnorm.training.probes import Probe, ProbeRunner


def test_a_probe_is_due_every_n_steps_but_the_last():
    runner = ProbeRunner(Probe(every=4, score=lambda model: {}))
    assert [s for s in range(1, 13) if runner.due(s, max_steps=12)] == [4, 8]
    assert not any(ProbeRunner(None).due(s, max_steps=12) for s in range(1, 13))


def test_given_the_step_a_probe_scores_only_when_it_is_due_and_keeps_nothing():
    runner = ProbeRunner(Probe(every=4, score=lambda model: {"one": 1.0}))
    model = nn.Linear(2, 1)
    assert runner(model, None, 4, 12) == {"probe_one": 1.0}
    assert runner(model, None, 5, 12) == {} and runner(model, None, 12, 12) == {}
    assert ProbeRunner(None)(model, None) == {}
    assert runner.state_entries() == {} and runner.stop_reason() is None


def test_a_probe_scores_a_scratch_copy_of_the_averaged_or_the_trained_weights():
    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    ema = make_ema(model, decay=0.5)
    with torch.no_grad():
        model.weight.add_(1.0)
    seen = []

    def score(scratch: nn.Module) -> dict[str, float]:
        assert scratch is not model and not scratch.training and not torch.is_grad_enabled()
        seen.append(scratch.weight.detach().clone())
        return {"weight_sum": scratch.weight.sum()}

    runner = ProbeRunner(Probe(every=1, score=score))
    assert runner(model, ema) == {"probe_weight_sum": float(seen[-1].sum())}
    assert torch.equal(seen[-1], ema.module.weight)
    runner(model, None)
    assert torch.equal(seen[-1], model.weight.detach())
    assert model.training  # the live model is left as it was
