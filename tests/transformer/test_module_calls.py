"""Every layer is called through ``nn.Module.__call__``, so what wraps a module sees the call:
forward hooks fire, ``torch.utils.checkpoint`` wrappers recompute (gradients equal those
without checkpointing: an identity), and per-layer FSDP2 ``fully_shard`` unshards each layer
before its forward (outputs and gradients equal the unsharded model's)."""

from __future__ import annotations

import dataclasses
import functools
import socket

import pytest
import torch
import torch.distributed as dist
from tolerances import FLOAT64_EXACT
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    apply_activation_checkpointing,
)

import addnorm
from addnorm.transformer.layers import DecoderLayer, EncoderLayer

LAYERS = (EncoderLayer, DecoderLayer)


def tiny_models() -> list[torch.nn.Module]:
    """An encoder-decoder and an LM, no dropout, so two forwards are comparable."""
    seq2seq = dataclasses.replace(addnorm.PRESETS["tiny"], dropout=0.0)
    lm = dataclasses.replace(addnorm.PRESETS["lm-tiny"], dropout=0.0, position_encoding="rotary")
    return [addnorm.Transformer(seq2seq), addnorm.TransformerLM(lm)]


def run(model: torch.nn.Module) -> torch.Tensor:
    ids = torch.randint(3, 128, (3, 9), generator=torch.Generator().manual_seed(1))
    ids[1, 6:] = 0  # padding, so the masks are in play
    if isinstance(model, addnorm.Transformer):
        return model(ids, ids[:, :7])
    return model(ids)


@pytest.mark.parametrize("index", [0, 1], ids=["transformer", "lm"])
def test_a_forward_hook_on_every_layer_fires(index):
    model = tiny_models()[index]
    layers = [m for m in model.modules() if isinstance(m, LAYERS)]
    fired: list[torch.nn.Module] = []
    for layer in layers:
        layer.register_forward_hook(lambda module, args, out: fired.append(module))
    run(model)
    assert fired == layers  # each once, in order


@pytest.mark.parametrize("index", [0, 1], ids=["transformer", "lm"])
def test_checkpointed_layers_give_the_same_gradients(index):
    torch.manual_seed(0)
    plain = tiny_models()[index].double()  # float64: recomputation is an identity
    wrapped = tiny_models()[index].double()
    wrapped.load_state_dict(plain.state_dict())
    recomputed: list[int] = []
    for layer in (m for m in wrapped.modules() if isinstance(m, LAYERS)):
        layer.register_forward_pre_hook(lambda module, args: recomputed.append(1))
    apply_activation_checkpointing(
        wrapped, checkpoint_wrapper_fn=functools.partial(
            torch.distributed.algorithms._checkpoint.checkpoint_wrapper.checkpoint_wrapper,
            checkpoint_impl=CheckpointImpl.NO_REENTRANT,
        ),
        check_fn=lambda m: isinstance(m, LAYERS),
    )
    run(plain).square().mean().backward()
    run(wrapped).square().mean().backward()
    n_layers = sum(isinstance(m, LAYERS) for m in plain.modules())
    assert len(recomputed) == 2 * n_layers  # forward, then recomputed in backward
    grads = {n.replace("_checkpoint_wrapped_module.", ""): p.grad
             for n, p in wrapped.named_parameters()}
    for name, p in plain.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, **FLOAT64_EXACT, msg=name)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_per_layer_fully_shard_matches_the_unsharded_model():
    """FSDP2 hooks unshard each layer's parameters in its pre-forward hook; a stack that
    bypassed ``__call__`` mixed DTensor and Tensor here."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1
    )
    try:
        mesh = init_device_mesh("cpu", (1,))
        torch.manual_seed(0)
        reference = tiny_models()[1]
        sharded = tiny_models()[1]
        sharded.load_state_dict(reference.state_dict())
        for layer in sharded.blocks.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(sharded, mesh=mesh)
        out, expected = run(sharded), run(reference)
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
        out.sum().backward()
        expected.sum().backward()
        got = sharded.blocks.layers[0].ff.w1.weight.grad.full_tensor()
        # One rank: the reduce-scatter copies, so the backward is the reference's ops, bitwise.
        expected_grad = reference.blocks.layers[0].ff.w1.weight.grad
        torch.testing.assert_close(got, expected_grad, rtol=0, atol=0)
    finally:
        dist.destroy_process_group()


def test_a_stack_compiles_with_fullgraph_and_matches_eager():
    """The checked-input context records nothing while dynamo traces, so no graph break."""
    torch.manual_seed(0)
    cfg = addnorm.LayerConfig(16, 2, 32, norm_position="pre")
    encoder = addnorm.Encoder(cfg, 2, rotary=addnorm.RotaryEmbedding(8)).double().eval()
    x = torch.randn(2, 5, 16, dtype=torch.float64)  # float64: the same function
    padding = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    compiled = torch.compile(encoder, fullgraph=True, backend="eager")
    expected = encoder(x, padding_mask=padding, causal=True)
    got = compiled(x, padding_mask=padding, causal=True)
    torch.testing.assert_close(got, expected, **FLOAT64_EXACT)
