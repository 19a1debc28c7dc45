"""The one typed ``generate`` of both models: each model's own keywords, and only its own.

Provenance: each model's keywords (``prompt_ids``, ``padding_mask``, ``stop_fn`` of the
decoder-only model; ``src_ids``, ``src_padding_mask`` of the encoder-decoder) give the tokens
of the same call made by position or through the function every model's ``generate`` runs,
:func:`addnorm.generation.generate.generate` (the same function, so equality is exact); a
name of the other model is refused by name, as any unknown Hugging Face setting.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from addnorm.generation.generate import generate
from addnorm.transformer.config import PRESETS
from addnorm.transformer.encoder_decoder import Transformer
from addnorm.transformer.generate_entry import GenerateEntry, GenerateKeywords
from addnorm.transformer.lm import TransformerLM


def _models() -> tuple[TransformerLM, Transformer]:
    torch.manual_seed(0)
    lm = TransformerLM(dataclasses.replace(PRESETS["lm-tiny"], dropout=0.0)).eval()
    seq2seq = Transformer(dataclasses.replace(PRESETS["tiny"], dropout=0.0)).eval()
    return lm, seq2seq


def _ids() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(3, 100, (2, 6), generator=torch.Generator().manual_seed(1))
    padding = torch.zeros(2, 6, dtype=torch.bool)
    padding[1, :2] = True  # left padding
    return ids, padding


def test_both_models_share_the_one_entry():
    lm, seq2seq = _models()
    assert type(lm).generate is type(seq2seq).generate is GenerateEntry.generate
    assert lm.generation_config.eos_id == lm.cfg.eos_id
    assert seq2seq.generation_config.pad_id == seq2seq.cfg.pad_id


def test_each_model_takes_its_own_names():
    lm, seq2seq = _models()
    ids, padding = _ids()
    config = dataclasses.replace(lm.generation_config, max_new_tokens=4, eos_id=None)
    want = generate(lm, ids, config, padding_mask=padding)
    assert torch.equal(lm.generate(ids, config, padding_mask=padding), want)
    assert torch.equal(lm.generate(prompt_ids=ids, config=config, padding_mask=padding), want)
    stop = lm.generate(ids, config, padding_mask=padding,
                       stop_fn=lambda tokens: torch.ones(tokens.shape[0], dtype=torch.bool))
    assert stop.shape == (2, 1)  # every row stopped after its first token
    s2s_config = dataclasses.replace(seq2seq.generation_config, max_new_tokens=4, eos_id=None)
    want = generate(seq2seq, ids, s2s_config, padding_mask=padding)
    assert torch.equal(seq2seq.generate(ids, s2s_config, src_padding_mask=padding), want)
    assert torch.equal(seq2seq.generate(src_ids=ids, config=s2s_config,
                                        src_padding_mask=padding), want)


@pytest.mark.parametrize(("family", "name"), [
    ("lm", "src_padding_mask"), ("lm", "src_ids"), ("seq2seq", "padding_mask"),
    ("seq2seq", "prompt_ids"), ("seq2seq", "stop_fn"),
])
def test_the_other_models_names_are_refused_by_name(family, name):
    lm, seq2seq = _models()
    ids, padding = _ids()
    model = lm if family == "lm" else seq2seq
    value = (lambda tokens: tokens) if name == "stop_fn" else padding
    with pytest.raises(ValueError, match=f"not implement these Hugging Face generation "
                                         f"settings: {name}="):
        model.generate(ids, **{name: value})
    assert name in GenerateKeywords.__annotations__  # typed: a mypy user's call type-checks


def test_inputs_given_twice_are_refused():
    lm, seq2seq = _models()
    ids, _ = _ids()
    with pytest.raises(TypeError, match="multiple values for argument 'prompt_ids'"):
        lm.generate(ids, prompt_ids=ids)
    with pytest.raises(TypeError, match="give src_ids or input_ids, not both"):
        seq2seq.generate(src_ids=ids, input_ids=ids)
    with pytest.raises(TypeError, match="generate needs src_ids"):
        seq2seq.generate()
