"""`addnorm explain`: the seed's worked examples computed by the library, plus the heat map."""

from __future__ import annotations

import json

from addnorm.cli.explain import run_explain


def test_explain_prints_the_worked_examples_and_writes_the_heatmap(tmp_path, capsys):
    assert run_explain(tmp_path) == 0
    out = capsys.readouterr().out
    # SPEC 1 worked example, pos 1 with d=4, base=100: [0.8415, 0.5403, 0.0998, 0.9950].
    assert "[+0.8415, +0.5403, +0.0998, +0.9950]" in out
    # SPEC 3 worked example: BatchNorm x_hat row 0 is [-1.2247, -1.2247]; LayerNorm rows [-1, 1].
    assert "BN [-1.2247, -1.2247]" in out
    assert "LN [-1.0000, +1.0000]" in out
    png = tmp_path / "pe_heatmap.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    numbers = json.loads((tmp_path / "explain.json").read_text())
    # Identity: PE(pos + k) = T(k) PE(pos) holds to float64 precision (SPEC claim 2).
    assert numbers["rotation_max_error"] < 1e-9
    assert numbers["dot_product_spread"] < 1e-9
    # SPEC claim 5: padding moves BatchNorm's output; the padding mask and LayerNorm do not.
    assert numbers["batchnorm_padding_gap"] > 1e-2
    assert numbers["masked_gap"] < 1e-5
    assert numbers["layernorm_gap"] < 1e-5
    # SPEC 3 worked example: mu = [2, 4], sigma^2 = [2/3, 8/3].
    assert numbers["batch_mean"] == [2.0, 4.0]
    var = numbers["batch_var"]
    assert abs(var[0] - 2 / 3) < 1e-12 and abs(var[1] - 8 / 3) < 1e-12
    # SPEC claim 9: frequencies from 1 down to max_period^(-(half-1)/half), half = 128.
    assert abs(numbers["freq_max"] - 1.0) < 1e-6
    assert abs(numbers["freq_min"] - 10000 ** (-127 / 128)) < 1e-6
