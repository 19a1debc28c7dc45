"""The quality `addnorm train ... --data` reaches on data it does not ship, with the default
command and budget, over seeds: the README's "Your own data" table.

    python benchmarks/own_data_quality.py run              # text and pairs, seeds 0-2
    python benchmarks/own_data_quality.py table            # the README's rows from the record

``run`` trains each kind of data with the command a user types (``addnorm train lm|translate
--data ... --seed N --out ...``: the plan, model, steps and schedule come from the data and
the default time budget), reads each run's ``metrics.json`` and writes
``docs/own-data-quality.json``: per run its command, plan lines, steps, time, what stopped it,
its scores, and the machine's load before and after (the budget fits the steps to the machine
as it is, so a busy machine trains fewer). The data:

- text: Python's own standard library sources, ``/usr/lib/python3.11/*.py`` (or
  ``--text GLOB``), character-level by default;
- pairs: 4,000 numbers of 0..99999 spelled in French by ``num2words`` and in digits
  (``benchmarks/number_words.py``; ``pip install num2words``).

Images are measured by ``benchmarks/dit_user_images.py`` (the same table's image rows).
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "docs" / "own-data-quality.json"
DEFAULT_TEXT = "/usr/lib/python3.11/*.py"
# What each kind's run is judged by, in metrics.json: the headline and the figures beside it.
SCORES = {
    "text": ("val_bpc", ("val_bpb",)),
    "pairs": ("test_exact_match", ("test_token_error_rate", "test_char_error_rate",
                                   "test_sequence_error_rate")),
}
TASKS = {"text": "lm", "pairs": "translate"}


def cpu_flags() -> str:
    """The AVX-512 flags of this CPU (what the README names a figure's machine by)."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return platform.processor()
    return " ".join(sorted({f for f in flags if f.startswith("avx512")}))


def write_pairs(path: Path) -> None:
    """The 4,000 French number-word pairs of benchmarks/number_words.py (its defaults)."""
    spec = importlib.util.spec_from_file_location("number_words", ROOT / "benchmarks" /
                                                  "number_words.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.write_pairs(path, 4000, 99_999, "fr", 0)


def command(kind: str, data: str, seed: int, out: Path, extra: list[str]) -> list[str]:
    """The user's command for ``kind``: the defaults, the data, a seed and the run folder."""
    return ["addnorm", "train", TASKS[kind], "--data", data, "--seed", str(seed),
            "--out", str(out), *extra]


def train(argv: list[str]) -> tuple[list[str], float]:
    """Run ``argv`` (``addnorm ...``) as ``python -m addnorm ...``; its stderr's plan lines
    (indented, printed before training) and the wall seconds."""
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "addnorm", *argv[1:]], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{shlex.join(argv)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    plan = [line.strip() for line in done.stderr.splitlines() if line.startswith("  ")]
    return plan, time.monotonic() - began


def result(kind: str, seed: int, argv: list[str], plan: list[str], wall_s: float,
           load: tuple[float, float]) -> dict:
    """One run's row of the record, from its ``metrics.json``."""
    out = Path(argv[argv.index("--out") + 1])
    metrics = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    headline, beside = SCORES[kind]
    return {
        "kind": kind, "seed": seed, "command": shlex.join(argv), "plan": plan,
        "step": metrics["step"], "stopped_by": metrics["stopped_by"],
        "elapsed_s": round(metrics["elapsed_s"], 1), "wall_s": round(wall_s, 1),
        "checkpoint": metrics.get("checkpoint", "last"),
        "scores": {name: metrics[name] for name in (headline, *beside) if name in metrics},
        "load_before": load[0], "load_after": load[1],
    }


def run(args: argparse.Namespace) -> None:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    data = {"text": args.text}
    if "pairs" in args.kinds:
        write_pairs(work / "pairs.tsv")
        data["pairs"] = str(work / "pairs.tsv")
    if "text" in args.kinds and not glob.glob(args.text):
        raise SystemExit(f"--text {args.text!r} matches no file")
    extra = [] if args.max_minutes is None else ["--max-minutes", str(args.max_minutes)]
    rows = []
    for kind in args.kinds:
        for seed in args.seeds:
            argv = command(kind, data[kind], seed, work / f"{kind}-{seed}", extra)
            load_before = os.getloadavg()[0]
            plan, wall_s = train(argv + ["--overwrite"])
            row = result(kind, seed, argv, plan, wall_s, (load_before, os.getloadavg()[0]))
            rows.append(row)
            print(json.dumps(row), flush=True)
    record = {
        "script": "benchmarks/own_data_quality.py",
        "machine": {"cpu": platform.processor() or platform.machine(),
                    "avx512": cpu_flags(), "cores": os.cpu_count()},
        "text": args.text, "runs": rows,
    }
    Path(args.record).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(table(record))


def spread(values: list[float], digits: int) -> str:
    """``min-max`` (or the one value) to ``digits`` decimals."""
    low, high = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return low if low == high else f"{low}-{high}"


def table(record: dict) -> str:
    """The README's Markdown rows: per kind, the seeds, steps, minutes and scores (min-max)."""
    lines = ["| data | seeds | steps | minutes | held-out quality | load |",
             "|---|---|---|---|---|---|"]
    for kind in SCORES:
        runs = [r for r in record["runs"] if r["kind"] == kind]
        if not runs:
            continue
        headline, beside = SCORES[kind]
        scores = [f"{headline} {spread([r['scores'][headline] for r in runs], 4)}"]
        scores += [f"{name} {spread([r['scores'][name] for r in runs], 4)}" for name in beside
                   if all(name in r["scores"] for r in runs)]
        loads = [v for r in runs for v in (r["load_before"], r["load_after"])]
        lines.append(
            f"| {kind} | {len(runs)} | {spread([r['step'] for r in runs], 0)} | "
            f"{spread([r['elapsed_s'] / 60 for r in runs], 1)} | {', '.join(scores)} | "
            f"{spread(loads, 1)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    go = sub.add_parser("run", help="train every kind on every seed and write the record")
    go.add_argument("--kinds", nargs="+", choices=sorted(SCORES), default=["text", "pairs"])
    go.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    go.add_argument("--text", default=DEFAULT_TEXT, help=f"the text glob ({DEFAULT_TEXT})")
    go.add_argument("--max-minutes", type=float, default=None,
                    help="a budget other than the task's default")
    go.add_argument("--work", default="runs/own-data", help="data and run folders")
    go.add_argument("--record", default=str(RECORD), help="the JSON record to write")
    show = sub.add_parser("table", help="print the README's rows from the record")
    show.add_argument("--record", default=str(RECORD))
    args = parser.parse_args()
    if args.command == "run":
        run(args)
    else:
        print(table(json.loads(Path(args.record).read_text(encoding="utf-8"))))


if __name__ == "__main__":
    main()
