"""Claim 10 (seed post 003): BatchNorm speeds up training, also with noise injected after it.

Santurkar et al. (2018), "How does batch normalization help optimization?": a network with
BatchNorm trains faster than one without, and still does when non-stationary noise (a random
per-unit scale and shift, redrawn every step, as a deliberate "covariate shift") is injected
right after each BatchNorm. Here: a 4-hidden-layer ReLU MLP on scikit-learn's digits, plain
SGD, the same seed and batches for the three variants.
"""

from __future__ import annotations

import torch
from torch import nn

from addnorm.data.digits import load_digits
from addnorm.experiments.outcome import Outcome, new_figure
from addnorm.norms import BatchNorm

NAME = "bn-speed"
CLAIM = (
    "An MLP with BatchNorm trains faster than without, even with random noise injected "
    "after each BatchNorm to re-create covariate shift."
)
SEEDS = ("003",)  # the seed posts the claim comes from
WIDTH, DEPTH, BATCH, LR = 64, 4, 64, 0.05
VARIANTS = ("no norm", "BatchNorm", "BatchNorm + noise")
TARGET = 0.9  # test accuracy that counts as "trained"


class ShiftNoise(nn.Module):
    """y = a * x + b with a ~ U(0.5, 1.5) and b ~ N(0, 0.5^2) per unit, redrawn each call
    in training (Santurkar et al.'s "noisy BatchNorm"); the identity in evaluation."""

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


def make_mlp(variant: str, seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    noise_gen = torch.Generator().manual_seed(seed + 100)
    layers: list[nn.Module] = []
    d_in = 64
    for _ in range(DEPTH):
        layers.append(nn.Linear(d_in, WIDTH))
        if variant != "no norm":
            layers.append(BatchNorm(WIDTH))
        if variant == "BatchNorm + noise":
            layers.append(ShiftNoise(noise_gen))
        layers.append(nn.ReLU())
        d_in = WIDTH
    layers.append(nn.Linear(WIDTH, 10))
    return nn.Sequential(*layers)


def train(variant: str, n_steps: int, eval_every: int, seed: int = 0):
    """Training losses per step and (step, test accuracy) pairs."""
    train_set, test_set = load_digits("train"), load_digits("test")
    x_train = train_set.pixels.flatten(1) / 16  # (N, 64), pixels 0..1
    x_test = test_set.pixels.flatten(1) / 16
    model = make_mlp(variant, seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    gen = torch.Generator().manual_seed(seed + 1)
    losses, accuracies = [], []
    for step in range(1, n_steps + 1):
        index = torch.randint(len(train_set), (BATCH,), generator=gen)
        loss = nn.functional.cross_entropy(model(x_train[index]), train_set.labels[index])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if step % eval_every == 0:
            model.eval()
            with torch.no_grad():
                correct = (model(x_test).argmax(-1) == test_set.labels).float().mean()
            accuracies.append((step, correct.item()))
            model.train()
    return losses, accuracies


def steps_to(accuracies: list[tuple[int, float]], target: float) -> int | None:
    return next((step for step, acc in accuracies if acc >= target), None)


def run(*, quick: bool = False) -> Outcome:
    n_steps, eval_every = (100, 25) if quick else (1500, 25)
    runs = {variant: train(variant, n_steps, eval_every) for variant in VARIANTS}
    reach = {v: steps_to(acc, TARGET) for v, (_, acc) in runs.items()}
    mean_loss = {v: sum(losses) / len(losses) for v, (losses, _) in runs.items()}
    final_acc = {v: acc[-1][1] for v, (_, acc) in runs.items()}
    never = n_steps + 1
    plain = reach["no norm"] or never
    supported: bool | None = all(
        (reach[v] or never) < plain and mean_loss[v] < mean_loss["no norm"] for v in VARIANTS[1:]
    )
    undecided_because = ""
    if not any(reach.values()):  # no variant trained: nothing to say which trains faster
        supported = None
        undecided_because = (f"no variant reached {TARGET:.0%} test accuracy within {n_steps} "
                             "steps, so none can be said to train faster")

    fig = new_figure(13, 5)
    left, right = fig.subplots(1, 2)
    for variant, (losses, accuracies) in runs.items():
        left.plot(_smooth(losses), label=variant, linewidth=2)
        right.plot(*zip(*accuracies, strict=True), "o-", markersize=3, label=variant)
    left.set(title="Training loss (smoothed over 20 steps)", xlabel="SGD step",
             ylabel="cross-entropy (nats)", yscale="log")
    right.axhline(TARGET, color="gray", linestyle=":", label=f"{TARGET:.0%} target")
    right.set(title="Test accuracy on digits", xlabel="SGD step",
              ylabel="accuracy (fraction of test images)", ylim=(0, 1))
    for ax in (left, right):
        ax.legend()
        ax.grid(alpha=0.3, which="both")
    fig.suptitle(f"{DEPTH}-hidden-layer MLP (width {WIDTH}), SGD lr {LR}, batch {BATCH}")
    headline = f"steps to {TARGET:.0%} test accuracy: " + ", ".join(
        f"{v} {reach[v] if reach[v] else f'not within {n_steps}'}" for v in VARIANTS
    ) + "; final accuracy " + ", ".join(f"{v} {final_acc[v]:.3f}" for v in VARIANTS)
    return Outcome(
        name=NAME, claim=CLAIM, seeds=SEEDS, headline=headline, supported=supported, quick=quick,
        method=(f"ReLU MLP 64 -> {DEPTH} x {WIDTH} -> 10 on scikit-learn's digits (train "
                f"split, pixels / 16), {n_steps} plain SGD steps (lr {LR}, batch {BATCH}, seed "
                "0), without norm, with addnorm.BatchNorm after each hidden Linear, and with a "
                "random per-unit scale U(0.5, 1.5) and shift N(0, 0.5^2), redrawn every step, "
                f"after each BatchNorm; test accuracy every {eval_every} steps."),
        numbers={"steps_to_target": reach, "mean_train_loss": mean_loss,
                 "final_test_accuracy": final_acc, "target": TARGET, "n_steps": n_steps},
        figure=fig, undecided_because=undecided_because,
    )


def _smooth(values: list[float], width: int = 20) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v - (values[i - width] if i >= width else 0.0)
        out.append(total / min(i + 1, width))
    return out
