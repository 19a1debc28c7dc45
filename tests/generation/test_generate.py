"""addnorm.generation.generate: the one ``generate`` drives any model that implements
``addnorm.family.GenerativeModel`` (``start``, ``step``, ``generation_spec``), so a new family
plugs in without an edit there.

Provenance: a bigram model, whose next-token logits are a table row of its last token, so its
greedy continuation is the chain of row argmaxes, computed here directly (an oracle by
definition). The Transformer families' own outputs are held to Hugging Face's in
tests/transformer/test_generate_like_transformers.py.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from properties import examples

from addnorm.cache import DecodingCache
from addnorm.family import GenerationSpec
from addnorm.generation.config import GenerationConfig
from addnorm.generation.generate import generate

V = 7


class Bigram:
    """A decoder-only model (``start_id`` None) or, with ``start_id``, an encoder-decoder whose
    decoder starts at it: logits = ``table[last token]``."""

    def __init__(self, start_id: int | None = None, seed: int = 0) -> None:
        self.table = torch.randn(V, V, generator=torch.Generator().manual_seed(seed))
        self.start_id = start_id

    @property
    def generation_spec(self) -> GenerationSpec:
        return GenerationSpec(vocab_size=V, eos_id=None, pad_id=0, start_id=self.start_id,
                              max_positions=None, cached_layers=1, d_model=1,
                              device=torch.device("cpu"))

    def start(
        self, inputs: torch.Tensor, padding_mask: torch.Tensor | None, /, *,
        max_new_tokens: int, static: bool = False,
    ) -> tuple[DecodingCache, torch.Tensor]:
        batch, length = inputs.shape
        kept = length if self.start_id is None else 0  # an encoder-decoder caches no source
        cache = DecodingCache.allocate(n_layers=1, batch_size=batch, n_heads=1, d_head=1,
                                       max_len=kept + max_new_tokens, dtype=torch.float32,
                                       device=inputs.device, static=static)
        if self.start_id is None:
            cache.extend(padding_mask, length)  # the prompt's padding, as a model records it
            return cache, self.table[inputs[:, -1]]
        return cache, self.step(torch.full((batch, 1), self.start_id), cache)

    def step(self, tokens: torch.Tensor, cache: DecodingCache) -> torch.Tensor:
        cache.extend(None, 1)
        return self.table[tokens[:, 0]]


def greedy_chain(model: Bigram, first: int, n: int, banned: set[int]) -> list[int]:
    """The argmax of each table row in turn, the banned ids left out."""
    out, token = [], first
    for _ in range(n):
        row = model.table[token].clone()
        row[list(banned)] = float("-inf")
        token = int(row.argmax())
        out.append(token)
    return out


@examples(15)
@given(seed=st.integers(0, 100), last=st.integers(1, V - 1), n=st.integers(1, 6))
def test_a_decoder_only_family_continues_its_prompt_greedily(seed, last, n):
    model = Bigram(seed=seed)
    prompt = torch.tensor([[3, last]])
    new = generate(model, prompt, GenerationConfig(max_new_tokens=n, pad_id=0))
    assert new.tolist() == [greedy_chain(model, last, n, banned={0})]
    # Hugging Face's call returns the prompt followed by the new tokens
    out = generate(model, prompt, settings={"max_new_tokens": n})
    assert out.tolist() == [[3, last, *greedy_chain(model, last, n, banned={0})]]


@examples(15)
@given(seed=st.integers(0, 100), n=st.integers(1, 6))
def test_an_encoder_decoder_family_starts_at_its_start_id_and_never_emits_it(seed, n):
    model = Bigram(start_id=1, seed=seed)
    source = torch.tensor([[5, 6, 4], [2, 3, 4]])
    out = generate(model, source, GenerationConfig(max_new_tokens=n, pad_id=0),
                   return_prompt=True)
    chain = [1, *greedy_chain(model, 1, n, banned={0, 1})]
    assert out.tolist() == [chain, chain]  # the source is not the decoder's prompt


def test_the_prompt_counts_as_seen_for_the_repetition_rules():
    model = Bigram(seed=3)
    prompt = torch.tensor([[0, 0, 2, 3, 4]])  # left padding: the pad id is never "seen"
    out = generate(model, prompt, GenerationConfig(max_new_tokens=2, pad_id=0,
                                                   no_repeat_ngram_size=1),
                   padding_mask=prompt == 0)
    assert not set(out[0].tolist()) & {2, 3, 4}


def test_a_config_against_the_family_is_checked_once_before_start():
    model = Bigram(start_id=1)
    with pytest.raises(ValueError, match=r"eos_id 1 includes bos_id \(1\)"):
        generate(model, torch.tensor([[2]]), GenerationConfig(eos_id=1, pad_id=0))
    with pytest.raises(ValueError, match=r"pad_id \(7\) must be < the vocabulary size V \(7\)"):
        generate(model, torch.tensor([[2]]), GenerationConfig(pad_id=7))
    with pytest.raises(ValueError, match=r"forced_eos_id 1 includes bos_id \(1\)"):
        generate(model, torch.tensor([[2]]), GenerationConfig(forced_eos_id=1, pad_id=0))


@examples(10)
@given(seed=st.integers(0, 100), pad_id=st.integers(0, V - 1), data=st.data())
def test_any_pad_id_fills_the_rows_that_stopped_and_the_models_own_stays_banned(seed, pad_id,
                                                                              data):
    # Oracle: each row's greedy chain (the model's pad id 0 banned, the config's pad_id not),
    # cut after its first stop token and filled with pad_id to the longest row.
    model = Bigram(seed=seed)
    starts = [2, 5, 6]
    chains = [greedy_chain(model, start, 6, banned={0}) for start in starts]
    eos = data.draw(st.sampled_from(sorted({t for chain in chains for t in chain})), label="eos")
    cut = [chain[: chain.index(eos) + 1] if eos in chain else chain for chain in chains]
    n = max(len(row) for row in cut)
    out = generate(model, torch.tensor([[s] for s in starts]),
                   GenerationConfig(max_new_tokens=6, eos_id=eos, pad_id=pad_id))
    assert out.tolist() == [row + [pad_id] * (n - len(row)) for row in cut]
