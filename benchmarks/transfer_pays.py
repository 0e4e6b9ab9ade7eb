"""Gather `polymem transfer --model --json` results (one per direction) into the transfer-pays record.

    python benchmarks/transfer_pays.py runs/pays/smollm2-to-gemma.json runs/pays/gemma-to-smollm2.json \\
        --out docs/results/transfer-pays.json

Each input is the summary of one direction (donor model -> recipient model). The record holds, per direction, the
curves (bits per byte per seed at each recipient budget, from 0 tokens), the out-of-domain scores per arm and
seed, the alignment fit, and every paired comparison with its per-seed 95 % intervals and verdict line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from polymem._io import atomic_write_json
from polymem.recipes.verdicts import direction_record


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path, help="`polymem transfer --model … --json` outputs, one per direction")
    p.add_argument("--out", required=True, type=Path)
    a = p.parse_args(argv)
    directions = []
    for f in a.runs:
        try:
            s = json.loads(f.read_text())
            directions.append(direction_record(s))
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"error: {f} is not a `polymem transfer --model --json` result ({type(e).__name__}: {e})", file=sys.stderr)
            return 2
    atomic_write_json(a.out, {"directions": directions}, indent=1)
    for d in directions:
        print(f"{d['donor']} -> {d['recipient']}: seeds {d['seeds']}, budgets {d['budgets']}")
        for line in d["verdicts"]:
            print(f"  {line}")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
