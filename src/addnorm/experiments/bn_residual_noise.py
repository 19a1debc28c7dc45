"""Seed post 003: "If BatchNorm is used on the residual path, batch-dependent noise is injected
into the residual path, because BN's output depends on the batch statistics. This makes the
gradient flow unstable, and in deep Transformers especially it can cause exploding or
vanishing gradients" (만약 Batch Normalization을 residual path에 사용하면, BN의 출력이 배치
통계에 의존하기 때문에 residual path에 batch-dependent noise가 주입됩니다. 이는 gradient flow를
불안정하게 만들고, 특히 깊은 Transformer에서는 gradient 폭발이나 소실을 일으킬 수 있습니다).

Pre-norm encoders ``x + f(norm(x))`` (the seed's formula) with BatchNorm or LayerNorm, at
each depth of ``DEPTHS``, ``repeats.N_RUNS`` initialisations each, in training mode. One probe
sequence is run in ``N_COMPANIONS`` batches whose other ``BATCH - 1`` sequences are drawn
afresh; its loss is the mean squared distance of its output to a fixed random target. Three
numbers per network:

* output noise: mean over companions of ||out_c - mean out|| / ||mean out|| for the probe;
* gradient noise: the same for the gradient of the probe's loss over all parameters;
* gradient imbalance: |ln(||grad of the first layer|| / ||grad of the last layer||)|, mean
  over companions (0 = the same gradient size at both ends; large = exploding or vanishing).

The claim holds when, beyond the spread over seeds (:mod:`repeats`): BatchNorm's output and
gradient noise exceed LayerNorm's (whose only noise is float32 rounding when the batch
changes) at every depth; BatchNorm's gradient noise is larger at the deepest than at the
shallowest depth; and at the deepest, BatchNorm's gradient imbalance exceeds LayerNorm's.
"""

from __future__ import annotations

import math

import torch

from addnorm.experiments.outcome import Outcome, new_figure
from addnorm.experiments.repeats import N_RUNS, draw_runs, larger, spread
from addnorm.inspection import Watch
from addnorm.transformer.config import LayerConfig
from addnorm.transformer.stacks import Encoder

NAME = "bn-residual-noise"
CLAIM = (
    "BatchNorm on the residual path injects batch-dependent noise, which makes the gradient "
    "flow unstable and, in deep Transformers especially, can make gradients explode or "
    "vanish."
)
SEEDS = ("003",)  # the seed posts the claim comes from
D_MODEL, N_HEADS, D_FF, LENGTH, BATCH = 64, 4, 128, 12, 8
DEPTHS = (2, 6, 12)
N_COMPANIONS = 8
NORMS = ("batch", "layer")  # the norm the claim blames, the one it does not
MEASURES = ("output noise", "gradient noise", "gradient imbalance")
FLOOR = 1e-9  # drawn in place of an exact 0 on the log axes


def measure(norm: str, depth: int, seed: int, n_companions: int) -> dict[str, float]:
    """The three numbers of the module docstring for one initialisation; the layers'
    gradient sizes are those the watch of a training run reports
    (:class:`addnorm.inspection.Watch`, ``grad_norm`` of each layer)."""
    torch.manual_seed(seed)
    cfg = LayerConfig(d_model=D_MODEL, n_heads=N_HEADS, d_ff=D_FF, norm=norm,
                      norm_position="pre")
    encoder = Encoder(cfg, depth, final_norm=False).train()
    gen = torch.Generator().manual_seed(1000 + seed)
    probe = torch.randn(1, LENGTH, D_MODEL, generator=gen)  # (1, L, D)
    target = torch.randn(LENGTH, D_MODEL, generator=gen)  # (L, D)
    watched = Watch(encoder, activations=False)
    first, last = watched.map.layers[0], watched.map.layers[-1]
    outputs, grads, imbalance = [], [], []
    for _ in range(n_companions):
        others = torch.randn(BATCH - 1, LENGTH, D_MODEL, generator=gen)  # (B - 1, L, D)
        out = encoder(torch.cat([probe, others]))[0]  # (L, D): the probe's output
        encoder.zero_grad(set_to_none=True)
        (out - target).square().mean().backward()
        grad_norm = watched.step()["grad_norm"]
        outputs.append(out.detach().flatten())
        grads.append(torch.cat([p.grad.flatten() for p in encoder.parameters()
                                if p.grad is not None]))
        imbalance.append(abs(math.log(grad_norm[first] / grad_norm[last])))
    return {"output noise": _noise(torch.stack(outputs)),
            "gradient noise": _noise(torch.stack(grads)),
            "gradient imbalance": sum(imbalance) / len(imbalance)}


def _noise(rows: torch.Tensor) -> float:
    """Mean distance of each row to the mean row, relative to the mean row's size."""
    mean = rows.mean(0)
    return ((rows - mean).norm(dim=1).mean() / mean.norm()).item()


def run(*, quick: bool = False, norms: tuple[str, str] = NORMS) -> Outcome:
    """``norms``: the norm the claim blames and the one it does not; the tests swap them to
    build a world where the claim is false."""
    blamed, other = norms
    depths, n_companions = ((2, 6), 4) if quick else (DEPTHS, N_COMPANIONS)
    # values[norm][measure][depth index] = one number per seed
    values: dict[str, dict[str, list[list[float]]]] = {
        norm: {m: [] for m in MEASURES} for norm in norms}
    for norm in norms:
        for depth in depths:
            runs = [measure(norm, depth, seed, n_companions) for seed in range(N_RUNS)]
            for m in MEASURES:
                values[norm][m].append([r[m] for r in runs])
    deep, shallow = len(depths) - 1, 0
    parts = {
        "output noise above the other norm's at every depth": all(
            larger(values[blamed]["output noise"][i], values[other]["output noise"][i])
            for i in range(len(depths))),
        "gradient noise above the other norm's at every depth": all(
            larger(values[blamed]["gradient noise"][i], values[other]["gradient noise"][i])
            for i in range(len(depths))),
        "gradient noise grows with depth": larger(values[blamed]["gradient noise"][deep],
                                                  values[blamed]["gradient noise"][shallow]),
        "gradient imbalance above the other norm's when deep": larger(
            values[blamed]["gradient imbalance"][deep], values[other]["gradient imbalance"][deep]),
    }
    supported = all(parts.values())
    label = {"batch": "BatchNorm", "layer": "LayerNorm"}

    fig = new_figure(15, 5)
    for ax, m in zip(fig.subplots(1, 3), MEASURES, strict=True):
        for norm, marker in zip(norms, "os", strict=True):
            shown = [[max(v, FLOOR) for v in runs] for runs in values[norm][m]]
            draw_runs(ax, list(depths), shown, label=label.get(norm, norm), marker=marker)
        ax.set(title=m, xlabel="encoder layers (pre-norm)", xticks=list(depths),
               yscale="log" if m != "gradient imbalance" else "linear",
               ylabel={"output noise": "relative spread of the probe's output",
                       "gradient noise": "relative spread of the probe's gradient",
                       "gradient imbalance": "|ln(||grad first layer|| / ||grad last||)|"}[m])
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle(f"One sequence in {n_companions} batches of {BATCH} with other companions, "
                 f"at initialisation ({N_RUNS} seeds per point; an exact 0 is drawn at "
                 f"{FLOOR:g})")
    headline = (
        f"at {depths[deep]} layers ({N_RUNS} seeds, min-max): "
        + "; ".join(f"{m} {label.get(blamed, blamed)} {_range(values[blamed][m][deep])} vs "
                    f"{label.get(other, other)} {_range(values[other][m][deep])}"
                    for m in MEASURES)
        + f"; {label.get(blamed, blamed)} gradient noise at {depths[shallow]} layers "
        + _range(values[blamed]["gradient noise"][shallow])
        + " (" + "; ".join(f"{p}: {'yes' if ok else 'NO'}" for p, ok in parts.items()) + ")"
    )
    return Outcome(
        name=NAME, claim=CLAIM, seeds=SEEDS, headline=headline, supported=supported, quick=quick,
        method=(f"addnorm Encoder(LayerConfig(d_model={D_MODEL}, n_heads={N_HEADS}, "
                f"d_ff={D_FF}, norm='batch' or 'layer', norm_position='pre')) at "
                f"{', '.join(map(str, depths))} layers, training mode, seeds 0..{N_RUNS - 1}; "
                f"one {LENGTH}-token probe sequence batched with {BATCH - 1} fresh random "
                f"sequences, {n_companions} times; its output, the gradient of its MSE to a "
                "fixed target, and the gradient sizes of the first and last layers compared "
                "across the batches. Differences must exceed the spread over seeds "
                "(rank-sum test at 5%: with 3 seeds, no overlap)."),
        numbers={"depths": list(depths),
                 "measures": {n: {m: {str(d): spread(v) for d, v in zip(depths, per_d,
                                                                          strict=True)}
                                  for m, per_d in by_m.items()} for n, by_m in values.items()},
                 "parts": parts},
        figure=fig,
    )


def _range(values: list[float]) -> str:
    return f"{min(values):.2g}-{max(values):.2g}"
