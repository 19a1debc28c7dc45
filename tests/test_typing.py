"""What a user's script sees under ``mypy --strict``: ``addnorm.load``, the presets, and
``generate`` called with Hugging Face's settings (typed keywords, or a plain dict of them).

Provenance: mypy itself, run on two scripts written here as a user would write them. The
first must pass ``--strict`` without a cast or an ``isinstance`` (load + generate, with and
without naming the class; presets per family, ``assert_type`` pinning each type); the second
holds mistakes mypy must find at the lines named, which shows that the check is alive (a
script typed ``Any`` throughout would pass the first and fail this one).

mypy reads addnorm (it ships ``py.typed``) and torch's tensor and module types. To stay
within seconds on a cold cache it skips the torch subpackages that a user's calls never
reach (compilers, distributed, export) and the other libraries addnorm imports, which it
then treats as ``Any``; the types these scripts use are still exact.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

pytest.importorskip("mypy")

USER_SCRIPT = '''\
"""A user's script: load + generate, presets."""
import dataclasses

import torch
from typing_extensions import assert_type

import addnorm
from addnorm import DiT, EncoderModel, LMConfig, TransformerConfig, TransformerLM
from addnorm.generation import GenerateOutput


def continue_text(path: str, ids: torch.Tensor) -> torch.Tensor:
    model = addnorm.load(path, TransformerLM)
    assert_type(model, TransformerLM)
    return model.generate(ids, dataclasses.replace(model.generation_config, max_new_tokens=4))


def embed(path: str, ids: torch.Tensor) -> torch.Tensor:
    encoder = addnorm.load(path, EncoderModel, dtype="float32")
    hidden: torch.Tensor = encoder(ids)  # torch types nn.Module.__call__ as Any
    return hidden


def hugging_face_settings(model: TransformerLM, ids: torch.Tensor) -> torch.Tensor:
    settings = {"max_new_tokens": 5, "do_sample": True, "temperature": 0.7}  # dict[str, float]
    sampled = model.generate(ids, **settings)
    mixed = {"max_new_tokens": 5, "eos_token_id": [1, 2], "early_stopping": "never"}
    beams = model.generate(ids, **mixed)  # dict[str, object]
    typed = model.generate(input_ids=ids, max_new_tokens=5, suppress_tokens=[3], min_p=0.1)
    assert_type(typed, torch.Tensor)
    result = model.generate(ids, max_new_tokens=5, return_dict_in_generate=True,
                            output_scores=True)
    assert_type(result, GenerateOutput)
    scores: tuple[torch.Tensor, ...] | None = result.scores
    out: torch.Tensor = sampled if scores is None else beams
    return out


def own_names(lm: TransformerLM, seq2seq: addnorm.Transformer, ids: torch.Tensor,
              padding: torch.Tensor) -> None:
    def stop(tokens: torch.Tensor) -> torch.Tensor:
        return tokens[:, -1] == 1

    config = lm.generation_config
    assert_type(lm.generate(prompt_ids=ids, config=config, padding_mask=padding, stop_fn=stop),
                torch.Tensor)
    assert_type(seq2seq.generate(src_ids=ids, src_padding_mask=padding, max_new_tokens=3),
                torch.Tensor)


# The class is not named: typed Any, so the common call type-checks as it is.
tokens = addnorm.load("folder").generate(torch.zeros(1, 2, dtype=torch.long))
lm_cfg = addnorm.PRESETS["lm-tiny"]
assert_type(lm_cfg, LMConfig)
assert_type(addnorm.PRESETS["tiny"], TransformerConfig)
lm = TransformerLM(dataclasses.replace(addnorm.PRESETS["lm-small"], n_layers=1))
seq2seq = addnorm.Transformer(addnorm.PRESETS["base"])
dit = DiT(addnorm.DIT_PRESETS["DiT-S/2"])
'''

MISTAKES = '''\
import torch

import addnorm

addnorm.TransformerLM(addnorm.PRESETS["tiny"])  # line 5: an encoder-decoder's config
n: int = addnorm.load("x", addnorm.TransformerLM).generate(torch.zeros(1))  # line 6: a Tensor
addnorm.load("x", 3)  # line 7: not a class
addnorm.load("x", addnorm.TransformerLM).generate(torch.zeros(1), 3)  # line 8: config is an int
t: torch.Tensor = addnorm.load("x", addnorm.TransformerLM).generate(
    torch.zeros(1), return_dict_in_generate=True)  # line 9: a GenerateOutput
'''
EXPECTED_MISTAKES = {5: "arg-type", 6: "assignment", 7: "call-overload", 8: "call-overload",
                     9: "assignment"}

# Skipped (followed as Any): what a user's calls never reach, and libraries beside torch.
SKIPPED = [
    "torch._dynamo", "torch._inductor", "torch.distributed", "torch.onnx", "torch.fx",
    "torch.export", "torch._export", "torch._higher_order_ops", "torch._functorch",
    "torch._subclasses", "torch.testing", "torch._prims", "torch._refs", "torch._decomp",
    "torch.ao", "torch.sparse", "torch.masked", "torch.nested", "torch._library",
    "torch.compiler", "torch.cuda", "torch.backends", "torch.jit", "torch.optim",
    "torch.package", "torch.distributions", "torch.multiprocessing", "torch._prims_common",
    "safetensors", "numpy", "matplotlib", "sklearn", "tqdm", "transformers", "tokenizers",
    "sympy", "onnx", "onnxscript", "onnxruntime", "diffusers", "hypothesis", "scipy", "PIL",
    "networkx", "jinja2",
]


def test_a_users_script_passes_mypy_strict_and_its_mistakes_are_found(tmp_path):
    (tmp_path / "user.py").write_text(USER_SCRIPT)
    (tmp_path / "mistakes.py").write_text(MISTAKES)
    (tmp_path / "mypy.ini").write_text(
        "[mypy]\n[mypy-" + ",".join(f"{m}.*" for m in SKIPPED) + "]\nfollow_imports = skip\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--config-file", "mypy.ini",
         "--cache-dir", str(tmp_path / "cache"), "--no-pretty", "user.py", "mistakes.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    errors = re.findall(r"^(\w+)\.py:(\d+): error: .*\[([\w-]+)\]$", result.stdout, re.M)
    assert [e for e in errors if e[0] == "user"] == [], result.stdout
    found = {int(line): code for name, line, code in errors if name == "mistakes"}
    assert found == EXPECTED_MISTAKES, result.stdout + result.stderr
