"""The encoder-decoder's ``generate`` with Hugging Face's names: the same logit rules, filler,
clock and output as the decoder-only model's (held to transformers' GPT-2 in
test_generate_hf_settings.py), here held to greedy decoding written out over the model's own
teacher-forced forward (no cache, no shared decode loop): each new token is the argmax of the
last position's logits with the rule applied, as transformers' processors define it."""

from __future__ import annotations

import warnings

import pytest
import torch

import addnorm
from addnorm.transformer.encoder_decoder import Transformer

NEW = 6  # new tokens after the start token


def model() -> Transformer:
    torch.manual_seed(0)
    return addnorm.Transformer(addnorm.PRESETS["tiny"]).eval()


SRC = torch.randint(3, 128, (3, 7), generator=torch.Generator().manual_seed(9))
MASK = torch.ones_like(SRC)
MASK[1, 5:] = 0  # row 1 has two padding tokens at its end


@torch.no_grad()
def greedy_by_hand(m: Transformer, *, eos: int, fill: int, bad: tuple | list = (),
                   suppress: tuple | list = (), forced_eos: int | None = None,
                   mask: torch.Tensor = MASK) -> torch.Tensor:
    """Greedy decoding from the full forward: the start token first, banned ids (pad, start)
    and the rules' ids at -inf, a row's tokens after its stop token replaced by ``fill``."""
    cfg = m.cfg
    tokens = torch.full((SRC.shape[0], 1), cfg.bos_id)
    done = torch.zeros(SRC.shape[0], dtype=torch.bool)
    for step in range(NEW):
        logits = m(SRC, tokens, src_padding_mask=mask == 0)[:, -1].clone()  # (B, V)
        logits[:, [cfg.pad_id, cfg.bos_id]] = float("-inf")  # never emitted
        for row in range(tokens.shape[0]):
            history = tokens[row].tolist()
            for word in bad:  # the word's last token, where the others end the history
                if len(word) == 1 or history[-(len(word) - 1):] == word[:-1]:
                    logits[row, word[-1]] = float("-inf")
        logits[:, list(suppress)] = float("-inf")
        if forced_eos is not None and step == NEW - 1:  # the last position: only the stop id
            logits[:, :] = float("-inf")
            logits[:, forced_eos] = 0.0
        picked = torch.where(done, fill, logits.argmax(dim=-1))
        done |= picked == eos
        tokens = torch.cat([tokens, picked[:, None]], dim=1)
    return tokens


# The tiny untrained model repeats one token per row: greedy gives rows 0 and 1 token 104
# and row 2 token 81 at every step (the first test pins that), so a stop id of 81 ends row 2
# at once, suppressing 104 sends rows 0 and 1 to 81 too, and the bad word [104, 104] makes
# rows 0 and 1 alternate.
EOS, FILL = 81, 5
RULES = {
    "pad": {},
    "bad_words": {"bad": [[104, 104], [90]]},
    "suppress": {"suppress": [104]},
    "forced_eos": {"forced_eos": EOS},
    "all": {"bad": [[104, 104]], "suppress": [90, 76], "forced_eos": EOS},
}
NAMES = {"bad": "bad_words_ids", "suppress": "suppress_tokens",
         "forced_eos": "forced_eos_token_id"}


def test_greedy_decoding_written_out_repeats_one_token_per_row():
    free = greedy_by_hand(model(), eos=-1, fill=-1)
    assert free[:, 1:].tolist() == [[104] * NEW, [104] * NEW, [EOS] * NEW]


@pytest.mark.parametrize("rule", list(RULES))
def test_the_rules_and_the_filler_give_greedy_decoding_written_out(rule):
    m = model()
    want = greedy_by_hand(m, eos=EOS, fill=FILL, **RULES[rule])
    settings = {NAMES[k]: v for k, v in RULES[rule].items()}
    got = m.generate(input_ids=SRC, attention_mask=MASK, max_new_tokens=NEW,
                     eos_token_id=EOS, pad_token_id=FILL, **settings)
    assert torch.equal(got, want[:, : got.shape[1]])
    assert (want[:, got.shape[1]:] == FILL).all()  # cut where every row had stopped
    assert (got[:, 1:] == EOS).any()  # some row stopped (and any after it were filled)


def test_a_source_of_padding_only_is_decoded_from_an_empty_memory_as_the_forward_does():
    # The decoder has its start token to continue, so (unlike a decoder-only prompt of
    # padding only, which is refused) the row is decoded, its cross-attention seeing no key.
    m = model()
    mask = MASK.clone()
    mask[1] = 0
    got = m.generate(input_ids=SRC, attention_mask=mask, max_new_tokens=NEW, eos_token_id=EOS,
                     pad_token_id=FILL)
    want = greedy_by_hand(m, eos=EOS, fill=FILL, mask=mask)
    assert torch.equal(got, want[:, : got.shape[1]])


def test_min_p_of_one_keeps_only_the_likeliest_token_so_sampling_is_greedy():
    # min_p = 1 keeps the tokens at least as likely as the likeliest one: the argmax
    # (ties have probability 0 between continuous logits).
    m = model()
    greedy = m.generate(input_ids=SRC, attention_mask=MASK, max_new_tokens=NEW)
    sampled = m.generate(input_ids=SRC, attention_mask=MASK, max_new_tokens=NEW,
                         do_sample=True, min_p=1.0, generator=torch.Generator().manual_seed(3))
    assert torch.equal(sampled, greedy)


def test_sampling_settings_without_sampling_warn_and_change_nothing():
    m = model()
    greedy = m.generate(input_ids=SRC, attention_mask=MASK, max_new_tokens=NEW)
    with pytest.warns(UserWarning, match="do_sample is not True"):
        warm = m.generate(input_ids=SRC, attention_mask=MASK, max_new_tokens=NEW,
                          temperature=0.3, top_p=0.5, min_p=0.2)
    assert torch.equal(warm, greedy)


@pytest.mark.parametrize("strategy", [{}, {"do_sample": True}, {"num_beams": 2}])
def test_a_max_time_already_over_ends_after_the_first_new_token(strategy):
    m = model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers-style notes on the strategy
        out = m.generate(input_ids=SRC, attention_mask=MASK, max_new_tokens=NEW, max_time=1e-9,
                         generator=torch.Generator().manual_seed(0), **strategy)
    assert out.shape == (SRC.shape[0], 2)  # the start token and one new token
    assert (out[:, 0] == m.cfg.bos_id).all()


def test_the_encoder_only_settings_are_refused_by_name():
    m = model()
    for name, value in (("encoder_repetition_penalty", 1.5), ("encoder_no_repeat_ngram_size", 2),
                        ("forced_bos_token_id", 7), ("begin_suppress_tokens", [7])):
        with pytest.raises(ValueError, match=rf"does not implement .*{name}="):
            m.generate(input_ids=SRC, max_new_tokens=2, **{name: value})
