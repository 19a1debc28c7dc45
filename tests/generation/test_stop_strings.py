"""Stop strings (``addnorm.generation.stop_strings``): rows end once their text holds one, the
text is cut before it (OpenAI's ``stop`` convention), and a bad ``stop_fn`` is refused.

Provenance: a scripted model whose tokens are known, decoded to letters by hand.
"""

from __future__ import annotations

import pytest
from toy_decoders import BeamCache, Scripted

from addnorm import GenerationConfig, generate_tokens
from addnorm.generation.stop_strings import cut_at_stop, stop_at_strings


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
