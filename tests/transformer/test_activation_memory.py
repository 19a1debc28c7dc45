"""Activation memory of a training step: addnorm's TransformerLM against Hugging Face GPT-2.

Oracle: ``transformers.GPT2LMHeadModel`` (sdpa attention) holding the same weights
(``from_transformers``), trained on the same batch with the same loss (cross-entropy of the
float32 logits, what ``addnorm bench`` times). What a step keeps for its backward is counted
with ``torch.autograd.graph.saved_tensors_hooks``: every tensor saved for the backward, the
storage of each counted once, parameters left out. Compiled, the saved tensors are the ones
the compiled function keeps (``aot_eager_decomp_partition``: inductor's decompositions and its
min-cut partitioner, without generating kernels).

addnorm must keep no more bytes per token than GPT-2 in eager and compiled steps, in float32
and under bfloat16 autocast, and no tensor of L x L entries (a materialised attention mask or
bias): without a padding token and a padding mask nothing needs masking but the causal order,
which SDPA's ``is_causal`` applies without a mask (a flash kernel's condition on CUDA).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from addnorm.interop import from_transformers

transformers = pytest.importorskip("transformers")

B, L, V = 4, 48, 256  # L differs from D (64), so an (L, L) shape is a mask


def gpt2_pair() -> tuple[nn.Module, nn.Module]:
    config = transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=V, n_positions=L, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=V - 1, eos_token_id=V - 1,
        pad_token_id=None,
    )
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(config)
    hf.set_attn_implementation("sdpa")
    return from_transformers(hf).train(), hf.train()


def saved_activations(loss_fn: Callable[[], torch.Tensor], model: nn.Module, bf16: bool
                      ) -> list[torch.Tensor]:
    """The non-parameter tensors one step saves for its backward, one per storage."""
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            loss = loss_fn()
    loss.backward()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages = {t.untyped_storage().data_ptr(): t for t in saved}
    return [t for ptr, t in storages.items() if ptr not in params]


def bytes_per_token(tensors: list[torch.Tensor]) -> float:
    return sum(t.untyped_storage().nbytes() for t in tensors) / (B * L)


@pytest.mark.parametrize("bf16", [False, True], ids=["float32", "bf16 autocast"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_training_step_saves_no_more_per_token_than_gpt2(compiled, bf16, fresh_dynamo):
    ours, hf = gpt2_pair()
    ids = torch.randint(0, V, (B, L + 1), generator=torch.Generator().manual_seed(0))
    x, y = ids[:, :-1], ids[:, 1:].flatten()

    def ours_loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(ours(x).flatten(0, 1).float(), y)

    def hf_loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(hf(input_ids=x).logits.flatten(0, 1).float(), y)

    steps = {"addnorm": ours_loss, "HF": hf_loss}
    if compiled:
        backend = "aot_eager_decomp_partition"
        steps = {"addnorm": torch.compile(ours_loss, fullgraph=True, backend=backend),
                 "HF": torch.compile(hf_loss, backend=backend)}
    saved = {}
    for (name, step), model in zip(steps.items(), (ours, hf), strict=True):
        step(x, y).backward()  # the first call compiles
        saved[name] = saved_activations(lambda step=step: step(x, y), model, bf16)
    ours_bytes, hf_bytes = bytes_per_token(saved["addnorm"]), bytes_per_token(saved["HF"])
    assert ours_bytes <= hf_bytes, (ours_bytes, hf_bytes)
    square = [tuple(t.shape) for t in saved["addnorm"] if t.shape[-2:] == (L, L)]
    assert not square  # no attention mask or bias kept
