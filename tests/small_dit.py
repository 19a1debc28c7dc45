"""A small DiT config and a perturbation of every weight, shared by the conversion tests of the
reference DiT layout and of diffusers (a zero-initialised weight, perturbed, cannot hide a
modulation or gating bug)."""

from __future__ import annotations

import torch

from addnorm.dit import DiTConfig


def perturbed(model: torch.nn.Module, seed: int = 0, scale: float = 0.1) -> torch.nn.Module:
    """Every parameter moved off its initial value (the zero-initialised ones too)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen).to(p.dtype))
    return model


def config(learn_sigma: bool) -> DiTConfig:
    return DiTConfig(input_size=8, patch_size=2, in_channels=4, d_model=32, n_layers=2,
                     n_heads=4, n_classes=5, class_dropout=0.1, learn_sigma=learn_sigma)
