"""FinalLayer: linear(modulate(norm(x), shift, scale)), checked with F ops."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from tolerances import FLOAT64_EXACT

from addnorm.dit import FinalLayer


def test_final_layer_is_the_modulated_linear_formula():
    # Oracle: DiT's FinalLayer written with F ops on the module's own (perturbed) weights.
    torch.manual_seed(0)
    layer = FinalLayer(8, 12).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(torch.randn_like(p))
    x, c = torch.randn(2, 3, 8, dtype=torch.float64), torch.randn(2, 8, dtype=torch.float64)
    mod = layer.adaLN_modulation[1]
    shift, scale = F.linear(F.silu(c), mod.weight, mod.bias).chunk(2, dim=1)
    h = F.layer_norm(x, (8,), eps=1e-6) * (1 + scale[:, None]) + shift[:, None]
    expected = F.linear(h, layer.linear.weight, layer.linear.bias)
    torch.testing.assert_close(layer(x, c), expected, **FLOAT64_EXACT)  # float64
    assert list(layer.norm.parameters()) == []
