"""Does loss-landscape's verdict survive the rounding by which two CPUs differ? Reruns the full
experiment with every initial weight one ulp off (``loss_landscape.run(nudge=k)``, a new draw
per k; k = 0 is the experiment as ``addnorm explain`` runs it) and prints, per run, the
verdicts and the rank-sum p-values they rest on; writes ``docs/landscape-nudges.json``.

    python benchmarks/landscape_nudges.py --draws 0 1 2            # ~3 min a draw, one core
    python benchmarks/landscape_nudges.py --draws 0 1 2 --seeds 12   # the former seed count

Draws already in the file for the same seed count are kept (a draw run again replaces its
entry), so draws can be added one invocation at a time.

The plain net at lr 0.3 is chaotic: one ulp gives a seed another run, as another CPU's
rounding does, so a p-value near the 5% line moves across it from one draw to the next (an
Intel Xeon gave 0.08 where this machine gave 0.001 with twelve seeds). A verdict that holds
on any CPU holds on every draw, with p well below the line.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "docs" / "landscape-nudges.json"


def p_values(measures: dict) -> dict[str, float]:
    """Rank-sum p of "smoother than the plain net" per net, deciding measure and rate, from
    a result's ``numbers["measures"]``."""
    from addnorm.experiments import loss_landscape as ll
    from addnorm.experiments.repeats import rank_sum_p

    found = {}
    for name in (ll.BN, ll.LN):
        for m in ll.DECIDING:
            for lr in ll.LRS:
                runs = measures[name][m][f"{lr:g}"]["runs"]
                plain = measures[ll.PLAIN][m][f"{lr:g}"]["runs"]
                found[f"{name} {m} at lr {lr:g}"] = rank_sum_p(plain, runs)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--seeds", type=int, default=None, help="default: the experiment's")
    parser.add_argument("--from-result", type=Path, default=None,
                        help="record draw 0 from this full run's loss-landscape/result.json "
                             "(addnorm explain's) instead of running it; --draws is ignored")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as addnorm explain runs it
    from addnorm.experiments import loss_landscape
    from addnorm.experiments.record import machine

    n_seeds = args.seeds or loss_landscape.N_SEEDS

    def results():
        if args.from_result is not None:  # the run addnorm explain made: draw 0
            yield 0, json.loads(args.from_result.read_text(encoding="utf-8"))
            return
        for draw in args.draws:
            yield draw, loss_landscape.run(nudge=draw, n_seeds=n_seeds).to_dict()

    for draw, result in results():
        n_seeds = result["numbers"]["n_seeds"]
        measures = result["numbers"]["measures"]
        (reading,) = result["also"]
        entry = {
            "nudge": draw, "verdict": result["verdict"],
            "conditions": {c["name"]: c["verdict"] for c in result["conditions"]},
            "layernorm": reading["verdict"],
            "layernorm_conditions": {c["name"]: c["verdict"] for c in reading["conditions"]},
            "p_smoother": p_values(measures),
            "lowest_accuracy": {name: {lr: spread["min"] for lr, spread in by_m[
                "accuracy"].items()} for name, by_m in measures.items()},
        }
        print(json.dumps(entry), flush=True)
        record = json.loads(RECORD.read_text(encoding="utf-8")) if RECORD.exists() else {}
        kept = record.get("by_seeds", {}).get(str(n_seeds), {})
        kept[str(draw)] = entry
        record["by_seeds"] = {**record.get("by_seeds", {}), str(n_seeds): dict(sorted(
            kept.items(), key=lambda item: int(item[0])))}
        record["_about"] = ("benchmarks/landscape_nudges.py: loss-landscape's full run with "
                            "every initial weight one ulp off (nudge k, 0 = none), by seed "
                            "count and draw: its verdicts and the p-values they rest on")
        record["cpu"] = machine()
        RECORD.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
