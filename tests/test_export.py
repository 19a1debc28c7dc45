"""addnorm.export and ``addnorm export``: exported programs and ONNX files of the four models.

Oracle: the eager model on the same weights, in eval mode, on padded batches (an unpadded, a
right-padded and a left-padded row) whose batch size and lengths differ from the ones the
export was captured with. ONNX files run with onnxruntime (skipped where it is absent; the
dev extra installs it).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import addnorm
from addnorm.export import export_program, onnx_max_error, run_onnx, sample_inputs, to_onnx
from addnorm.transformer.encoder_model import EncoderConfig, EncoderModel


def tiny(name: str) -> torch.nn.Module:
    """A model in training mode with dropout on: the export must switch it off."""
    torch.manual_seed(0)
    if name.startswith("lm"):
        position = name.split("-")[1]
        cfg = dataclasses.replace(
            addnorm.PRESETS["lm-tiny"], d_model=32, n_heads=2, n_layers=1, d_ff=64,
            position_encoding=position, max_len=32,
        )
        return addnorm.TransformerLM(cfg)
    if name.startswith("transformer"):
        cfg = dataclasses.replace(
            addnorm.PRESETS["tiny"], d_model=32, n_heads=2, n_encoder_layers=1,
            n_decoder_layers=1, d_ff=64,
        )
        return addnorm.Transformer(cfg)
    if name.startswith("encoder"):
        cfg = EncoderConfig(vocab_size=50, d_model=32, n_heads=2, n_layers=1, d_ff=64,
                            max_len=32, pooler=True)
        return EncoderModel(cfg)
    dit = addnorm.DiT(dataclasses.replace(addnorm.DIT_PRESETS["DiT-digits"], d_model=32,
                                          n_heads=2, n_layers=1))
    with torch.no_grad():  # off adaLN-Zero's all-zero start, so every part shows
        for p in dit.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return dit


CASES = {
    "lm-learned": "forward",
    "lm-rotary": "forward",
    "transformer": "forward",
    "encoder-model": "forward",
    "dit": "forward",
}


def eval_output(model: torch.nn.Module, part: str, inputs: dict) -> torch.Tensor:
    """The eager model's output in eval mode, called with the inputs by name."""
    forward = model.encode if part == "encoder" else model
    model.eval()
    with torch.no_grad():
        out = forward(**inputs)
    model.train()
    return out


@pytest.mark.parametrize("name", CASES)
def test_an_exported_program_gives_the_eager_outputs_at_other_sizes(name):
    model, part = tiny(name), CASES[name]
    program = export_program(model, part=part)
    assert model.training  # the mode it was in is restored
    for batch, length in [(4, 11), (3, 5)]:
        inputs = sample_inputs(model, part=part, batch=batch, length=length, seed=batch)
        with torch.no_grad():
            got = program.module()(**inputs)
        # The program runs eager's aten kernels (measured equal, AVX2 and AVX-512); a kernel
        # decomposed on export would reorder sums by ~1e-6 on these logits (|y| <= 6).
        torch.testing.assert_close(got, eval_output(model, part, inputs), rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    ("name", "part"), [("transformer", "encoder"), ("encoder-model", "forward"), ("dit", "forward")]
)
def test_an_onnx_file_gives_the_pytorch_outputs_on_other_padded_batches(name, part, tmp_path):
    # The LM's forward is checked through the command below; the Transformer's forward
    # exports as its encoder does (checked by hand: 2e-6), at four times the export time.
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    model = tiny(name)
    path = to_onnx(model, tmp_path / f"{name}.onnx", part=part)
    # onnxruntime's float32 kernels (its own exp/sin/erf and sum orders) are not torch's, so
    # no rounding bound applies: measured 8.6e-6 (DiT, |y| <= 1.4) and 7e-7 (encoder) on AVX2
    # and AVX-512, 6e-7 (EncoderModel, |y| <= 3.4, one CPU); 1e-4 keeps 10x over that, while
    # a wrong mask or op is off by O(0.1).
    assert onnx_max_error(model, path, part=part) < 1e-4


def test_an_encoder_model_onnx_file_takes_bert_token_type_ids(tmp_path):
    """BERT users pass segments: the file has a token_type_ids input, and onnxruntime with
    mixed types gives the eager model's hidden states (tolerance as above), which the types
    change (a file that ignored them would match the all-zero run instead)."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    import onnxruntime

    model = tiny("encoder-model")
    path = to_onnx(model, tmp_path / "bert.onnx")
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["ids", "padding_mask", "token_type_ids"]
    inputs = sample_inputs(model, batch=4, length=9, seed=2)
    types = inputs["token_type_ids"]
    assert types.any() and not types[inputs["padding_mask"]].any()
    expected = eval_output(model, "forward", inputs)
    untyped = eval_output(model, "forward", {**inputs, "token_type_ids": torch.zeros_like(types)})
    got = run_onnx(path, inputs)
    assert (got - expected).abs().max() < 1e-4
    assert (untyped - expected).abs().max() > 1e-2
    no_types = EncoderModel(dataclasses.replace(model.cfg, n_token_types=0))
    assert list(sample_inputs(no_types)) == ["ids", "padding_mask"]


def test_export_refuses_what_it_cannot_export():
    lm = tiny("lm-rotary")
    with pytest.raises(ValueError, match=r"part='encoder' is not one of TransformerLM's parts"):
        export_program(lm, part="encoder")
    with pytest.raises(ValueError, match=r"part must be one of 'forward', 'encoder'"):
        sample_inputs(lm, part="decoder")
    with pytest.raises(TypeError, match=r"model must be a TransformerLM, Transformer, EncoderM"):
        export_program(torch.nn.Linear(2, 2))


def test_sample_inputs_hold_every_kind_of_padding():
    inputs = sample_inputs(tiny("lm-rotary"), batch=3, length=6)
    padding = inputs["padding_mask"]
    assert not padding[0].any() and padding[1, -1] and padding[2, 0]  # none, right, left
    assert torch.equal(inputs["ids"] == 0, padding)  # pad_id exactly where the mask says


def test_the_export_command_writes_a_checked_onnx_file(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from addnorm.cli.parser import main

    run = tmp_path / "lm"
    train = ["train", "lm", "--preset", "lm-tiny", "--d-model", "32", "--n-heads", "2",
             "--d-ff", "64", "--n-layers", "1", "--batch-size", "2", "--seq-len", "16",
             "--eval-size", "2", "--max-steps", "1", "--quiet", "--out", str(run)]
    assert main(train) == 0
    out = tmp_path / "lm.onnx"
    assert main(["export", str(run), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert out.is_file() and "max |difference|" in printed
    assert main(["export", str(run), "--out", str(out), "--part", "encoder"]) == 2
    assert "a TransformerLM exports forward" in capsys.readouterr().err


def test_the_export_command_takes_a_pretrained_folder_of_any_family(tmp_path, capsys):
    # The BERT-family EncoderModel has no training task: a save_pretrained folder is its form.
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from addnorm.cli.parser import main

    torch.manual_seed(0)
    folder = EncoderModel(EncoderConfig(vocab_size=50, d_model=32, n_heads=2, n_layers=1,
                                        d_ff=64, max_len=64)).save_pretrained(tmp_path / "enc")
    out = tmp_path / "enc.onnx"
    assert main(["export", str(folder), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert out.is_file() and "EncoderModel's forward" in printed and "max |difference|" in printed


def test_a_model_without_a_padding_token_exports_on_masked_batches():
    """GPT-2's layout (``pad_id=None``): the mask alone marks padding; any id may sit there."""
    torch.manual_seed(0)
    cfg = dataclasses.replace(
        addnorm.PRESETS["lm-tiny"], d_model=32, n_heads=2, n_layers=1, d_ff=64,
        position_encoding="learned", max_len=32, pad_id=None, embed_scale="none",
    )
    model = addnorm.TransformerLM(cfg)
    program = export_program(model)
    inputs = sample_inputs(model, batch=3, length=7, seed=1)
    assert inputs["padding_mask"][1:].any(dim=1).all()
    # float32 defaults: eager's aten kernels again (equal); see the first test.
    torch.testing.assert_close(program.module()(**inputs), eval_output(model, "forward", inputs))
