"""Conversion to and from diffusers' DiTTransformer2DModel, checked by parity of outputs:
diffusers is the oracle (same weights, same inputs). Every zero-initialised weight is perturbed
first, so a modulation or gating bug cannot hide behind a zero."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from properties import examples
from small_dit import config, perturbed
from tolerances import FLOAT32_MODEL

from addnorm.dit import DiT
from addnorm.interop import from_diffusers, to_diffusers
from addnorm.timestep import TimestepEmbedder


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


def test_to_diffusers_refuses_dits_timestep_convention():
    pytest.importorskip("diffusers")
    dit = DiT(config(True))  # DiT's downscale_freq_shift 0; diffusers fixes it at 1
    with pytest.raises(ValueError, match=r"fixes timestep_downscale_freq_shift at 1.0, the "
                                         r"config has 0.0"):
        to_diffusers(dit)
