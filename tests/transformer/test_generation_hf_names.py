"""Hugging Face's generation names through whole decoders: greedy generation against
transformers' ``generate``, the repetition rules in sampling, beam search and a padded batch,
pad_id None.

Provenance: transformers' ``generate`` driving the same stand-in model (a fixed random bigram
table) greedily; the invariants that no n-gram repeats in an output and that a left-padded row
decodes as it does alone; Hugging Face's rule that finished rows are filled with the eos id
when there is no pad id. The rules' own checks against transformers' logits processors are in
tests/generation/test_repetition.py, the mapping of the names in test_config.py, stop strings
in test_stop_strings.py.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from toy_decoders import BeamCache, Scripted

import addnorm
from addnorm import GenerationConfig, TransformerLM, generate_tokens

VOCAB = 12


class Bigram:
    """A stand-in model: the next-token logits are a fixed random row per last token."""

    def __init__(self, vocab: int = VOCAB, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.table = torch.randn(vocab, vocab, generator=gen)

    def step(self, tokens: torch.Tensor, cache: object) -> torch.Tensor:
        return self.table[tokens[:, -1]]  # (B, V)


def _tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=16, n_layer=1, n_head=2,
                     bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)
    return GPT2LMHeadModel(cfg).eval()


class Recompute:
    """A step function over a transformers model without a cache: the whole sequence is run
    again at every step (the ids so far live in ``ids``)."""

    def __init__(self, model, prompt: torch.Tensor) -> None:
        self.model, self.ids = model, prompt

    def logits(self) -> torch.Tensor:
        return self.model(self.ids).logits[:, -1].double()  # (B, V)

    def step(self, tokens: torch.Tensor, cache: object) -> torch.Tensor:
        self.ids = torch.cat([self.ids, tokens], dim=1)
        return self.logits()


@pytest.mark.parametrize(
    "names",
    [
        {"repetition_penalty": 1.8},
        {"no_repeat_ngram_size": 2},
        {"repetition_penalty": 1.2, "no_repeat_ngram_size": 3},
    ],
)
def test_greedy_generation_matches_transformers_generate_with_the_same_names(names):
    gpt2 = _tiny_gpt2()
    prompt = torch.randint(0, VOCAB - 1, (3, 4), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs = gpt2.generate(
            prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=10,
            pad_token_id=VOCAB - 1, eos_token_id=VOCAB - 1, **names,
        )[:, prompt.shape[1] :]
    config = GenerationConfig.from_transformers(
        max_new_tokens=10, eos_token_id=VOCAB - 1, pad_token_id=None, **names
    )
    model = Recompute(gpt2, prompt)
    with torch.no_grad():
        ours = generate_tokens(model.step, model.logits(), None, config, prompt_ids=prompt)
    assert torch.equal(ours, theirs[:, : ours.shape[1]])
    assert (theirs[:, ours.shape[1] :] == VOCAB - 1).all()  # transformers pads to the end
    model = Recompute(gpt2, prompt)
    with torch.no_grad():
        plain = generate_tokens(model.step, model.logits(), None,
                                dataclasses.replace(config, repetition_penalty=1.0,
                                                    no_repeat_ngram_size=0))
    assert not torch.equal(ours, plain[:, : ours.shape[1]])  # the rules changed the output


def _ngrams(row: list[int], n: int) -> list[tuple[int, ...]]:
    return [tuple(row[i : i + n]) for i in range(len(row) - n + 1)]


@pytest.mark.parametrize("strategy", ["sample", "beam"])
def test_no_ngram_repeats_in_sampling_and_beam_search(strategy):
    bigram = Bigram(vocab=30)
    prompt = torch.randint(0, 30, (2, 3), generator=torch.Generator().manual_seed(2))
    fields = {"num_beams": 3} if strategy == "beam" else {}
    config = GenerationConfig(strategy=strategy, max_new_tokens=12, no_repeat_ngram_size=2,
                              **fields)
    cache = BeamCache() if strategy == "beam" else None

    def repeats(config: GenerationConfig) -> list[int]:
        out = generate_tokens(bigram.step, bigram.step(prompt, None), cache, config,
                              prompt_ids=prompt, generator=torch.Generator().manual_seed(0))
        rows = torch.cat([prompt, out], dim=1).tolist()
        return [len(_ngrams(row, 2)) - len(set(_ngrams(row, 2))) for row in rows]

    assert repeats(config) == [0, 0]
    assert any(repeats(dataclasses.replace(config, no_repeat_ngram_size=0)))  # without the rule


def test_a_row_left_with_no_token_is_named():
    bigram = Bigram(vocab=3)
    prompt = torch.tensor([[0, 1, 2]])
    config = GenerationConfig(max_new_tokens=8, no_repeat_ngram_size=1)
    with pytest.raises(ValueError, match=r"rules \(no_repeat_ngram_size=1\) leave row 0 no "
                       "token to emit at step 0"):
        generate_tokens(bigram.step, bigram.step(prompt, None), None, config, prompt_ids=prompt)


def test_the_lm_counts_its_prompt_and_decodes_a_padded_row_as_alone():
    torch.manual_seed(0)
    model = TransformerLM(addnorm.PRESETS["lm-tiny"]).eval()
    config = dataclasses.replace(
        model.generation_config, max_new_tokens=8, repetition_penalty=1.5,
        no_repeat_ngram_size=2, eos_id=None,
    )
    short = torch.tensor([[5, 6, 7]])
    long = torch.tensor([[9, 10, 11, 12, 13]])
    padded = torch.cat([torch.cat([torch.zeros(1, 2, dtype=torch.long), short], 1), long])
    batch = model.generate(padded, config)
    assert torch.equal(batch[0], model.generate(short, config)[0])
    assert torch.equal(batch[1], model.generate(long, config)[0])
    row = short[0].tolist() + batch[0].tolist()
    assert len(_ngrams(row, 2)) == len(set(_ngrams(row, 2)))


def test_without_a_pad_id_finished_rows_are_filled_with_the_eos_id():
    model = Scripted([[4, 2, 5, 6, 7], [4, 5, 6, 2, 9]])
    config = GenerationConfig(max_new_tokens=5, eos_id=(2, 3), pad_id=None)
    assert config.fill_id == 2
    out = generate_tokens(model.step, model.logits(), None, config)
    assert out.tolist() == [[4, 2, 2, 2], [4, 5, 6, 2]]


def test_beam_search_without_a_pad_id_fills_with_the_eos_id():
    model = Bigram()
    model.table[1, 3] = 50.0  # after token 1 the stop token 3 is certain
    config = GenerationConfig(strategy="beam", num_beams=2, max_new_tokens=5, eos_id=3,
                              pad_id=None)
    prompt = torch.tensor([[1], [2]])
    out = generate_tokens(model.step, model.step(prompt, None), BeamCache(), config)
    padded = generate_tokens(model.step, model.step(prompt, None), BeamCache(),
                             dataclasses.replace(config, pad_id=0))
    assert out[0].tolist() == [3] * out.shape[1] and out.shape[1] > 1
    assert padded[0].tolist() == [3] + [0] * (out.shape[1] - 1)
    assert torch.equal(out[1], padded[1])


def test_a_model_without_a_pad_id_bans_nothing_as_padding():
    torch.manual_seed(0)
    model = TransformerLM(addnorm.PRESETS["lm-tiny"]).eval()
    prompt = torch.tensor([[5, 6, 7]])
    captured = {}
    hook = model.to_logits.register_forward_hook(
        lambda module, inputs, output: captured.update(h=inputs[0][0, -1])
    )
    model(prompt)
    hook.remove()
    with torch.no_grad():  # make id 0, the usual pad id, by far the likeliest next token
        model.embed.tokens.weight[0] = 1000 * captured["h"] / captured["h"].norm()
    assert model(prompt)[0, -1].argmax() == 0
    no_pad = TransformerLM(dataclasses.replace(model.cfg, pad_id=None)).eval()
    no_pad.load_state_dict(model.state_dict())
    assert no_pad.generation_config.pad_id is None
    for lm, first in [(no_pad, 0), (model, None)]:
        config = dataclasses.replace(lm.generation_config, max_new_tokens=3, eos_id=None)
        token = int(lm.generate(prompt, config)[0, 0])
        assert token == first if first is not None else token != 0


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_the_encoder_decoder_never_repeats_a_token_with_ngram_size_1(strategy):
    torch.manual_seed(0)
    model = addnorm.Transformer(addnorm.PRESETS["tiny"]).eval()
    config = dataclasses.replace(
        model.generation_config, strategy=strategy, num_beams=2, max_new_tokens=12,
        no_repeat_ngram_size=1, eos_id=None,
    )
    out = model.generate(torch.randint(3, 128, (2, 5)), config)
    assert out.shape == (2, 12)
    for row in out.tolist():
        assert len(row) == len(set(row)), row
