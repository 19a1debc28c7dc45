"""Claim 5 (seed post 003): BatchNorm's output for a sentence changes with the padding in its batch.

One sentence of 4 tokens is normalized in batches padded to longer and longer lengths (pad
tokens embed as zeros, as a zeroed padding row would). BatchNorm with padding in its
statistics drifts; LayerNorm, and addnorm.BatchNorm given the ``padding_mask``, do not.
"""

from __future__ import annotations

import torch

from addnorm.experiments.outcome import Outcome, new_figure
from addnorm.norms import BatchNorm, LayerNorm

NAME = "bn-padding"
CLAIM = (
    "The same sentence is normalized differently by BatchNorm depending on how much padding "
    "its batch holds; LayerNorm, and BatchNorm that leaves padding out, give the same output."
)
SEEDS = ("003",)  # the seed posts the claim comes from
N_TOKENS, D_MODEL, SEED = 4, 16, 0


def drift(n_pads: list[int]) -> dict[str, list[float]]:
    """max |output(sentence padded by n) - output(sentence alone)| over its real tokens."""
    gen = torch.Generator().manual_seed(SEED)
    others = torch.randn(2, N_TOKENS, D_MODEL, generator=gen) * 2 + 1  # (2, L, D)
    sentence = torch.randn(1, N_TOKENS, D_MODEL, generator=gen) * 2 + 1  # (1, L, D)
    batch = torch.cat([sentence, others])  # (3, L, D): the sentence and two others
    norms = {"BatchNorm": BatchNorm(D_MODEL).train(), "LayerNorm": LayerNorm(D_MODEL)}
    gaps: dict[str, list[float]] = {"BatchNorm": [], "BatchNorm + padding_mask": [],
                                    "LayerNorm": []}
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


def run(*, quick: bool = False) -> Outcome:
    n_pads = [0, 1, 2, 4, 8, 16] if quick else [0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
    gaps = drift(n_pads)
    bn, masked, ln = gaps["BatchNorm"], gaps["BatchNorm + padding_mask"], gaps["LayerNorm"]
    grows = all(b >= a for a, b in zip(bn, bn[1:], strict=False)) and bn[-1] > 0.1
    supported = grows and max(masked) < 1e-5 and max(ln) < 1e-5

    fig = new_figure(8, 5)
    ax = fig.subplots()
    styles = {"BatchNorm": "o-", "BatchNorm + padding_mask": "s--", "LayerNorm": "D:"}
    for name, values in gaps.items():
        ax.plot(n_pads, values, styles[name], label=name, markersize=7, linewidth=2)
    ax.set(title=f"One {N_TOKENS}-token sentence in a batch of 3, padded to longer lengths",
           xlabel="padding tokens added to each sequence",
           ylabel="max |change| of the sentence's output\n(normalized units)")
    ax.legend()
    ax.grid(alpha=0.3)
    headline = (
        f"with {n_pads[-1]} pad tokens: BatchNorm moves by {bn[-1]:.3f}, BatchNorm with "
        f"padding_mask by {max(masked):.1e}, LayerNorm by {max(ln):.1e}"
    )
    return Outcome(
        name=NAME, claim=CLAIM, seeds=SEEDS, headline=headline, supported=supported, quick=quick,
        method=(f"A batch of three {N_TOKENS}-token sequences (d_model {D_MODEL}, seed {SEED}, "
                f"values ~ N(1, 2^2)) padded with {n_pads} zero tokens; addnorm.BatchNorm in "
                "training mode with and without padding_mask, and addnorm.LayerNorm; the first "
                "sentence's output compared with its unpadded output."),
        numbers={"n_pad": n_pads, "batchnorm_change": bn, "masked_batchnorm_change": masked,
                 "layernorm_change": ln},
        figure=fig,
    )
