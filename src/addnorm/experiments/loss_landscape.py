"""Seed post 003, on Santurkar et al. (2018): the paper explains BatchNorm's benefit by "a
smoothing effect: the loss landscape becomes much more predictable, which makes training more
effective" (논문에서는 Batch Norm의 Smoothing 효과 때문이라고 설명합니다. Loss Landscape가 훨씬 더
예측 가능한 범위로 형성되면서 학습효과가 증대된다고 말하고 있습니다).

Santurkar et al.'s Fig. 4 measures, during training, at every ``PROBE_EVERY``-th step: from
the current weights w and the batch's gradient g, the weights w - eta g for eta in ``ETAS``
times the learning rate (the step SGD takes, halved to quadrupled), on the same batch:

* loss variation: max - min of the loss over those points (and w itself);
* gradient predictiveness: max ||grad(w - eta g) - g||, how far the gradient a step away is
  from the one that chose the step;
* effective beta-smoothness: max ||grad(w - eta g) - g|| / ||eta g|| (reported, not decided on).

The MLP of :mod:`digits_mlp` without norm and with BatchNorm, plain SGD at each learning rate
of ``LRS`` (so that no single rate decides), ``repeats.N_RUNS`` seeds; a run's number is the
mean over its probes. The claim holds when, at every rate, BatchNorm's loss variation and
gradient change are both smaller than the plain net's beyond the spread over seeds
(:mod:`repeats`). The run also tests LayerNorm, the norm of the Transformer's Add & Norm, in
BatchNorm's place: a reading the seed does not make, reported on its own.

The measures scale with the gradient: a plain net still near its initial plateau (the
default initialisation of this 4-layer ReLU net trains slowly at lr 0.1) has small gradients
and a flat landscape there. The verdict takes that as measured: the claim says BatchNorm's
landscape is the smoother one, and at such a rate it is not. The headline gives each net's
final test accuracy so a reader can see where each one was.
"""

from __future__ import annotations

import torch
from torch import nn

from addnorm.experiments.digits_mlp import NORMS, NormFactory, make_mlp, train
from addnorm.experiments.outcome import Outcome, Reading, new_figure
from addnorm.experiments.repeats import N_RUNS, smaller, spread

NAME = "loss-landscape"
CLAIM = (
    "BatchNorm helps through a smoothing effect: the loss landscape becomes much more "
    "predictable, which makes training more effective."
)
LAYERNORM_READING = (
    "The same holds for LayerNorm, the norm in the Transformer's Add & Norm: its loss "
    "landscape is smoother (more predictable) than the plain net's."
)
SEEDS = ("003",)  # the seed posts the claim comes from
PLAIN, BN, LN = "no norm", "BatchNorm", "LayerNorm"
LRS = (0.1, 0.3)
ETAS = (0.5, 1.0, 2.0, 4.0)
MEASURES = ("loss variation", "gradient change", "beta-smoothness")
DECIDING = MEASURES[:2]


def _loss_and_grad(model: nn.Module, params: list[nn.Parameter], x: torch.Tensor,
                   y: torch.Tensor) -> tuple[float, list[torch.Tensor]]:
    loss = nn.functional.cross_entropy(model(x), y)
    grads = torch.autograd.grad(loss, params)
    return loss.item(), list(grads)


def _norm(tensors: list[torch.Tensor]) -> float:
    return torch.cat([t.flatten() for t in tensors]).norm().item()


def landscape_probe(lr: float, every: int, record: list[tuple[float, float, float]]):
    """A :data:`digits_mlp.StepProbe` appending (loss variation, gradient change, beta) at
    every ``every``-th step; weights, gradients and BatchNorm's running statistics are put
    back as they were, so training goes on undisturbed."""

    def probe(step: int, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
        if step % every:
            return
        params = [p for p in model.parameters() if p.grad is not None]
        start = [p.detach().clone() for p in params]
        grad = [p.grad.detach().clone() for p in params if p.grad is not None]
        buffers = [b.clone() for b in model.buffers()]
        with torch.no_grad():
            losses = [nn.functional.cross_entropy(model(x), y).item()]
        changes, betas = [], []
        grad_norm = _norm(grad)
        for eta in ETAS:
            with torch.no_grad():
                for p, p0, g in zip(params, start, grad, strict=True):
                    p.copy_(p0 - eta * lr * g)
            loss, moved = _loss_and_grad(model, params, x, y)
            change = _norm([a - b for a, b in zip(moved, grad, strict=True)])
            losses.append(loss)
            changes.append(change)
            betas.append(change / (eta * lr * grad_norm))
        with torch.no_grad():
            for p, p0 in zip(params, start, strict=True):
                p.copy_(p0)
            for b, b0 in zip(model.buffers(), buffers, strict=True):
                b.copy_(b0)
        record.append((max(losses) - min(losses), max(changes), max(betas)))

    return probe


def measure(norm: NormFactory, lr: float, n_steps: int, every: int, seed: int
            ) -> dict[str, float]:
    """The three measures of one training run, each averaged over its probes, and its test
    accuracy at the end (``"accuracy"``: whether it has left its initial plateau)."""
    record: list[tuple[float, float, float]] = []
    run = train(make_mlp(norm, seed), lr=lr, n_steps=n_steps, eval_every=n_steps, seed=seed,
                probe=landscape_probe(lr, every, record))
    means = {m: sum(r[i] for r in record) / len(record) for i, m in enumerate(MEASURES)}
    return means | {"accuracy": run.accuracies[-1][1] if run.accuracies else 0.0}


# Test accuracy at which a run has left its initial plateau: three times chance (0.1), well
# above what a net on its plateau reaches (0.10-0.26 in 40 steps here), far below what
# training reaches (a logistic regression: 0.96).
LEARNED = 0.3


def run(*, quick: bool = False, norms: dict[str, NormFactory] | None = None) -> Outcome:
    """``norms``: the factories behind "no norm", "BatchNorm" and "LayerNorm" (default
    :data:`NORMS`); the tests swap them to build a world where the claim is false."""
    norms = {name: NORMS[name] for name in (PLAIN, BN, LN)} | (norms or {})
    n_steps, every = (40, 10) if quick else (200, 20)
    # values[name][measure][lr index] = one number per seed
    values: dict[str, dict[str, list[list[float]]]] = {
        name: {m: [] for m in (*MEASURES, "accuracy")} for name in (PLAIN, BN, LN)}
    for name in (PLAIN, BN, LN):
        for lr in LRS:
            runs = [measure(norms[name], lr, n_steps, every, seed) for seed in range(N_RUNS)]
            for m in (*MEASURES, "accuracy"):
                values[name][m].append([r[m] for r in runs])

    def learned(name: str, i: int) -> bool:
        """Whether every seed of ``name`` at ``LRS[i]`` left its initial plateau: on a
        plateau nothing moves, so its landscape is flat for want of training, which says
        nothing about smoothness."""
        return min(values[name]["accuracy"][i]) >= LEARNED

    def smoother(name: str) -> dict[str, bool]:
        return {f"{m} at lr {lr:g}": smaller(values[name][m][i], values[PLAIN][m][i])
                for m in DECIDING for i, lr in enumerate(LRS)
                if learned(name, i) and learned(PLAIN, i)}

    def verdict(name: str) -> tuple[bool | None, str]:
        if not checks[name]:
            return None, (f"at no learning rate did both the net without norm and the one with "
                          f"{name} leave their initial plateau (test accuracy >= {LEARNED:g} "
                          f"for every seed) in {n_steps} steps, so there is no training whose "
                          "landscape to compare")
        return all(checks[name].values()), ""

    checks = {name: smoother(name) for name in (BN, LN)}
    ln_supported, ln_undecided = verdict(LN)
    layer_norm = Reading(
        claim=LAYERNORM_READING, supported=ln_supported, undecided_because=ln_undecided,
        headline=_summary(values, LN, checks[LN]),
    )
    headline = _summary(values, BN, checks[BN])
    supported, undecided_because = verdict(BN)
    return Outcome(
        name=NAME, claim=CLAIM, seeds=SEEDS, headline=headline,
        supported=supported, undecided_because=undecided_because, quick=quick,
        method=("ReLU MLP 64 -> 4 x 64 -> 10 on scikit-learn's digits, without norm, with "
                "addnorm.BatchNorm and with addnorm.LayerNorm after each hidden Linear; plain "
                f"SGD (batch 64) at lr {' and '.join(f'{lr:g}' for lr in LRS)} for {n_steps} "
                f"steps, seeds 0..{N_RUNS - 1}. Every {every} steps, from the weights w and the "
                f"batch gradient g: loss and gradient at w - eta g, eta = "
                f"{', '.join(f'{e:g}' for e in ETAS)} x lr, on the same batch (Santurkar et "
                "al.'s Fig. 4). Smoother = smaller loss variation and gradient change at every "
                "rate where every seed of both nets left its initial plateau (test accuracy "
                f">= {LEARNED:g}), beyond the spread over seeds (rank-sum test at 5%: no "
                "overlap)."),
        numbers={"learning_rates": list(LRS), "etas": list(ETAS), "n_steps": n_steps,
                 "measures": {name: {m: {f"{lr:g}": spread(v) for lr, v in zip(
                     LRS, per_lr, strict=True)} for m, per_lr in by_m.items()}
                     for name, by_m in values.items()},
                 "smoother_than_plain": checks},
        figure=_figure(values), also=(layer_norm,),
    )


def _summary(values, name: str, checks: dict[str, bool]) -> str:
    parts = []
    for i, lr in enumerate(LRS):
        parts.append(f"lr {lr:g}: loss variation {name} " + _range(values[name][DECIDING[0]][i])
                     + " vs no norm " + _range(values[PLAIN][DECIDING[0]][i])
                     + f", gradient change {name} " + _range(values[name][DECIDING[1]][i])
                     + " vs no norm " + _range(values[PLAIN][DECIDING[1]][i]))
    failed = [check for check, ok in checks.items() if not ok]
    compared = [lr for lr in LRS if any(key.endswith(f" at lr {lr:g}") for key in checks)]
    skipped = [f"{lr:g}" for lr in LRS if lr not in compared]
    verdict = ("no comparison (no rate where both nets left their plateau)" if not checks
               else "smoother in every comparison" if not failed
               else "not smoother in: " + ", ".join(failed))
    if checks and skipped:
        verdict += (f" (compared at lr {', '.join(f'{lr:g}' for lr in compared)} only: at lr "
                    f"{', '.join(skipped)} a net had not left its initial plateau)")
    accuracy = ", ".join(f"lr {lr:g} {_range(values[PLAIN]['accuracy'][i])} vs "
                         f"{_range(values[name]['accuracy'][i])}" for i, lr in enumerate(LRS))
    return (f"{'; '.join(parts)} ({N_RUNS} seeds, min-max): {name} {verdict}; test accuracy "
            f"at the end, no norm vs {name}: {accuracy}")


def _range(values: list[float]) -> str:
    return f"{min(values):.3g}-{max(values):.3g}"


def _figure(values):
    fig = new_figure(15, 5)
    axes = fig.subplots(1, len(MEASURES))
    names = (PLAIN, BN, LN)
    colors = {PLAIN: "tab:blue", BN: "tab:orange", LN: "tab:green"}
    width = 0.25
    for ax, m in zip(axes, MEASURES, strict=True):
        for j, name in enumerate(names):
            for i in range(len(LRS)):
                runs = values[name][m][i]
                x = i + (j - 1) * width
                ax.bar(x, sum(runs) / len(runs), width * 0.9, color=colors[name], alpha=0.5,
                       label=name if i == 0 else None)
                ax.vlines(x, min(runs), max(runs), color="black", linewidth=1.5)
                ax.plot([x] * len(runs), runs, "k.", markersize=4)
        ax.set_xticks(range(len(LRS)), [f"lr {lr:g}" for lr in LRS])
        ax.set(yscale="log", title=m + (" (decides)" if m in DECIDING else " (reported)"),
               ylabel={"loss variation": "max - min loss along the gradient (nats)",
                       "gradient change": "max ||grad(w - eta g) - g||",
                       "beta-smoothness": "max ||grad(w - eta g) - g|| / ||eta g||"}[m])
        ax.grid(alpha=0.3, which="both", axis="y")
        ax.legend(fontsize=8)
    fig.suptitle(f"Loss landscape along the gradient during training (bars: mean of {N_RUNS} "
                 "seeds; lines: min-max; dots: each seed)")
    return fig
