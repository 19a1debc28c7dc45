"""The trainer's optimizer: torch's fused AdamW, weight decay on matrices only."""

from __future__ import annotations

import torch
from torch import nn

from addnorm.training.config import TrainConfig
from addnorm.training.optimizer import clip_factor, gradient_norm, make_optimizer


def test_optimizer_is_torchs_fused_adamw_with_decay_on_matrices_only():
    # Provenance: torch's own AdamW (fused=False) from the same state takes the same step.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3))
    config = TrainConfig(lr=0.01, weight_decay=0.1)
    optimizer = make_optimizer(model, config)
    assert optimizer.defaults["fused"] is True
    decays = [(group["weight_decay"], [p.ndim for p in group["params"]])
              for group in optimizer.param_groups]
    assert decays == [(0.1, [2]), (0.0, [1, 1, 1])]
    twin = [p.detach().clone().requires_grad_() for p in model.parameters()]
    loop = torch.optim.AdamW(
        [{"params": twin[:1], "weight_decay": 0.1}, {"params": twin[1:], "weight_decay": 0.0}],
        lr=0.01, betas=(config.beta1, config.beta2), foreach=False,
    )
    for p, q in zip(model.parameters(), twin, strict=True):
        p.grad = torch.randn_like(p)
        q.grad = p.grad.clone()
    optimizer.step()
    loop.step()
    for p, q in zip(model.parameters(), twin, strict=True):
        # One float32 step each, randn gradients (|g| >> eps): a handful of roundings per
        # element in each implementation; rtol 1e-6 is 16 u, atol covers values near 0.
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


def _model_with_gradients() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    model(torch.randn(5, 3)).pow(2).sum().backward()
    return model


def test_gradient_norm_is_the_norm_of_every_gradient_together_before_clipping():
    model = _model_with_gradients()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    whole = torch.linalg.vector_norm(grads)  # the definition, over one flat vector
    assert torch.equal(gradient_norm(model, clip=0.0), gradient_norm(model, clip=0.0))
    torch.testing.assert_close(gradient_norm(model, clip=0.0), whole)  # float32 sums reordered
    assert torch.equal(torch.cat([p.grad.flatten() for p in model.parameters()]), grads)


def test_gradient_norm_with_a_clip_returns_the_norm_before_and_clips_the_gradients():
    model = _model_with_gradients()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    clip = float(torch.linalg.vector_norm(grads)) / 4
    before = gradient_norm(model, clip=clip)
    torch.testing.assert_close(before, torch.linalg.vector_norm(grads))
    after = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in model.parameters()]))
    torch.testing.assert_close(after, torch.tensor(clip))  # scaled by clip / norm (+1e-6)


def test_clip_factor_is_what_clipping_multiplied_every_gradient_by():
    """Provenance: torch's clip_grad_norm_ itself; it multiplies each gradient by one float32
    scalar, and clip_factor computes that scalar the same way, so the clipped gradients equal
    the unclipped ones times it bit for bit."""
    model = _model_with_gradients()
    unclipped = [p.grad.clone() for p in model.parameters()]
    total = float(torch.linalg.vector_norm(torch.cat([g.flatten() for g in unclipped])))
    for clip, clipped in ((total / 4, True), (total * 4, False)):
        for p, g in zip(model.parameters(), unclipped, strict=True):
            p.grad = g.clone()
        norm = gradient_norm(model, clip=clip)
        factor = clip_factor(norm, clip)
        assert (float(factor) < 1) == clipped and float(factor) <= 1
        for p, g in zip(model.parameters(), unclipped, strict=True):
            assert torch.equal(p.grad, g * factor)
    assert float(clip_factor(torch.tensor(5.0), 0.0)) == 1.0  # no clipping
