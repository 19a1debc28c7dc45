"""addnorm.inspection.summary: sentences read off records built by hand, so every number in
them is known (a gradient profile 1, 2, 4 over three layers is a fitted ratio of exactly 4,
a slope of ln 2 per layer)."""

from __future__ import annotations

import math

import pytest

from addnorm.inspection.summary import depth_profile, summarize

LAYERS = ["layers.0", "layers.1", "layers.2"]


def _record(step, grads, ratios, rms, **extra):
    return {
        "step": step, "layers": LAYERS,
        "grad_norm": dict(zip(LAYERS, grads, strict=True)),
        "update_ratio": {**dict(zip(LAYERS, ratios, strict=True)), "layers.1.ff": 1e-5},
        "residual": {layer: {"in": a, "out": b}
                     for layer, (a, b) in zip(LAYERS, zip(rms, rms[1:], strict=False),
                                              strict=True)},
        **extra,
    }


def test_depth_profile_fits_the_log_gradient_over_layers():
    slope, ratio = depth_profile(_record(1, [1.0, 2.0, 4.0], [1, 1, 1], [1, 1, 1, 1]))
    assert slope == pytest.approx(math.log(2)) and ratio == pytest.approx(4.0)
    assert depth_profile({"layers": LAYERS, "grad_norm": {"layers.0": 1.0}}) is None


def test_summary_names_the_profile_the_slowest_layers_and_the_scale():
    first = _record(1, [1.0, 1.0, 1.0], [1e-3, 2e-3, 3e-3], [1.0, 2.0, 3.0, 7.0])
    last = _record(9, [1.0, 2.0, 4.0], [3e-3, 2e-3, 1e-3], [1.0, 1.0, 1.0, 1.0], norms={
        "layers.0.norm": {"kind": "batch", "mean_gap": 0.5, "var_log_ratio": 0.1,
                          "train_eval_gap": 0.5, "batch_effect": 0.3, "running_lag": 0.4},
        "layers.1.norm": {"kind": "batch", "mean_gap": 0.3, "var_log_ratio": 0.1,
                          "train_eval_gap": 1.0, "batch_effect": 0.6, "running_lag": 0.8}},
        attention_entropy={"layers.0.attn": [0.5, 2.0]},
        ffn_units={"layers.0.ff": {"activation": "relu", "near_zero": 0.25, "dead": 0.0},
                   "layers.1.ff": {"activation": "relu", "near_zero": 0.75, "dead": 0.5}})
    lines = summarize([last, first])  # any order
    assert lines[0] == "2 watched steps, 1 to 9, 3 layers"
    assert "step 1 is flat over depth: last layer / first layer 1x" in lines[1]
    assert "step 9 grows toward the output: last layer / first layer 4x" in lines[2]
    assert "+0.693 per layer" in lines[2]
    # update ratios per layer over both steps: medians 2e-3 each; then the sublayer
    assert "learns least" in lines[3] and "the median layer 0.002" in lines[3]
    assert lines[4] == "the sublayer that moves least: layers.1.ff 1e-05"
    assert "1 entering layers.0, 7 leaving layers.2 (7x); it grows most in layers.2 (2.33x)" \
        in lines[5]
    assert "BatchNorm at step 9: batch mean 0.4 running stds" in lines[7]
    assert ("the batch's own effect 0.45 (||y - y_full|| / ||y||, from half batches) and the "
            "running statistics' lag 0.6 on average (train/eval gap 0.75)") in lines[7]
    assert "most focused head layers.0.attn head 1 (0.5 nats)" in lines[8]
    assert lines[9] == ("FFN units whose output stays near zero (relu: within 1% of the FFN's "
                        "RMS output on every token) at step 9: 50.0% on average, 75.0% in "
                        "layers.1.ff")
    assert lines[10] == ("dead ReLU units (no positive pre-activation on any token) at step 9: "
                         "25.0% on average, 50.0% in layers.1.ff")


def test_records_from_before_the_separation_are_named_for_what_they_hold():
    """``batch_noise`` was the train/eval gap, ``dead_units`` the units with no positive
    pre-activation whatever the activation: a summary of an older watch.jsonl says so."""
    old = _record(3, [1.0, 1.0, 1.0], [1e-3] * 3, [1.0] * 4, norms={
        "layers.0.norm": {"kind": "batch", "mean_gap": 0.5, "var_log_ratio": 0.1,
                          "batch_noise": 0.25}}, dead_units={"layers.0.ff": 0.5})
    lines = summarize([old])
    assert any("train/eval gap ||y - y_eval|| / ||y|| 0.25 on average (the batch's own effect "
               "and the running statistics' lag together" in line for line in lines)
    assert lines[-1] == ("FFN units with no positive pre-activation on any token (dead only for "
                         "ReLU) at step 3: 50.0% on average, 50.0% in layers.0.ff")


def test_no_records_no_sentences():
    assert summarize([]) == []
