"""``generate`` with the rest of Hugging Face's everyday settings gives transformers' tokens,
scores and logits for the same weights: any ``pad_token_id`` beside any ``eos_token_id``,
with or without an ``attention_mask``; ``input_ids=``; float attention masks;
``bad_words_ids``, ``suppress_tokens``, ``forced_eos_token_id``, ``min_p``, ``max_time``;
``return_dict_in_generate`` with ``output_scores`` and ``output_logits``; sampling settings
outside sampling (ignored with a warning, as transformers ignores them).

Provenance: transformers' own ``GPT2LMHeadModel.generate`` (the installed transformers 5.x)
given the weights of the ``TransformerLM`` that ``addnorm.from_transformers`` builds from it
(tests/gpt2_pair.py: the model, prompts and seeds that test_generate_like_transformers.py
uses too), called with the same arguments; sampling compared draw for draw under one seed.
Scores and logits are compared within ``FLOAT32_MODEL`` (two float32 implementations of one
small model: the logits differ by the rounding of their kernels; the rules add -inf, which
must sit at the same places). A row's scores are compared while it is live: after its stop
token transformers runs its rules on the filler, addnorm does not (the filler follows
whatever they say). Where addnorm refuses a call (a prompt row ending in padding, by
transformers' pad rule) the test checks that the refusal names the reason, and that the
reason holds.

Three conventions differ from transformers' and are checked as such: a bad word's prefix
never matches padding (addnorm leaves padding out of a row's history; the drawn prefixes
avoid the pad value so both agree); beam search writes ``pad_token_id`` after a finished
hypothesis even when it is 0 (transformers' beam search writes ``eos_token_id[0]`` then: it
reads ``pad_token_id or eos_token_id[0]``); and where a forced token leaves a row fewer
continuations than beams, the missing hypotheses are none (the filler), where transformers
returns either that or a copy, by a tie of its top-k.
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
import transformers
from gpt2_pair import SEEDS, V, free_run, models, no_stop_lm, prompt
from hypothesis import event, given
from hypothesis import strategies as st
from properties import examples
from test_host_reads import CountReads
from tolerances import FLOAT32_MODEL

import addnorm
from addnorm.generation.output import GenerateOutput

transformers.logging.set_verbosity_error()

STRATEGIES = st.sampled_from(["greedy", "sample", "beam"])


def strategy_names(strategy: str, data: st.DataObject) -> dict:
    """Hugging Face's names for one strategy, the row counts drawn."""
    if strategy == "greedy":
        return {"do_sample": False}
    if strategy == "sample":
        return {"do_sample": True,
                "num_return_sequences": data.draw(st.integers(1, 3), label="rows")}
    beams = data.draw(st.integers(2, 4), label="num_beams")
    return {"num_beams": beams, "num_return_sequences": data.draw(st.integers(1, beams)),
            "early_stopping": data.draw(st.sampled_from([True, False, "never"]))}


def run_both(seed: int, mask: bool = True, **names) -> tuple:
    """(addnorm's, transformers') output for prompt(seed), with or without its mask; an
    exception addnorm raises is returned in place of its output."""
    gpt2, lm = models()
    ids, attention = prompt(seed)
    given_mask = {"attention_mask": attention} if mask else {}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers: right padding, length constraints
        torch.manual_seed(seed)
        theirs = gpt2.generate(ids, **given_mask, **names)
        torch.manual_seed(seed)
        try:
            ours = lm.generate(ids, **given_mask, **names)
        except ValueError as error:
            return error, theirs
    return ours, theirs


def as_transformers_beam_fills(ours: torch.Tensor, prompt_length: int, eos: int) -> torch.Tensor:
    """addnorm's beam output with the filler after each row's first stop token written as
    transformers' beam search writes it when ``pad_token_id`` is 0: ``eos_token_id``."""
    new = ours[:, prompt_length:]
    after_stop = (new == eos).long().cumsum(dim=1) - (new == eos).long() > 0  # (B, N)
    return torch.cat([ours[:, :prompt_length], new.masked_fill(after_stop, eos)], dim=1)


# ---------------------------------------------------------------- pad_token_id and eos_token_id


@examples(30)
@given(seed=SEEDS, strategy=STRATEGIES, mask=st.booleans(), data=st.data())
def test_any_pad_and_eos_give_transformers_tokens(seed, strategy, mask, data):
    emitted = sorted(set(free_run(seed).flatten().tolist()))
    eos = data.draw(st.one_of(st.none(), st.sampled_from(emitted)), label="eos")
    pad = data.draw(st.one_of(st.none(), st.just(0), st.just(V - 1), st.integers(0, V - 1),
                              st.sampled_from(emitted)), label="pad")
    names = {"max_new_tokens": data.draw(st.integers(1, 10)), **strategy_names(strategy, data)}
    if eos is not None:
        names["eos_token_id"] = eos
    if pad is not None:
        names["pad_token_id"] = pad
    ours, theirs = run_both(seed, mask, **names)
    ids, _ = prompt(seed)
    stop = eos if eos is not None else V - 1  # the model's own: GPT-2's eos_token_id
    if isinstance(ours, ValueError):
        # transformers' rule without a mask: every occurrence of a pad id that is no stop id is
        # padding; addnorm refuses a row that then ends in padding (nothing real to continue)
        assert not mask and pad is not None and pad != stop and (ids[:, -1] == pad).any()
        assert "only padding" in str(ours) or "must be left padding" in str(ours)
        return
    if strategy == "beam" and pad == 0:
        assert torch.equal(as_transformers_beam_fills(ours, ids.shape[1], stop), theirs)
    else:
        assert torch.equal(ours, theirs)


def test_padding_between_real_tokens_changes_nothing_and_a_row_of_padding_is_refused():
    # Identity: positions count real tokens, padded keys are masked, so a prompt with padding
    # inside gives the tokens of the same prompt without it; transformers' pad rule puts it
    # there when the pad id occurs inside an unmasked prompt.
    _, lm = models()
    config = dataclasses.replace(lm.generation_config, max_new_tokens=6, eos_id=None)
    plain = torch.tensor([[4, 7, 9, 2]])
    holed = torch.tensor([[4, 0, 7, 0, 0, 9, 2]])
    padding = torch.tensor([[False, True, False, True, True, False, False]])
    assert torch.equal(lm.generate(holed, config, padding_mask=padding), lm.generate(plain, config))
    assert torch.equal(lm.generate(holed, pad_token_id=0, max_new_tokens=6)[:, 7:],
                       lm.generate(plain, max_new_tokens=6)[:, 4:])
    with pytest.raises(ValueError, match="row 1 of prompt_ids is only padding"):
        lm.generate(torch.tensor([[4, 5], [3, 3]]), attention_mask=torch.tensor([[1, 1], [0, 0]]))
    with pytest.raises(ValueError, match=r"must be left padding .*row 0 of prompt_ids does"):
        lm.generate(torch.tensor([[4, 5, 0]]), pad_token_id=0, max_new_tokens=2)


# ------------------------------------------------------------ how the inputs and masks come


def test_input_ids_by_name_and_a_float_mask_are_read_as_transformers_reads_them():
    gpt2, lm = models()
    ids, mask = prompt(11)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers: "Using the model-agnostic default"
        theirs = gpt2.generate(input_ids=ids, attention_mask=mask, max_new_tokens=5)
        default = gpt2.generate(input_ids=ids, attention_mask=mask)
    tokenized = {"input_ids": ids, "attention_mask": mask}  # a tokenizer's output, unpacked
    assert torch.equal(lm.generate(**tokenized, max_new_tokens=5), theirs)
    assert torch.equal(lm.generate(input_ids=ids, attention_mask=mask.float(), max_new_tokens=5),
                       theirs)
    # input_ids alone makes the call one in transformers' terms: its defaults, the prompt first
    assert torch.equal(lm.generate(**tokenized), default)


# ------------------------------------------------------------------------- the new logit rules


@examples(30)
@given(seed=SEEDS, strategy=STRATEGIES, data=st.data())
def test_bad_words_suppressed_and_forced_tokens_and_min_p_give_transformers_tokens(
    seed, strategy, data
):
    emitted = sorted(set(free_run(seed).flatten().tolist()))
    eos = data.draw(st.sampled_from(emitted), label="eos")
    names = {"max_new_tokens": data.draw(st.integers(1, 9)), "eos_token_id": eos,
             "pad_token_id": eos, **strategy_names(strategy, data)}
    tokens = st.integers(0, V - 1)
    # prefixes of tokens the rows emit (so that they match), never the pad value V - 1
    prefix = st.sampled_from([t for t in emitted if t < V - 1] or [0])
    if data.draw(st.booleans(), label="bad words"):
        singles = st.lists(tokens, min_size=1, max_size=1)
        longer = st.builds(lambda head, last: [*head, last],
                           st.lists(prefix, min_size=1, max_size=2), tokens)
        names["bad_words_ids"] = data.draw(st.lists(singles | longer, min_size=1, max_size=4))
    suppressed = data.draw(st.lists(tokens, max_size=3, unique=True), label="suppress")
    if suppressed:
        names["suppress_tokens"] = suppressed
    forced = data.draw(st.one_of(st.none(), tokens.filter(lambda t: t not in suppressed)))
    if forced is not None:
        names["forced_eos_token_id"] = forced
    if strategy == "sample":
        names["min_p"] = data.draw(st.sampled_from([None, 0.0, 0.05, 0.3, 1.0]))
    names["min_new_tokens"] = data.draw(st.integers(0, 3))
    ours, theirs = run_both(seed, **names)
    if first_steps_forced(names):
        assert_forced_beams(ours, theirs, names)
    else:
        assert torch.equal(ours, theirs), names


def first_steps_forced(names: dict) -> bool:
    """Beam search whose one new token is forced: each row has one continuation for its K
    beams (see :func:`test_a_row_with_fewer_continuations_than_beams_returns_the_filler`)."""
    return (names.get("num_beams", 1) > 1 and names.get("forced_eos_token_id") is not None
            and names.get("max_new_tokens") == 1)


def assert_forced_beams(ours: torch.Tensor, theirs: torch.Tensor, names: dict) -> None:
    """The first hypothesis of each row is transformers'; the others are none (the filler)."""
    rows = names.get("num_return_sequences", 1)
    assert torch.equal(ours[::rows], theirs[::rows])
    fill = names.get("pad_token_id", names.get("eos_token_id", V - 1))
    for j in range(1, rows):
        assert (ours[j::rows, -1] == fill).all()


def test_a_row_with_fewer_continuations_than_beams_returns_the_filler():
    # forced_eos_token_id with one new token leaves a row one continuation for its K beams:
    # its other hypotheses are none, returned as the filler. transformers' empty slots and
    # its copies of the one continuation both score -1e9, and which its top-k keeps is a tie
    # (with 2 beams here the empty slot, with 3 a copy); addnorm keeps the empty slot, and
    # scores it -inf.
    for beams, rows in ((2, 2), (3, 2), (3, 3)):
        names = {"max_new_tokens": 1, "num_beams": beams, "num_return_sequences": rows,
                 "forced_eos_token_id": 0}
        ours, theirs = run_both(0, **names)
        assert (ours[::rows, -1] == 0).all()
        assert_forced_beams(ours, theirs, names)


def test_a_single_bad_word_that_is_a_stop_id_is_not_banned_as_transformers_filters_it():
    emitted = free_run(3)
    eos = int(emitted[0, 0])  # the first row's first greedy token
    ours, theirs = run_both(3, max_new_tokens=4, eos_token_id=eos, pad_token_id=eos,
                            bad_words_ids=[[eos]])
    assert torch.equal(ours, theirs)
    ids, _ = prompt(3)
    assert ours[0, ids.shape[1]] == eos  # still emitted: a row must be able to stop


@examples(6)
@given(seed=SEEDS, strategy=STRATEGIES, data=st.data())
def test_sampling_settings_outside_sampling_warn_and_are_ignored_as_transformers_does(
    seed, strategy, data
):
    if strategy == "sample":
        strategy = "greedy"
    ignored = data.draw(st.fixed_dictionaries({}, optional={
        "temperature": st.sampled_from([0.5, 2.0]), "top_p": st.just(0.5),
        "top_k": st.just(3), "min_p": st.just(0.2), "typical_p": st.just(0.9)}).filter(bool))
    names = {"max_new_tokens": 6, **strategy_names(strategy, data)}
    gpt2, lm = models()
    ids, mask = prompt(seed)
    with torch.no_grad():
        theirs = gpt2.generate(ids, attention_mask=mask, **names, **ignored)
        with pytest.warns(UserWarning, match="sampling settings are ignored") as caught:
            ours = lm.generate(ids, attention_mask=mask, **names, **ignored)
    assert torch.equal(ours, theirs)
    warning = next(w for w in caught if "sampling settings" in str(w.message))
    assert all(name in str(warning.message) for name in ignored)
    assert warning.filename == __file__  # the warning points at the caller's line


# ------------------------------------------------------------------ scores, logits, beam parts


@examples(20)
@given(seed=SEEDS, strategy=STRATEGIES, rules=st.booleans(), data=st.data())
def test_scores_and_logits_are_transformers_within_float32_rounding(seed, strategy, rules,
                                                                    data):
    emitted = sorted(set(free_run(seed).flatten().tolist()))
    eos = data.draw(st.sampled_from(emitted), label="eos")
    names = {"max_new_tokens": data.draw(st.integers(1, 8)), "eos_token_id": eos,
             "pad_token_id": eos, "return_dict_in_generate": True, "output_scores": True,
             "output_logits": True, **strategy_names(strategy, data)}
    if strategy == "sample":
        names.update(temperature=data.draw(st.sampled_from([1.0, 0.7])),
                     top_k=data.draw(st.sampled_from([0, 6])),
                     top_p=data.draw(st.sampled_from([1.0, 0.8])),
                     min_p=data.draw(st.sampled_from([None, 0.1])))
    if strategy == "beam":
        names["length_penalty"] = data.draw(st.sampled_from([1.0, 0.0, 2.0, -0.5]))
    if rules:
        names.update(repetition_penalty=1.3, suppress_tokens=[data.draw(st.integers(0, V - 1))],
                     min_new_tokens=2, bad_words_ids=[[data.draw(st.integers(0, V - 2)),
                                                       data.draw(st.integers(0, V - 1))]])
    ours, theirs = run_both(seed, **names)
    assert isinstance(ours, GenerateOutput)
    assert torch.equal(ours.sequences, theirs.sequences)
    assert len(ours.scores) == len(theirs.scores) == len(ours.logits) == len(theirs.logits)
    new = ours.sequences[:, prompt(seed)[0].shape[1]:]
    for step, (mine, reference) in enumerate(zip(ours.scores, theirs.scores, strict=True)):
        live = torch.ones(mine.shape[0], dtype=torch.bool)
        if strategy != "beam":  # rows that ended before this step: their filler's scores
            live = ~(new[:, :step] == eos).any(dim=1)
        torch.testing.assert_close(mine[live], reference[live], **FLOAT32_MODEL)
    for mine, reference in zip(ours.logits, theirs.logits, strict=True):
        torch.testing.assert_close(mine, reference, **FLOAT32_MODEL)
    if strategy == "beam":
        torch.testing.assert_close(ours.sequences_scores, theirs.sequences_scores,
                                   **FLOAT32_MODEL)
        assert torch.equal(ours.beam_indices, theirs.beam_indices.long())
    else:
        assert ours.sequences_scores is None and ours.beam_indices is None


def test_the_encoder_decoder_returns_its_scores_and_reads_input_ids():
    torch.manual_seed(0)
    model = addnorm.Transformer(addnorm.PRESETS["tiny"]).eval()
    src = torch.randint(3, 100, (2, 7), generator=torch.Generator().manual_seed(9))
    config = dataclasses.replace(model.generation_config, max_new_tokens=5)
    want = model.generate(src, config)
    out = model.generate(input_ids=src, max_new_tokens=5, return_dict_in_generate=True,
                         output_scores=True)
    assert torch.equal(out.sequences[:, 1:], want)
    # greedy: each token is its step's argmax, as long as its row lives
    picked = torch.stack([scores.argmax(dim=-1) for scores in out.scores], dim=1)
    live = torch.ones_like(want, dtype=torch.bool)
    live[:, 1:] = ~(want[:, :-1] == model.cfg.eos_id).cumsum(dim=1).bool()
    assert torch.equal(picked[live], want[live])


# ---------------------------------------------------------------------------------- max_time


@pytest.mark.parametrize("strategy", ["greedy", "sample", "beam"])
def test_a_max_time_already_over_ends_every_row_after_its_first_token_as_in_transformers(
    strategy
):
    # transformers' clock starts before the prompt runs, so 1 ns has passed by the first
    # token: both end there.
    names = {"max_new_tokens": 10, "max_time": 1e-9}
    names.update({"greedy": {}, "sample": {"do_sample": True},
                  "beam": {"num_beams": 3, "num_return_sequences": 2}}[strategy])
    ours, theirs = run_both(4, **names)
    assert torch.equal(ours, theirs)
    assert ours.shape[1] == prompt(4)[0].shape[1] + 1


@pytest.mark.parametrize("stop", [True, False])
def test_max_time_and_the_output_parts_add_no_host_read(stop):
    lm = models()[1] if stop else no_stop_lm()  # with and without a stop check per token
    ids, mask = prompt(5)

    def reads(**names) -> int:
        with torch.no_grad(), CountReads() as counter:
            lm.generate(ids, attention_mask=mask, max_new_tokens=8, **names)
        return counter.total

    plain = reads()
    assert reads(max_time=3600.0) == plain
    assert reads(return_dict_in_generate=True, output_scores=True, output_logits=True) == plain


# ------------------------------------------------------------- any combination of the names

# Settings addnorm does not implement, at values that change the tokens where they apply.
UNIMPLEMENTED = {
    "typical_p": st.just(0.9), "epsilon_cutoff": st.just(3e-4), "eta_cutoff": st.just(3e-4),
    "encoder_repetition_penalty": st.just(1.2), "begin_suppress_tokens": st.just([3]),
    "sequence_bias": st.just([[[3], -2.0]]), "renormalize_logits": st.just(True),
    "remove_invalid_values": st.just(True), "output_attentions": st.just(True),
    "output_hidden_states": st.just(True), "exponential_decay_length_penalty": st.just((2, 1.5)),
}


@examples(40)
@given(seed=SEEDS, strategy=STRATEGIES, data=st.data())
def test_any_combination_of_hugging_faces_names_matches_transformers_or_is_refused_by_name(
    seed, strategy, data
):
    emitted = sorted(set(free_run(seed).flatten().tolist()))
    tokens = st.integers(0, V - 1)
    optional = {
        "min_new_tokens": st.integers(0, 4), "repetition_penalty": st.sampled_from([0.8, 1.3]),
        "no_repeat_ngram_size": st.integers(1, 3), "eos_token_id": st.sampled_from(emitted),
        "pad_token_id": tokens, "bad_words_ids": st.lists(st.lists(st.integers(0, V - 2),
                                                                    min_size=1, max_size=2),
                                                           min_size=1, max_size=3),
        "suppress_tokens": st.lists(tokens, max_size=2), "forced_eos_token_id": tokens,
        "max_time": st.just(3600.0), "use_cache": st.booleans(),
        "temperature": st.sampled_from([0.7, 1.0, 1.5]), "top_k": st.sampled_from([0, 5, 50]),
        "top_p": st.sampled_from([0.8, 1.0]), "min_p": st.sampled_from([0.05, 0.3]),
        "length_penalty": st.sampled_from([0.0, 2.0]), "early_stopping": st.booleans(),
        "return_dict_in_generate": st.booleans(), "output_scores": st.booleans(),
        "attention_mask": st.booleans(),
    }
    drawn = data.draw(st.fixed_dictionaries({}, optional=optional), label="names")
    extra = data.draw(st.one_of(st.none(), st.sampled_from(sorted(UNIMPLEMENTED))))
    unimplemented = {} if extra is None else {extra: data.draw(UNIMPLEMENTED[extra])}
    names = {"max_new_tokens": data.draw(st.integers(1, 8)), **strategy_names(strategy, data),
             **drawn, **unimplemented}
    if "no_repeat_ngram_size" in names:
        names["attention_mask"] = False  # transformers counts padding there: unpadded rows
    mask = names.pop("attention_mask", True)
    ids, attention = prompt(seed)
    if not mask:  # the rows without padding (the last column if every row has some)
        unpadded = attention.bool().all(dim=1)
        ids = ids[unpadded] if unpadded.any() else ids[:, -1:]
    call = {"attention_mask": attention} if mask else {}
    gpt2, lm = models()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.manual_seed(seed)
            theirs = gpt2.generate(ids, **call, **names)
        except (ValueError, TypeError, NotImplementedError, RuntimeError):
            event("transformers refuses")
            return  # a combination transformers itself does not accept
        torch.manual_seed(seed)
        try:
            ours = lm.generate(ids, **call, **names)
        except ValueError as error:
            if "must be left padding" in str(error) or "only padding" in str(error):
                # transformers' pad rule without a mask made a row end in padding
                pad, stop = names.get("pad_token_id"), names.get("eos_token_id", V - 1)
                assert not mask and pad is not None and pad != stop and (ids[:, -1] == pad).any()
                event("refused: a row ends in padding")
                return
            # refused by name: an unimplemented setting that applies to this call
            applies = {name for name in unimplemented if strategy == "sample" or name not in (
                "typical_p", "epsilon_cutoff", "eta_cutoff")}
            assert applies and any(name in str(error) for name in applies), (names, error)
            event("refused: not implemented")
            return
    event("matched")
    assert not unimplemented or strategy != "sample" and set(unimplemented) <= {
        "typical_p", "epsilon_cutoff", "eta_cutoff"}, names  # only those greedy ignores ran
    sequences = ours.sequences if isinstance(ours, GenerateOutput) else ours
    expected = theirs.sequences if names.get("return_dict_in_generate") else theirs
    if strategy == "beam" and names.get("pad_token_id") == 0:
        eos = names.get("eos_token_id", V - 1)
        sequences = as_transformers_beam_fills(sequences, ids.shape[1], eos)
    if first_steps_forced(names):
        assert_forced_beams(sequences, expected, names)
    else:
        assert torch.equal(sequences, expected), names
