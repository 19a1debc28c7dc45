"""Seed post 000, on why the Transformer uses LayerNorm: it "normalizes the output of each
self-attention head independently, so each head's output keeps its own distinctive
representation; with BN the heads' outputs are normalized together" (각 self-attention head의
output을 독립적으로 정규화 ⇒ 각 head의 output이 독특한 표현을 유지 / BN사용시 각 head의 output
함께 정규화 진행).

An addnorm :class:`MultiHeadAttention` (``D_MODEL``, ``N_HEADS`` heads) runs on random
sequences; its heads' outputs are read where the paper concatenates them (the input of
``out_proj``, (B, L, H * Dh)), and three norms are applied there:

* LayerNorm as the Transformer has it: each token over all D features (every head at once);
* BatchNorm (training mode): each feature over the batch and the positions;
* per-head LayerNorm: each token over each head's own Dh features (the reading under which
  the seed's sentence would hold; used in some later models, not in the Transformer).

How much a norm ties a head to the others is measured by replacing one head's output (with
that head's output on other sequences) and seeing how far the *other* heads' normalized
outputs move, relative to their size: the cross-head coupling, averaged over which head is
replaced. The cross-sample coupling does the same with the other sequences of the batch,
watching the first. ``repeats.N_RUNS`` seeds.

"Independently" means a coupling of 0 up to float32 rounding: below ``TOLERANCE`` (float32's
unit roundoff is 6e-8; a normalized value of size ~1 after a few operations is off by
~1e-7). The claim holds when the Transformer's LayerNorm's cross-head coupling is below it
for every seed and BatchNorm's is above it for every seed.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from addnorm.attention import MultiHeadAttention
from addnorm.experiments.outcome import Outcome, Reading, new_figure
from addnorm.experiments.repeats import N_RUNS, spread
from addnorm.norms import BatchNorm, LayerNorm

NAME = "per-head-norm"
CLAIM = (
    "LayerNorm normalizes the output of each self-attention head independently, so each "
    "head's output keeps its own distinctive representation; with BatchNorm the heads' "
    "outputs are normalized together."
)
PER_HEAD_READING = (
    "What would make it true: a per-head LayerNorm (each head's features normalized on their "
    "own) keeps every head's output independent of the others, unlike the Transformer's "
    "LayerNorm over all of d_model."
)
SEEDS = ("000",)  # the seed posts the claim comes from
D_MODEL, N_HEADS, BATCH, LENGTH = 64, 4, 8, 12
TOLERANCE = 1e-5
NormFactory = Callable[[int, int], nn.Module]  # (d_model, n_heads) -> a (B, L, D) norm


class PerHeadLayerNorm(nn.Module):
    """LayerNorm over each head's Dh features of a (B, L, H * Dh) tensor, one per token."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.norm = LayerNorm(d_model // n_heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Shapes: x (B, L, D) -> (B, L, D)."""
        batch, length, d_model = x.shape
        heads = x.reshape(batch * length, self.n_heads, d_model // self.n_heads)  # (B*L, H, Dh)
        return self.norm(heads).reshape(batch, length, d_model)  # (B, L, D)


NORMS: dict[str, NormFactory] = {
    "LayerNorm (over d_model)": lambda d, h: LayerNorm(d),
    "BatchNorm": lambda d, h: BatchNorm(d).train(),
    "per-head LayerNorm": PerHeadLayerNorm,
}
LAYER, BATCHNORM, PER_HEAD = NORMS


def head_outputs(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The concatenated head outputs of one attention on two independent batches.

    Shapes: returns two (B, L, D) tensors.
    """
    torch.manual_seed(seed)
    attention = MultiHeadAttention(D_MODEL, N_HEADS)
    captured: list[torch.Tensor] = []
    attention.out_proj.register_forward_pre_hook(lambda _, args: captured.append(args[0]))
    gen = torch.Generator().manual_seed(1000 + seed)
    with torch.no_grad():
        for _ in range(2):
            attention(torch.randn(BATCH, LENGTH, D_MODEL, generator=gen))
    return captured[0], captured[1]


def coupling(norm: nn.Module, z: torch.Tensor, other: torch.Tensor) -> tuple[torch.Tensor,
                                                                             float]:
    """The cross-head coupling matrix and the cross-sample coupling of one norm.

    ``matrix[j, h]``: relative change of head h's normalized output when head j's output is
    replaced by ``other``'s (the diagonal, head j itself, is left at 0). Cross-sample: the
    relative change of sequence 0's normalized output when the others are replaced.

    Shapes: z, other (B, L, D); returns (H, H) and a float.
    """
    d_head = D_MODEL // N_HEADS
    with torch.no_grad():
        base = norm(z)  # (B, L, D)
        matrix = torch.zeros(N_HEADS, N_HEADS)
        for j in range(N_HEADS):
            changed = z.clone()
            changed[..., j * d_head : (j + 1) * d_head] = other[..., j * d_head : (j + 1) * d_head]
            moved = norm(changed)
            for h in range(N_HEADS):
                if h != j:
                    part = slice(h * d_head, (h + 1) * d_head)
                    matrix[j, h] = ((moved[..., part] - base[..., part]).norm()
                                    / base[..., part].norm())
        swapped = torch.cat([z[:1], other[1:]])  # (B, L, D): sequence 0 kept, the rest new
        sample = ((norm(swapped)[0] - base[0]).norm() / base[0].norm()).item()
    return matrix, sample


def run(*, quick: bool = False, norms: dict[str, NormFactory] | None = None) -> Outcome:
    """``norms``: factories for the three roles (default :data:`NORMS`); the tests swap them
    to build worlds where the claim is true or false."""
    norms = NORMS | (norms or {})
    heads: dict[str, list[float]] = {name: [] for name in norms}
    samples: dict[str, list[float]] = {name: [] for name in norms}
    matrices: dict[str, torch.Tensor] = {}
    for seed in range(N_RUNS):
        z, other = head_outputs(seed)
        for name, factory in norms.items():
            matrix, sample = coupling(factory(D_MODEL, N_HEADS), z, other)
            heads[name].append(matrix.sum().item() / (N_HEADS * (N_HEADS - 1)))
            samples[name].append(sample)
            matrices.setdefault(name, matrix)
    independent = {name: max(v) < TOLERANCE for name, v in heads.items()}
    supported = independent[LAYER] and min(heads[BATCHNORM]) >= TOLERANCE
    per_head = Reading(
        claim=PER_HEAD_READING,
        supported=independent[PER_HEAD] and min(heads[LAYER]) >= TOLERANCE,
        headline=(f"cross-head coupling: per-head LayerNorm {_range(heads[PER_HEAD])}, "
                  f"LayerNorm over d_model {_range(heads[LAYER])} (independent below "
                  f"{TOLERANCE:g})"),
    )
    headline = (
        "cross-head coupling (" + f"{N_RUNS} seeds, min-max): " + ", ".join(
            f"{name} {_range(v)}" for name, v in heads.items())
        + f" (independent below {TOLERANCE:g}); cross-sample coupling: " + ", ".join(
            f"{name} {_range(v)}" for name, v in samples.items())
    )
    return Outcome(
        name=NAME, claim=CLAIM, seeds=SEEDS, headline=headline, supported=supported, quick=quick,
        method=(f"addnorm MultiHeadAttention(d_model={D_MODEL}, n_heads={N_HEADS}) on random "
                f"batches of {BATCH} x {LENGTH} tokens, seeds 0..{N_RUNS - 1}; the heads' "
                "concatenated outputs (out_proj's input) normalized by LayerNorm over d_model, "
                "BatchNorm (training mode) and a per-head LayerNorm. Cross-head coupling: how "
                "far the other heads' normalized outputs move (relative) when one head's "
                "output is replaced by its output on other sequences; cross-sample: how far "
                "sequence 0's moves when the other sequences are replaced."),
        numbers={"cross_head_coupling": {n: spread(v) for n, v in heads.items()},
                 "cross_sample_coupling": {n: spread(v) for n, v in samples.items()},
                 "tolerance": TOLERANCE,
                 "seed0_matrix": {n: m.tolist() for n, m in matrices.items()}},
        figure=_figure(heads, samples, matrices), also=(per_head,),
    )


def _range(values: list[float]) -> str:
    return f"{min(values):.2g}-{max(values):.2g}"


def _figure(heads, samples, matrices):
    fig = new_figure(16, 4.8)
    axes = fig.subplots(1, 4, width_ratios=[1.6, 1, 1, 1])
    floor = 1e-9
    names = list(heads)
    for i, name in enumerate(names):
        for offset, values, color, label in ((-0.15, heads[name], "tab:red", "across heads"),
                                             (0.15, samples[name], "tab:blue",
                                              "across samples")):
            shown = [max(v, floor) for v in values]
            axes[0].bar(i + offset, sum(shown) / len(shown), 0.28, color=color, alpha=0.5,
                        label=label if i == 0 else None)
            axes[0].plot([i + offset] * len(shown), shown, "k.", markersize=5)
    axes[0].axhline(TOLERANCE, color="black", linestyle="--",
                    label=f"independent below {TOLERANCE:g}")
    axes[0].set_xticks(range(len(names)), [n.replace(" (", "\n(") for n in names])
    axes[0].set(yscale="log", title="How much a norm ties outputs together",
                ylabel="relative change of the other outputs\n(exact 0 drawn at 1e-9)")
    axes[0].legend(fontsize=8)
    axes[0].grid(alpha=0.3, which="both", axis="y")
    top = max(m.max().item() for m in matrices.values()) or 1.0
    for ax, name in zip(axes[1:], names, strict=True):
        image = ax.imshow(matrices[name].numpy(), cmap="Reds", vmin=0, vmax=top)
        ax.set(title=name, xlabel="head watched", ylabel="head replaced",
               xticks=range(N_HEADS), yticks=range(N_HEADS))
    fig.colorbar(image, ax=axes[1:], shrink=0.8, label="relative change (seed 0)")
    return fig
