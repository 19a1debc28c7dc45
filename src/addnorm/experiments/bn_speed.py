"""Seed post 003, on Santurkar et al. (2018), "How does batch normalization help
optimization?": the network with BatchNorm "rises to high accuracy on a steep curve", and
"even with noise put right after the BatchNorm layer to cause covariate shift, the network
with BatchNorm performed better than the ordinary network" (임의로 Batch Norm Layer 이후 바로
Noise를 넣어 covariate shift를 발생시켰을 때에도 BatchNorm을 적용한 네트워크는 일반적인
네트워크보다 성능이 우수함을 보였습니다).

The MLP of :mod:`digits_mlp` without norm, with BatchNorm after each hidden Linear, and with
BatchNorm followed by Santurkar et al.'s non-stationary noise (a random per-unit scale and
shift, redrawn every step); plain SGD at each learning rate of ``LRS`` (half a decade apart,
so that no single rate decides), ``repeats.N_RUNS`` seeds each. The number compared is the
number of steps to ``TARGET`` test accuracy (evaluated every ``EVAL_EVERY`` steps; a run that
never gets there counts as one evaluation past its end). At every learning rate both
BatchNorm variants must get there in fewer steps than the plain net, beyond the spread over
seeds (:mod:`repeats`).

``TARGET`` = 90%: a multinomial logistic regression on the same pixels reaches 96% on
this test split, so every net that learns the task passes 90%, while one that has not left
its initial plateau sits near chance (10%).
"""

from __future__ import annotations

from addnorm.experiments.digits_mlp import NORMS, NormFactory, make_mlp, steps_to, train
from addnorm.experiments.outcome import Outcome, new_figure
from addnorm.experiments.repeats import N_RUNS, draw_runs, smaller, spread

NAME = "bn-speed"
CLAIM = (
    "A network with BatchNorm reaches high accuracy faster than one without, and still "
    "performs better with noise injected right after each BatchNorm to create covariate "
    "shift."
)
SEEDS = ("003",)  # the seed posts the claim comes from
PLAIN, BN, NOISY = "no norm", "BatchNorm", "BatchNorm + noise"
LRS = (0.03, 0.1, 0.3)
TARGET, EVAL_EVERY = 0.9, 10


def steps_to_target(norm: NormFactory, noise: bool, lr: float, n_steps: int,
                    seed: int) -> tuple[int, list[tuple[int, float]]]:
    """Steps to ``TARGET`` (``n_steps + EVAL_EVERY`` if never) and the accuracy curve; the
    run stops at the target."""
    run = train(make_mlp(norm, seed, noise=noise), lr=lr, n_steps=n_steps,
                eval_every=EVAL_EVERY, seed=seed, stop_at=TARGET)
    reached = steps_to(run, TARGET)
    return (n_steps + EVAL_EVERY if reached is None else reached), run.accuracies


def run(*, quick: bool = False, norms: dict[str, NormFactory] | None = None) -> Outcome:
    """``norms``: the factories behind "no norm" and "BatchNorm" (default :data:`NORMS`);
    the tests swap them to build a world where the claim is false."""
    norms = {PLAIN: NORMS["no norm"], BN: NORMS["BatchNorm"], **(norms or {})}
    lrs, n_steps = ((0.1, 0.3), 100) if quick else (LRS, 400)
    variants = {PLAIN: (norms[PLAIN], False), BN: (norms[BN], False), NOISY: (norms[BN], True)}
    never = n_steps + EVAL_EVERY
    steps: dict[str, list[list[int]]] = {v: [] for v in variants}  # [lr][seed]
    curves: dict[str, list[list[tuple[int, float]]]] = {v: [] for v in variants}
    for variant, (norm, noise) in variants.items():
        for i, lr in enumerate(lrs):
            results = [steps_to_target(norm, noise, lr, n_steps, seed) for seed in range(N_RUNS)]
            steps[variant].append([s for s, _ in results])
            if i == len(lrs) // 2:
                curves[variant] = [c for _, c in results]
    per_lr: list[bool | None] = []
    for i in range(len(lrs)):
        plain = steps[PLAIN][i]
        if all(s == never for v in variants for s in steps[v][i]):
            per_lr.append(None)  # nothing reached the target: this rate cannot tell
        else:
            per_lr.append(all(smaller(steps[v][i], plain) for v in (BN, NOISY)))
    undecided_because = ""
    supported: bool | None = all(per_lr) if None not in per_lr else None
    if False in per_lr:
        supported = False
    elif supported is None:
        undecided_because = (f"at some learning rate no net reached {TARGET:.0%} test accuracy "
                             f"within {n_steps} steps, so none can be said to train faster")

    fig = new_figure(13, 5)
    left, right = fig.subplots(1, 2)
    for variant, marker in zip(variants, "osD", strict=True):
        draw_runs(left, list(lrs), steps[variant], label=variant, marker=marker)
    left.axhline(never, color="gray", linestyle=":", label=f"never within {n_steps} steps")
    left.set(title=f"Steps to {TARGET:.0%} test accuracy", xlabel="SGD learning rate",
             ylabel="SGD steps (lower is faster)", xscale="log")
    left.set_xticks(list(lrs), [f"{lr:g}" for lr in lrs])
    left.minorticks_off()
    mid = lrs[len(lrs) // 2]
    for variant, color in zip(variants, ("tab:blue", "tab:orange", "tab:green"), strict=True):
        for seed, curve in enumerate(curves[variant]):
            right.plot(*zip(*curve, strict=True), "o-", color=color, markersize=3, alpha=0.7,
                       label=f"{variant} ({N_RUNS} seeds)" if seed == 0 else None)
    right.axhline(TARGET, color="gray", linestyle=":", label=f"{TARGET:.0%} target")
    right.set(title=f"Test accuracy at lr {mid:g} (each run stops at the target)",
              xlabel="SGD step", ylabel="accuracy (fraction of test images)", ylim=(0, 1))
    for ax in (left, right):
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3, which="both")
    headline = f"steps to {TARGET:.0%} test accuracy ({N_RUNS} seeds, min-max) at lr " + "; ".join(
        f"{lr:g}: " + ", ".join(f"{v} {_range(steps[v][i], never)}" for v in variants)
        for i, lr in enumerate(lrs)
    )
    return Outcome(
        name=NAME, claim=CLAIM, seeds=SEEDS, headline=headline, supported=supported, quick=quick,
        method=("ReLU MLP 64 -> 4 x 64 -> 10 on scikit-learn's digits (pixels / 16), plain SGD "
                f"(batch 64) at lr {', '.join(f'{lr:g}' for lr in lrs)} for up to {n_steps} "
                f"steps, seeds 0..{N_RUNS - 1}: without norm, with addnorm.BatchNorm after each "
                "hidden Linear, and with a random per-unit scale U(0.5, 1.5) and shift "
                "N(0, 0.5^2), redrawn every step, after each BatchNorm. Test accuracy every "
                f"{EVAL_EVERY} steps; faster = fewer steps at every rate, beyond the spread "
                "over seeds (rank-sum test at 5%: no overlap)."),
        numbers={"learning_rates": list(lrs), "target": TARGET, "n_steps": n_steps,
                 "steps_to_target": {v: {f"{lr:g}": spread(s) for lr, s in zip(
                     lrs, steps[v], strict=True)} for v in variants},
                 "faster_at_each_lr": per_lr},
        figure=fig, undecided_because=undecided_because,
    )


def _range(values: list[int], never: int) -> str:
    shown = [str(v) if v < never else "never" for v in (min(values), max(values))]
    return shown[0] if shown[0] == shown[1] else "-".join(shown)
