"""A diffusers ``save_pretrained`` folder of a DiT, read without diffusers.

Oracles: :func:`from_diffusers` of the model the folder was saved from (the same config and
every tensor equal: the folder path applies the same rules to the same tensors), and
diffusers' own forward of the model it loads back from the folder. Tampered folders must fail
with one ``CheckpointError`` naming the file and the field or tensor, before the model is built.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tolerances import FLOAT32_MODEL

from addnorm.interop import from_diffusers, from_diffusers_folder
from addnorm.utils.files import CheckpointError

diffusers = pytest.importorskip("diffusers")

WEIGHTS = "diffusion_pytorch_model.safetensors"


def diffusers_dit(*, shared: bool, seed: int = 0, learn_sigma: bool = True):
    """A small perturbed diffusers DiT; ``shared``: every block's embedders equal block 0's
    (as in the paper's converted checkpoints), else each block's its own."""
    torch.manual_seed(seed)
    model = diffusers.DiTTransformer2DModel(
        num_attention_heads=2, attention_head_dim=8, in_channels=3,
        out_channels=6 if learn_sigma else 3, num_layers=3, sample_size=8, patch_size=2,
        num_embeds_ada_norm=5, norm_eps=0.5,
    )
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # off the zero initialisation, so every weight shows
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))
    if shared:
        first = model.transformer_blocks[0].norm1.emb.state_dict()
        for block in model.transformer_blocks[1:]:
            block.norm1.emb.load_state_dict(first)
    return model.eval()


def inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    return torch.randn(4, 3, 8, 8, generator=gen), torch.tensor([0, 10, 500, 999]), \
        torch.tensor([0, 4, 5, 2])


def assert_same_dit(got, expected) -> None:
    assert got.cfg == expected.cfg
    theirs = expected.state_dict()
    assert set(got.state_dict()) == set(theirs)
    for key, value in got.state_dict().items():
        assert torch.equal(value, theirs[key]), key


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("sharded", [False, True])
def test_a_saved_diffusers_dit_loads_as_from_diffusers_converts_it(shared, sharded, tmp_path):
    theirs = diffusers_dit(shared=shared)
    theirs.save_pretrained(tmp_path, max_shard_size="20KB" if sharded else "10GB")
    assert (tmp_path / f"{WEIGHTS}.index.json").is_file() == sharded
    ours = from_diffusers_folder(tmp_path)
    assert not ours.training
    assert ours.cfg.conditioning == ("shared" if shared else "per_block")
    assert_same_dit(ours, from_diffusers(theirs))
    x, t, y = inputs()
    with torch.no_grad():
        expected = theirs(x, timestep=t, class_labels=y, return_dict=False)[0]
        torch.testing.assert_close(ours(x, t, y), expected, **FLOAT32_MODEL)  # D = 16, float32


def test_the_saved_dtype_is_kept_unless_another_is_asked_for(tmp_path):
    theirs = diffusers_dit(shared=True, learn_sigma=False).to(torch.bfloat16)
    theirs.save_pretrained(tmp_path)
    assert next(from_diffusers_folder(tmp_path).parameters()).dtype == torch.bfloat16
    ours = from_diffusers_folder(tmp_path, dtype="float32")
    assert next(ours.parameters()).dtype == torch.float32
    assert_same_dit(ours, from_diffusers(theirs.float()))


def saved(tmp_path: Path) -> Path:
    folder = tmp_path / "dit"
    diffusers_dit(shared=False).save_pretrained(folder)
    return folder


def edit_config(folder: Path, **changes) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def edit_weights(folder: Path, change) -> None:
    tensors = load_file(folder / WEIGHTS)
    change(tensors)
    save_file(tensors, folder / WEIGHTS)


def pickled_only(folder: Path) -> None:
    (folder / WEIGHTS).rename(folder / "diffusion_pytorch_model.bin")


def pipeline(folder: Path) -> None:
    shutil.move(folder, folder.with_name("transformer"))
    folder.mkdir()
    shutil.move(folder.with_name("transformer"), folder / "transformer")
    (folder / "model_index.json").write_text('{"_class_name": "DiTPipeline"}')


@pytest.mark.parametrize(
    ("tamper", "match"),
    [
        (lambda f: edit_config(f, _class_name="UNet2DModel"),
         r"diffusers class 'UNet2DModel' is not supported; supported: DiTTransformer2DModel"),
        (lambda f: edit_config(f, activation_fn="gelu"),
         r"config.json: cannot convert a diffusers DiT with activation_fn='gelu'"),
        (lambda f: edit_config(f, out_channels=5),
         r"out_channels \(5\) must be in_channels \(3\) or twice it"),
        (lambda f: edit_config(f, num_layers=10**6),
         r"config.json: num_layers \(1000000\) is more than \d+ layers per stack"),
        (lambda f: edit_config(f, num_layers=4),
         r"diffusion_pytorch_model.safetensors does not fit the DiT of .*config.json: lacks "
         r"the tensors \['transformer_blocks.3."),
        (lambda f: edit_config(f, num_attention_heads=3),
         r"does not fit the DiT of its config.json: mismatched shapes \['block_embeds.0."
         r"class_embed.table.weight: saved \(6, 16\), model \(6, 24\)"),
        (lambda f: edit_config(f, sample_size=7),
         r"config.json: input_size \(7\) must be divisible by patch_size \(2\) \(input_size "
         r"is config.json's sample_size\)"),
        (lambda f: edit_config(f, num_attention_heads="2"),
         r"num_attention_heads \('2'\) and attention_head_dim \(8\) must be ints"),
        (lambda f: edit_weights(f, lambda t: t.update(extra=torch.zeros(2))),
         r"holds tensors a DiTTransformer2DModel of .* has no place for: \['extra'\]"),
        (lambda f: edit_weights(f, lambda t: t.update(
            {"proj_out_2.weight": torch.zeros(5, 16)})),
         r"does not fit the DiT of its config.json: mismatched shapes \['final_layer.linear"),
        (lambda f: edit_weights(f, lambda t: t.pop("transformer_blocks.0.ff.net.2.weight")),
         r"transformer_blocks.0.ff.net.2.weight is missing, a \(D, width\) matrix"),
        (pickled_only, r"weights missing: .*diffusion_pytorch_model.safetensors or .*index.json "
                       r"\(it has \['diffusion_pytorch_model.bin'\], a format addnorm does not"),
        (pipeline, r"is a diffusers pipeline \(model_index.json\): load the DiT in it, "
                   r".*/transformer"),
        (lambda f: (f / "config.json").write_text("{not json"), r"config.json is not valid JSON"),
    ],
)
def test_a_tampered_folder_is_refused_naming_the_file_and_what_is_wrong(tamper, match, tmp_path):
    folder = saved(tmp_path)
    tamper(folder)
    with pytest.raises(CheckpointError, match=match):
        from_diffusers_folder(folder)
