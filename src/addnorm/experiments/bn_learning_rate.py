"""Seed post 000, on BatchNorm's pros: "the learning rate can be set large, which speeds up
training; it solves gradient vanishing/exploding, so training is less sensitive to the
learning rate" (learning rate 크게 설정하여 학습속도 증가 / gradient vanishing/exploding 문제
해결 ⇒ learning rate에 덜 민감); and on LayerNorm's cons: "training can be slower than with
BN" (BN에 비해 학습 속도 느릴 수 있음).

The MLP of :mod:`digits_mlp` without norm, with BatchNorm and with LayerNorm after each hidden
Linear, trained by plain SGD at every learning rate of ``LRS`` (half a decade apart, from a
rate too small for any net to reach the target in time to one where most diverge), with
``repeats.N_RUNS`` seeds each. A run *trains* when it reaches ``TARGET`` test accuracy within
the run (90%: a logistic regression on the same pixels reaches 96%, a net stuck on its
initial plateau or diverged sits near 10%). Per seed, three numbers:

* the largest learning rate at which the run trains;
* how many of the learning rates it trains at (the sensitivity to the rate);
* its fastest time to the target over the learning rates (steps; one evaluation past the
  end if never).

The claim holds when, beyond the spread over seeds (:mod:`repeats`), BatchNorm trains at a
larger rate than the plain net, at more rates, and reaches the target sooner; and LayerNorm
reaches it later than BatchNorm. If the plain net trains at no rate at all (the quick run's
100 steps), it has no largest rate to compare: the verdict is undecided unless one of the
other comparisons already fails.
"""

from __future__ import annotations

from addnorm.experiments.digits_mlp import NORMS, NormFactory, make_mlp, steps_to, train
from addnorm.experiments.outcome import Outcome, new_figure
from addnorm.experiments.repeats import N_RUNS, draw_runs, larger, smaller, spread

NAME = "bn-learning-rate"
CLAIM = (
    "BatchNorm lets the learning rate be set large, which speeds up training, and makes "
    "training less sensitive to the learning rate; LayerNorm can train more slowly than "
    "BatchNorm."
)
SEEDS = ("000",)  # the seed posts the claim comes from
PLAIN, BN, LN = "no norm", "BatchNorm", "LayerNorm"
LRS = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0)
TARGET, EVAL_EVERY = 0.9, 10
RANGE_PARTS = ("BatchNorm trains at a larger learning rate",
               "BatchNorm trains at more learning rates")


def sweep(norm: NormFactory, lrs: tuple[float, ...], n_steps: int) -> list[list[int | None]]:
    """Steps to ``TARGET`` (None: never) for each seed and learning rate: [seed][lr]."""
    return [[steps_to(train(make_mlp(norm, seed), lr=lr, n_steps=n_steps,
                            eval_every=EVAL_EVERY, seed=seed, stop_at=TARGET), TARGET)
             for lr in lrs] for seed in range(N_RUNS)]


def run(*, quick: bool = False, norms: dict[str, NormFactory] | None = None) -> Outcome:
    """``norms``: the factories behind "no norm", "BatchNorm" and "LayerNorm" (default
    :data:`NORMS`); the tests swap them to build a world where the claim is false."""
    norms = {name: NORMS[name] for name in (PLAIN, BN, LN)} | (norms or {})
    lrs, n_steps = ((0.3, 3.0), 100) if quick else (LRS, 400)
    never = n_steps + EVAL_EVERY
    steps = {name: sweep(norms[name], lrs, n_steps) for name in (PLAIN, BN, LN)}
    largest = {name: [max((lr for lr, s in zip(lrs, row, strict=True) if s is not None),
                          default=0.0) for row in runs] for name, runs in steps.items()}
    count = {name: [sum(s is not None for s in row) for row in runs]
             for name, runs in steps.items()}
    fastest = {name: [min((s for s in row if s is not None), default=never) for row in runs]
               for name, runs in steps.items()}
    parts = {
        RANGE_PARTS[0]: larger(largest[BN], largest[PLAIN]),
        RANGE_PARTS[1]: larger(count[BN], count[PLAIN]),
        "BatchNorm reaches the target sooner": smaller(fastest[BN], fastest[PLAIN]),
        "LayerNorm reaches it later than BatchNorm": larger(fastest[LN], fastest[BN]),
    }
    undecided_because = ""
    supported: bool | None = all(parts.values())
    if not any(count[PLAIN]):  # the plain net's range of working rates is unknown
        decidable = [ok for part, ok in parts.items() if part not in RANGE_PARTS]
        supported = None if all(decidable) else False
        undecided_because = "" if supported is False else (
            f"the plain net reached {TARGET:.0%} at no learning rate within {n_steps} steps, so "
            "its range of working rates is unknown and BatchNorm's cannot be called larger"
            + ("; the full run (without --quick) trains 400 steps at six rates" if quick else "")
        )

    fig = new_figure(13, 5)
    left, right = fig.subplots(1, 2, width_ratios=[1.6, 1])
    for name, marker in zip((PLAIN, BN, LN), "osD", strict=True):
        per_lr = [[float(_or_never(row[i], never)) for row in steps[name]]
                  for i in range(len(lrs))]
        draw_runs(left, list(lrs), per_lr, label=name, marker=marker)
    left.axhline(never, color="gray", linestyle=":", label=f"never within {n_steps} steps")
    left.set(title=f"Steps to {TARGET:.0%} test accuracy by learning rate",
             xlabel="SGD learning rate", ylabel="SGD steps (lower is faster)", xscale="log")
    left.set_xticks(list(lrs), [f"{lr:g}" for lr in lrs])
    left.minorticks_off()
    left.legend(fontsize=8)
    left.grid(alpha=0.3, which="both")
    names = (PLAIN, BN, LN)
    for i, name in enumerate(names):
        right.plot([i - 0.1] * N_RUNS, count[name], "o", color="tab:purple", alpha=0.7,
                   label="learning rates that train" if i == 0 else None)
    right.set_xticks(range(3), list(names))
    right.set(title=f"Of {len(lrs)} learning rates, how many reach {TARGET:.0%}",
              ylabel="count per seed (one dot each)", ylim=(-0.3, len(lrs) + 0.3))
    right.legend(fontsize=8)
    right.grid(alpha=0.3)
    headline = "; ".join(
        f"{name}: largest training lr {_range(largest[name])}, trains at {_range(count[name])} "
        f"of {len(lrs)} rates, fastest {_range(fastest[name], never)} steps"
        for name in names
    ) + " (" + "; ".join(f"{part}: {'yes' if ok else 'NO'}" for part, ok in parts.items()) + ")"
    return Outcome(
        name=NAME, claim=CLAIM, seeds=SEEDS, headline=headline, supported=supported, quick=quick,
        method=("ReLU MLP 64 -> 4 x 64 -> 10 on scikit-learn's digits (pixels / 16) without "
                "norm, with addnorm.BatchNorm and with addnorm.LayerNorm after each hidden "
                f"Linear; plain SGD (batch 64) at lr {', '.join(f'{lr:g}' for lr in lrs)}, up "
                f"to {n_steps} steps, seeds 0..{N_RUNS - 1}; test accuracy every {EVAL_EVERY} "
                f"steps; a run trains when it reaches {TARGET:.0%}. Each comparison over seeds "
                "must exceed the spread (rank-sum test at 5%: with 3 seeds, no overlap)."),
        numbers={"learning_rates": list(lrs), "target": TARGET, "n_steps": n_steps,
                 "steps_to_target": steps,
                 "largest_training_lr": {n: spread(v) for n, v in largest.items()},
                 "training_lr_count": {n: spread(v) for n, v in count.items()},
                 "fastest_steps": {n: spread(v) for n, v in fastest.items()},
                 "parts": parts},
        figure=fig, undecided_because=undecided_because,
    )


def _or_never(steps: int | None, never: int) -> int:
    return never if steps is None else steps


def _range(values: list, never: int | None = None) -> str:
    """min-max of a number over seeds; "never" past the run's end, "none" for no rate."""
    shown = [("never" if never is not None and v >= never else "none" if v == 0 else f"{v:g}")
             for v in (min(values), max(values))]
    return shown[0] if shown[0] == shown[1] else "-".join(shown)
