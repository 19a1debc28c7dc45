"""Print the tables of an ``addnorm bench --json`` file again (a run cut short leaves its
JSON, written after each group, but no table). Not part of pytest.

    .venv/bin/python benchmarks/bench_table.py gpu_out/bench.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from addnorm.bench.harness import format_table, from_json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", type=Path, help="the file addnorm bench --json wrote")
    args = parser.parse_args()
    print(format_table(from_json(json.loads(args.json.read_text(encoding="utf-8")))))


if __name__ == "__main__":
    main()
