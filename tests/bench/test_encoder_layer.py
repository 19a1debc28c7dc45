"""addnorm.bench.encoder_layer: the timed encoder layers are checked against torch.nn's and BERT's
with the same weights."""

from __future__ import annotations

import torch

from addnorm.bench import Report


def test_encoder_layer_matches_torch_nn_and_bert_with_the_same_weights_and_not_without():
    from addnorm.bench.encoder_layer import _checks, _implementations

    report = Report()
    layers, refs, pairs = _implementations(32, 4, 64, report)
    x = torch.randn(2, 5, 32)
    _checks(layers, pairs, x, report)
    assert {"torch.nn post-LN", "torch.nn pre-LN"} <= refs
    assert report.checks and all(check.passed for check in report.checks)
    with torch.no_grad():  # the check can fail: a changed weight is caught
        layers["addnorm post-LN"].ff.w2.weight[0, 0] += 1.0  # (a shared bias shift the
        # post-LN norm would remove)
    failed = Report()
    _checks(layers, pairs, x, failed)
    assert not failed.checks[0].passed
