"""Hugging Face's generation names: the mapping, the repetition rules, pad_id None, stop strings.

Provenance: transformers' own ``RepetitionPenaltyLogitsProcessor`` and
``NoRepeatNGramLogitsProcessor`` on the same random logits and histories, and transformers'
``generate`` driving the same stand-in model (a fixed random bigram table) greedily; the
invariants that no n-gram repeats in an output and that a left-padded row decodes as it does
alone; Hugging Face's rule that finished rows are filled with the eos id when there is no pad
id.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import (
    LogitsProcessorList,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
)

import addnorm
from addnorm import GenerationConfig, TransformerLM, generate_tokens
from addnorm.generation.repetition import apply_repetition_rules
from addnorm.generation.stop_strings import cut_at_stop, stop_at_strings

VOCAB = 12


def _random_case(seed: int, batch: int = 4, length: int = 15, n_ids: int = 5):
    """Random logits of both signs and histories drawn from few ids, so repeats abound."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, VOCAB, generator=gen, dtype=torch.float64) * 3
    history = torch.randint(0, n_ids, (batch, length), generator=gen)
    return logits, history


def _no_padding(history: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(history, dtype=torch.bool)


@pytest.mark.parametrize("penalty", [1.3, 0.7, 2.0])
def test_repetition_penalty_matches_transformers_processor(penalty):
    logits, history = _random_case(0)
    ours = apply_repetition_rules(logits, history, _no_padding(history),
                                  repetition_penalty=penalty)
    theirs = RepetitionPenaltyLogitsProcessor(penalty)(history, logits.clone())
    # One IEEE multiply or divide per logit, correctly rounded on any machine: bitwise.
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    assert not torch.equal(ours, logits)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("length", [1, 3, 15])
def test_no_repeat_ngram_matches_transformers_processor(n, length):
    logits, history = _random_case(n, length=length, n_ids=3)
    ours = apply_repetition_rules(logits, history, _no_padding(history),
                                  no_repeat_ngram_size=n)
    theirs = NoRepeatNGramLogitsProcessor(n)(history, logits.clone())
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def test_both_rules_together_match_transformers_order():
    logits, history = _random_case(7)
    rules = {"repetition_penalty": 1.5, "no_repeat_ngram_size": 2}
    ours = apply_repetition_rules(logits, history, _no_padding(history), **rules)
    processors = LogitsProcessorList(
        [RepetitionPenaltyLogitsProcessor(1.5), NoRepeatNGramLogitsProcessor(2)]
    )
    expected = processors(history, logits.clone())
    torch.testing.assert_close(ours, expected, rtol=0, atol=0)  # one IEEE op per logit


def test_padding_is_not_part_of_the_history():
    logits, history = _random_case(3, batch=1)
    padded = torch.cat([torch.full((1, 4), 0), history], dim=1)  # left padding, id 0
    padding = torch.zeros_like(padded, dtype=torch.bool)
    padding[:, :4] = True
    rules = {"repetition_penalty": 1.4, "no_repeat_ngram_size": 3}
    alone = apply_repetition_rules(logits, history, _no_padding(history), **rules)
    got = apply_repetition_rules(logits, padded, padding, **rules)
    torch.testing.assert_close(got, alone, rtol=0, atol=0)  # the same per-logit ops: bitwise


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


class BeamCache:
    """The bigram needs no cache; beam search only asks it to follow the beams."""

    def reorder(self, index: torch.Tensor) -> None:
        pass


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


class Scripted:
    """Emits a fixed sequence of tokens per row, whatever it is fed."""

    def __init__(self, rows: list[list[int]], vocab: int = VOCAB) -> None:
        self.rows, self.vocab, self.n = rows, vocab, 0

    def logits(self) -> torch.Tensor:
        out = torch.zeros(len(self.rows), self.vocab)
        for b, row in enumerate(self.rows):
            out[b, row[min(self.n, len(row) - 1)]] = 10.0
        self.n += 1
        return out

    def step(self, tokens: torch.Tensor, cache: object) -> torch.Tensor:
        return self.logits()


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


def test_from_transformers_maps_the_strategy_names():
    greedy = GenerationConfig.from_transformers()
    assert greedy.strategy == "greedy"
    sample = GenerationConfig.from_transformers(do_sample=True, temperature=0.7, top_k=5,
                                                top_p=0.9)
    assert (sample.strategy, sample.temperature, sample.top_k, sample.top_p) == (
        "sample", 0.7, 5, 0.9)
    beam = GenerationConfig.from_transformers(num_beams=5, length_penalty=0.6)
    assert (beam.strategy, beam.num_beams, beam.length_penalty) == ("beam", 5, 0.6)


def test_from_transformers_maps_the_token_names_and_the_rules():
    config = GenerationConfig.from_transformers(
        eos_token_id=[7, 8], pad_token_id=None, max_new_tokens=9, repetition_penalty=1.1,
        no_repeat_ngram_size=3,
    )
    assert config == GenerationConfig(
        eos_id=(7, 8), pad_id=None, max_new_tokens=9, repetition_penalty=1.1,
        no_repeat_ngram_size=3,
    )


def test_from_transformers_refuses_what_has_no_meaning_here():
    with pytest.raises(ValueError, match="beam sampling"):
        GenerationConfig.from_transformers(do_sample=True, num_beams=4)
    with pytest.warns(UserWarning, match=r"sampling settings are ignored.*temperature=0\.5"):
        assert GenerationConfig.from_transformers(temperature=0.5) == (
            GenerationConfig.from_transformers())  # greedy: ignored, as transformers does
    with pytest.raises(ValueError, match="repetition_penalty must be > 0"):
        GenerationConfig.from_transformers(repetition_penalty=0.0)
    with pytest.raises(ValueError, match="no_repeat_ngram_size must be >= 0"):
        GenerationConfig.from_transformers(no_repeat_ngram_size=-1)
    with pytest.raises(TypeError, match="do_sample must be a bool"):
        GenerationConfig.from_transformers(do_sample=1)  # type: ignore[arg-type]


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


def test_stop_strings_end_rows_and_cut_the_text():
    text = "abc\n\ndef"
    assert cut_at_stop(text, ["\n\n", "c"]) == "ab"
    assert cut_at_stop(text, ["zz"]) == text
    letters = "_abcdefghij"  # id i is letters[i]

    def decode(ids: list[int]) -> str:
        return "".join(letters[i] for i in ids)

    model = Scripted([[1, 2, 3, 4, 5, 6, 7], [4, 3, 7, 5, 6, 8, 9]])
    config = GenerationConfig(max_new_tokens=7, pad_id=0)
    stop = stop_at_strings(decode, ["cd", "ef"])
    out = generate_tokens(model.step, model.logits(), None, config, stop_fn=stop)
    # "abcd" stops at its 4th token, "dcgef" at its 5th; then every row has stopped
    assert out.tolist() == [[1, 2, 3, 4, 0], [4, 3, 7, 5, 6]]
    assert [cut_at_stop(decode(r), ["cd", "ef"]) for r in out.tolist()] == ["ab", "dcg"]


def test_stop_fn_is_checked():
    model = Scripted([[1, 2]])
    with pytest.raises(TypeError, match="stop_fn must return a bool tensor of shape"):
        generate_tokens(model.step, model.logits(), None, GenerationConfig(max_new_tokens=3),
                        stop_fn=lambda tokens: [True])
    with pytest.raises(ValueError, match="beam"):
        generate_tokens(model.step, model.logits(), BeamCache(),
                        GenerationConfig(strategy="beam", max_new_tokens=3),
                        stop_fn=lambda tokens: tokens[:, -1] == 2)
    with pytest.raises(ValueError, match="set pad_id or eos_id"):
        generate_tokens(model.step, model.logits(), None,
                        GenerationConfig(max_new_tokens=3, pad_id=None),
                        stop_fn=lambda tokens: tokens[:, -1] == 2)
    with pytest.raises(ValueError, match=r"stops\[0\] must be a non-empty string"):
        stop_at_strings(str, [""])


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
