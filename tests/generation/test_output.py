"""What ``generate`` returns with ``return_dict_in_generate=True``
(``addnorm.generation.output``): ``GenerateOutput`` reads by attribute and by name and lists
the fields that are set, as transformers' outputs do; ``Recorder`` keeps float32 copies of
what it is given, only what was asked.

Provenance: the identity with the plain call's tokens, transformers' ``ModelOutput``
conventions (``keys()`` lists the fields set, in field order), and the tensors handed in.
Scores and logits against transformers' are in tests/transformer/test_generate_hf_settings.py.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from gpt2_pair import models, prompt

from addnorm.generation.output import GenerateOutput, Recorder


def test_the_output_reads_by_name_and_holds_what_was_asked():
    _, lm = models()
    ids, mask = prompt(2)
    plain = lm.generate(ids, attention_mask=mask, max_new_tokens=4)
    out = lm.generate(ids, attention_mask=mask, max_new_tokens=4, return_dict_in_generate=True)
    assert torch.equal(out.sequences, plain) and torch.equal(out["sequences"], plain)
    assert out.keys() == ["sequences"] and out.scores is None and out.logits is None
    with pytest.raises(KeyError, match="'scores': this output holds sequences"):
        out["scores"]
    # output_scores without return_dict_in_generate: ignored with a warning, as in transformers
    with pytest.warns(UserWarning, match="output_scores asks for what only"):
        assert torch.equal(lm.generate(ids, attention_mask=mask, max_new_tokens=4,
                                       output_scores=True), plain)
    # from a generation_config too
    config = transformers.GenerationConfig(max_new_tokens=4, return_dict_in_generate=True,
                                           output_scores=True)
    from_config = lm.generate(ids, attention_mask=mask, generation_config=config)
    assert torch.equal(from_config.sequences, plain)
    assert len(from_config.scores) == plain.shape[1] - ids.shape[1]


def test_keys_list_the_fields_set_in_field_order_and_a_missing_name_is_a_key_error():
    tokens = torch.zeros(2, 3, dtype=torch.long)
    out = GenerateOutput(sequences=tokens, beam_indices=tokens, scores=(torch.zeros(2, 5),))
    assert out.keys() == ["sequences", "scores", "beam_indices"]
    assert out["beam_indices"] is tokens and out.beam_indices is tokens
    for name in ["logits", "nothing", 0]:
        with pytest.raises(KeyError, match="holds sequences, scores, beam_indices"):
            out[name]


def test_the_recorder_keeps_float32_copies_of_only_what_was_asked():
    step = torch.randn(2, 5)  # float32: a copy is still made
    recorder = Recorder(scores=True, logits=False)
    recorder.add_scores(step)
    recorder.add_logits(step)  # not asked: dropped
    step.fill_(7.0)  # a later write to the step's tensor (a graph's buffer) is not seen
    out = recorder.output(torch.zeros(2, 1, dtype=torch.long))
    assert out.logits is None and len(out.scores) == 1 and not (out.scores[0] == 7.0).any()
    wide = Recorder(scores=False, logits=True)
    wide.add_logits(torch.ones(2, 5, dtype=torch.float64))
    logits = wide.output(out.sequences).logits
    assert logits[0].dtype == torch.float32 and torch.equal(logits[0], torch.ones(2, 5))
    assert Recorder(scores=False, logits=False).output(out.sequences).keys() == ["sequences"]
