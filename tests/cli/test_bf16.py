"""``--bf16`` says where it wins and where it loses (measured; :mod:`addnorm.cli.bf16`), and a
CPU run with it starts with a warning.

Provenance: the warning's numbers are those of ``addnorm.cli.bf16``'s measurements; whether
this CPU has bf16 instructions is what oneDNN reports (``cpu_has_bf16``), the same check the
bench uses.
"""

from __future__ import annotations

from addnorm.bench.harness import cpu_has_bf16
from addnorm.cli.bf16 import BF16_HELP, cpu_bf16_warning
from addnorm.cli.parser import main

TINY_TRANSLATE = ["--preset", "tiny", "--d-model", "32", "--n-heads", "2", "--d-ff", "64",
                  "--n-encoder-layers", "1", "--n-decoder-layers", "1", "--batch-size", "4",
                  "--eval-size", "4", "--max-steps", "1", "--quiet", "--device", "cpu"]


def test_the_warning_says_what_it_is_based_on_and_what_this_cpu_has():
    with_instructions, without = cpu_bf16_warning(True), cpu_bf16_warning(False)
    for text in (with_instructions, without):
        assert "0.2-0.4x" in text and "addnorm bench --bf16 --only small" in text
        assert "avx512_bf16" in text
    assert "has bf16 instructions" in with_instructions
    assert "no bf16 instructions" in without and "emulated" in without


def test_a_cpu_training_run_with_bf16_starts_with_the_warning(tmp_path, capsys):
    assert main(["train", "translate", *TINY_TRANSLATE, "--bf16",
                 "--out", str(tmp_path / "bf16")]) == 0
    err = capsys.readouterr().err
    assert "addnorm train translate: " + cpu_bf16_warning(cpu_has_bf16()) in err


def test_no_warning_without_bf16(tmp_path, capsys):
    assert main(["train", "translate", *TINY_TRANSLATE, "--out", str(tmp_path / "fp32")]) == 0
    assert "--bf16" not in capsys.readouterr().err


def test_train_and_bench_help_state_the_measured_gains_and_losses(capsys):
    assert main(["train", "translate", "--help"]) == 0
    train_help = " ".join(capsys.readouterr().out.split())
    assert " ".join(BF16_HELP.split()) in train_help
    assert main(["bench", "--help"]) == 0
    bench_help = " ".join(capsys.readouterr().out.split())
    assert "0.2-0.4x" in bench_help and "avx512_bf16" in bench_help
