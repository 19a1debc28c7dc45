"""`addnorm explain`: the seed documents' worked examples and claims, computed by the library.

Every number printed here comes from the public API, so the showcase cannot drift from the
code: the positional-encoding table of seed 002, the T(k) rotation of seed 000, the BatchNorm
and LayerNorm example of seed 003, the padding effect on BatchNorm, and the span of the
diffusion timestep frequencies (seed 004). The PE heat map (SPEC claim 1) is written as PNG.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from addnorm.encodings import relative_shift_matrix, sinusoidal_encoding
from addnorm.norms import BatchNorm, LayerNorm
from addnorm.timestep import timestep_embedding

HEATMAP_DIMS = (16, 64, 128, 512)


def _fmt(row: torch.Tensor) -> str:
    return "[" + ", ".join(f"{v:+.4f}" for v in row.tolist()) + "]"


def positional_example() -> dict[str, object]:
    """Seed 002: "The dog ran fast" with d_model = 4 and base = 100."""
    pe = sinusoidal_encoding(4, 4, base=100.0, dtype=torch.float64)  # (P, D)
    words = ["The", "dog", "ran", "fast"]
    print("1. Sinusoidal positional encoding, d_model=4, base=100 (seed 002)")
    for pos, (word, row) in enumerate(zip(words, pe, strict=True)):
        print(f"   pos {pos} {word:<5} {_fmt(row)}")
    return {"pe_d4_base100": pe.tolist()}


def rotation_check(d_model: int = 512, n_positions: int = 2048) -> dict[str, float]:
    """Seed 000: PE(pos + k) = T(k) PE(pos), and PE(p) . PE(p + k) depends on k only."""
    pos = torch.arange(n_positions, dtype=torch.float64)
    worst, spread = 0.0, 0.0
    for k in (1, 7, 50, 333):
        pe = sinusoidal_encoding(pos, d_model, dtype=torch.float64)  # (P, D)
        shifted = sinusoidal_encoding(pos + k, d_model, dtype=torch.float64)  # (P, D)
        rotated = pe @ relative_shift_matrix(k, d_model, dtype=torch.float64).T  # (P, D)
        worst = max(worst, (shifted - rotated).abs().max().item())
        dots = (pe * shifted).sum(-1)  # (P,)
        spread = max(spread, (dots.max() - dots.min()).item())
    print(f"2. PE(pos+k) = T(k) PE(pos), d_model={d_model}, pos < {n_positions}, k in 1,7,50,333")
    print(f"   max |PE(pos+k) - T(k) PE(pos)| = {worst:.2e}")
    print(f"   max over k of (max_p - min_p) of PE(p).PE(p+k) = {spread:.2e}")
    return {"rotation_max_error": worst, "dot_product_spread": spread}


def norm_example() -> dict[str, object]:
    """Seed 003: X = [[1,2],[2,4],[3,6]], 3 samples and 2 features, eps ignored.

    The batch mean and biased variance are read back from BatchNorm itself: with
    ``momentum=1`` its running mean is the batch mean and its running variance the unbiased
    one, n / (n - 1) times the biased variance used to normalize.
    """
    x = torch.tensor([[1.0, 2.0], [2.0, 4.0], [3.0, 6.0]], dtype=torch.float64)  # (B, D)
    batch_norm = BatchNorm(2, eps=0.0, momentum=1.0).double().train()
    layer_norm = LayerNorm(2, eps=0.0).double()
    with torch.no_grad():
        bn, ln = batch_norm(x), layer_norm(x)
    n = x.shape[0]
    mean, var = batch_norm.running_mean, batch_norm.running_var * (n - 1) / n
    print("3. BatchNorm vs LayerNorm on X = [[1,2],[2,4],[3,6]] (seed 003)")
    print(f"   BatchNorm mean {_fmt(mean)}, variance {_fmt(var)}")
    for row_x, row_bn, row_ln in zip(x, bn, ln, strict=True):
        print(f"   x {_fmt(row_x)} -> BN {_fmt(row_bn)}   LN {_fmt(row_ln)}")
    return {"batch_norm": bn.tolist(), "layer_norm": ln.tolist(), "batch_mean": mean.tolist(),
            "batch_var": var.tolist()}


def padding_effect(d_model: int = 8, seed: int = 0) -> dict[str, float]:
    """SPEC claim 5: BatchNorm's output for a sentence depends on its batch's padding."""
    gen = torch.Generator().manual_seed(seed)
    sentence = torch.randn(1, 4, d_model, generator=gen) * 2 + 1  # (1, L, D), 4 real tokens
    padded = torch.cat([sentence, torch.zeros(1, 2, d_model)], dim=1)  # (1, L + 2, D)
    padding_mask = torch.tensor([[False] * 4 + [True] * 2])  # (1, L + 2), True = padding
    batch_norm = BatchNorm(d_model).train()
    layer_norm = LayerNorm(d_model)
    with torch.no_grad():
        bn_alone = batch_norm(sentence)[:, :4]
        bn_padded = batch_norm(padded)[:, :4]
        bn_masked = batch_norm(padded, padding_mask=padding_mask)[:, :4]
        ln_gap = (layer_norm(sentence) - layer_norm(padded)[:, :4]).abs().max().item()
    plain_gap = (bn_alone - bn_padded).abs().max().item()
    masked_gap = (bn_alone - bn_masked).abs().max().item()
    print("4. The same 4-token sentence alone and padded to 6 (seeds 000, 003)")
    print(f"   BatchNorm, padding in the statistics: max change {plain_gap:.4f}")
    print(f"   BatchNorm with padding_mask:          max change {masked_gap:.2e}")
    print(f"   LayerNorm:                            max change {ln_gap:.2e}")
    return {"batchnorm_padding_gap": plain_gap, "masked_gap": masked_gap, "layernorm_gap": ln_gap}


def timestep_frequencies(dim: int = 256, max_period: int = 10000) -> dict[str, float]:
    """SPEC claim 9: the timestep embedding's frequencies span 1 .. 1/max_period.

    The frequencies are read back from the embedding itself: at t = 1 the sine half holds
    sin(f) with every f <= 1 < pi/2, so asin recovers f exactly.
    """
    t = torch.ones(1, dtype=torch.float64)
    emb = timestep_embedding(t, dim, max_period=max_period)  # (1, dim), [cos | sin]
    freqs = torch.asin(emb[0, dim // 2 : 2 * (dim // 2)])  # (dim // 2,)
    print(f"5. Timestep embedding frequencies, dim={dim}, max_period={max_period} (seed 004)")
    print(f"   highest {freqs[0].item():.4f}, lowest {freqs[-1].item():.3e} "
          f"(1/max_period = {1 / max_period:.1e})")
    return {"freq_max": freqs[0].item(), "freq_min": freqs[-1].item()}


def write_heatmap(path: Path, dims: tuple[int, ...] = HEATMAP_DIMS, n_positions: int = 100) -> None:
    """SPEC claim 1: the PE matrix as a heat map (x: dimension, y: position) per d_model.

    Drawn on a bare Agg canvas, so no global matplotlib backend is switched.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4 * len(dims), 4), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(dims))
    for ax, d_model in zip(axes, dims, strict=True):
        pe = sinusoidal_encoding(n_positions, d_model)  # (P, D)
        image = ax.imshow(pe.numpy(), cmap="RdBu", vmin=-1, vmax=1, aspect="auto")
        ax.set(title=f"d_model = {d_model}", xlabel="dimension", ylabel="position")
    fig.colorbar(image, ax=axes, shrink=0.8, label="PE value")
    fig.savefig(path, dpi=100)


def run_explain(out_dir: Path) -> int:
    """Print the worked examples, write `pe_heatmap.png` and `explain.json` under out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    numbers: dict[str, object] = {}
    for section in (positional_example, rotation_check, norm_example, padding_effect,
                    timestep_frequencies):
        numbers.update(section())
        print()
    heatmap = out_dir / "pe_heatmap.png"
    write_heatmap(heatmap)
    (out_dir / "explain.json").write_text(json.dumps(numbers, indent=2) + "\n")
    print(f"PE heat map written to {heatmap}")
    return 0
