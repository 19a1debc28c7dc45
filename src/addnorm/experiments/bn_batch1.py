"""Claim 6 (seed posts 000 and 003): BatchNorm at batch size 1, and the train/eval gap of
running statistics.

At batch size 1 (one vector per step, as in autoregressive decoding) the batch variance is
0: BatchNorm in training mode has nothing to normalize with, and addnorm.BatchNorm refuses,
as nn.BatchNorm1d does. For larger batches the training output (batch statistics) and the
evaluation output (running statistics) of the same sample differ, the more so the smaller
the batch; LayerNorm is the same in both modes at every batch size.
"""

from __future__ import annotations

import torch

from addnorm.experiments.outcome import Outcome, new_figure
from addnorm.norms import BatchNorm, LayerNorm

NAME = "bn-batch1"
CLAIM = (
    "BatchNorm cannot train at batch size 1 (its batch variance is 0), and its training and "
    "evaluation outputs differ more the smaller the batch; LayerNorm's never differ."
)
SEEDS = ("000", "003")  # the seed posts the claim comes from
D_MODEL, SEED = 16, 0


def _batch(gen: torch.Generator, size: int, mean: torch.Tensor, std: torch.Tensor):
    return torch.randn(size, D_MODEL, generator=gen) * std + mean  # (B, D)


def batch_size_one_refused() -> bool:
    """Whether BatchNorm in training mode refuses one vector (variance 0)."""
    try:
        with torch.no_grad():
            BatchNorm(D_MODEL).train()(torch.randn(1, D_MODEL))
    except ValueError:
        return True
    return False


def train_eval_gap(batch_size: int, n_warmup: int, n_test: int) -> tuple[float, float]:
    """Mean |train-mode output - eval-mode output| for BatchNorm and LayerNorm."""
    gen = torch.Generator().manual_seed(SEED)
    mean = torch.rand(D_MODEL, generator=gen) * 4 - 2
    std = torch.rand(D_MODEL, generator=gen) * 2.5 + 0.5
    batch_norm, layer_norm = BatchNorm(D_MODEL).train(), LayerNorm(D_MODEL)
    bn_gaps, ln_gaps = [], []
    with torch.no_grad():
        for _ in range(n_warmup):  # running statistics settle, as during training
            batch_norm(_batch(gen, batch_size, mean, std))
        for _ in range(n_test):
            x = _batch(gen, batch_size, mean, std)
            train_out = batch_norm.train()(x)
            eval_out = batch_norm.eval()(x)
            bn_gaps.append((train_out - eval_out).abs().mean().item())
            ln_gaps.append((layer_norm.train()(x) - layer_norm.eval()(x)).abs().mean().item())
    return sum(bn_gaps) / n_test, max(ln_gaps)


def run(*, quick: bool = False) -> Outcome:
    sizes = [2, 4, 16, 64] if quick else [2, 3, 4, 8, 16, 32, 64, 128, 256]
    n_warmup, n_test = (50, 20) if quick else (300, 100)
    refused = batch_size_one_refused()
    gaps = [train_eval_gap(b, n_warmup, n_test) for b in sizes]
    bn = [g[0] for g in gaps]
    ln = [g[1] for g in gaps]
    shrinks = bn[0] > 3 * bn[-1] and all(b <= a * 1.1 for a, b in zip(bn, bn[1:], strict=False))
    supported = refused and shrinks and max(ln) == 0.0

    fig = new_figure(8, 5)
    ax = fig.subplots()
    ax.loglog(sizes, bn, "o-", label="BatchNorm (batch vs running statistics)", linewidth=2)
    ax.plot(sizes, [max(v, 1e-4) for v in ln], "D:", label="LayerNorm (exactly 0, drawn at 1e-4)")
    note = ("batch size 1 in training: variance 0, refused (ValueError)" if refused
            else "batch size 1 in training ran")
    ax.text(0.98, 0.5, note, transform=ax.transAxes, ha="right", fontsize=10,
            bbox={"facecolor": "white", "edgecolor": "gray"})
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.minorticks_off()
    ax.set(title="Train/eval gap of one batch's output vs batch size",
           xlabel="batch size (vectors per step)",
           ylabel="mean |train output - eval output|\n(normalized units)")
    ax.legend(loc="lower left")
    ax.grid(alpha=0.3, which="both")
    headline = (
        f"batch size 1 {'refused (variance 0)' if refused else 'ran'}; train/eval gap "
        f"{bn[0]:.3f} at batch {sizes[0]}, {bn[-1]:.3f} at batch {sizes[-1]}; LayerNorm gap "
        f"{max(ln):.1e}"
    )
    return Outcome(
        name=NAME, claim=CLAIM, seeds=SEEDS, headline=headline, supported=supported, quick=quick,
        method=(f"d_model {D_MODEL} vectors with per-feature means in [-2, 2] and stds in "
                f"[0.5, 3] (seed {SEED}); per batch size, {n_warmup} training steps settle the "
                f"running statistics (momentum 0.1), then {n_test} batches are normalized in "
                "both modes. Batch size 1 is tried in training mode."),
        numbers={"batch_size_1_refused": refused, "batch_sizes": sizes,
                 "batchnorm_gap": bn, "layernorm_gap": ln},
        figure=fig,
    )
