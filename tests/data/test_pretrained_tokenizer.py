"""PretrainedTokenizer, the deprecated name of ``HFTokenizer.from_pretrained``: it warns, and
gives what the new name gives (the oracle: ``HFTokenizer.encode_for_model`` on the same file,
itself tested in tests/data/test_hf_tokenizer.py against a vocabulary built here and in
tests/interop/test_hf_models.py against transformers' tokenizer)."""

from __future__ import annotations

import pytest
import torch

from addnorm.data.hf_tokenizer import HFTokenizer
from addnorm.data.pretrained_tokenizer import PretrainedTokenizer

tokenizers = pytest.importorskip("tokenizers")

VOCAB = {"[PAD]": 0, "[UNK]": 1, "the": 2, "cat": 3, "sat": 4, "down": 5}


def _save(path, *, padded: bool):
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(VOCAB, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.post_processor = tokenizers.processors.TemplateProcessing(
        single="[UNK] $A", special_tokens=[("[UNK]", 1)])
    if padded:
        tok.enable_padding(pad_id=0, pad_token="[PAD]", length=8)  # replaced when read
    tok.save(str(path / "tokenizer.json"))


@pytest.mark.parametrize("padded", [True, False])
def test_the_old_name_warns_and_gives_what_the_new_one_gives(tmp_path, padded):
    _save(tmp_path, padded=padded)
    texts = ["the cat sat down", "the dog", "sat"]
    with pytest.warns(DeprecationWarning, match="HFTokenizer.from_pretrained"):
        old = PretrainedTokenizer.from_dir(tmp_path, max_len=4)
    new = HFTokenizer.from_pretrained(tmp_path, max_len=4)
    for got, want in zip(old.encode_batch(texts), new.encode_for_model(texts), strict=True):
        assert torch.equal(got, want)
    assert old.encode("the cat") == [1, 2, 3]  # the file's own framing
    assert old.pad_id == (0 if padded else None) and old.max_len == 4
    assert old.vocab_size == len(VOCAB) and old.decode(torch.tensor([2, 3])) == "the cat"
    with pytest.raises(TypeError, match="text must be a str"):
        old.encode(["the cat"])  # type: ignore[arg-type]
