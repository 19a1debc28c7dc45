"""Conversion to and from the reference DiT and diffusers, checked by parity of outputs.

facebookresearch/DiT is not on PyPI, so its forward is restated below in plain torch ops
that read a DiT-layout state dict (``reference_*``), after its ``models.py``: timm's fused
``qkv`` reshaped (B, N, 3, H, Dh), the adaLN-Zero chunks in the order shift_msa, scale_msa,
gate_msa, shift_mlp, scale_mlp, gate_mlp, LayerNorms without affine and eps 1e-6, GELU tanh,
``unpatchify`` by ``einsum('nhwpqc->nchpwq')``, and positions from ``meshgrid(w, h)`` in
NumPy's default ``xy`` indexing. Every zero-initialised weight is perturbed first, so a
modulation or gating bug cannot hide behind a zero. diffusers' ``DiTTransformer2DModel`` is
the oracle of the diffusers conversion (same weights, same inputs).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from properties import examples
from tolerances import FLOAT32_MODEL, FLOAT64_EXACT, u

from addnorm.dit import DiT, DiTConfig, classifier_free_guidance
from addnorm.interop import from_diffusers, from_dit_state_dict, to_diffusers, to_dit_state_dict
from addnorm.timestep import TimestepEmbedder

F64 = torch.float64


def perturbed(model: torch.nn.Module, seed: int = 0, scale: float = 0.1) -> torch.nn.Module:
    """Every parameter moved off its initial value (the zero-initialised ones too)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen).to(p.dtype))
    return model


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


def config(learn_sigma: bool) -> DiTConfig:
    return DiTConfig(input_size=8, patch_size=2, in_channels=4, d_model=32, n_layers=2,
                     n_heads=4, n_classes=5, class_dropout=0.1, learn_sigma=learn_sigma)


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


# ---------------------------------------------------------------------------- diffusers


def diffusers_dit(out_channels: int, norm_eps: float):
    """A small diffusers DiT, perturbed, with one set of embedders shared by every block
    (as in converted checkpoints)."""
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    model = diffusers.DiTTransformer2DModel(
        num_attention_heads=2, attention_head_dim=8, in_channels=3, out_channels=out_channels,
        num_layers=2, sample_size=8, patch_size=2, num_embeds_ada_norm=5, norm_eps=norm_eps,
    )
    perturbed(model)
    first = model.transformer_blocks[0].norm1.emb.state_dict()
    for block in model.transformer_blocks[1:]:
        block.norm1.emb.load_state_dict(first)
    return model.eval()


def diffusers_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(4, 3, 8, 8, generator=gen)
    return x, torch.tensor([0.0, 17.5, 500.0, 999.0]), torch.tensor([0, 4, 5, 2])


# norm_eps 0.5 is far from 1e-6, so using the wrong epsilon anywhere would show.
@pytest.mark.parametrize(("out_channels", "norm_eps"), [(6, 1e-5), (3, 0.5)])
def test_from_diffusers_reproduces_diffusers_outputs(out_channels, norm_eps):
    theirs = diffusers_dit(out_channels, norm_eps)
    ours = from_diffusers(theirs)
    cfg = ours.cfg
    assert (cfg.d_model, cfg.n_heads, cfg.n_classes) == (16, 2, 5)
    assert cfg.learn_sigma == (out_channels == 6)
    assert (cfg.timestep_downscale_freq_shift, cfg.timestep_flip_sin_to_cos) == (1.0, True)
    assert (cfg.norm_eps, cfg.ff_norm_eps, cfg.class_dropout) == (1e-6, norm_eps, 0.1)
    assert cfg.conditioning == "shared"  # every block's embedders are equal: DiT's layout
    assert not ours.training
    x, t, y = diffusers_inputs()
    with torch.no_grad():
        expected = theirs(x, timestep=t, class_labels=y, return_dict=False)[0]
        torch.testing.assert_close(ours(x, t, y), expected, **FLOAT32_MODEL)  # float32, D = 16


def test_one_timestep_for_the_batch_is_taken_as_diffusers_takes_it():
    # diffusers' DiT broadcasts a (1,) timestep over the batch; its pipeline makes a number
    # or a 0-d tensor a (1,) one (float64 for a float) and expands it.
    theirs = diffusers_dit(6, 1e-5)
    ours = from_diffusers(theirs)
    x, _, y = diffusers_inputs()
    with torch.no_grad():
        for t in (torch.tensor([17.5]), torch.tensor([999])):
            expected = theirs(x, timestep=t, class_labels=y, return_dict=False)[0]
            torch.testing.assert_close(ours(x, t, y), expected, **FLOAT32_MODEL)  # float32
        once = torch.tensor([17.5], dtype=torch.float64).expand(4)
        expected = theirs(x, timestep=once, class_labels=y, return_dict=False)[0]
        for t in (17.5, torch.tensor(17.5)):
            torch.testing.assert_close(ours(x, t, y), expected, **FLOAT32_MODEL)


def test_timestep_embedder_with_shift_1_is_diffusers_timestep_mlp():
    # Oracle: diffusers' Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=1) and
    # TimestepEmbedding, the pair inside its DiT, given our weights.
    embeddings = pytest.importorskip("diffusers.models.embeddings")
    torch.manual_seed(0)
    ours = TimestepEmbedder(16, downscale_freq_shift=1.0)
    proj = embeddings.Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=1)
    mlp = embeddings.TimestepEmbedding(256, 16)
    mlp.linear_1.load_state_dict(ours.w1.state_dict())
    mlp.linear_2.load_state_dict(ours.w2.state_dict())
    t = torch.tensor([0.0, 3.5, 999.0])
    with torch.no_grad():
        # diffusers' features are float32 whatever the input (the same float32 recipe), then
        # two float32 implementations of the same two Linear layers: FLOAT32_MODEL.
        torch.testing.assert_close(ours(t), mlp(proj(t)), **FLOAT32_MODEL)


def test_diffusers_uses_the_same_positions():
    theirs = diffusers_dit(6, 1e-5)
    ours = from_diffusers(theirs)
    # float64 codes rounded to float32, |x| <= 1: one float32 ulp apart at most, 2**-24 < 1e-7.
    torch.testing.assert_close(ours.pos_embed, theirs.pos_embed.pos_embed, rtol=0, atol=1e-7)


@pytest.mark.parametrize("conditioning", ["shared", "per_block"])
def test_to_diffusers_reproduces_our_outputs_and_round_trips(conditioning):
    theirs = diffusers_dit(6, 1e-5)
    torch.manual_seed(1)
    cfg = dataclasses.replace(from_diffusers(theirs).cfg, conditioning=conditioning)
    ours = perturbed(DiT(cfg), seed=5).eval()  # per_block: every block's embedders differ
    back = to_diffusers(ours)
    x, t, y = diffusers_inputs()
    with torch.no_grad():
        expected = ours(x, t, y)
        torch.testing.assert_close(back(x, t, y, return_dict=False)[0], expected,
                                   **FLOAT32_MODEL)  # float32, D = 16
    again = from_diffusers(back)
    assert again.cfg == cfg
    for key, value in ours.state_dict().items():
        assert torch.equal(again.state_dict()[key], value), key


def test_blocks_with_different_embedders_convert_to_the_per_block_layout():
    theirs = diffusers_dit(6, 1e-5)
    with torch.no_grad():  # one bias of block 1's timestep MLP: block 0's no longer fits it
        theirs.transformer_blocks[1].norm1.emb.timestep_embedder.linear_1.bias.add_(1.0)
    ours = from_diffusers(theirs)
    assert ours.cfg.conditioning == "per_block"
    assert not hasattr(ours, "timestep_embed") and len(ours.block_embeds) == 2
    x, t, y = diffusers_inputs()
    with torch.no_grad():
        expected = theirs(x, timestep=t, class_labels=y, return_dict=False)[0]
        torch.testing.assert_close(ours(x, t, y), expected, **FLOAT32_MODEL)  # float32, D = 16


def test_a_per_block_dit_with_equal_embedders_comes_back_shared_and_computes_the_same():
    # from_diffusers reads the layout from the weights: equal embedders are the shared layout.
    cfg = dataclasses.replace(from_diffusers(diffusers_dit(6, 1e-5)).cfg, conditioning="per_block")
    torch.manual_seed(0)
    ours = perturbed(DiT(cfg)).eval()
    first = ours.block_embeds[0].state_dict()
    for embed in ours.block_embeds[1:]:
        embed.load_state_dict(first)
    shared = from_diffusers(to_diffusers(ours))
    assert shared.cfg == dataclasses.replace(cfg, conditioning="shared")
    x, t, y = diffusers_inputs()
    with torch.no_grad():  # the same float32 operations on the same weights: bit for bit
        torch.testing.assert_close(shared(x, t, y), ours(x, t, y), rtol=0, atol=0)


@examples(10)
@given(
    n_heads=st.integers(1, 3),
    head_dim=st.sampled_from([4, 8]),  # d_model = n_heads * head_dim, divisible by 4
    n_layers=st.integers(1, 3),
    patch=st.sampled_from([1, 2]),
    grid=st.integers(1, 3),
    in_channels=st.integers(1, 3),
    learn_sigma=st.booleans(),
    n_classes=st.integers(1, 6),
    norm_eps=st.sampled_from([1e-5, 0.5]),
    batch=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_any_diffusers_dit_converts_both_ways_with_its_outputs(
    n_heads, head_dim, n_layers, patch, grid, in_channels, learn_sigma, n_classes, norm_eps,
    batch, seed,
):
    # Oracle: diffusers' own forward, on the same weights, every block's embedders different
    # (as a model built or fine-tuned in diffusers has them).
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(seed)
    theirs = diffusers.DiTTransformer2DModel(
        num_attention_heads=n_heads, attention_head_dim=head_dim, in_channels=in_channels,
        out_channels=in_channels * (2 if learn_sigma else 1), num_layers=n_layers,
        sample_size=patch * grid, patch_size=patch, num_embeds_ada_norm=n_classes,
        norm_eps=norm_eps,
    )
    perturbed(theirs, seed=seed).eval()
    ours = from_diffusers(theirs)
    # One block has nothing to differ from: the shared layout holds it.
    assert ours.cfg.conditioning == ("per_block" if n_layers > 1 else "shared")
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, in_channels, patch * grid, patch * grid, generator=gen)
    t = torch.rand(batch, generator=gen) * 1000
    y = torch.randint(0, n_classes + 1, (batch,), generator=gen)  # the null class included
    back = to_diffusers(ours)
    with torch.no_grad():
        expected = theirs(x, timestep=t, class_labels=y, return_dict=False)[0]
        got = ours(x, t, y)
        # float32, D <= 24, 3 blocks: two implementations of one small model (tolerances.py).
        torch.testing.assert_close(got, expected, **FLOAT32_MODEL)
        torch.testing.assert_close(back(x, timestep=t, class_labels=y, return_dict=False)[0],
                                   expected, **FLOAT32_MODEL)
    their_weights, again = theirs.state_dict(), back.state_dict()
    assert set(again) == set(their_weights)
    for key, value in their_weights.items():
        assert torch.equal(again[key], value), key  # the weights themselves, unchanged


def test_the_reference_layout_refuses_a_per_block_dit():
    cfg = dataclasses.replace(config(True), conditioning="per_block")
    with pytest.raises(ValueError, match=r"one timestep MLP and label table for all blocks"):
        to_dit_state_dict(DiT(cfg))
    sd = to_dit_state_dict(DiT(config(True)))
    with pytest.raises(ValueError, match=r"conditioning='per_block' has one per block"):
        from_dit_state_dict(sd, cfg)


def test_to_diffusers_refuses_dits_timestep_convention():
    pytest.importorskip("diffusers")
    dit = DiT(config(True))  # DiT's downscale_freq_shift 0; diffusers fixes it at 1
    with pytest.raises(ValueError, match=r"fixes timestep_downscale_freq_shift at 1.0, the "
                                         r"config has 0.0"):
        to_diffusers(dit)
