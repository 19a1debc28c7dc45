"""A random GPT-2 with spread logits, the ``TransformerLM`` holding its weights, and the
prompts that the tests comparing ``generate`` with transformers' share
(tests/transformer/test_generate_like_transformers.py, test_generate_hf_settings.py).

The weights are drawn wider than GPT-2's initialisation (std 0.5 to 1 instead of 0.02) so the
logits are spread: no near-tie is decided by float rounding.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import transformers
from hypothesis import strategies as st

import addnorm

V = 24  # vocabulary; GPT-2's bos and eos is V - 1
POSITIONS = 40  # GPT-2's n_positions

transformers.logging.set_verbosity_error()  # "Setting pad_token_id to eos_token_id", ...


@functools.cache
def models() -> tuple[transformers.GPT2LMHeadModel, addnorm.TransformerLM]:
    """A random GPT-2 with spread logits, and the TransformerLM holding its weights."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=V, n_positions=POSITIONS, n_embd=16,
                                     n_layer=2, n_head=2, bos_token_id=V - 1, eos_token_id=V - 1)
    gpt2 = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for name, weight in gpt2.named_parameters():
            if weight.ndim == 2:
                weight.normal_(0.0, 1.0 if name.endswith(("wte.weight", "wpe.weight")) else 0.5)
    lm = addnorm.from_transformers(gpt2)
    assert isinstance(lm, addnorm.TransformerLM)
    return gpt2, lm


@functools.cache
def free_run(seed: int) -> torch.Tensor:
    """transformers' greedy continuation of ``prompt(seed)`` without a stop token: where to
    pick stop tokens the models really emit."""
    gpt2, _ = models()
    ids, mask = prompt(seed)
    with torch.no_grad():
        out = gpt2.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                            eos_token_id=None, pad_token_id=0)
    return out[:, ids.shape[1]:]


@functools.cache
def no_stop_lm() -> addnorm.TransformerLM:
    """The GPT-2's TransformerLM without a stop token (transformers' kwarg eos_token_id=None)."""
    _, lm = models()
    alone = addnorm.TransformerLM(dataclasses.replace(lm.cfg, eos_id=None)).eval()
    alone.load_state_dict(lm.state_dict())
    return alone


@functools.cache
def prompt(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """1 to 3 left-padded rows of 1 to 6 tokens (padding holds the eos id, as a GPT-2
    tokenizer pads) and their attention_mask (1 = real token)."""
    gen = torch.Generator().manual_seed(seed)
    batch, length = (int(n) for n in (torch.randint(1, 4, (), generator=gen),
                                      torch.randint(1, 7, (), generator=gen)))
    ids = torch.randint(0, V - 1, (batch, length), generator=gen)
    mask = torch.ones_like(ids)
    for row in range(batch):
        mask[row, : int(torch.randint(0, length, (), generator=gen))] = 0
    return ids.masked_fill(mask == 0, V - 1), mask


SEEDS = st.integers(0, 10_000)
