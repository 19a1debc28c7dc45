"""One ``addnorm bench`` run: the chosen case groups in order, into one :class:`Report`.

Two suites: the CPU suite (today's cases: one layer, small models, decoding and DiT at CPU
sizes) and the GPU suite (GPT-2 small training and decoding, BERT-base, DiT-XL/2 and DiT-B/2
at their real sizes, each also at a tiny size for the CPU). The GPU suite first times a
same-run matrix multiply, the peak its TFLOP/s are shares of.
"""

from __future__ import annotations

import gc
import time
import traceback
from collections.abc import Callable, Sequence

import torch

from addnorm.bench.bert_inference import run_bert_inference
from addnorm.bench.decoding import run_decoding
from addnorm.bench.dit import run_dit, run_timestep
from addnorm.bench.dit_inference import run_dit_inference
from addnorm.bench.dit_training import run_dit_b_training, run_dit_xl_training
from addnorm.bench.encoder_layer import run_encoder_layer
from addnorm.bench.gpt2_decoding import run_gpt2_decoding
from addnorm.bench.gpt2_training import run_gpt2_training
from addnorm.bench.harness import BenchSettings, Report, machine_info
from addnorm.bench.padded_batch import run_padded_batch
from addnorm.bench.peak import measure_peak
from addnorm.bench.small_models import run_small_models
from addnorm.utils.checks import check_choice

__all__ = ["CPU_GROUPS", "GPU_GROUPS", "GROUPS", "SUITES", "run_bench"]

Group = Callable[[BenchSettings, Report, Callable[[str], None]], None]

CPU_GROUPS: dict[str, Group] = {
    "encoder": run_encoder_layer,
    "padded": run_padded_batch,
    "small": run_small_models,
    "decoding": run_decoding,
    "dit": run_dit,
    "timestep": run_timestep,
}
# In the order a short GPU session should run them: the largest gaps first.
GPU_GROUPS: dict[str, Group] = {
    "gpt2-train": run_gpt2_training,
    "gpt2-decode": run_gpt2_decoding,
    "bert": run_bert_inference,
    "dit-infer": run_dit_inference,
    "dit-train": run_dit_xl_training,
    "dit-b-train": run_dit_b_training,
}
GROUPS: dict[str, Group] = {**CPU_GROUPS, **GPU_GROUPS}
SUITES = {"cpu": CPU_GROUPS, "gpu": GPU_GROUPS}


def _free(device: torch.device) -> None:
    """Release what the finished group held (its models go out of scope)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run_bench(
    settings: BenchSettings,
    groups: Sequence[str] | None = None,
    *,
    suite: str | None = None,
    command: str = "addnorm bench",
    log: Callable[[str], None] | None = None,
    keep_going: bool = False,
    budget: float | None = None,
    after_group: Callable[[Report], None] | None = None,
) -> Report:
    """Run ``groups`` (default: every group of ``suite``, which defaults to ``"gpu"`` on
    CUDA and ``"cpu"`` on the CPU). ``log`` gets one line per case as it starts (the CLI
    prints them to stderr; the library prints nothing).

    ``keep_going``: a group that raises is recorded in ``report.errors`` (type, message and
    traceback) and the run goes on. ``budget``: seconds after which the groups not yet
    started are skipped, with a note. ``after_group`` is called with the report after each
    group (the CLI writes the JSON there, so a run cut short keeps what it measured).
    """
    device = settings.torch_device
    suite = check_choice("suite", suite, SUITES) if suite is not None \
        else ("gpu" if device.type == "cuda" else "cpu")
    names = list(SUITES[suite]) if groups is None \
        else [check_choice("group", g, GROUPS) for g in groups]
    on_cpu_only = [name for name in names if name in CPU_GROUPS]
    if device.type != "cpu" and on_cpu_only:
        raise ValueError(f"the CPU suite's groups {on_cpu_only} run on the CPU only; on "
                         f"{settings.device} choose among {list(GPU_GROUPS)}")
    say = log or (lambda line: None)
    report = Report(machine=machine_info(command, settings.device))
    start = time.perf_counter()
    if any(name in GPU_GROUPS for name in names):
        measure_peak(settings, report, say)
    for name in names:
        if budget is not None and time.perf_counter() - start > budget:
            report.notes.append(f"{name}: not run, the run's budget of {budget:.0f} s was spent")
            continue
        try:
            GROUPS[name](settings, report, say)
        except Exception as err:
            if not keep_going:
                raise
            first_line = (str(err).splitlines() or [""])[0]
            say(f"{name}: FAILED: {type(err).__name__}: {first_line}")
            report.errors.append(f"{name}: {type(err).__name__}: {first_line}\n"
                                 + traceback.format_exc())
        finally:
            _free(device)
        if after_group is not None:
            after_group(report)
    return report
