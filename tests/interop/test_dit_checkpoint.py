"""Conversion to and from the reference DiT's state dict, checked by parity of outputs.

facebookresearch/DiT is not on PyPI, so its forward is restated below in plain torch ops
that read a DiT-layout state dict (``reference_*``), after its ``models.py``: timm's fused
``qkv`` reshaped (B, N, 3, H, Dh), the adaLN-Zero chunks in the order shift_msa, scale_msa,
gate_msa, shift_mlp, scale_mlp, gate_mlp, LayerNorms without affine and eps 1e-6, GELU tanh,
``unpatchify`` by ``einsum('nhwpqc->nchpwq')``, and positions from ``meshgrid(w, h)`` in
NumPy's default ``xy`` indexing. Every zero-initialised weight is perturbed first, so a
modulation or gating bug cannot hide behind a zero (the diffusers conversion:
test_diffusers.py).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from small_dit import config, perturbed
from tolerances import FLOAT32_MODEL, FLOAT64_EXACT, u

from addnorm.dit import DiT, classifier_free_guidance
from addnorm.interop import from_dit_state_dict, to_dit_state_dict

F64 = torch.float64


# ------------------------------------------------------------- the reference, restated


def reference_positions(d_model: int, grid: int) -> torch.Tensor:
    """DiT's get_2d_sincos_pos_embed: meshgrid(w, h) ('xy'), first half from grid[0]."""
    coords = np.stack(np.meshgrid(np.arange(grid, dtype=np.float32),
                                  np.arange(grid, dtype=np.float32)), axis=0)  # (2, g, g)
    omega = 1.0 / 10000 ** (np.arange(d_model // 4, dtype=np.float64) / (d_model / 4))

    def one_axis(pos: np.ndarray) -> np.ndarray:
        angles = np.outer(pos.reshape(-1), omega)
        return np.concatenate([np.sin(angles), np.cos(angles)], axis=1)

    return torch.from_numpy(np.concatenate([one_axis(coords[0]), one_axis(coords[1])], axis=1))


def reference_timesteps(t: torch.Tensor, dim: int = 256) -> torch.Tensor:
    """DiT's TimestepEmbedder.timestep_embedding: [cos | sin], exponent k / half."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=t.dtype) / half)
    args = t[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def linear(sd: dict, prefix: str, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, sd[prefix + ".weight"], sd[prefix + ".bias"])


def reference_attention(sd: dict, prefix: str, x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """timm's Attention: qkv -> (3, B, H, N, Dh), softmax(q k^T / sqrt(Dh)) v, proj."""
    b, n, d = x.shape
    qkv = linear(sd, prefix + ".qkv", x).reshape(b, n, 3, n_heads, d // n_heads)
    q, k, v = qkv.permute(2, 0, 3, 1, 4)
    weights = (q @ k.transpose(-2, -1) * (d // n_heads) ** -0.5).softmax(dim=-1)
    return linear(sd, prefix + ".proj", (weights @ v).transpose(1, 2).reshape(b, n, d))


def reference_forward(sd: dict, x, t, y, *, patch: int, n_heads: int) -> torch.Tensor:
    """DiT.forward (eval mode) from a DiT-layout state dict."""
    def modulate(h, shift, scale):
        return h * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)

    def norm(h):
        return F.layer_norm(h, (h.shape[-1],), eps=1e-6)

    w = sd["x_embedder.proj.weight"]
    h = F.conv2d(x, w, sd["x_embedder.proj.bias"], stride=patch).flatten(2).transpose(1, 2)
    h = h + sd["pos_embed"]
    c = linear(sd, "t_embedder.mlp.2", F.silu(linear(sd, "t_embedder.mlp.0",
                                                       reference_timesteps(t).to(x.dtype))))
    c = c + sd["y_embedder.embedding_table.weight"][y]
    i = 0
    while f"blocks.{i}.attn.qkv.weight" in sd:
        p = f"blocks.{i}"
        chunks = linear(sd, p + ".adaLN_modulation.1", F.silu(c)).chunk(6, dim=1)
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = chunks
        h = h + gate_msa.unsqueeze(1) * reference_attention(
            sd, p + ".attn", modulate(norm(h), shift_msa, scale_msa), n_heads)
        hidden = F.gelu(linear(sd, p + ".mlp.fc1", modulate(norm(h), shift_mlp, scale_mlp)),
                        approximate="tanh")
        h = h + gate_mlp.unsqueeze(1) * linear(sd, p + ".mlp.fc2", hidden)
        i += 1
    shift, scale = linear(sd, "final_layer.adaLN_modulation.1", F.silu(c)).chunk(2, dim=1)
    out = linear(sd, "final_layer.linear", modulate(norm(h), shift, scale))
    g = int(out.shape[1] ** 0.5)
    channels = out.shape[-1] // patch**2
    out = torch.einsum("nhwpqc->nchpwq", out.reshape(-1, g, g, patch, patch, channels))
    return out.reshape(-1, channels, g * patch, g * patch)


def reference_forward_with_cfg(forward, x, t, y, cfg_scale: float) -> torch.Tensor:
    """DiT.forward_with_cfg: x's first half doubled, channels 0..2 guided, the rest kept."""
    half = x[: len(x) // 2]
    out = forward(torch.cat([half, half], dim=0), t, y)
    eps, rest = out[:, :3], out[:, 3:]
    cond_eps, uncond_eps = torch.split(eps, len(eps) // 2, dim=0)
    half_eps = uncond_eps + cfg_scale * (cond_eps - uncond_eps)
    return torch.cat([torch.cat([half_eps, half_eps], dim=0), rest], dim=1)


# ---------------------------------------------------------------- the DiT layout

# Every key of DiT's state dict for a 2-block model, as models.py names them.
DIT_KEYS = {
    "pos_embed", "x_embedder.proj.weight", "x_embedder.proj.bias",
    "t_embedder.mlp.0.weight", "t_embedder.mlp.0.bias", "t_embedder.mlp.2.weight",
    "t_embedder.mlp.2.bias", "y_embedder.embedding_table.weight",
    "final_layer.linear.weight", "final_layer.linear.bias",
    "final_layer.adaLN_modulation.1.weight", "final_layer.adaLN_modulation.1.bias",
} | {
    f"blocks.{i}.{name}.{kind}"
    for i in range(2)
    for name in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2", "adaLN_modulation.1")
    for kind in ("weight", "bias")
}


def dit_inputs(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 4, 8, 8, generator=gen).to(dtype)
    t = torch.tensor([0.0, 17.5, 500.0, 999.0], dtype=dtype)
    return x, t, torch.tensor([0, 3, 5, 1])  # 5 = the null class


def test_state_dict_has_dits_keys_and_positions():
    dit = DiT(config(True))
    sd = to_dit_state_dict(dit)
    assert set(sd) == DIT_KEYS
    assert sd["blocks.0.attn.qkv.weight"].shape == (96, 32)
    assert sd["y_embedder.embedding_table.weight"].shape == (6, 32)  # with the null row
    # float64 codes (NumPy's sin against torch's, an ulp apart at most) rounded to float32,
    # |x| <= 1: they may land one float32 ulp apart, at most 2**-24 = u(float32).
    torch.testing.assert_close(sd["pos_embed"][0], reference_positions(32, 4).float(),
                               rtol=0, atol=u(torch.float32))


@pytest.mark.parametrize("learn_sigma", [True, False])
@pytest.mark.parametrize(("dtype", "tol"), [(F64, FLOAT64_EXACT), (torch.float32, FLOAT32_MODEL)])
def test_forward_matches_the_restated_reference(learn_sigma, dtype, tol):
    torch.manual_seed(0)
    dit = perturbed(DiT(config(learn_sigma))).to(dtype).eval()
    sd = to_dit_state_dict(dit)
    x, t, y = dit_inputs(dtype)
    expected = reference_forward(sd, x, t, y, patch=2, n_heads=4)
    assert expected.shape == (4, 8 if learn_sigma else 4, 8, 8)
    torch.testing.assert_close(dit(x, t, y), expected, **tol)  # two implementations, D = 32
    # Loading the DiT-layout weights back gives the same model.
    loaded = from_dit_state_dict(sd, config(learn_sigma)).eval()
    assert loaded.pos_embed.dtype == dtype
    torch.testing.assert_close(loaded(x, t, y), dit(x, t, y), rtol=0, atol=0)


@pytest.mark.parametrize("learn_sigma", [True, False])
def test_first3_channel_guidance_matches_the_reference(learn_sigma):
    torch.manual_seed(0)
    dit = perturbed(DiT(config(learn_sigma))).double().eval()
    sd = to_dit_state_dict(dit)
    x, t, _ = dit_inputs(F64)
    y = torch.tensor([0, 3, 5, 5])

    def forward(xx, tt, yy):
        return reference_forward(sd, xx, tt, yy, patch=2, n_heads=4)

    expected = reference_forward_with_cfg(forward, x, t, y, 4.0)
    half = x[:2]  # addnorm's DiT on the doubled half, guided on 3 channels as the reference
    got = classifier_free_guidance(dit(torch.cat([half, half]), t, y), 4.0, n_guided=3)
    torch.testing.assert_close(got, expected, **FLOAT64_EXACT)  # float64


def test_from_dit_state_dict_names_missing_and_misshapen_keys():
    sd = to_dit_state_dict(DiT(config(True)))
    partial = {k: v for k, v in sd.items() if k != "blocks.1.mlp.fc2.bias"}
    with pytest.raises(ValueError, match=r"missing keys \['blocks.1.mlp.fc2.bias'\]"):
        from_dit_state_dict(partial, config(True))
    no_null = dataclasses.replace(config(True), class_dropout=0.0)
    with pytest.raises(ValueError, match=r"y_embedder.embedding_table.weight: \(6, 32\), "
                                         r"expected \(5, 32\)"):
        from_dit_state_dict(sd, no_null)


def test_from_dit_state_dict_refuses_positions_in_another_layout():
    sd = dict(to_dit_state_dict(DiT(config(True))))
    d = sd["pos_embed"].shape[-1]
    sd["pos_embed"] = sd["pos_embed"].roll(d // 2, dims=-1)  # row half first: not DiT's
    with pytest.raises(ValueError, match=r"pos_embed differs from DiT's fixed 2-D sin-cos"):
        from_dit_state_dict(sd, config(True))



def test_the_reference_layout_refuses_a_per_block_dit():
    cfg = dataclasses.replace(config(True), conditioning="per_block")
    with pytest.raises(ValueError, match=r"one timestep MLP and label table for all blocks"):
        to_dit_state_dict(DiT(cfg))
    sd = to_dit_state_dict(DiT(config(True)))
    with pytest.raises(ValueError, match=r"conditioning='per_block' has one per block"):
        from_dit_state_dict(sd, cfg)
