"""addnorm.watch: a step's record, checked against the model's own tensors and against
identities of the residual stream.

Provenance: gradient norms and update ratios are recomputed from the parameters themselves
(float64 norms of ``p.grad`` and of the weights before and after the optimizer step); the
stream that leaves a layer is the stream that enters the next (the same tensor), a pre-LN
norm's input is its Add & Norm's input and a post-LN norm's output its Add & Norm's output
(the formulas); the first layer's input and a post-LN encoder's output are computed directly.
Invariances: what padding holds, the split of a batch into micro-batches, activation
checkpointing's recomputation and the watch itself leave the numbers (and the training) as
they are. Float32 against float64: ``FLOAT32_MODEL``.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from tolerances import FLOAT32_MODEL, LOW_PRECISION
from torch import nn

import addnorm
from addnorm.inspection import Watch
from addnorm.training.distributed import checkpoint_layers
from addnorm.transformer.config import LayerConfig


def _close(a, b, tolerance=FLOAT32_MODEL) -> None:
    assert math.isclose(a, b, rel_tol=tolerance["rtol"], abs_tol=tolerance["atol"]), (a, b)


def _lm(**overrides):
    settings = dict(vocab_size=32, d_model=16, n_heads=2, d_ff=32, n_layers=2, dropout=0.0)
    cfg = dataclasses.replace(addnorm.PRESETS["lm-tiny"], **{**settings, **overrides})
    torch.manual_seed(0)
    return addnorm.TransformerLM(cfg)


def _ids(batch=4, length=9, seed=0):
    return torch.randint(3, 32, (batch, length), generator=torch.Generator().manual_seed(seed))


def _lm_step(model, watch, ids, optimizer=None) -> dict:
    logits = model(ids[:, :-1])
    loss = nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    if optimizer is not None:
        watch.before_update()
        optimizer.step()
        optimizer.zero_grad()
    return watch.step()


def _encoder(norm_position="post", norm="layer", depth=3, dropout=0.0):
    torch.manual_seed(0)
    cfg = LayerConfig(d_model=16, n_heads=2, d_ff=32, norm=norm, norm_position=norm_position,
                      dropout=dropout)
    return addnorm.Encoder(cfg, depth, final_norm=False)


def _rms(x: torch.Tensor) -> float:
    return x.double().square().mean().sqrt().item()


def test_an_lm_record_has_every_layer_norm_attention_and_ffn():
    model = _lm()
    with addnorm.watch(model) as watch:
        record = _lm_step(model, watch, _ids(), torch.optim.AdamW(model.parameters(), 1e-3))
    layers = ["blocks.layers.0", "blocks.layers.1"]
    assert record["layers"] == layers
    adds = [f"{layer}.{part}" for layer in layers for part in ("attn_add_norm", "ff_add_norm")]
    assert set(record["residual"]) == {*layers, *adds}
    assert set(record["norms"]) == {f"{a}.norm" for a in adds} | {"blocks.norm"}
    assert {n["kind"] for n in record["norms"].values()} == {"layer"}
    assert set(record["attention_entropy"]) == {f"{layer}.self_attn" for layer in layers}
    assert all(len(h) == 2 for h in record["attention_entropy"].values())
    assert set(record["ffn_units"]) == {f"{layer}.ff" for layer in layers}
    assert set(record["update_ratio"]) == set(record["grad_norm"])
    for heads in record["attention_entropy"].values():  # causal rows see 1..8 keys
        assert all(0 < h < math.log(8) for h in heads)


def test_encoder_decoder_and_dit_records_name_their_own_parts():
    cfg = dataclasses.replace(addnorm.PRESETS["tiny"], src_vocab_size=20, tgt_vocab_size=20,
                              n_encoder_layers=1, n_decoder_layers=1)
    model = addnorm.Transformer(cfg)
    src, tgt = _ids(2, 5) % 20, _ids(2, 6, seed=1) % 20
    with addnorm.watch(model) as watch:
        model(src, tgt).sum().backward()
        record = watch.step()
    assert record["layers"] == ["encoder.layers.0", "decoder.layers.0"]
    assert set(record["attention_entropy"]) == {"encoder.layers.0.self_attn",
                                                 "decoder.layers.0.self_attn",
                                                 "decoder.layers.0.cross_attn"}
    dit = addnorm.DiT(dataclasses.replace(addnorm.DIT_PRESETS["DiT-S/2"], input_size=8,
                                          n_layers=2, d_model=32, n_heads=2, n_classes=3))
    with addnorm.watch(dit) as watch:
        out = dit(torch.randn(2, 4, 8, 8), torch.tensor([3, 500]), torch.tensor([0, 2]))
        out.square().mean().backward()
        record = watch.step()
    assert record["layers"] == ["blocks.0", "blocks.1"]
    assert set(record["residual"]) == {"blocks.0", "blocks.1"}  # its residual adds are inline
    assert {"blocks.0.attn_norm", "blocks.0.ff_norm"} <= set(record["norms"])
    assert set(record["ffn_units"]) == {"blocks.0.ff", "blocks.1.ff"}


def test_gradient_norms_and_update_ratios_are_the_parameters_own():
    model = _lm()
    optimizer = torch.optim.AdamW(model.parameters(), 1e-2)
    with addnorm.watch(model, per_parameter=True) as watch:
        logits = model(_ids()[:, :-1])
        logits.square().mean().backward()
        grads = {n: p.grad.double().clone() for n, p in model.named_parameters()}
        before = {n: p.detach().double().clone() for n, p in model.named_parameters()}
        watch.before_update()
        optimizer.step()
        record = watch.step()
    after = dict(model.named_parameters())
    for group, members in watch.map.groups.items():
        names = [watch.map.params[i][0] for i in members]
        grad = torch.cat([grads[n].flatten() for n in names]).norm().item()
        moved = torch.cat([(after[n].detach().double() - before[n]).flatten() for n in names])
        size = torch.cat([before[n].flatten() for n in names]).norm().item()
        _close(record["grad_norm"][group], grad)
        if size > 0:
            _close(record["update_ratio"][group], moved.norm().item() / size)
        else:  # zero-initialised biases: no ratio
            assert record["update_ratio"][group] is None


def test_the_stream_leaving_a_layer_enters_the_next_and_the_norms_sit_where_they_should():
    for position in ("post", "pre"):
        encoder = _encoder(position)
        x = torch.randn(3, 7, 16, generator=torch.Generator().manual_seed(1)) * 2
        with addnorm.watch(encoder) as watch:
            out = encoder(x)
            record = watch.step()  # no backward: activations and no gradients
        residual, norms = record["residual"], record["norms"]
        _close(residual["layers.0"]["in"], _rms(x))
        for i in range(2):
            assert residual[f"layers.{i}"]["out"] == residual[f"layers.{i + 1}"]["in"]
        if position == "post":
            _close(residual["layers.2"]["out"], _rms(out))  # no final norm
        for layer in record["layers"]:
            for add in ("attn_add_norm", "ff_add_norm"):
                path = f"{layer}.{add}"
                side = "in" if position == "pre" else "out"
                assert norms[f"{path}.norm"][side] == residual[path][side]
        assert "grad_norm" in record and record["grad_norm"] == {}


def test_padding_contents_change_nothing():
    encoder = _encoder("pre")
    x = torch.randn(3, 7, 16, generator=torch.Generator().manual_seed(2))
    padding = torch.zeros(3, 7, dtype=torch.bool)
    padding[0, 5:] = True
    padding[2, 3:] = True
    records = []
    for filler in (0.0, 1e4):
        filled = torch.where(padding[..., None], torch.full_like(x, filler), x)
        with addnorm.watch(encoder) as watch:
            encoder(filled, padding_mask=padding)
            records.append(watch.step())
    assert records[0] == records[1]


def test_micro_batches_measure_what_the_whole_batch_does():
    """LayerNorm is per token, so two halves see what the whole batch sees; the gradients of
    two half-batch losses, each weighted by half, add up to the whole batch's."""
    encoder = _encoder("pre", depth=2)
    x = torch.randn(4, 6, 16, generator=torch.Generator().manual_seed(3))
    target = torch.randn(4, 6, 16, generator=torch.Generator().manual_seed(4))
    records = []
    for parts in (1, 2):
        encoder.zero_grad(set_to_none=True)
        with addnorm.watch(encoder) as watch:
            for xs, ts in zip(x.chunk(parts), target.chunk(parts), strict=True):
                ((encoder(xs) - ts).square().mean() / parts).backward()
            records.append(watch.step())
    whole, halves = records
    assert whole["layers"] == halves["layers"]
    for section in ("grad_norm", "residual", "norms", "attention_entropy", "ffn_units"):
        _compare(whole[section], halves[section])


def _compare(a, b) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            _compare(a[key], b[key])
    elif isinstance(a, list):
        for x, y in zip(a, b, strict=True):
            _compare(x, y)
    elif isinstance(a, float):
        _close(a, b)
    else:
        assert a == b


def test_activation_checkpointing_recomputation_is_not_counted_again():
    model, wrapped = _lm(), checkpoint_layers(_lm())
    records = []
    for m in (model, wrapped):
        with addnorm.watch(m) as watch:
            records.append(_lm_step(m, watch, _ids()))
    _compare(records[0], records[1])


def test_the_watch_leaves_training_as_it_was_and_its_hooks_go_with_it():
    """Dropout everywhere: the weights after three watched steps equal three unwatched ones
    bit for bit (recomputing attention draws no random number)."""
    results = []
    for watched in (False, True):
        torch.manual_seed(0)
        model = _lm(dropout=0.2)
        optimizer = torch.optim.AdamW(model.parameters(), 1e-2)
        watch = Watch(model)
        for step in range(3):
            if watched:
                watch.attach()
            _lm_step(model, watch, _ids(seed=step), optimizer)
            watch.detach()
        results.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
        hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
        assert hooks == 0
    assert torch.equal(results[0], results[1])


def test_without_activations_no_hook_is_registered():
    model = _lm()
    with addnorm.watch(model, activations=False) as watch:
        hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
        record = _lm_step(model, watch, _ids())
    assert hooks == 0 and not watch.attached
    assert set(record) == {"layers", "grad_norm"}


def test_a_failing_forward_leaves_the_watch_ready():
    model = _lm()
    with addnorm.watch(model) as watch:
        with pytest.raises(ValueError):
            model(torch.full((2, 3), 99))  # ids beyond the vocabulary
        record = _lm_step(model, watch, _ids())
    assert set(record["residual"]) >= {"blocks.layers.0"}


def test_bfloat16_autocast_measures_in_float32():
    model = _lm()
    records = []
    for enabled in (False, True):
        model.zero_grad(set_to_none=True)
        with addnorm.watch(model) as watch, torch.autocast("cpu", torch.bfloat16, enabled=enabled):
            records.append(_lm_step(model, watch, _ids()))
    plain, low = records
    # the activations are bfloat16 roundings of a 2-layer forward: LOW_PRECISION's few u
    for path, entry in plain["residual"].items():
        _close(low["residual"][path]["out"], entry["out"], LOW_PRECISION[torch.bfloat16])
    assert all(isinstance(v, float) for v in low["grad_norm"].values())


def test_train_eval_gap_is_batchnorms_train_against_eval_output_and_zero_for_layernorm():
    """The reference: nn.BatchNorm1d given the same weights and running statistics, in
    training mode (the batch's statistics) and in eval mode (the running ones)."""
    x = torch.randn(4, 5, 16, generator=torch.Generator().manual_seed(5)) * 2 + 0.3
    for norm in ("batch", "layer"):
        add_norm = addnorm.AddNorm(16, norm=norm, norm_position="pre")
        if norm == "batch":
            with torch.no_grad():
                add_norm.norm.running_mean.uniform_(-0.5, 0.5)
                add_norm.norm.running_var.uniform_(0.5, 2.0)
                add_norm.norm.weight.uniform_(0.5, 1.5)
            reference = nn.BatchNorm1d(16).double()
            reference.load_state_dict(add_norm.norm.state_dict())
            tokens = x.double().reshape(-1, 16)
            y_eval = reference.eval()(tokens)
            y_train = reference.train()(tokens)
            expected = ((y_train - y_eval).norm() / y_train.norm()).item()
        with addnorm.watch(add_norm) as watch:
            add_norm(x, nn.Identity())
            entry = watch.step()["norms"]["norm"]
        if norm == "batch":
            _close(entry["train_eval_gap"], expected)
            assert entry["mean_gap"] > 0 and entry["var_log_ratio"] > 0
            assert entry["batch_effect"] > 0
        else:
            assert entry["train_eval_gap"] == 0.0
            assert not {"mean_gap", "batch_effect", "running_lag"} & set(entry)


# BatchNorm's two effects, where both are known. The full data: N sequences of L tokens, each
# feature N(mu, sd^2); the running statistics made exact by one training-mode call on all of
# it with momentum None (a cumulative average over one batch: the data's mean and, as
# BatchNorm stores it, its unbiased variance), then frozen (momentum 0) for the watched calls:
# K batches of B sequences, summed by the watch as micro-batches of one step.
_N, _L, _D, _B, _K = 256, 32, 32, 8, 64


def _batchnorm_with_exact_running_statistics():
    gen = torch.Generator().manual_seed(0)
    mean, sd = torch.rand(_D, generator=gen) * 2 - 1, torch.rand(_D, generator=gen) * 1.5 + 0.5
    data = torch.randn(_N, _L, _D, generator=gen) * sd + mean  # (N, L, D)
    add_norm = addnorm.AddNorm(_D, norm="batch", norm_position="pre")
    bn = add_norm.norm
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5, generator=gen)
        bn.bias.uniform_(-0.5, 0.5, generator=gen)
    bn.momentum = None
    bn(data)  # training mode, the whole data: exact running statistics
    bn.momentum = 0.0
    order = torch.cat([torch.randperm(_N, generator=gen) for _ in range(_K * _B // _N)])
    batches = [data[order[i * _B:(i + 1) * _B]] for i in range(_K)]  # (B, L, D) each
    return add_norm, data, batches


def _watched(add_norm, batches) -> dict:
    with addnorm.watch(add_norm) as watch:
        for x in batches:
            add_norm(x, nn.Identity())  # pre-LN: the norm sees x itself
        return watch.step()["norms"]["norm"]


def _known_effects(bn, data, batches) -> tuple[float, float]:
    """float64 from the formulas: ||y - y_full|| / ||y|| (the batch's own effect) and
    ||y_full - y_eval|| / ||y|| (the running statistics' lag) over every batch's tokens."""
    var_full, mean_full = torch.var_mean(data.double().reshape(-1, _D), 0, correction=0)
    weight, bias = bn.weight.detach().double(), bn.bias.detach().double()

    def normalized(t, mean, var):
        return (t - mean) / torch.sqrt(var + bn.eps) * weight + bias

    effect = lag = signal = 0.0
    for x in batches:
        tokens = x.double().reshape(-1, _D)
        var, mean = torch.var_mean(tokens, 0, correction=0)
        y = normalized(tokens, mean, var)
        y_full = normalized(tokens, mean_full, var_full)
        y_eval = normalized(tokens, bn.running_mean.double(), bn.running_var.double())
        effect += (y - y_full).square().sum().item()
        lag += (y_full - y_eval).square().sum().item()
        signal += y.square().sum().item()
    return math.sqrt(effect / signal), math.sqrt(lag / signal)


def test_batchnorms_batch_effect_is_known_where_the_running_statistics_are_exact():
    """Exact running statistics: the train/eval gap is the batch's own effect alone (the lag
    is n / (n - 1) of the stored variance, 1e-4 here). ``batch_effect`` estimates it from
    halves of each batch: within 10% (its first-order bias is about 1 / (tokens in a half) =
    1/128, the sampling error sqrt(2 / (K D)) ~ 3% for each sum of squares); ``running_lag``,
    what is left of the gap, then within sqrt(1 - 0.9^2) ~ 0.44 of it."""
    add_norm, data, batches = _batchnorm_with_exact_running_statistics()
    entry = _watched(add_norm, batches)
    effect, lag = _known_effects(add_norm.norm, data, batches)
    assert lag < 1e-3 * effect
    _close(entry["train_eval_gap"], effect, {"rtol": 1e-3, "atol": 0.0})  # the 1e-4 lag
    assert abs(entry["batch_effect"] / effect - 1) < 0.1
    assert entry["running_lag"] < 0.44 * effect


def test_batchnorms_running_lag_is_known_where_the_running_statistics_are_moved():
    """The same data and batches with the running mean moved by half a running standard
    deviation and the running variance by 1.5x: the batch's own effect is what it was (it
    reads only the batches), and ``running_lag`` is the known lag ||y_full - y_eval|| / ||y||
    within 5% (the error of gap^2 - effect^2: the effect's 20% of effect^2, 0.003 of lag^2
    here, and a cross term whose mean is 0)."""
    add_norm, data, batches = _batchnorm_with_exact_running_statistics()
    exact = _watched(add_norm, batches)
    bn = add_norm.norm
    with torch.no_grad():
        bn.running_mean += 0.5 * bn.running_var.sqrt()
        bn.running_var *= 1.5
    moved = _watched(add_norm, batches)
    _, lag = _known_effects(bn, data, batches)
    assert moved["batch_effect"] == exact["batch_effect"]
    assert moved["train_eval_gap"] > 2 * exact["train_eval_gap"]
    assert abs(moved["running_lag"] / lag - 1) < 0.05


def test_ffn_units_near_zero_and_dead_are_the_units_made_so():
    """FFNs whose units 0-2 are switched off by construction (w1's bias -50: ReLU and GELU
    output exactly 0 there; SwiGLU's value projection w3 zero there: the gated product is 0),
    the others driven by N(0, 1) inputs: 3 of 8 units are near zero for every activation, and
    dead for ReLU (no positive pre-activation), which GELU and SwiGLU do not report."""
    x = torch.randn(4, 6, 16, generator=torch.Generator().manual_seed(2))
    for activation in ("relu", "gelu", "swiglu"):
        torch.manual_seed(0)
        ffn = addnorm.make_feedforward(16, 8, activation=activation)
        with torch.no_grad():
            if activation == "swiglu":
                ffn.w3.weight[:3] = 0.0
                ffn.w3.bias[:3] = 0.0
            else:
                ffn.w1.bias[:3] = -50.0
        with addnorm.watch(ffn) as watch:
            ffn(x).sum().backward()
            units = watch.step()["ffn_units"][""]
        assert units["activation"] == activation
        assert units["near_zero"] == 3 / 8
        if activation == "relu":
            assert units["dead"] == 3 / 8
        else:
            assert "dead" not in units


def test_bad_arguments_are_refused_by_name():
    model = _lm()
    with pytest.raises(ValueError, match="torch.compile wrapper"):
        Watch(torch.compile(model))
    with pytest.raises(TypeError, match="nn.Module"):
        Watch("model")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="activations"):
        Watch(model, activations=1)  # type: ignore[arg-type]
