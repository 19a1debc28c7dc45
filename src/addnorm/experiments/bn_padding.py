"""Seed post 003: with BatchNorm "meaningless padding tokens' zero vectors enter the
statistics; the normalization statistics are distorted by the sentence length, and the same
sentence can be normalized differently depending on the amount of padding" (같은 내용의
문장이라도 padding의 양에 따라 다르게 정규화될 수 있습니다), while LayerNorm, normalizing each
token alone, is not affected by padding at all.

One sentence of 4 tokens is normalized in batches padded to longer and longer lengths (pad
tokens embed as zeros, as a zeroed padding row would), for ``repeats.N_RUNS`` random batches.
"Differently" and "the same" are told apart by ``ROUNDING``: float32 statistics of a dozen
values summed in another order differ by a few 1e-7 (the tests bound it at 3e-6), so a
change above 1e-5 is no rounding and one below it is. BatchNorm must move the sentence's
output beyond it at every amount of padding; LayerNorm, and addnorm.BatchNorm given the
``padding_mask``, must stay within it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from addnorm.experiments.outcome import Outcome, new_figure
from addnorm.experiments.repeats import N_RUNS, spread
from addnorm.norms import BatchNorm, LayerNorm

NAME = "bn-padding"
CLAIM = (
    "The same sentence is normalized differently by BatchNorm depending on how much padding "
    "its batch holds; LayerNorm is not affected by padding."
)
SEEDS = ("003",)  # the seed posts the claim comes from
N_TOKENS, D_MODEL = 4, 16
ROUNDING = 1e-5
NAMES = ("BatchNorm", "BatchNorm + padding_mask", "LayerNorm")


def drift(n_pads: list[int], seed: int, batch_norm: Callable[[int], nn.Module] = BatchNorm
          ) -> dict[str, list[float]]:
    """max |output(sentence padded by n) - output(sentence alone)| over its real tokens."""
    gen = torch.Generator().manual_seed(seed)
    others = torch.randn(2, N_TOKENS, D_MODEL, generator=gen) * 2 + 1  # (2, L, D)
    sentence = torch.randn(1, N_TOKENS, D_MODEL, generator=gen) * 2 + 1  # (1, L, D)
    batch = torch.cat([sentence, others])  # (3, L, D): the sentence and two others
    norms = {"BatchNorm": batch_norm(D_MODEL).train(), "LayerNorm": LayerNorm(D_MODEL)}
    gaps: dict[str, list[float]] = {name: [] for name in NAMES}
    with torch.no_grad():
        alone = {name: norm(batch)[0] for name, norm in norms.items()}  # (L, D)
        for n in n_pads:
            padded = torch.cat([batch, torch.zeros(3, n, D_MODEL)], dim=1)  # (3, L + n, D)
            padding_mask = torch.zeros(3, N_TOKENS + n, dtype=torch.bool)  # True = padding
            padding_mask[:, N_TOKENS:] = True
            outputs = {
                "BatchNorm": norms["BatchNorm"](padded),
                "BatchNorm + padding_mask": norms["BatchNorm"](padded, padding_mask=padding_mask),
                "LayerNorm": norms["LayerNorm"](padded),
            }
            for name, out in outputs.items():
                reference = alone["LayerNorm" if name == "LayerNorm" else "BatchNorm"]
                gaps[name].append((out[0, :N_TOKENS] - reference).abs().max().item())
    return gaps


def run(*, quick: bool = False, batch_norm: Callable[[int], nn.Module] = BatchNorm) -> Outcome:
    """``batch_norm``: the norm under test as BatchNorm (it must take ``padding_mask``); the
    tests pass LayerNorm, a world where the claim is false."""
    n_pads = [0, 1, 2, 4, 8, 16] if quick else [0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
    runs = [drift(n_pads, seed, batch_norm) for seed in range(N_RUNS)]
    gaps = {name: [[r[name][i] for r in runs] for i in range(len(n_pads))] for name in NAMES}
    moves = all(min(seeds) > ROUNDING for seeds in gaps["BatchNorm"][1:])
    still = {name: max(max(seeds) for seeds in gaps[name]) < ROUNDING for name in NAMES[1:]}
    supported = moves and still["LayerNorm"]

    fig = new_figure(8, 5)
    ax = fig.subplots()
    styles = {"BatchNorm": "o-", "BatchNorm + padding_mask": "s--", "LayerNorm": "D:"}
    for name, per_pad in gaps.items():
        means = [max(sum(s) / len(s), 1e-9) for s in per_pad]
        (line,) = ax.plot(n_pads, means, styles[name], label=name, markersize=7, linewidth=2)
        ax.fill_between(n_pads, [max(min(s), 1e-9) for s in per_pad],
                        [max(max(s), 1e-9) for s in per_pad], color=line.get_color(), alpha=0.2)
    ax.axhline(ROUNDING, color="gray", linestyle=":", label=f"rounding level {ROUNDING:g}")
    ax.set(title=f"A {N_TOKENS}-token sentence in a batch of 3, padded\n"
                 f"({N_RUNS} random batches: mean line, min-max band)",
           xlabel="padding tokens added to each sequence",
           ylabel="max |change| of the sentence's output\n(normalized units; 0 drawn at 1e-9)",
           yscale="log")
    ax.legend()
    ax.grid(alpha=0.3, which="both")
    bn, masked, ln = (gaps[name][-1] for name in NAMES)
    headline = (
        f"with {n_pads[-1]} pad tokens ({N_RUNS} batches, min-max): BatchNorm moves by "
        f"{min(bn):.3f}-{max(bn):.3f}, with 1 pad token by {min(gaps['BatchNorm'][1]):.3f}-"
        f"{max(gaps['BatchNorm'][1]):.3f}; BatchNorm with padding_mask by at most "
        f"{max(map(max, gaps['BatchNorm + padding_mask'])):.1e}, LayerNorm by at most "
        f"{max(map(max, gaps['LayerNorm'])):.1e} (rounding level {ROUNDING:g})"
    )
    return Outcome(
        name=NAME, claim=CLAIM, seeds=SEEDS, headline=headline, supported=supported, quick=quick,
        method=(f"Batches of three {N_TOKENS}-token sequences (d_model {D_MODEL}, values "
                f"~ N(1, 2^2), seeds 0..{N_RUNS - 1}) padded with {n_pads} zero tokens; "
                "addnorm.BatchNorm in training mode with and without padding_mask, and "
                "addnorm.LayerNorm; the first sentence's output compared with its unpadded "
                f"output; a change counts above {ROUNDING:g} (float32 rounding is below it)."),
        numbers={"n_pad": n_pads, "batchnorm_change": [spread(s) for s in gaps["BatchNorm"]],
                 "masked_batchnorm_change": [spread(s) for s in gaps[NAMES[1]]],
                 "layernorm_change": [spread(s) for s in gaps["LayerNorm"]],
                 "masked_batchnorm_stays": still[NAMES[1]], "rounding": ROUNDING},
        figure=fig,
    )
