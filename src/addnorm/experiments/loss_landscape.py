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
of ``LRS``, ``N_SEEDS`` seeds (``repeats.N_RUNS`` in the quick run); a run's number is the
mean over its probes. The claim is decided at each rate on its own (an
:class:`~addnorm.experiments.outcome.Condition`): it holds there when BatchNorm's loss
variation and gradient change are both smaller than the plain net's beyond the spread over
seeds (:mod:`repeats`). The verdict is *supported* when it holds at every rate compared,
*not supported* when at none, and *mixed* when the rates disagree. The run also tests
LayerNorm, the norm of the Transformer's Add & Norm, in BatchNorm's place: a reading the seed
does not make, decided the same way and reported on its own.

Forty-eight seeds, where the other training experiments take three. At lr 0.3 the plain net
trains at the edge of stability: its loss spikes, and where the spikes fall is chaotic, so one
rounding difference in the initial weights (another CPU's kernels) gives a seed another run.
Its measures are then draws from a distribution rather than fixed per seed, and a verdict is
the same on every CPU only where it holds by a wide margin over that distribution: with twelve
seeds the LayerNorm reading at lr 0.3 did not (supported on one CPU, not on another).
``run(nudge=k)`` moves every initial weight by one ulp, as drawn by ``k``, to rerun the
experiment as another CPU would; ``benchmarks/landscape_nudges.py`` records the verdicts and
p-values over such draws (``docs/landscape-nudges.json``; ``docs/experiments.md`` gives them).
A run's mean over its probes follows the spikes; the median over its probes, reported beside
it, follows a typical step.

A rate is compared only where every seed of both nets has learned something: test accuracy
above what a guess unrelated to the digits reaches on the test split (the largest class's
share) beyond the test set's sampling noise (one-sided binomial test at
``repeats.SIGNIFICANCE``: 0.134 on the 359 test digits). A net that has learned nothing has
a flat landscape for want of training, which says nothing about smoothness; that is why the
quick run's 40 steps decide nothing. Past that, the measures are taken as they come: they
scale with the gradient, so a plain net still near its initial plateau (the default
initialisation of this 4-layer ReLU net trains slowly; at lr 0.1 it ends far below
BatchNorm's net in test accuracy) has a flatter landscape than BatchNorm's, whose net has
trained. Where that line is drawn decides the verdict: the outcome's :class:`Sensitivity`
gives the verdicts of the same runs with the line at 0 (every rate compared), 0.2 and 0.3
(where the plain net's lr-0.1 runs drop out and BatchNorm is decided on lr 0.3 alone).
"""

from __future__ import annotations

import math
import statistics

import torch
from torch import nn

from addnorm.data.digits import load_digits
from addnorm.experiments.digits_mlp import NORMS, NormFactory, make_mlp, train
from addnorm.experiments.outcome import (
    Condition,
    Outcome,
    Reading,
    Sensitivity,
    combine,
    new_figure,
    verdict_of,
)
from addnorm.experiments.repeats import N_RUNS, SIGNIFICANCE, larger, smaller, spread

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
MEDIANS = tuple(f"median {m}" for m in DECIDING)  # per run over its probes; reported
N_SEEDS = 48  # seeds per net and rate in the full run (module docstring)
# Other lines between "has learned nothing" and "has trained", shown beside the rule's own
# (:func:`learned_threshold`): 0 compares every rate; 0.3 was this experiment's rule before.
THRESHOLDS = (0.0, 0.2, 0.3)


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


def measure(norm: NormFactory, lr: float, n_steps: int, every: int, seed: int,
            nudge: int = 0) -> dict[str, float]:
    """The three measures of one training run, each averaged over its probes, the deciding
    ones' medians over its probes too (``"median ..."``, reported), and its test accuracy at
    the end (``"accuracy"``: whether it has learned something). ``nudge``: see
    :func:`digits_mlp.make_mlp`."""
    record: list[tuple[float, float, float]] = []
    run = train(make_mlp(norm, seed, nudge=nudge), lr=lr, n_steps=n_steps, eval_every=n_steps,
                seed=seed, probe=landscape_probe(lr, every, record))
    means = {m: sum(r[i] for r in record) / len(record) for i, m in enumerate(MEASURES)}
    medians = {f"median {m}": statistics.median(r[i] for r in record)
               for i, m in enumerate(DECIDING)}
    return means | medians | {"accuracy": run.accuracies[-1][1] if run.accuracies else 0.0}


def learned_threshold() -> float:
    """The lowest test accuracy that shows a net has learned something: above what a guess
    unrelated to the digits gets on the test split (in expectation at most the largest
    class's share) beyond sampling noise: the smallest k / n with P(Binomial(n, share) >= k)
    <= ``repeats.SIGNIFICANCE``, n the test split's size."""
    labels = load_digits("test").labels
    n = len(labels)
    share = torch.bincount(labels).max().item() / n
    tail = 1.0
    for k in range(n + 1):  # tail = P(X >= k)
        if tail <= SIGNIFICANCE:
            return k / n
        tail -= math.comb(n, k) * share**k * (1 - share) ** (n - k)
    return 1.0


def run(*, quick: bool = False, norms: dict[str, NormFactory] | None = None,
        n_seeds: int | None = None, nudge: int = 0) -> Outcome:
    """``norms``: the factories behind "no norm", "BatchNorm" and "LayerNorm" (default
    :data:`NORMS`); the tests swap them to build a world where the claim is false.
    ``n_seeds``: seeds per net and rate (default ``N_SEEDS``, quick ``repeats.N_RUNS``);
    ``nudge``: every initial weight one ulp off, as drawn by ``nudge`` (0: none), to check
    that the verdicts survive the rounding by which two CPUs differ."""
    norms = {name: NORMS[name] for name in (PLAIN, BN, LN)} | (norms or {})
    n_steps, every, default_seeds = (40, 10, N_RUNS) if quick else (200, 20, N_SEEDS)
    n_seeds = default_seeds if n_seeds is None else n_seeds
    kept = (*MEASURES, *MEDIANS, "accuracy")
    # values[name][measure][lr index] = one number per seed
    values: dict[str, dict[str, list[list[float]]]] = {
        name: {m: [] for m in kept} for name in (PLAIN, BN, LN)}
    for name in (PLAIN, BN, LN):
        for lr in LRS:
            runs = [measure(norms[name], lr, n_steps, every, seed, nudge)
                    for seed in range(n_seeds)]
            for m in kept:
                values[name][m].append([r[m] for r in runs])
    learned = learned_threshold()
    thresholds = tuple(sorted({learned, *THRESHOLDS}))
    by_threshold = {name: {t: _conditions(values, name, t) for t in thresholds}
                    for name in (BN, LN)}
    ln_conditions = by_threshold[LN][learned]
    ln_supported, ln_undecided = combine(ln_conditions)
    layer_norm = Reading(
        claim=LAYERNORM_READING, supported=ln_supported, undecided_because=ln_undecided,
        headline=_summary(values, LN, ln_conditions, n_seeds), conditions=ln_conditions,
    )
    conditions = by_threshold[BN][learned]
    supported, undecided_because = combine(conditions)
    sensitivity = Sensitivity(
        setting=("the test accuracy every seed of both nets must reach at a learning rate for "
                 f"the rate to be compared (the rule: {learned:.3g}, above a guess unrelated "
                 f"to the digits beyond the test set's sampling noise)"),
        values=thresholds, used=learned,
        rows=tuple((f"{name}{label}", tuple(verdict_of(by_threshold[name][t])
                                            for t in thresholds))
                   for name, label in ((BN, " (the seed's claim)"), (LN, " (also tested)"))),
        notes=tuple(_compared_note(by_threshold, t) for t in thresholds),
    )
    headline = _summary(values, BN, conditions, n_seeds)
    return Outcome(
        name=NAME, claim=CLAIM, seeds=SEEDS, headline=headline,
        supported=supported, undecided_because=undecided_because, quick=quick,
        method=("ReLU MLP 64 -> 4 x 64 -> 10 on scikit-learn's digits, without norm, with "
                "addnorm.BatchNorm and with addnorm.LayerNorm after each hidden Linear; plain "
                f"SGD (batch 64) at lr {' and '.join(f'{lr:g}' for lr in LRS)} for {n_steps} "
                f"steps, seeds 0..{n_seeds - 1}. Every {every} steps, from the weights w and "
                "the batch gradient g: loss and gradient at w - eta g, eta = "
                f"{', '.join(f'{e:g}' for e in ETAS)} x lr, on the same batch (Santurkar et "
                "al.'s Fig. 4). Decided at each rate on its own: smoother = smaller loss "
                "variation and gradient change beyond the spread over seeds (rank-sum test at "
                f"{SIGNIFICANCE:.0%}), at a rate where every seed of both nets has learned "
                f"something (test accuracy >= {learned:.3g}); supported where every rate "
                "compared agrees, not supported where none does, mixed where they disagree."),
        numbers={"learning_rates": list(LRS), "etas": list(ETAS), "n_steps": n_steps,
                 "n_seeds": n_seeds, "learned_threshold": learned,
                 "measures": {name: {m: {f"{lr:g}": spread(v) for lr, v in zip(
                     LRS, per_lr, strict=True)} for m, per_lr in by_m.items()}
                     for name, by_m in values.items()},
                 "smoother_than_plain": {
                     name: {f"{m} at lr {lr:g}": smaller(values[name][m][i],
                                                          values[PLAIN][m][i])
                            for m in DECIDING for i, lr in enumerate(LRS)}
                     for name in (BN, LN)}},
        figure=_figure(values, n_seeds, {BN: conditions, LN: ln_conditions}),
        also=(layer_norm,), conditions=conditions, sensitivity=sensitivity,
    )


def _conditions(values, name: str, threshold: float) -> tuple[Condition, ...]:
    """The claim for ``name`` at each rate: compared where every seed of both nets reached
    ``threshold``; there, smoother when both deciding measures are smaller beyond the
    spread."""
    conditions = []
    for i, lr in enumerate(LRS):
        headline = _at_rate(values, name, i)
        lowest = {net: min(values[net]["accuracy"][i]) for net in (PLAIN, name)}
        if min(lowest.values()) < threshold:
            conditions.append(Condition(
                name=f"lr {lr:g}", supported=None, headline=headline,
                undecided_because=(f"a net had learned nothing to compare (lowest test "
                                   f"accuracy over seeds: {lowest[PLAIN]:.3g} without norm, "
                                   f"{lowest[name]:.3g} with {name}; needed "
                                   f"{threshold:.3g})")))
            continue
        smoother = all(smaller(values[name][m][i], values[PLAIN][m][i]) for m in DECIDING)
        conditions.append(Condition(name=f"lr {lr:g}", supported=smoother, headline=headline))
    return tuple(conditions)


def _at_rate(values, name: str, i: int) -> str:
    """Both deciding measures and the test accuracies at ``LRS[i]``, ``name`` vs no norm."""
    smoother = all(smaller(values[name][m][i], values[PLAIN][m][i]) for m in DECIDING)
    rougher = all(larger(values[name][m][i], values[PLAIN][m][i]) for m in DECIDING)
    word = ("smoother" if smoother else "rougher" if rougher
            else "neither smoother nor rougher beyond the spread")
    measures = ", ".join(f"{m} {name} {_range(values[name][m][i])} vs no norm "
                         f"{_range(values[PLAIN][m][i])}" for m in DECIDING)
    return (f"{name} {word}: {measures}; test accuracy {name} "
            f"{_range(values[name]['accuracy'][i])}, no norm "
            f"{_range(values[PLAIN]['accuracy'][i])}")


def _summary(values, name: str, conditions: tuple[Condition, ...], n_seeds: int) -> str:
    parts = [f"{c.name}: {c.headline}" + ("" if c.supported is not None
                                           else " (not compared: a net learned nothing)")
             for c in conditions]
    return f"{'; '.join(parts)} ({n_seeds} seeds, min-max): {verdict_of(conditions)}"


def _compared_note(by_threshold, threshold: float) -> str:
    rates = {name: [c.name for c in by[threshold] if c.supported is not None]
             for name, by in by_threshold.items()}
    return "; ".join(f"{name} compared at {', '.join(r) if r else 'no rate'}"
                     for name, r in rates.items())


def _range(values: list[float]) -> str:
    return f"{min(values):.3g}-{max(values):.3g}"


def _figure(values, n_seeds: int, conditions: dict[str, tuple[Condition, ...]]):
    fig = new_figure(15, 5.5)
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
        ax.set_xticks(range(len(LRS)), [
            f"lr {lr:g}\n" + "\n".join(f"{name}: {by[i].verdict}"
                                        for name, by in conditions.items())
            for i, lr in enumerate(LRS)])
        ax.set(yscale="log", title=m + (" (decides)" if m in DECIDING else " (reported)"),
               ylabel={"loss variation": "max - min loss along the gradient (nats)",
                       "gradient change": "max ||grad(w - eta g) - g||",
                       "beta-smoothness": "max ||grad(w - eta g) - g|| / ||eta g||"}[m])
        ax.grid(alpha=0.3, which="both", axis="y")
        ax.legend(fontsize=8)
    fig.suptitle(f"Loss landscape along the gradient during training (bars: mean of {n_seeds} "
                 "seeds; lines: min-max; dots: each seed)")
    return fig
