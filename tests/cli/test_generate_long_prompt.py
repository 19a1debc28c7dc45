"""``addnorm generate`` with a prompt longer than the model's context: continued from its last
``max_len - 1`` characters (not prefilled whole, whose cost grows with its length squared),
and said so on stderr.

Provenance: the rule of ``prompt_room`` (the prompt's last ``max_len - 1`` tokens at most,
then the new tokens cut to the room left, as the sample cut them before), checked as
identities over drawn lengths; the CLI's continuation equals the library's continuation of
the kept characters alone (greedy decoding is a function of the tokens it sees), and the
model's ``start`` is handed no more than the kept characters.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from properties import examples

from addnorm.cli.parser import main
from addnorm.tasks.lm import LMTask, prompt_room
from addnorm.training.checkpoint import save_checkpoint
from addnorm.transformer.lm import TransformerLM

MAX_LEN = 48


@examples(40)
@given(prompt_length=st.integers(1, 10**6), max_new=st.integers(1, 10**6),
       max_len=st.integers(2, 4096))
def test_prompt_room_fits_the_context_and_keeps_short_prompts_whole(prompt_length, max_new,
                                                                    max_len):
    kept, new = prompt_room(prompt_length, max_new, max_len)
    assert kept == min(prompt_length, max_len - 1) and 1 <= new <= max_new
    assert kept + new <= max_len
    if prompt_length + max_new <= max_len:
        assert (kept, new) == (prompt_length, max_new)  # nothing is cut
    elif prompt_length < max_len:
        assert new == max(max_len - prompt_length, 1)  # the new tokens are cut, as before


@pytest.fixture(scope="module")
def lm_checkpoint(tmp_path_factory):
    """An lm run's checkpoint with random weights and a context of MAX_LEN characters."""
    run_dir = tmp_path_factory.mktemp("lm-long")
    task = LMTask()
    cfg = dataclasses.replace(task.prepare(task.default_model_config()), d_model=32, n_heads=2,
                              n_layers=1, d_ff=64, max_len=MAX_LEN)
    torch.manual_seed(0)
    state = task.build_model(cfg).state_dict()
    run = {"task": "lm", "model_config": cfg.to_dict(), "task_data": task.to_dict()}
    save_checkpoint(run_dir, 1, {"model": state}, {"run": run})
    return run_dir, task, cfg, state


def test_a_prompt_longer_than_the_context_is_continued_from_its_end_and_said_so(
    lm_checkpoint, capsys, monkeypatch
):
    run_dir, task, cfg, state = lm_checkpoint
    prompt = "def fn(x):\n    return x\n" * 400  # 10,000 characters, ~200 contexts
    lengths = []
    start = TransformerLM.start

    def recorded_start(self, prompt_ids, *args, **kwargs):
        lengths.append(prompt_ids.shape[1])
        return start(self, prompt_ids, *args, **kwargs)

    monkeypatch.setattr(TransformerLM, "start", recorded_start)
    argv = ["generate", "--prompt", prompt, "--max-new-tokens", "5", "--temperature", "0",
            "--checkpoint", str(run_dir)]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert lengths == [MAX_LEN - 1]  # the prefill sees the context, not 10,000 characters
    assert err.splitlines() == [
        f"note: the prompt has {len(prompt)} characters, more than the model's context "
        f"(max_len {MAX_LEN}): continuing its last {MAX_LEN - 1} with 1 new character"
    ]
    assert out.startswith(prompt)
    model = task.build_model(cfg)
    model.load_state_dict(state)
    alone = task.sample(model, prompt[-(MAX_LEN - 1):], max_new_tokens=5, temperature=0)
    assert out == prompt + alone[MAX_LEN - 1:] + "\n"


def test_a_prompt_within_the_context_is_not_mentioned(lm_checkpoint, capsys):
    run_dir, *_ = lm_checkpoint
    argv = ["generate", "--prompt", "def ", "--max-new-tokens", "5", "--temperature", "0",
            "--checkpoint", str(run_dir)]
    assert main(argv) == 0
    assert capsys.readouterr().err == ""
