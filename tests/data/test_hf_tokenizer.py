"""Tokenizers for a user's text: a byte-level BPE trained with ``tokenizers`` and a user's
``tokenizer.json``, behind the interface the character tokenizer has.

Provenance: ``tokenizers`` itself is the reference (the wrapped tokenizer's own ``encode`` /
``decode``); identities (decode inverts encode on any text for a byte-level BPE; the bytes
per token sum to the text's UTF-8 length); GPT-2's byte-level vocabulary is built here by the
``tokenizers`` API, not downloaded.
"""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from properties import examples

from addnorm.data.fingerprint import DataError
from addnorm.data.hf_tokenizer import (
    MAX_VOCAB_SIZE,
    SPECIAL_TOKENS,
    HFTokenizer,
    token_byte_lengths,
    tokenizer_from_dict,
)
from addnorm.data.tokenizers import CharTokenizer

CORPUS = ["the cat sat on the mat", "der Hund läuft über die Straße", "日本語のテキスト"] * 20


@pytest.fixture(scope="module")
def bpe() -> HFTokenizer:
    return HFTokenizer.train_bpe(iter(CORPUS), 300)


def test_a_trained_bpe_starts_with_the_specials_and_is_deterministic(bpe):
    assert (bpe.pad_id, bpe.bos_id, bpe.eos_id) == (0, 1, 2)
    assert [bpe.tokenizer.id_to_token(i) for i in range(3)] == list(SPECIAL_TOKENS)
    assert HFTokenizer.train_bpe(iter(CORPUS), 300).to_json() == bpe.to_json()
    assert bpe.is_byte_level()


@examples(40)
@given(text=st.text(st.characters(blacklist_categories=("Cs",)), max_size=60))
def test_decode_inverts_encode_on_any_text_and_bytes_add_up(bpe, text):
    ids = bpe.encode(text)
    assert ids == bpe.tokenizer.encode(text, add_special_tokens=False).ids
    assert bpe.decode(ids) == text
    assert int(token_byte_lengths(bpe)[ids].sum()) == len(text.encode("utf-8"))


def test_framing_padding_and_the_end_token(bpe):
    batch = bpe.encode_batch(["the cat", "a"], add_bos=True, add_eos=True)
    first = bpe.encode("the cat", add_bos=True, add_eos=True)
    assert batch.dtype == torch.long and batch.shape == (2, len(first))
    assert batch[0].tolist() == first
    assert batch[1, -1].item() == bpe.pad_id
    assert bpe.decode([*bpe.encode("the cat"), bpe.eos_id, *bpe.encode("mat")]) == "the cat"


def test_a_file_without_specials_gets_them_added_and_keeps_its_own(tmp_path):
    """A GPT-2-like byte-level tokenizer: <|endoftext|> is its end token; <pad> and <bos>
    are added after its vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=280, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    path = tmp_path / "tokenizer.json"
    path.write_text(raw.to_str(), encoding="utf-8")
    size = raw.get_vocab_size()
    tok = HFTokenizer.from_file(path)
    assert tok.eos_id == raw.token_to_id("<|endoftext|>")
    assert {tok.pad_id, tok.bos_id} == {size, size + 1}
    assert tok.vocab_size == size + 2
    again = tokenizer_from_dict(json.loads(json.dumps(tok.to_dict())))
    assert again == tok and (again.pad_id, again.bos_id, again.eos_id) == (
        tok.pad_id, tok.bos_id, tok.eos_id)


def test_a_vocabulary_larger_than_a_model_takes_is_refused(bpe, monkeypatch):
    import addnorm.data.hf_tokenizer as module

    monkeypatch.setattr(module, "MAX_VOCAB_SIZE", 100)
    with pytest.raises(DataError, match="a vocabulary of 300 tokens, more than the 100"):
        HFTokenizer.from_json(bpe.to_json())
    with pytest.raises(ValueError, match="vocab_size"):
        HFTokenizer.train_bpe(iter(CORPUS), MAX_VOCAB_SIZE + 1)


def test_character_bytes_are_each_characters_utf8_length():
    tok = CharTokenizer("aé日")
    assert token_byte_lengths(tok).tolist() == [0, 0, 0, 0, 1, 2, 3]
    assert tokenizer_from_dict(tok.to_dict()) == tok


@examples(40)
@given(texts=st.lists(st.text(st.characters(blacklist_categories=("Cs",)), max_size=30),
                      max_size=5),
       add_bos=st.booleans(), add_eos=st.booleans())
def test_a_batch_is_each_texts_own_encoding_right_padded(bpe, texts, add_bos, add_eos):
    """Oracle: ``encode`` of each text alone (``tokenizers``' own ``encode``, above); the
    batch pads them on the right with ``pad_id`` to the longest."""
    batch = bpe.encode_batch(texts, add_bos=add_bos, add_eos=add_eos)
    rows = [bpe.encode(t, add_bos=add_bos, add_eos=add_eos) for t in texts]
    width = max(map(len, rows), default=0)
    assert batch.dtype == torch.long
    assert batch.tolist() == [r + [bpe.pad_id] * (width - len(r)) for r in rows]
    assert bpe.tokenizer.padding is None  # padding is on for the batch only


# ---- a pretrained model's own tokenizer.json ------------------------------------------------
# Oracle: a word-level tokenizer built here with ``tokenizers`` (its vocabulary is the
# expectation: each word's id), saved with a fixed padding length and truncation that the
# reader must replace. The real MiniLM tokenizer is compared with transformers' in
# tests/interop/test_hf_models.py.

VOCAB = {"[PAD]": 0, "[UNK]": 1, "the": 2, "cat": 3, "sat": 4, "down": 5}


@pytest.fixture
def model_file(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(VOCAB, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.enable_padding(pad_id=0, pad_token="[PAD]", length=8)  # replaced when read
    tok.enable_truncation(max_length=8)
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return path


def test_a_models_batches_are_right_padded_to_the_longest_row(model_file):
    tok = HFTokenizer.from_pretrained(model_file)
    ids, padding, types = tok.encode_for_model(["the cat sat down", "the dog"])
    assert tok.pad_id == 0 and tok.vocab_size == len(VOCAB)  # nothing added
    assert ids.tolist() == [[2, 3, 4, 5], [2, 1, 0, 0]]  # "dog" is unknown
    assert padding.tolist() == [[False] * 4, [False, False, True, True]]
    assert types.tolist() == [[0] * 4] * 2


def test_a_models_max_len_cuts_and_decode_inverts(model_file):
    tok = HFTokenizer.from_pretrained(model_file, max_len=2)
    assert tok.encode_for_model(["the cat sat"]).ids.tolist() == [[2, 3]]
    assert tok.decode([2, 3, 4]) == "the cat sat"


def test_without_a_pad_token_a_model_pads_with_id_zero_marked_by_the_mask(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(VOCAB, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    reader = HFTokenizer.from_pretrained(tmp_path)  # its folder
    ids, padding, _ = reader.encode_for_model(["sat", "the cat"])
    assert reader.special_id("pad") is None and reader.vocab_size == len(VOCAB)
    assert ids.tolist() == [[4, 0], [2, 3]] and padding.tolist() == [[False, True], [False] * 2]
    with pytest.raises(ValueError, match="has no pad token"):
        reader.encode_batch(["sat"])


def test_a_folders_special_tokens_map_names_the_padding_token(model_file):
    (model_file.parent / "special_tokens_map.json").write_text('{"pad_token": {"content": "sat"}}')
    tok = HFTokenizer.from_pretrained(model_file.parent)
    assert tok.pad_id == 4
    assert tok.encode_for_model(["the cat", "the"]).ids.tolist() == [[2, 3], [2, 4]]


def test_a_models_bad_files_and_arguments_are_refused(model_file, tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer file not found"):
        HFTokenizer.from_pretrained(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="cannot read .*bad.json as a tokenizer.json"):
        HFTokenizer.from_pretrained(tmp_path / "bad.json")
    with pytest.raises(ValueError, match=r"pad_token '<pad>' is not in the vocabulary"):
        HFTokenizer.from_pretrained(model_file, pad_token="<pad>")
    with pytest.raises(TypeError, match="texts must be a non-empty sequence of str"):
        HFTokenizer.from_pretrained(model_file).encode_for_model("the cat")
    with pytest.raises(ValueError, match="max_len"):
        HFTokenizer.from_pretrained(model_file, max_len=0)
