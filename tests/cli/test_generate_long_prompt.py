"""``addnorm generate`` past the model's context: a prompt longer than the window is continued
from its last ``window`` characters (not prefilled whole, whose cost grows with its length
squared), and said so on stderr; ``--max-new-tokens`` are all generated, the window sliding
over the run's ``seq_len`` (or ``--window``), never cut.

Provenance: the CLI's continuation equals the library's (greedy decoding is a function of the
tokens it sees: a prompt's last ``window`` characters continue as the whole prompt does), the
model's prefill is handed no more than the window, and a run's checkpoint gives the model
the ``seq_len`` it recorded (a checkpoint that records none: ``max_len``).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from addnorm.cli.parser import main
from addnorm.generation.config import GenerationConfig
from addnorm.tasks.lm import LMTask, LMTaskConfig
from addnorm.tasks.trained import load_trained
from addnorm.training.checkpoint import save_checkpoint
from addnorm.training.config import TrainConfig
from addnorm.transformer.lm import TransformerLM

MAX_LEN = 48
SEQ_LEN = 12


def _checkpoint(run_dir, seq_len: int | None, position_encoding: str = "sinusoidal"):
    """An lm run's checkpoint with random weights, a max_len of MAX_LEN and, with
    ``seq_len``, the run's settings as the trainer records them (windows of ``seq_len``)."""
    task = LMTask()
    cfg = dataclasses.replace(task.prepare(task.default_model_config()), d_model=32, n_heads=2,
                              n_layers=1, d_ff=64, max_len=MAX_LEN,
                              position_encoding=position_encoding)
    torch.manual_seed(0)
    state = task.build_model(cfg).state_dict()
    extra = {"run": {"task": "lm", "model_config": cfg.to_dict(), "task_data": task.to_dict()}}
    if seq_len is not None:
        extra["train_config"] = {**TrainConfig().to_dict(),
                                 **LMTaskConfig(seq_len=seq_len).to_dict()}
    save_checkpoint(run_dir, 1, {"model": state}, extra)
    return run_dir, task, cfg, state


@pytest.fixture(scope="module")
def lm_checkpoint(tmp_path_factory):
    """A checkpoint that records no run settings: the model's context is its max_len."""
    return _checkpoint(tmp_path_factory.mktemp("lm-long"), None)


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    """A run's checkpoint that records windows of SEQ_LEN characters."""
    return _checkpoint(tmp_path_factory.mktemp("lm-run"), SEQ_LEN)


def test_a_prompt_longer_than_the_context_is_continued_from_its_end_and_said_so(
    lm_checkpoint, capsys, monkeypatch
):
    run_dir, task, cfg, state = lm_checkpoint
    prompt = "def fn(x):\n    return x\n" * 400  # 10,000 characters, ~200 contexts
    lengths = []
    run = TransformerLM._run

    def recorded_run(self, ids, *args, **kwargs):
        lengths.append(ids.shape[1])
        return run(self, ids, *args, **kwargs)

    monkeypatch.setattr(TransformerLM, "_run", recorded_run)
    argv = ["generate", "--prompt", prompt, "--max-new-tokens", "5", "--temperature", "0",
            "--checkpoint", str(run_dir)]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert lengths[0] == MAX_LEN and max(lengths) == MAX_LEN  # never 10,000 characters
    assert err.splitlines() == [
        f"note: the prompt has {len(prompt)} tokens, more than the model's context "
        f"({MAX_LEN}): continuing from its last {MAX_LEN}"
    ]
    assert out.startswith(prompt)
    model = task.build_model(cfg)
    model.load_state_dict(state)
    alone = task.sample(model, prompt[-MAX_LEN:], max_new_tokens=5, temperature=0)
    assert out == prompt + alone[MAX_LEN:] + "\n"


def test_a_prompt_within_the_context_is_not_mentioned(lm_checkpoint, capsys):
    run_dir, *_ = lm_checkpoint
    argv = ["generate", "--prompt", "def ", "--max-new-tokens", "5", "--temperature", "0",
            "--checkpoint", str(run_dir)]
    assert main(argv) == 0
    assert capsys.readouterr().err == ""


def test_a_run_generates_every_new_token_within_its_trained_windows(lm_run, capsys):
    # The issue: --max-new-tokens 1000 printed 250 characters (max_len), past the windows of
    # training. Now every token comes, each from at most seq_len characters.
    run_dir, task, _, _ = lm_run
    _, model, _ = load_trained(run_dir)
    assert model.context == SEQ_LEN  # the run's seq_len, read from its checkpoint
    new = 5 * MAX_LEN
    argv = ["generate", "--prompt", "def ", "--max-new-tokens", str(new), "--temperature", "0",
            "--checkpoint", str(run_dir)]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert err == ""
    prompt = torch.tensor([task.tokenizer.encode("def ")])
    config = GenerationConfig(max_new_tokens=new, pad_id=model.cfg.pad_id, window=SEQ_LEN)
    ids = model.generate(prompt, config)
    assert ids.shape == (1, new)  # all of them (a special token decodes to no character)
    assert out == "def " + task.tokenizer.decode(ids[0].tolist()) + "\n"


def test_window_widens_what_the_model_sees_when_asked(lm_run, capsys):
    run_dir, task, _, _ = lm_run
    _, model, _ = load_trained(run_dir)
    argv = ["generate", "--prompt", "def ", "--max-new-tokens", "40", "--temperature", "0",
            "--window", "30", "--checkpoint", str(run_dir)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    config = GenerationConfig(max_new_tokens=40, pad_id=model.cfg.pad_id, window=30)
    ids = model.generate(torch.tensor([task.tokenizer.encode("def ")]), config)
    assert out == "def " + task.tokenizer.decode(ids[0].tolist()) + "\n"


def test_a_window_out_of_range_exits_2_with_one_line(lm_run, tmp_path, capsys):
    run_dir, *_ = lm_run
    learned, *_ = _checkpoint(tmp_path, SEQ_LEN, position_encoding="learned")
    for checkpoint, window, message in [
        (run_dir, "0", "--window must be >= 1, got 0"),
        (learned, str(MAX_LEN + 1), f"--window ({MAX_LEN + 1}) exceeds max_len ({MAX_LEN})"),
    ]:
        argv = ["generate", "--prompt", "def ", "--window", window, "--checkpoint",
                str(checkpoint)]
        code = main(argv)
        out, err = capsys.readouterr()
        assert code == 2 and out == ""
        assert err.count("\n") == 1 and message in err
