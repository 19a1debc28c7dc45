"""Claim 4 (seed post 003): its BatchNorm and LayerNorm worked example,
X = [[1,2],[2,4],[3,6]].

The batch mean and biased variance are read back from BatchNorm itself: with
``momentum=1`` its running mean is the batch mean and its running variance the unbiased
one, n / (n - 1) times the biased variance it normalized with. Tolerance: half a unit of the
last digit the seed prints (5e-5).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
from torch import nn

from addnorm.experiments.outcome import Outcome, new_figure
from addnorm.norms import BatchNorm, LayerNorm

NAME = "norm-examples"
CLAIM = (
    "On X = [[1,2],[2,4],[3,6]] BatchNorm gives mu = [2, 4], sigma^2 = [2/3, 8/3] and rows "
    "[-1.2247, -1.2247], [0, 0], [1.2247, 1.2247]; LayerNorm turns every row into [-1, 1]."
)
SEEDS = ("003",)  # the seed posts the claim comes from
X = [[1.0, 2.0], [2.0, 4.0], [3.0, 6.0]]
# Seed 003's worked example, eps ignored.
EXPECTED_BN = [[-1.2247, -1.2247], [0.0, 0.0], [1.2247, 1.2247]]
EXPECTED_LN = [[-1.0, 1.0]] * 3
EXPECTED_MEAN, EXPECTED_VAR = [2.0, 4.0], [2 / 3, 8 / 3]
DIGITS = 5e-5  # half a unit of the last printed digit


def run(*, quick: bool = False,
        batch_norm_factory: Callable[[], nn.Module] = lambda: BatchNorm(2, eps=0.0, momentum=1.0),
        layer_norm_factory: Callable[[], nn.Module] = lambda: LayerNorm(2, eps=0.0)) -> Outcome:
    """The factories build the norms under test (the batch norm must keep ``running_mean`` and
    ``running_var`` with momentum 1); the tests pass the Annotated Transformer's LayerNorm
    (unbiased std, eps outside the root), a world where the claim is false."""
    x = torch.tensor(X, dtype=torch.float64)  # (B, D)
    batch_norm = batch_norm_factory().double().train()
    layer_norm = layer_norm_factory().double()
    with torch.no_grad():
        bn, ln = batch_norm(x), layer_norm(x)
    n = x.shape[0]
    running_mean, running_var = (cast(torch.Tensor, getattr(batch_norm, name))
                                 for name in ("running_mean", "running_var"))
    mean, var = running_mean, running_var * (n - 1) / n
    f64 = torch.float64
    errors = {
        "batch_norm": (bn - torch.tensor(EXPECTED_BN, dtype=f64)).abs().max().item(),
        "layer_norm": (ln - torch.tensor(EXPECTED_LN, dtype=f64)).abs().max().item(),
        "mean": (mean - torch.tensor(EXPECTED_MEAN, dtype=f64)).abs().max().item(),
        "variance": (var - torch.tensor(EXPECTED_VAR, dtype=f64)).abs().max().item(),
    }
    supported = max(errors.values()) < DIGITS

    fig = new_figure(13, 4.5)
    axes = fig.subplots(1, 4, width_ratios=[1, 1, 1, 1.4])
    for ax, table, title in zip(axes[:3], (x, bn, ln), ("input X", "BatchNorm x_hat",
                                                        "LayerNorm x_hat"), strict=True):
        _draw_table(ax, table, title)
    ax = axes[3]
    ax.plot(x[:, 0], x[:, 1], "ko-", label="X (samples)", markersize=8)
    ax.plot(bn[:, 0], bn[:, 1], "s--", color="tab:blue", label="BatchNorm", markersize=9)
    ax.plot(ln[:, 0], ln[:, 1], "D", color="tab:red", label="LayerNorm (all 3 rows)",
            markersize=10)
    ax.axhline(0, color="gray", linewidth=0.5)
    ax.axvline(0, color="gray", linewidth=0.5)
    ax.set(title="Samples in feature space", xlabel="feature 1 (unitless)",
           ylabel="feature 2 (unitless)")
    ax.legend(loc="upper left")
    fig.suptitle("Seed 003: BatchNorm normalizes each column over the batch, "
                 "LayerNorm each row over its features (eps = 0)", fontsize=13)
    headline = (
        f"BN mean {[round(v, 4) for v in mean.tolist()]}, var "
        f"{[round(v, 4) for v in var.tolist()]}, row 0 {[round(v, 4) for v in bn[0].tolist()]}; "
        f"LN rows {[round(v, 4) for v in ln[0].tolist()]}; max error vs seed 003's digits "
        f"{max(errors.values()):.1e}"
    )
    return Outcome(
        name=NAME, claim=CLAIM, seeds=SEEDS, headline=headline, supported=supported, quick=quick,
        method=("addnorm.BatchNorm (training mode, eps=0, momentum=1 to read the batch mean "
                "and variance back) and addnorm.LayerNorm (eps=0) on seed 003's 3x2 matrix, "
                "in float64, compared with the digits seed 003 prints: BN mu = [2, 4], "
                "sigma^2 = [2/3, 8/3], x_hat rows [-1.2247, -1.2247], [0, 0], [1.2247, 1.2247]; "
                "LN rows [-1, 1]."),
        numbers={"batch_mean": mean.tolist(), "batch_var": var.tolist(),
                 "batch_norm": bn.tolist(), "layer_norm": ln.tolist(),
                 "max_errors": errors},
        figure=fig,
    )


def _draw_table(ax, table: torch.Tensor, title: str) -> None:
    ax.imshow(table.numpy(), cmap="RdBu_r", vmin=-6, vmax=6, aspect="auto")
    for row in range(table.shape[0]):
        for col in range(table.shape[1]):
            ax.text(col, row, f"{table[row, col].item():+.4f}", ha="center", va="center",
                    fontsize=12)
    ax.set_xticks([0, 1], ["feature 1", "feature 2"])
    ax.set_yticks([0, 1, 2], ["sample 1", "sample 2", "sample 3"])
    ax.set_title(title)
