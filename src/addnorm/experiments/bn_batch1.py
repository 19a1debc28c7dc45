"""Seed posts 000 and 003: BatchNorm "depends on the batch size: with batch = 1 the variance
becomes 0; at test time the running mean and variance are used, so it behaves differently
from training" (Batch=1이면, variance는 0이 됨 / test의 mean과 var은 running mean, variance를
사용하여 train과 다른 동작 수행), while LayerNorm "normalizes each sample on its own, so the
batch size does not affect it" (batch size에 영향 X).

At batch size 1 (one vector per step, as in autoregressive decoding) the batch variance is
0: BatchNorm in training mode has nothing to normalize with, and addnorm.BatchNorm refuses,
as nn.BatchNorm1d does. For larger batches the training output (batch statistics) and the
evaluation output (running statistics) of the same sample differ, the more so the smaller
the batch: the gap at the smallest batch must exceed the gap at the largest beyond the spread
over ``repeats.N_RUNS`` data seeds. LayerNorm must give a sample the same output at every
batch size, 1 included, up to float32 rounding (``ROUNDING``: a normalized value of size ~1
after a few operations is off by ~1e-7).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from addnorm.experiments.outcome import Outcome, new_figure
from addnorm.experiments.repeats import N_RUNS, draw_runs, larger, spread
from addnorm.norms import BatchNorm, LayerNorm

NAME = "bn-batch1"
CLAIM = (
    "BatchNorm depends on the batch size: at batch size 1 its variance is 0, and in testing "
    "it uses running statistics, so it behaves differently from training; LayerNorm is not "
    "affected by the batch size."
)
SEEDS = ("000", "003")  # the seed posts the claim comes from
D_MODEL = 16
ROUNDING = 1e-5
NormFactory = Callable[[int], nn.Module]


def _batch(gen: torch.Generator, size: int, mean: torch.Tensor, std: torch.Tensor):
    return torch.randn(size, D_MODEL, generator=gen) * std + mean  # (B, D)


def _data(seed: int) -> tuple[torch.Generator, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    mean = torch.rand(D_MODEL, generator=gen) * 4 - 2
    std = torch.rand(D_MODEL, generator=gen) * 2.5 + 0.5
    return gen, mean, std


def batch_size_one_refused(batch_norm: NormFactory = BatchNorm) -> bool:
    """Whether the batch norm in training mode refuses one vector (variance 0)."""
    try:
        with torch.no_grad():
            batch_norm(D_MODEL).train()(torch.randn(1, D_MODEL))
    except ValueError:
        return True
    return False


def train_eval_gap(batch_norm: NormFactory, batch_size: int, n_warmup: int, n_test: int,
                   seed: int) -> float:
    """Mean |train-mode output - eval-mode output| of the batch norm, once its running
    statistics have settled."""
    gen, mean, std = _data(seed)
    norm = batch_norm(D_MODEL).train()
    gaps = []
    with torch.no_grad():
        for _ in range(n_warmup):  # running statistics settle, as during training
            norm(_batch(gen, batch_size, mean, std))
        for _ in range(n_test):
            x = _batch(gen, batch_size, mean, std)
            train_out = norm.train()(x)
            eval_out = norm.eval()(x)
            gaps.append((train_out - eval_out).abs().mean().item())
    return sum(gaps) / n_test


def batch_size_dependence(layer_norm: NormFactory, sizes: list[int], seed: int) -> float:
    """max |output of sample 0 in a batch of b - its output alone| over the batch sizes,
    training mode; infinite if the norm refuses some batch size."""
    gen, mean, std = _data(seed)
    norm = layer_norm(D_MODEL).train()
    x = _batch(gen, max(sizes), mean, std)
    try:
        with torch.no_grad():
            alone = norm(x[:1])[0]
            return max((norm(x[:b])[0] - alone).abs().max().item() for b in sizes)
    except ValueError:  # refused a batch size: as dependent as can be
        return math.inf


def run(*, quick: bool = False, batch_norm: NormFactory = BatchNorm,
        layer_norm: NormFactory = LayerNorm) -> Outcome:
    """``batch_norm``, ``layer_norm``: the norms under test; the tests swap them to build a
    world where the claim is false."""
    sizes = [2, 4, 16, 64] if quick else [2, 3, 4, 8, 16, 32, 64, 128, 256]
    n_warmup, n_test = (50, 20) if quick else (300, 100)
    refused = batch_size_one_refused(batch_norm)
    gaps = [[train_eval_gap(batch_norm, b, n_warmup, n_test, seed) for seed in range(N_RUNS)]
            for b in sizes]  # [size][seed]
    shrinks = larger(gaps[0], gaps[-1])
    ln_dependence = [batch_size_dependence(layer_norm, [1, *sizes], seed)
                     for seed in range(N_RUNS)]
    ln_unaffected = max(ln_dependence) < ROUNDING
    supported = refused and shrinks and ln_unaffected

    fig = new_figure(8, 5)
    ax = fig.subplots()
    draw_runs(ax, sizes, [[max(g, 1e-9) for g in seeds] for seeds in gaps],
              label="BatchNorm: |train output - eval output|")
    ax.axhline(max(max(ln_dependence), 1e-9), color="tab:red", linestyle=":",
               label="LayerNorm: largest change of a sample's output over batch sizes "
                     "1.." + str(sizes[-1]) + " (0 drawn at 1e-9)")
    note = ("batch size 1 in training: variance 0, refused (ValueError)" if refused
            else "batch size 1 in training ran")
    ax.text(0.98, 0.5, note, transform=ax.transAxes, ha="right", fontsize=10,
            bbox={"facecolor": "white", "edgecolor": "gray"})
    ax.set(xscale="log", yscale="log")
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.minorticks_off()
    ax.set(title="Train/eval gap of one batch's output vs batch size",
           xlabel="batch size (vectors per step)",
           ylabel="mean |train output - eval output|\n(normalized units)")
    ax.legend(loc="lower left", fontsize=8)
    ax.grid(alpha=0.3, which="both")
    headline = (
        f"batch size 1 {'refused (variance 0)' if refused else 'ran'}; train/eval gap "
        f"({N_RUNS} seeds, min-max) {min(gaps[0]):.3f}-{max(gaps[0]):.3f} at batch {sizes[0]}, "
        f"{min(gaps[-1]):.3f}-{max(gaps[-1]):.3f} at batch {sizes[-1]}; LayerNorm output of a "
        f"sample changes by at most {max(ln_dependence):.1e} over batch sizes 1..{sizes[-1]}"
    )
    return Outcome(
        name=NAME, claim=CLAIM, seeds=SEEDS, headline=headline, supported=supported, quick=quick,
        method=(f"d_model {D_MODEL} vectors with per-feature means in [-2, 2] and stds in "
                f"[0.5, 3] (seeds 0..{N_RUNS - 1}); per batch size, {n_warmup} training steps "
                f"settle the running statistics (momentum 0.1), then {n_test} batches are "
                "normalized in both modes; batch size 1 is tried in training mode; LayerNorm "
                f"normalizes one sample alone and within batches of up to {sizes[-1]}."),
        numbers={"batch_size_1_refused": refused, "batch_sizes": sizes,
                 "batchnorm_gap": [spread(g) for g in gaps], "gap_shrinks": shrinks,
                 "layernorm_batch_size_dependence": spread(ln_dependence),
                 "rounding": ROUNDING},
        figure=fig,
    )
