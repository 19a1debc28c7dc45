"""The small MLP on scikit-learn's digits that the normalization experiments train.

``bn-speed``, ``bn-learning-rate`` and ``loss-landscape`` share it: 64 pixels (scaled to
0..1) -> ``DEPTH`` hidden Linear layers of ``WIDTH`` units, each followed by a norm (or none)
and a ReLU -> 10 logits; plain SGD on seeded batches of ``BATCH`` training images; accuracy on
the fixed test split. A norm is injected as a factory ``width -> module`` (``NORMS``), so an
experiment's test can swap one in for another and build a world where its claim is false.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TypeVar

import torch
from torch import nn

from addnorm.data.digits import load_digits
from addnorm.norms import BatchNorm, LayerNorm

__all__ = ["BATCH", "DEPTH", "NORMS", "WIDTH", "NormFactory", "Run", "ShiftNoise", "make_mlp",
           "nudged", "steps_to", "train"]

WIDTH, DEPTH, BATCH = 64, 4, 64
NormFactory = Callable[[int], nn.Module]
NORMS: dict[str, NormFactory] = {
    "no norm": lambda width: nn.Identity(),
    "BatchNorm": BatchNorm,
    "LayerNorm": LayerNorm,
}
ModuleT = TypeVar("ModuleT", bound=nn.Module)
# Called after each step's backward pass, before the optimizer moves (the loss-landscape probe).
StepProbe = Callable[[int, nn.Module, torch.Tensor, torch.Tensor], None]


class ShiftNoise(nn.Module):
    """y = a * x + b with a ~ U(0.5, 1.5) and b ~ N(0, 0.5^2) per unit, redrawn each call in
    training (Santurkar et al.'s "noisy BatchNorm"); the identity in evaluation."""

    def __init__(self, generator: torch.Generator) -> None:
        super().__init__()
        self.generator = generator

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Shapes: x (B, D) -> (B, D)."""
        if not self.training:
            return x
        scale = torch.rand(x.shape[-1], generator=self.generator) + 0.5  # (D,)
        shift = torch.randn(x.shape[-1], generator=self.generator) * 0.5  # (D,)
        return x * scale + shift


def make_mlp(norm: NormFactory, seed: int, *, noise: bool = False,
             nudge: int = 0) -> nn.Sequential:
    """The MLP with ``norm(WIDTH)`` after each hidden Linear (and :class:`ShiftNoise` after
    it when ``noise``), initialised from ``seed``; with ``nudge`` > 0, every initial weight
    then moves by one float32 ulp, up or down as a generator seeded by ``nudge`` draws:
    the size of the rounding by which two CPUs' runs first differ, to see whether a result
    survives it (:func:`nudged`)."""
    model = _mlp(norm, seed, noise=noise)
    return nudged(model, nudge) if nudge else model


def nudged(model: ModuleT, draw: int) -> ModuleT:
    """``model`` with each parameter moved by one ulp toward +inf or -inf, chosen per entry by
    a generator seeded by ``draw``; returns the model."""
    gen = torch.Generator().manual_seed(draw)
    with torch.no_grad():
        for p in model.parameters():
            up = torch.rand(p.shape, generator=gen) < 0.5
            p.copy_(torch.nextafter(p, torch.where(up, torch.inf, -torch.inf)))
    return model


def _mlp(norm: NormFactory, seed: int, *, noise: bool) -> nn.Sequential:
    torch.manual_seed(seed)
    noise_gen = torch.Generator().manual_seed(seed + 100)
    layers: list[nn.Module] = []
    d_in = 64
    for _ in range(DEPTH):
        layers += [nn.Linear(d_in, WIDTH), norm(WIDTH)]
        if noise:
            layers.append(ShiftNoise(noise_gen))
        layers.append(nn.ReLU())
        d_in = WIDTH
    layers.append(nn.Linear(WIDTH, 10))
    return nn.Sequential(*layers)


@lru_cache(maxsize=1)
def _digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Training pixels and labels, test pixels and labels; pixels flattened to 0..1."""
    train_set, test_set = load_digits("train"), load_digits("test")
    return (train_set.pixels.flatten(1) / 16, train_set.labels,
            test_set.pixels.flatten(1) / 16, test_set.labels)


@dataclass
class Run:
    """One training run: the loss of every step and (step, test accuracy) pairs."""

    losses: list[float] = field(default_factory=list)
    accuracies: list[tuple[int, float]] = field(default_factory=list)

    @property
    def diverged(self) -> bool:
        """Whether the loss became NaN or infinite."""
        return not all(torch.isfinite(torch.tensor(self.losses)).tolist())


def train(model: nn.Module, *, lr: float, n_steps: int, eval_every: int, seed: int,
          probe: StepProbe | None = None, stop_at: float | None = None) -> Run:
    """``n_steps`` of plain SGD on batches drawn from ``seed``; stops early on a NaN loss,
    and at the first evaluation whose test accuracy reaches ``stop_at`` if given."""
    x_train, y_train, x_test, y_test = _digits()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed + 1)
    run = Run()
    model.train()
    for step in range(1, n_steps + 1):
        index = torch.randint(len(y_train), (BATCH,), generator=gen)
        x, y = x_train[index], y_train[index]
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        if probe is not None:
            probe(step, model, x, y)
        optimizer.step()
        run.losses.append(loss.item())
        if not torch.isfinite(loss):
            break
        if step % eval_every == 0:
            model.eval()
            with torch.no_grad():
                correct = (model(x_test).argmax(-1) == y_test).float().mean().item()
            run.accuracies.append((step, correct))
            if stop_at is not None and correct >= stop_at:
                break
            model.train()
    return run


def steps_to(run: Run, target: float) -> int | None:
    """The first evaluated step at which test accuracy reached ``target``; None if never."""
    return next((step for step, acc in run.accuracies if acc >= target), None)
