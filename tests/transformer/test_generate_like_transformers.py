"""``generate`` in Hugging Face's terms gives transformers' tokens for the same weights.

Provenance: transformers' own ``GPT2LMHeadModel.generate`` (the installed transformers 5.x),
given the weights of the ``TransformerLM`` that ``addnorm.from_transformers`` builds from it,
called with the same arguments: greedy, beam search (``num_return_sequences``, every
``early_stopping`` value, length penalties of both signs), ``min_new_tokens``, ``max_length``,
left padding through ``attention_mask``, ``generation_config`` objects and dicts. Sampling is
compared draw for draw under one seed: both draw one ``torch.multinomial`` per step over the
same (B * r, V) probabilities from the global generator, so the same seed gives the same
tokens. The weights are drawn wider than GPT-2's initialisation (std 0.5 to 1 instead of 0.02)
so the logits are spread: no near-tie is decided by float rounding. Refusals and the output
convention are checked on their own; the encoder-decoder against its addnorm-config call.
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
import transformers
from gpt2_pair import POSITIONS, SEEDS, V, free_run, models, no_stop_lm, prompt
from hypothesis import given
from hypothesis import strategies as st
from properties import examples
from test_host_reads import CountReads

import addnorm
from addnorm import GenerationConfig

transformers.logging.set_verbosity_error()  # "Setting pad_token_id to eos_token_id", ...


def both(seed: int, **names) -> tuple[torch.Tensor, torch.Tensor]:
    """(addnorm's, transformers') output for the same prompt and Hugging Face names."""
    gpt2, lm = models()
    ids, mask = prompt(seed)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers: "Unfeasible length constraints", ...
        torch.manual_seed(seed)
        theirs = gpt2.generate(ids, attention_mask=mask, **names)
        torch.manual_seed(seed)
        ours = lm.generate(ids, attention_mask=mask, **names)
    return ours, theirs


def stop_token(seed: int, data: st.DataObject) -> int:
    """A stop id one of the rows emits within its first 12 tokens (or, rarely, never)."""
    emitted = sorted(set(free_run(seed).flatten().tolist()))
    return data.draw(st.sampled_from(emitted), label="eos")


# ------------------------------------------------------------------- the tokens of transformers


@examples(8)
@given(seed=SEEDS, max_new=st.integers(1, 12), min_new=st.integers(0, 8),
       by_length=st.booleans(), data=st.data())
def test_greedy_gives_transformers_tokens(seed, max_new, min_new, by_length, data):
    eos = stop_token(seed, data)
    length = {"max_length": prompt(seed)[0].shape[1] + max_new} if by_length else {
        "max_new_tokens": max_new}
    ours, theirs = both(seed, do_sample=False, min_new_tokens=min_new, eos_token_id=eos,
                        pad_token_id=eos, **length)
    assert torch.equal(ours, theirs)  # the prompt, then the new tokens


@examples(8)
@given(seed=SEEDS, num_beams=st.integers(2, 4), data=st.data(),
       early_stopping=st.sampled_from([True, False, "never"]),
       length_penalty=st.sampled_from([1.0, 0.0, 2.0, -0.5]), min_new=st.integers(0, 4))
def test_beam_search_gives_transformers_tokens(seed, num_beams, data, early_stopping,
                                               length_penalty, min_new):
    eos = stop_token(seed, data)
    rows = data.draw(st.integers(1, num_beams), label="num_return_sequences")
    ours, theirs = both(
        seed, num_beams=num_beams, num_return_sequences=rows, early_stopping=early_stopping,
        length_penalty=length_penalty, min_new_tokens=min_new, max_new_tokens=10,
        eos_token_id=eos, pad_token_id=eos,
    )
    assert torch.equal(ours, theirs)


@examples(6)
@given(seed=SEEDS, rows=st.integers(1, 3), data=st.data(),
       temperature=st.sampled_from([1.0, 0.7, 1.5]), top_k=st.sampled_from([None, 0, 4]),
       top_p=st.sampled_from([None, 0.8]))
def test_sampling_with_one_seed_gives_transformers_draws(seed, rows, data, temperature, top_k,
                                                         top_p):
    eos = stop_token(seed, data)
    ours, theirs = both(
        seed, do_sample=True, num_return_sequences=rows, temperature=temperature, top_k=top_k,
        top_p=top_p, max_new_tokens=8, eos_token_id=eos, pad_token_id=eos,
    )
    assert torch.equal(ours, theirs)
    ids, _ = prompt(seed)
    assert torch.equal(ours[:, : ids.shape[1]], ids.repeat_interleave(rows, dim=0))


@pytest.mark.parametrize("repetition", [{"repetition_penalty": 1.5},
                                        {"no_repeat_ngram_size": 2}])
def test_the_repetition_rules_give_transformers_tokens_on_unpadded_prompts(repetition):
    # transformers counts padding as seen, addnorm does not: the same on unpadded rows.
    gpt2, lm = models()
    ids = torch.randint(0, V - 1, (3, 5), generator=torch.Generator().manual_seed(3))
    names = {"max_new_tokens": 12, "do_sample": False, **repetition}
    with torch.no_grad():
        assert torch.equal(lm.generate(ids, **names), gpt2.generate(ids, **names))


def test_a_generation_config_object_or_dict_gives_transformers_tokens():
    gpt2, lm = models()
    ids, mask = prompt(5)
    eos = free_run(5)[0, 3].item()
    hf = transformers.GenerationConfig(max_new_tokens=7, num_beams=3, num_return_sequences=2,
                                       early_stopping=True, eos_token_id=eos, pad_token_id=eos)
    with torch.no_grad():
        theirs = gpt2.generate(ids, attention_mask=mask, generation_config=hf)
        overridden = gpt2.generate(ids, attention_mask=mask, generation_config=hf,
                                   max_new_tokens=3, num_return_sequences=1)
        # transformers' second positional argument is its generation_config
        assert torch.equal(lm.generate(ids, hf, attention_mask=mask), theirs)
        for settings in (hf, hf.to_diff_dict()):
            ours = lm.generate(ids, attention_mask=mask, generation_config=settings)
            assert torch.equal(ours, theirs)
            # keywords win over generation_config, as in transformers
            assert torch.equal(lm.generate(ids, attention_mask=mask, generation_config=settings,
                                           max_new_tokens=3, num_return_sequences=1),
                               overridden)


def test_without_a_length_both_generate_twenty_tokens_capped_by_the_positions():
    gpt2, lm = models()
    for length in (4, POSITIONS - 6):
        ids = torch.randint(0, V - 1, (2, length), generator=torch.Generator().manual_seed(6))
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # transformers: "Using the model-agnostic default"
            theirs = gpt2.generate(ids, attention_mask=torch.ones_like(ids))
        ours = lm.generate(ids, attention_mask=torch.ones_like(ids))  # the model's eos: V - 1
        assert ours.shape[1] <= min(length + 20, POSITIONS)
        assert torch.equal(ours, theirs)
        no_stop = no_stop_lm().generate(ids, attention_mask=torch.ones_like(ids))
        assert no_stop.shape[1] == min(length + 20, POSITIONS)


def test_a_models_own_generation_config_and_its_diff_dict_are_read():
    gpt2, lm = models()
    ids, mask = prompt(7)
    # to_diff_dict() of a model's config holds metadata and switches that change no token
    diff = gpt2.generation_config.to_diff_dict()
    assert {"transformers_version", "_from_model_config", "use_cache"} <= set(diff)
    config = GenerationConfig.from_transformers(**diff, max_new_tokens=5)
    assert config == GenerationConfig(max_new_tokens=5, eos_id=V - 1, pad_id=None)
    assert GenerationConfig.from_transformers(gpt2.generation_config) == dataclasses.replace(
        config, max_new_tokens=20)
    with torch.no_grad():
        theirs = gpt2.generate(ids, attention_mask=mask, max_new_tokens=5)
    assert torch.equal(lm.generate(ids, attention_mask=mask, max_new_tokens=5), theirs)
    assert torch.equal(
        lm.generate(ids, attention_mask=mask, generation_config=diff, max_new_tokens=5), theirs)
    # keywords that change no token at these values are accepted, as transformers takes them
    assert torch.equal(lm.generate(ids, attention_mask=mask, max_new_tokens=5, use_cache=False,
                                   output_scores=False, typical_p=1.0), theirs)


# -------------------------------------------------------------------------- output convention


def test_addnorm_calls_return_new_tokens_and_hugging_face_calls_the_prompt_too():
    _, lm = models()
    ids, mask = prompt(8)
    padding = mask == 0
    config = dataclasses.replace(lm.generation_config, max_new_tokens=6)
    new = lm.generate(ids, config, padding_mask=padding)
    assert new.shape[0] == ids.shape[0] and new.shape[1] <= 6
    with_prompt = torch.cat([ids, new], dim=1)
    assert torch.equal(lm.generate(ids, config, padding_mask=padding, return_prompt=True),
                       with_prompt)
    # the same settings in Hugging Face's names (early_stopping has no effect on greedy)
    hf = lm.generate(ids, attention_mask=mask, max_new_tokens=6)
    assert torch.equal(hf, with_prompt)
    assert torch.equal(lm.generate(ids, attention_mask=mask, max_new_tokens=6,
                                   return_prompt=False), new)
    # attention_mask with an addnorm config: only the mask's polarity changes
    assert torch.equal(lm.generate(ids, config, attention_mask=mask.bool()), new)


def test_the_encoder_decoder_takes_hugging_faces_names_and_returns_its_start_token():
    torch.manual_seed(0)
    model = addnorm.Transformer(addnorm.PRESETS["tiny"]).eval()
    cfg = model.cfg
    src = torch.randint(3, 100, (2, 7), generator=torch.Generator().manual_seed(9))
    src[1, 5:] = cfg.pad_id
    padding = src == cfg.pad_id
    config = dataclasses.replace(
        model.generation_config, strategy="beam", num_beams=3, num_return_sequences=2,
        max_new_tokens=6, beam_stop="heuristic", min_new_tokens=2,
    )
    want = model.generate(src, config, src_padding_mask=padding)
    got = model.generate(src, attention_mask=(~padding).long(), num_beams=3,
                         num_return_sequences=2, max_length=7, min_new_tokens=2)
    assert got.shape == (4, 1 + want.shape[1]) and (got[:, 0] == cfg.bos_id).all()
    assert torch.equal(got[:, 1:], want)
    assert torch.equal(model.generate(src, attention_mask=~padding, num_beams=3,
                                      num_return_sequences=2, max_new_tokens=6,
                                      min_new_tokens=2, return_prompt=False), want)
    with pytest.raises(ValueError, match=r"decoder_start_token_id \(5\) must be the model's bos"):
        model.generate(src, max_new_tokens=3, generation_config={"decoder_start_token_id": 5})


# --------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("names", "error", "words"),
    [
        ({"do_sample": True, "typical_p": 0.9}, ValueError, r"does not implement .*typical_p=0\.9"),
        ({"generation_config": {"output_attentions": True, "num_beam_groups": 2}}, ValueError,
         r"output_attentions=True, num_beam_groups=2"),
        ({"begin_suppress_tokens": [3]}, ValueError, r"does not implement .*begin_suppress"),
        ({"generation_config": {"not_a_setting": 1}}, ValueError, "not_a_setting=1"),
        ({"early_stopping": "sometimes"}, ValueError, "early_stopping must be True, False"),
        ({"max_length": 3}, ValueError, r"max_length \(3\) leaves no new token"),
        ({"num_return_sequences": 2}, ValueError, "needs strategy='sample' or 'beam'"),
        ({"num_beams": 2, "num_return_sequences": 3}, ValueError, r"must be <= num_beams \(2\)"),
        ({"do_sample": True, "num_beams": 2}, ValueError, "beam sampling"),
        ({"pad_token_id": V}, ValueError, rf"pad_id \({V}\) must be < the vocabulary size"),
        ({"suppress_tokens": [2, V]}, ValueError, rf"suppress_tokens .* holds {V}, which must"),
        ({"bad_words_ids": [[3], []]}, ValueError, r"bad_words_ids\[1\] must hold at least one"),
        ({"forced_eos_token_id": [3], "suppress_tokens": [3]}, ValueError,
         "also in suppress_tokens"),
        ({"do_sample": True, "min_p": 1.5}, ValueError, r"min_p must be <= 1"),
        ({"max_time": 0.0}, ValueError, r"max_time must be > 0"),
        ({"generation_config": GenerationConfig()}, TypeError, "addnorm's GenerationConfig"),
        ({"generation_config": [("max_new_tokens", 3)]}, TypeError, "mapping"),
        ({"attention_mask": torch.full((2, 4), 2)}, ValueError, "only 0 .padding. and 1"),
        ({"attention_mask": torch.full((2, 4), 0.5)}, ValueError, "only 0 .padding. and 1"),
        ({"attention_mask": torch.full((2, 4), float("nan"))}, ValueError, "only 0 .padding"),
        ({"attention_mask": torch.ones(2, 4, dtype=torch.complex64)}, TypeError,
         "bool, or integer or float"),
        ({"attention_mask": torch.tensor([[1, 1, 1, 1], [0, 0, 0, 0]])}, ValueError,
         "row 1 of prompt_ids is only padding"),
        ({"input_ids": torch.zeros(2, 4, dtype=torch.long)}, TypeError,
         "give prompt_ids or input_ids, not both"),
        ({"num_beams": 10**15, "max_new_tokens": 2}, ValueError,
         r"num_beams \(1000000000000000\) with max_new_tokens \(2\) makes 2 x"),
        ({"do_sample": True, "num_return_sequences": 10**15}, ValueError,
         r"num_return_sequences \(1000000000000000\) with max_new_tokens \(20\) makes"),
        ({"attention_mask": torch.ones(2, 3, dtype=torch.long)}, ValueError, r"shape \(2, 4\)"),
        ({"attention_mask": torch.ones(2, 4, dtype=torch.long),
          "padding_mask": torch.zeros(2, 4, dtype=torch.bool)}, ValueError, "not both"),
        ({"return_prompt": 1}, TypeError, "return_prompt must be a bool"),
    ],
)
def test_what_addnorm_cannot_match_is_refused_by_name(names, error, words):
    _, lm = models()
    ids = torch.randint(0, V - 1, (2, 4), generator=torch.Generator().manual_seed(10))
    with pytest.raises(error, match=words):
        lm.generate(ids, **names)


def test_an_addnorm_config_with_hugging_face_settings_is_refused():
    _, lm = models()
    ids = torch.randint(0, V - 1, (2, 4))
    with pytest.raises(ValueError, match=r"settings \(do_sample, max_new_tokens\) were both"):
        lm.generate(ids, lm.generation_config, max_new_tokens=3, do_sample=False)
    with pytest.raises(ValueError, match=r"\(generation_config\) were both given"):
        lm.generate(ids, lm.generation_config, generation_config={"max_new_tokens": 3})


def test_from_transformers_needs_the_prompt_length_for_lengths_that_count_it():
    with pytest.raises(ValueError, match="max_length counts the prompt's tokens"):
        GenerationConfig.from_transformers(max_length=10)
    assert GenerationConfig.from_transformers(max_length=10, prompt_length=4).max_new_tokens == 6
    assert GenerationConfig.from_transformers(
        min_length=10, prompt_length=4, max_new_tokens=9).min_new_tokens == 6
    # max_new_tokens wins over max_length, min_new_tokens over min_length, as in transformers
    both_lengths = GenerationConfig.from_transformers(
        max_length=10, max_new_tokens=3, min_length=9, min_new_tokens=1, prompt_length=4)
    assert (both_lengths.max_new_tokens, both_lengths.min_new_tokens) == (3, 1)


def test_from_transformers_takes_transformers_defaults():
    assert GenerationConfig.from_transformers() == GenerationConfig(max_new_tokens=20, pad_id=None)
    sample = GenerationConfig.from_transformers(do_sample=True)
    assert (sample.top_k, sample.top_p, sample.temperature) == (50, None, 1.0)
    assert GenerationConfig.from_transformers(do_sample=True, top_k=0, top_p=1.0).top_k is None
    beams = {flag: GenerationConfig.from_transformers(num_beams=2, early_stopping=flag)
             for flag in (False, True, "never")}
    assert {flag: c.beam_stop for flag, c in beams.items()} == {
        False: "heuristic", True: "k_finished", "never": "exact"}
    assert GenerationConfig.from_transformers(num_beams=2).beam_stop == "heuristic"
    # HF's default top_k and the values that switch a setting off are no error outside sampling
    greedy = GenerationConfig.from_transformers(top_k=50, top_p=1.0, temperature=1.0,
                                                typical_p=1.0, output_scores=False)
    assert greedy == GenerationConfig.from_transformers()


# ------------------------------------------------------------------------------- host reads


@examples(4)
@given(seed=SEEDS, stop=st.booleans(), strategy=st.sampled_from(["greedy", "sample"]))
def test_a_hugging_face_call_reads_back_one_value_per_token_at_most(seed, stop, strategy):
    lm = models()[1] if stop else no_stop_lm()
    ids, mask = prompt(seed)
    names = {"attention_mask": mask, "do_sample": strategy == "sample"}

    def reads(max_new_tokens: int) -> tuple[int, int]:
        with torch.no_grad(), CountReads() as counter:
            out = lm.generate(ids, max_new_tokens=max_new_tokens, **names)
        return counter.total, out.shape[1] - ids.shape[1]

    one, _ = reads(1)  # the mask, the prompt, the first token, the final check
    total, n = reads(9)
    assert total == one + (1 if stop else 0) * (n - 1)
