"""patchify / unpatchify and PatchEmbed: DiT's layouts, pinned against F.unfold and einsum."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tolerances import FLOAT64_EXACT

from addnorm.dit.patches import PatchEmbed, grid_to_tokens, patchify, unpatchify


def test_unpatchify_inverts_patchify_on_rectangular_images():
    x = torch.randn(2, 3, 6, 10)
    tokens = patchify(x, 2)
    assert tokens.shape == (2, 15, 12)
    assert torch.equal(unpatchify(tokens, 2, (3, 5)), x)
    assert torch.equal(patchify(unpatchify(tokens, 2, (3, 5)), 2), tokens)


def test_unpatchify_is_dits_einsum_layout():
    # Oracle: DiT's unpatchify, reshape (B, h, w, p, p, C) then einsum 'nhwpqc->nchpwq'.
    tokens = torch.randn(2, 9, 2 * 2 * 5)
    expected = torch.einsum("nhwpqc->nchpwq", tokens.reshape(2, 3, 3, 2, 2, 5))
    assert torch.equal(unpatchify(tokens, 2, (3, 3)), expected.reshape(2, 5, 6, 6))


def test_patch_features_are_row_column_channel_with_tokens_row_major():
    # A worked example: pixel (row r, column s) of channel ch holds 100 r + 10 s + ch.
    r, s, ch = torch.meshgrid(torch.arange(4), torch.arange(4), torch.arange(2), indexing="ij")
    x = (100 * r + 10 * s + ch).permute(2, 0, 1)[None].float()  # (1, 2, 4, 4)
    tokens = patchify(x, 2)  # grid 2 x 2; token 1 = grid row 0, grid column 1
    assert tokens[0, 1].tolist() == [20, 21, 30, 31, 120, 121, 130, 131]


def test_patch_embedding_is_a_linear_map_on_unfolded_patches():
    # Oracle: F.unfold (patches as (channel, row, column)) and the conv weight viewed as a
    # Linear (D, C * p * p), DiT's reading of it for its Xavier initialisation.
    torch.manual_seed(0)
    embed = PatchEmbed(3, 8, 2).double()  # float64: a convolution against a matmul
    x = torch.randn(2, 3, 4, 6, dtype=torch.float64)
    patches = F.unfold(x, kernel_size=2, stride=2).transpose(1, 2)  # (B, N, C*p*p)
    weight = embed.proj.weight.view(8, -1)
    expected = F.linear(patches, weight, embed.proj.bias)
    torch.testing.assert_close(embed(x), expected, **FLOAT64_EXACT)


def test_grid_to_tokens_is_row_major():
    features = torch.arange(6.0).reshape(1, 1, 2, 3)  # value = 3 * row + column
    assert grid_to_tokens(features)[0, :, 0].tolist() == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: patchify(torch.zeros(1, 1, 5, 4), 2),
         r"image size \(5, 4\) must be divisible by patch_size \(2\)"),
        (lambda: PatchEmbed(3, 8, 2)(torch.zeros(1, 1, 4, 4)),
         r"x has 1 channels, PatchEmbed expects in_channels \(3\)"),
        (lambda: unpatchify(torch.zeros(1, 5, 8), 2, (2, 2)),
         r"tokens of shape \(1, 5, 8\) do not fit a 2 x 2 grid of 2 x 2 patches"),
    ],
)
def test_bad_shapes_raise_naming_them(call, match):
    with pytest.raises(ValueError, match=match):
        call()
