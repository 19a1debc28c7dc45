"""DiTBlock: adaLN-Zero's identity at initialisation, and the paper's formulas with F ops."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tolerances import FLOAT64_EXACT

from addnorm.dit import DiT, DiTBlock, DiTConfig
from addnorm.norms import LayerNorm

CFG = DiTConfig(input_size=4, patch_size=2, in_channels=1, d_model=16, n_layers=2, n_heads=2,
                n_classes=3)


def perturbed(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every parameter moved off its initial value (zero-initialised ones too)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return module


def test_a_fresh_block_is_the_identity_map():
    # adaLN-Zero (DiT section 3.2): the modulation starts at zero, so both gates are 0.
    torch.manual_seed(0)
    for block in DiT(CFG).blocks:
        x, c = torch.randn(3, 4, 16), torch.randn(3, 16)
        assert torch.equal(block(x, c), x)


def test_block_is_the_adaln_zero_formula():
    # Oracle: the paper's block written with F ops on the module's own weights.
    torch.manual_seed(0)
    block = perturbed(DiTBlock(16, 2, d_ff=64), seed=1).double()
    x, c = torch.randn(3, 5, 16, dtype=torch.float64), torch.randn(3, 16, dtype=torch.float64)
    mod = block.adaLN_modulation[1]
    chunks = F.linear(F.silu(c), mod.weight, mod.bias).chunk(6, dim=1)
    shift1, scale1, gate1, shift2, scale2, gate2 = chunks

    def norm(h):
        return F.layer_norm(h, (16,), eps=1e-6)

    h = norm(x) * (1 + scale1[:, None]) + shift1[:, None]
    q, k, v = F.linear(h, block.attn.in_proj.weight, block.attn.in_proj.bias).chunk(3, dim=-1)
    q, k, v = (z.reshape(3, 5, 2, 8).transpose(1, 2) for z in (q, k, v))  # (B, H, L, Dh)
    heads = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(3, 5, 16)
    x1 = x + gate1[:, None] * F.linear(heads, block.attn.out_proj.weight, block.attn.out_proj.bias)
    h = norm(x1) * (1 + scale2[:, None]) + shift2[:, None]
    ff = F.linear(F.gelu(F.linear(h, block.ff.w1.weight, block.ff.w1.bias), approximate="tanh"),
                  block.ff.w2.weight, block.ff.w2.bias)
    torch.testing.assert_close(block(x, c), x1 + gate2[:, None] * ff, **FLOAT64_EXACT)  # float64


def test_layer_norm_without_affine_equals_torchs():
    # Oracle: nn.LayerNorm(elementwise_affine=False); neither has parameters to save.
    ours = LayerNorm(16, eps=1e-6, elementwise_affine=False)
    torchs = torch.nn.LayerNorm(16, eps=1e-6, elementwise_affine=False)
    x = torch.randn(2, 3, 16)
    torch.testing.assert_close(ours(x), torchs(x), rtol=0, atol=0)  # both call F.layer_norm
    assert ours.state_dict() == {} == torchs.state_dict()


def test_block_norms_have_no_parameters_and_dits_epsilon():
    block = DiTBlock(16, 2, d_ff=64)
    for norm in (block.attn_norm, block.ff_norm):
        assert list(norm.parameters()) == [] and norm.eps == 1e-6
    assert block.ff.activation == "gelu_tanh" and block.ff.d_ff == 64
    assert block.attn.in_proj.bias is not None


@pytest.mark.parametrize(
    ("x", "c", "match"),
    [
        (torch.zeros(2, 4, 8), torch.zeros(2, 16), r"x last dim must be 16"),
        (torch.zeros(2, 4, 16), torch.zeros(3, 16), r"c has batch size 3, x has 2"),
    ],
)
def test_bad_shapes_raise_naming_them(x, c, match):
    with pytest.raises(ValueError, match=match):
        DiTBlock(16, 2, d_ff=64)(x, c)
