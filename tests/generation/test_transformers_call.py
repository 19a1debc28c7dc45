"""A ``generate`` call in Hugging Face's terms read into a GenerationCall: transformers' rule
for padding without an attention mask, the attention mask's polarity and values, its default
length, and the refusals of a call that mixes addnorm's config with Hugging Face's names.
(The whole calls are compared with ``GPT2LMHeadModel.generate`` in
tests/transformer/test_generate_hf_settings.py.)"""

from __future__ import annotations

import pytest
import torch

from addnorm.family import GenerationSpec
from addnorm.generation.config import GenerationConfig
from addnorm.generation.hf_settings import TRANSFORMERS_DEFAULT_NEW_TOKENS
from addnorm.generation.transformers_call import (
    padding_from_attention_mask,
    padding_from_pad_id,
    transformers_call,
)


def spec(*, pad_id=None, eos_id=2, max_positions=None, context=None) -> GenerationSpec:
    return GenerationSpec(vocab_size=10, eos_id=eos_id, pad_id=pad_id, start_id=None,
                          max_positions=max_positions, cached_layers=1, d_model=4,
                          device=torch.device("cpu"), context=context)


def call(inputs, *, config=None, model=None, **names):
    attention_mask = names.pop("attention_mask", None)
    return transformers_call(
        model or spec(), config, generation_config=names.pop("generation_config", None),
        names=names, attention_mask=attention_mask, padding_mask=None, return_prompt=None,
        inputs=inputs, prompt_length=inputs.shape[1],
    )


IDS = torch.tensor([[0, 0, 5, 6], [7, 8, 0, 9]])


def test_a_pad_id_that_is_no_stop_id_marks_every_occurrence_as_padding():
    # transformers' rule: pad_token_id set and not among the eos ids -> inputs != pad_token_id
    config = GenerationConfig(pad_id=0, eos_id=2)
    assert torch.equal(padding_from_pad_id(IDS, config, model_pad_id=None), IDS == 0)


def test_a_pad_id_that_is_also_a_stop_id_marks_nothing():
    config = GenerationConfig(pad_id=2, eos_id=2)
    assert padding_from_pad_id(IDS, config, model_pad_id=None) is None  # the model's default
    none_padded = padding_from_pad_id(IDS, config, model_pad_id=1)
    assert none_padded is not None and not none_padded.any() and none_padded.shape == IDS.shape


def test_an_attention_mask_is_negated_into_addnorm_padding_for_every_accepted_dtype():
    ones = torch.tensor([[0, 1, 1], [1, 1, 1]])
    expected = ones == 0
    for mask in (ones, ones.bool(), ones.float(), ones.to(torch.int8)):
        assert torch.equal(padding_from_attention_mask(mask, None, (2, 3)), expected)
    padding = torch.zeros(2, 3, dtype=torch.bool)
    assert padding_from_attention_mask(None, padding, (2, 3)) is padding


@pytest.mark.parametrize(("mask", "padding", "error", "message"), [
    (torch.ones(2, 3), torch.zeros(2, 3, dtype=torch.bool), ValueError, "not both"),
    ([[1, 1, 1]], None, TypeError, "must be a torch.Tensor, got list"),
    (torch.ones(2, 4), None, ValueError, r"the prompt's shape \(2, 3\), got \(2, 4\)"),
    (torch.full((2, 3), 0.5), None, ValueError, "only 0 .padding. and 1"),
    (torch.ones(2, 3, dtype=torch.complex64), None, TypeError, "bool, or integer or float"),
])
def test_a_bad_attention_mask_is_refused_naming_what_is_wrong(mask, padding, error, message):
    with pytest.raises(error, match=message):
        padding_from_attention_mask(mask, padding, (2, 3))


def test_addnorm_config_and_hugging_face_names_together_are_refused():
    with pytest.raises(ValueError, match=r"both given: pass one of them.*"):
        call(IDS, config=GenerationConfig(), max_new_tokens=3)


def test_a_plain_call_keeps_addnorm_s_config_and_its_return():
    plain = call(IDS)
    assert plain.config is None and plain.padding_mask is None and plain.return_prompt is False
    assert not (plain.return_dict or plain.output_scores or plain.output_logits)


def test_a_hugging_face_call_takes_its_defaults_and_returns_the_prompt():
    read = call(IDS, do_sample=False)
    assert isinstance(read.config, GenerationConfig) and read.return_prompt is True
    assert read.config.max_new_tokens == TRANSFORMERS_DEFAULT_NEW_TOKENS  # transformers': 20
    assert read.config.eos_id == 2  # the model's eos id, under the call's names
    capped = call(IDS, do_sample=False, model=spec(max_positions=10))
    assert capped.config.max_new_tokens == 10 - IDS.shape[1]  # the position table's room
    # a model that could slide its window is capped alike: transformers' length, as its
    # GPT-2 gives it (tests/transformer/test_generate_like_transformers.py)
    windowed = call(IDS, do_sample=False, model=spec(max_positions=10, context=10))
    assert windowed.config.max_new_tokens == 10 - IDS.shape[1]


def test_output_scores_without_return_dict_in_generate_warn_and_are_ignored():
    with pytest.warns(UserWarning, match="only return_dict_in_generate=True returns"):
        read = call(IDS, output_scores=True)
    assert not (read.return_dict or read.output_scores)
    asked = call(IDS, output_scores=True, return_dict_in_generate=True)
    assert asked.return_dict and asked.output_scores and not asked.output_logits
