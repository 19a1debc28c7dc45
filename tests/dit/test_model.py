"""DiT: zero output at initialisation, guidance, boundary checks, compile and hooks.

Parity with the reference DiT and with diffusers is in test_interop.py.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from properties import examples
from test_host_reads import CountReads
from tolerances import FLOAT32_MODEL, FLOAT64_EXACT

from addnorm.dit import DIT_PRESETS, DiT, DiTBlock, DiTConfig, classifier_free_guidance

F64 = torch.float64  # model() is float64: its comparisons use FLOAT64_EXACT
CFG = DiTConfig(input_size=8, patch_size=2, in_channels=4, d_model=32, n_layers=2, n_heads=4,
                n_classes=5, class_dropout=0.1, learn_sigma=True)


def perturbed(model: DiT, seed: int = 0) -> DiT:
    """Every parameter moved off its initial value, so zero-initialised parts are exercised."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return model


def model(cfg: DiTConfig = CFG, *, seed: int = 0) -> DiT:
    torch.manual_seed(seed)
    return perturbed(DiT(cfg), seed).double().eval()


def inputs(batch: int = 4, cfg: DiTConfig = CFG) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(batch, cfg.in_channels, cfg.input_size, cfg.input_size, generator=gen,
                    dtype=F64)
    t = torch.tensor([0.0, 17.5, 500.0, 999.0], dtype=F64)[:batch]
    y = torch.tensor([0, 3, 4, 1])[:batch]
    return x, t, y


def host_reads(fn) -> int:
    with torch.no_grad(), CountReads() as counter:
        fn()
    return counter.total


def first3_channels_guidance(dit: DiT, x, t, y, scale: float) -> torch.Tensor:
    """DiT's reference ``forward_with_cfg``: x's first half doubled, channels 0..2 guided
    ("for exact reproducibility" of its paper's samples), the rest kept from each half."""
    half = x[: len(x) // 2]
    return classifier_free_guidance(dit(torch.cat([half, half]), t, y), scale, n_guided=3)


def test_a_fresh_dit_outputs_exactly_zero():
    # adaLN-Zero: the final modulation and linear start at zero (DiT's initialize_weights).
    torch.manual_seed(0)
    dit = DiT(CFG)
    x, t, y = inputs()
    out = dit(x.float(), t.float(), y)
    assert out.shape == (4, 8, 8, 8)  # C_out = 2C with learn_sigma
    assert torch.equal(out, torch.zeros_like(out))


def test_initialisation_follows_dits_rules():
    torch.manual_seed(0)
    dit = DiT(dataclasses.replace(DIT_PRESETS["DiT-B/4"], d_model=256, n_heads=4, n_layers=1))
    # Sample stds of n >= 16384 draws: relative sd <= 1 / sqrt(2 n) = 0.0055, so rel=0.05
    # is >= 9 sd; the uniform in_proj (n = 196608, sd 0.001) gets 0.02, 20 sd.
    std = dit.class_embed.table.weight.std().item()
    assert std == pytest.approx(0.02, rel=0.05)  # N(0, 0.02^2)
    assert dit.timestep_embed.w1.weight.std().item() == pytest.approx(0.02, rel=0.05)
    # Xavier-uniform on the (3D, D) fused qkv as one matrix: bound sqrt(6 / (D + 3D)).
    w = dit.blocks[0].attn.in_proj.weight
    assert w.abs().max().item() <= math.sqrt(6 / (4 * 256))
    assert w.std().item() == pytest.approx(math.sqrt(6 / (4 * 256)) / math.sqrt(3), rel=0.02)
    # Patch embedding: Xavier on the Conv2d weight viewed as Linear (D, C p p) = (256, 64).
    proj = dit.patch_embed.proj.weight
    assert proj.std().item() == pytest.approx(math.sqrt(2 / (256 + 64)), rel=0.05)
    assert not dit.pos_embed.requires_grad and "pos_embed" in dit.state_dict()
    assert "pos_embed" not in dict(dit.named_parameters())


def test_timestep_embedding_is_dits_256_channel_cos_sin_mlp():
    # Oracle: DiT's TimestepEmbedder written out: [cos | sin] of t * exp(-ln(1e4) k / 128),
    # k < 128, then Linear(256, D) - SiLU - Linear(D, D).
    dit = model()
    t = torch.tensor([0.0, 3.5, 999.0], dtype=F64)
    freqs = torch.exp(-math.log(10000) * torch.arange(128, dtype=F64) / 128)
    args = t[:, None] * freqs[None]
    feats = torch.cat([args.cos(), args.sin()], dim=-1)
    emb = dit.timestep_embed
    hidden = F.silu(F.linear(feats, emb.w1.weight, emb.w1.bias))
    expected = F.linear(hidden, emb.w2.weight, emb.w2.bias)
    torch.testing.assert_close(emb(t), expected, **FLOAT64_EXACT)


def test_guidance_scale_1_equals_the_conditional_output():
    # Identity of the guidance formula: uncond + 1 * (cond - uncond) = cond.
    dit = model()
    x, t, _ = inputs()
    y = torch.tensor([2, 4, 5, 5])  # conditional half, then the null class (id 5)
    cond = dit(x[:2], t[:2], y[:2])
    out = dit.forward_with_cfg(x, t, y, 1.0)
    torch.testing.assert_close(out[:2], cond, **FLOAT64_EXACT)
    torch.testing.assert_close(out[2:, :4], cond[:, :4], **FLOAT64_EXACT)


def test_guidance_guides_every_noise_channel():
    # Oracle: two separate forwards (classes, then the null class) and the CFG formula.
    dit = model()
    x, t, _ = inputs()
    y = torch.tensor([2, 4, 5, 5])
    x2 = torch.cat([x[:2], x[:2]])
    cond, uncond = dit(x[:2], t[:2], y[:2]), dit(x[:2], t[2:], y[2:])
    out = dit.forward_with_cfg(x2, t, y, 3.0)
    expected = uncond[:, :4] + 3.0 * (cond[:, :4] - uncond[:, :4])
    torch.testing.assert_close(out[:2, :4], expected, **FLOAT64_EXACT)
    torch.testing.assert_close(out[2:, :4], expected, **FLOAT64_EXACT)
    # The learned variance channels are not guided: each half keeps its own.
    torch.testing.assert_close(out[:2, 4:], cond[:, 4:], **FLOAT64_EXACT)
    torch.testing.assert_close(out[2:, 4:], uncond[:, 4:], **FLOAT64_EXACT)
    # The reference's first-3-channels variant leaves channel 3 of 4 unguided.
    quirk = first3_channels_guidance(dit, x2, t, y, 3.0)
    torch.testing.assert_close(quirk[:, :3], out[:, :3], **FLOAT64_EXACT)
    torch.testing.assert_close(quirk[:2, 3], cond[:, 3], **FLOAT64_EXACT)
    assert not torch.allclose(quirk[:2, 3], out[:2, 3])


def test_forced_label_drops_equal_passing_the_null_class():
    dit = model()
    x, t, y = inputs()
    drop = torch.tensor([True, False, True, False])
    null = torch.where(drop, 5, y)
    torch.testing.assert_close(dit(x, t, y, force_drop_ids=drop), dit(x, t, null), rtol=0, atol=0)


def test_training_label_dropout_is_reproducible_with_a_generator():
    dit = model().train()
    x, t, y = inputs()
    a = dit(x, t, y, generator=torch.Generator().manual_seed(3))
    b = dit(x, t, y, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b)


def bad_input_cases() -> list[tuple[dict, type, str]]:
    return [
        ({"x": torch.zeros(4, 4, 9, 9, dtype=F64)}, ValueError,
         r"x image size \(9, 9\) must be divisible by patch_size \(2\)"),
        ({"x": torch.zeros(4, 3, 8, 8, dtype=F64)}, ValueError,
         r"x has 3 channels, the model expects in_channels \(4\)"),
        ({"x": torch.zeros(4, 4, 6, 6, dtype=F64)}, ValueError,
         r"x image size \(6, 6\) must equal \(input_size, input_size\) = \(8, 8\)"),
        ({"y": torch.tensor([0, 1, 6, 2])}, ValueError, r"class id 6 outside \[0, 5\]"),
        ({"y": torch.tensor([0, -1, 2, 2])}, ValueError, r"class id -1 outside \[0, 5\]"),
        ({"y": torch.tensor([0, 1, 2])}, ValueError, r"y must have shape \(4,\)"),
        ({"y": torch.zeros(4)}, TypeError, r"y must be an integer tensor"),
        ({"t": torch.zeros(3)}, ValueError, r"t must have shape \(4,\), one timestep per image"),
        ({"t": torch.zeros(4, 1)}, ValueError, r"t must have shape \(4,\)"),
        ({"t": torch.tensor([0.0, math.nan, 1.0, 2.0])}, ValueError, r"t must be finite, got nan"),
        ({"t": math.nan}, ValueError, r"t must be finite, got nan"),
        ({"t": True}, TypeError, r"t must be a torch.Tensor, got bool"),
        ({"t": 10**30}, ValueError, r"t \(1000000000000000000000000000000\) does not fit int64"),
        ({"t": torch.zeros(2)}, ValueError,
         r"t must have shape \(4,\), one timestep per image \(or one for the batch: a number"),
    ]


@pytest.mark.parametrize(("change", "error", "match"), bad_input_cases())
def test_bad_inputs_raise_naming_the_values(change, error, match):
    dit = model()
    x, t, y = inputs()
    args = {"x": x, "t": t, "y": y} | change
    with pytest.raises(error, match=match):
        dit(args["x"], args["t"], args["y"])


@examples(10)
@given(batch=st.integers(1, 4), step=st.integers(0, 999), fraction=st.sampled_from([0.0, 0.5]),
       form=st.sampled_from(["number", "0-d", "(1,)"]))
def test_one_timestep_for_the_whole_batch_is_broadcast_over_it(batch, step, fraction, form):
    # Identity: one timestep given once equals it given per image (diffusers' models broadcast
    # a (1,) timestep, its pipelines a number or a 0-d tensor), the same operations bit for bit.
    dit = model()
    x, _, y = inputs(batch)
    value = step + fraction
    per_image = dit(x, torch.full((batch,), value, dtype=F64), y)
    once = {"number": value, "0-d": torch.tensor(value, dtype=F64),
            "(1,)": torch.tensor([value], dtype=F64)}[form]
    assert torch.equal(dit(x, once, y), per_image)


def test_checked_labels_give_the_same_output_and_are_not_read_again():
    # Oracle: the call with plain labels (the same ids, the same operations). The reads are
    # counted as tests/test_host_reads.py counts them.
    dit = model(PER_BLOCK)
    x, t, y = inputs()
    labels = dit.checked_labels(y)
    assert torch.equal(dit(x, t, labels), dit(x, t, y))
    steps = torch.tensor([999, 500, 20, 0])
    assert host_reads(lambda: dit(x, steps, y)) == 1  # the labels' range, read once
    assert host_reads(lambda: dit(x, steps, labels)) == 0  # checked before, integer steps
    assert host_reads(lambda: dit(x, t, labels)) == 1  # float timesteps: their finiteness


def test_checked_labels_are_refused_by_a_model_of_another_label_count():
    x, t, y = inputs()
    with pytest.raises(ValueError, match=r"class id 6 outside \[0, 5\]"):
        model().checked_labels(torch.tensor([0, 6]))
    labels = model(dataclasses.replace(CFG, class_dropout=0.0)).checked_labels(y)  # 5 rows
    with pytest.raises(ValueError, match=r"y was checked against 5 label rows, this model has 6"):
        model()(x, t, labels)
    with pytest.raises(ValueError, match=r"y must have shape \(4,\)"):
        model()(x, t, model().checked_labels(y[:3]))


def test_the_null_class_is_out_of_range_without_label_dropout():
    dit = model(dataclasses.replace(CFG, class_dropout=0.0))
    x, t, _ = inputs()
    with pytest.raises(ValueError, match=r"class id 5 outside \[0, 4\]"):
        dit(x, t, torch.tensor([0, 1, 5, 5]))


def test_guidance_without_a_null_class_raises():
    dit = model(dataclasses.replace(CFG, class_dropout=0.0))
    x, t, _ = inputs()
    y = torch.tensor([0, 1, 5, 5])
    with pytest.raises(ValueError, match=r"guidance needs the null class, but class_dropout"):
        dit.forward_with_cfg(x, t, y, 4.0)


@pytest.mark.parametrize(
    ("batch", "y", "match"),
    [
        (4, [0, 1, 2, 5], r"y's second half must be the null class id \(5\), got \[2, 5\]"),
        (3, [0, 5, 5], r"guidance takes 2B rows, conditional then null: got x batch 3"),
    ],
)
def test_guidance_checks_its_batch_convention(batch, y, match):
    dit = model()
    x, t, _ = inputs()
    with pytest.raises(ValueError, match=match):
        dit.forward_with_cfg(x[:batch], t[:batch], torch.tensor(y), 4.0)


def test_the_whole_forward_compiles_with_fullgraph_and_matches_eager():
    dit = model(DIT_PRESETS["DiT-digits-tiny"])
    x, t, y = inputs(cfg=DIT_PRESETS["DiT-digits-tiny"])
    expected = dit(x, t, y)
    compiled = torch.compile(dit, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x, t, y), expected, **FLOAT64_EXACT)


@torch.no_grad()
def test_one_dynamic_compile_serves_every_batch_size():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    dit = model()
    compiled = torch.compile(dit, fullgraph=True, dynamic=True, backend="eager")
    for batch in (2, 3, 4):
        x, t, y = inputs(batch)
        torch.testing.assert_close(compiled(x, t, y), dit(x, t, y), **FLOAT64_EXACT)
    assert counters["stats"]["unique_graphs"] == 1
    # Eager reads the labels back and names the culprit; the graph asserts in-graph instead.
    x, t, _ = inputs(2)
    with pytest.raises(RuntimeError, match=r"class id outside \[0, 5\]"):
        compiled(x, t, torch.tensor([1, 7]))
    torch._dynamo.reset()


@torch.no_grad()
def test_a_traced_forward_gives_the_eager_output_at_another_batch_size():
    # The forward has no data-dependent branch (its value checks only raise), so a trace,
    # and the legacy ONNX exporter built on it, records the whole computation.
    dit = model()
    with pytest.warns(torch.jit.TracerWarning):
        traced = torch.jit.trace(dit, inputs(2), check_trace=False)
    x, t, y = inputs(4)
    torch.testing.assert_close(traced(x, t, y), dit(x, t, y), **FLOAT64_EXACT)


def test_a_forward_hook_on_every_block_fires_in_order():
    dit = model()
    blocks = [m for m in dit.modules() if isinstance(m, DiTBlock)]
    fired: list[torch.nn.Module] = []
    for block in blocks:
        block.register_forward_hook(lambda module, args, out: fired.append(module))
    dit(*inputs())
    assert fired == blocks and len(blocks) == CFG.n_layers


# ------------------------------------------------- per-block conditioning (diffusers' layout)

PER_BLOCK = dataclasses.replace(CFG, conditioning="per_block")


def shared_as_per_block(shared: DiT) -> DiT:
    """A per-block DiT holding ``shared``'s weights, its embedders copied into every block."""
    dit = DiT(dataclasses.replace(shared.cfg, conditioning="per_block")).to(F64)
    weights = {k: v for k, v in shared.state_dict().items()
               if not k.startswith(("timestep_embed.", "class_embed."))}
    for i in range(shared.cfg.n_layers):
        for name in ("timestep_embed", "class_embed"):
            for key, value in getattr(shared, name).state_dict().items():
                weights[f"block_embeds.{i}.{name}.{key}"] = value
    dit.load_state_dict(weights)
    return dit.train(shared.training)


def test_a_fresh_per_block_dit_outputs_exactly_zero():
    # adaLN-Zero holds in either layout: the final modulation and linear start at zero.
    torch.manual_seed(0)
    dit = DiT(PER_BLOCK)
    x, t, y = inputs()
    out = dit(x.float(), t.float(), y)
    assert out.shape == (4, 8, 8, 8)
    assert torch.equal(out, torch.zeros_like(out))
    # Each block's pair follows DiT's rule (N(0, 0.02^2) tables, zero timestep biases), and
    # the blocks' pairs are separate draws.
    tables = [embed.class_embed.table.weight for embed in dit.block_embeds]
    assert not torch.equal(tables[0], tables[1])
    assert all(torch.equal(e.timestep_embed.w1.bias, torch.zeros(32)) for e in dit.block_embeds)


@pytest.mark.parametrize("training", [False, True])
def test_per_block_with_equal_embedders_is_the_shared_model(training):
    # In eval mode the same weights give the same function. In training the one label-dropout
    # draw (the same generator, the same draw as the shared layout's) is used by every block
    # and by the final layer; a block drawing its own would drop other labels.
    shared = model().train(training)
    per_block = shared_as_per_block(shared)
    x, t, y = inputs()
    for seed in range(4):  # p = 0.1, 4 rows: a draw drops some label in 1 - 0.9**16 = 81%
        a = shared(x, t, y, generator=torch.Generator().manual_seed(seed))
        b = per_block(x, t, y, generator=torch.Generator().manual_seed(seed))
        torch.testing.assert_close(b, a, rtol=0, atol=0)  # the same float64 operations


def test_per_block_training_drops_one_draw_of_labels_for_every_block():
    # Oracle: eval mode with force_drop_ids = the draw label_drops makes with that generator.
    dit = model(PER_BLOCK).train()
    x, t, y = inputs()
    for seed in range(4):
        drops = torch.rand(4, generator=torch.Generator().manual_seed(seed)) < 0.1
        trained = dit(x, t, y, generator=torch.Generator().manual_seed(seed))
        forced = dit.eval()(x, t, y, force_drop_ids=drops)
        dit.train()
        torch.testing.assert_close(trained, forced, rtol=0, atol=0)


def test_per_block_forced_drops_and_guidance_use_the_null_class():
    dit = model(PER_BLOCK)
    x, t, y = inputs()
    drop = torch.tensor([True, False, True, False])
    null = torch.where(drop, 5, y)
    torch.testing.assert_close(dit(x, t, y, force_drop_ids=drop), dit(x, t, null), rtol=0, atol=0)
    # Guidance's identity at scale 1: uncond + 1 * (cond - uncond) = cond.
    y = torch.tensor([2, 4, 5, 5])
    out = dit.forward_with_cfg(x, t, y, 1.0)
    torch.testing.assert_close(out[:2], dit(x[:2], t[:2], y[:2]), **FLOAT64_EXACT)


def test_every_block_uses_its_own_conditioning_and_the_final_layer_block_0s():
    # Oracle: the model's parts called by hand with c_i = block_embeds[i](t, y).
    dit = model(PER_BLOCK)
    x, t, y = inputs()
    h = dit.patch_embed(x) + dit.pos_embed
    cs = [embed(t, y) for embed in dit.block_embeds]
    assert not torch.allclose(cs[0], cs[1])
    for block, c in zip(dit.blocks, cs, strict=True):
        h = block(h, c)
    patches = dit.final_layer(h, cs[0])
    expected = patches.reshape(4, 4, 4, 2, 2, 8).permute(0, 5, 1, 3, 2, 4).reshape(4, 8, 8, 8)
    torch.testing.assert_close(dit(x, t, y), expected, rtol=0, atol=0)


def test_a_per_block_dit_saves_and_loads_its_layout(tmp_path):
    dit = model(PER_BLOCK)
    dit.save_pretrained(tmp_path)
    loaded = DiT.from_pretrained(tmp_path).eval()
    assert loaded.cfg == PER_BLOCK
    x, t, y = inputs()
    torch.testing.assert_close(loaded(x, t, y), dit(x, t, y), rtol=0, atol=0)


def test_a_config_saved_before_the_option_loads_shared():
    data = CFG.to_dict()
    del data["conditioning"]
    assert DiTConfig.from_dict(data) == CFG and CFG.conditioning == "shared"


@torch.no_grad()
def test_a_per_block_dit_compiles_with_fullgraph_and_exports(fresh_dynamo):
    from torch._dynamo.utils import counters

    from addnorm.export import export_program, sample_inputs

    dit = model(PER_BLOCK)
    compiled = torch.compile(dit, fullgraph=True, dynamic=True, backend="eager")
    for batch in (2, 3):
        x, t, y = inputs(batch)
        torch.testing.assert_close(compiled(x, t, y), dit(x, t, y), **FLOAT64_EXACT)
    assert counters["stats"]["unique_graphs"] == 1
    dit = dit.float()  # export's sample inputs are float32
    program = export_program(dit)
    example = sample_inputs(dit, batch=5, seed=3)  # another batch size than the capture's
    # The program runs eager's aten kernels; one decomposed on export would reorder float32
    # sums: at most two float32 implementations of one small model apart (tolerances.py).
    torch.testing.assert_close(program.module()(**example), dit(**example), **FLOAT32_MODEL)


def test_a_per_block_forward_reads_its_inputs_back_once():
    from test_host_reads import CountReads

    dit = model(PER_BLOCK)
    with CountReads() as counter:
        dit(*inputs())
    assert counter.total == 1, counter.reads  # the boundary's one check of t and y


def test_per_block_embedders_shard_with_the_model_under_per_layer_fsdp():
    """Each block sharded alone (FSDP2, as ``addnorm train --fsdp`` does), the root holding
    the embedders: the final layer reads block 0's conditioning outside block 0's forward."""
    import socket

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        reference = model(PER_BLOCK)
        sharded = model(PER_BLOCK)
        for block in sharded.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(sharded, mesh=mesh)
        out, expected = sharded(*inputs()), reference(*inputs())
        torch.testing.assert_close(out, expected, rtol=0, atol=0)  # one rank: the same ops
        out.sum().backward()
        expected.sum().backward()
        got = sharded.block_embeds[0].timestep_embed.w1.weight.grad.full_tensor()
        torch.testing.assert_close(got, reference.block_embeds[0].timestep_embed.w1.weight.grad,
                                   rtol=0, atol=0)
    finally:
        dist.destroy_process_group()
