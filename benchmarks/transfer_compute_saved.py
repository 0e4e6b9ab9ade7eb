"""The compute a donor saves at its own budget, measured against complete scratch runs.

One run's intermediate points are taken before the learning-rate decay, so "scratch needs X tokens to reach
donor_finetune's final bpb" cannot be read off one run. This script takes the arm's final bpb per seed from a
``polymem transfer`` result and scratch runs of several lengths (``polymem transfer --arms scratch --steps N`` with
the same seeds and recipient settings), and interpolates between their final (post-decay) points
(:func:`polymem.recipes.curves.end_of_schedule_saving`).

    python benchmarks/transfer_compute_saved.py --result docs/results/transfer-curves.json \\
        --scratch docs/results/transfer-scratch150.json --scratch docs/results/transfer-scratch200.json \\
        --arms donor_finetune,donor --json docs/results/transfer-compute-saved.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from polymem._io import atomic_write_text
from polymem.recipes.curves import end_of_schedule_saving


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--result", required=True, help="transfer JSON with the arms (and a scratch arm at the same budget)")
    p.add_argument("--scratch", action="append", default=[], help="transfer JSON of a longer scratch-only run")
    p.add_argument("--arms", default="donor_finetune,donor")
    p.add_argument("--json", required=True)
    a = p.parse_args(argv)
    res = json.loads(Path(a.result).read_text())
    found = []  # (tokens, final scratch bpb per seed, file)
    if "scratch" in res["arms"]:
        found.append((res["tokens"], res["arms"]["scratch"]["bpb"], a.result))
    for f in a.scratch:
        r = json.loads(Path(f).read_text())
        if r["seeds"] != res["seeds"]:
            raise SystemExit(f"error: {f} has seeds {r['seeds']}, {a.result} has {res['seeds']}: use the same --seeds")
        if "scratch" not in r["arms"]:
            raise SystemExit(f"error: {f} has no scratch arm (it has {sorted(r['arms'])}): pass a run of --arms scratch")
        found.append((r["tokens"], r["arms"]["scratch"]["bpb"], f))
    runs, first = [], {}
    for tokens, bpb, f in found:
        if tokens in first:  # same seeds and settings, same length: the same run again, nothing to interpolate
            print(f"note: {f} is as long as {first[tokens]} ({tokens:,} tokens), so it adds no point; "
                  "scratch runs longer than the result's budget (more --steps) measure the saving")
            continue
        first[tokens] = f
        runs.append((tokens, bpb))
    out = {"result": a.result, "scratch_runs": [a.result] * ("scratch" in res["arms"]) + a.scratch,
           "seeds": res["seeds"], "budget": res["tokens"], "arms": {}}
    for arm in a.arms.split(","):
        out["arms"][arm] = end_of_schedule_saving(res["arms"][arm]["bpb"], res["tokens"], runs)
        s = out["arms"][arm]
        per = ", ".join("n/a" if x["extra_fraction"] is None
                       else ("<= " if x["status"] == "at_or_before" else "") + f"{x['extra_fraction']:+.0%}"
                       for x in s["per_seed"])
        print(f"{arm}: scratch needs extra tokens per seed {per}; mean "
              f"{'n/a' if s['extra_fraction_mean'] is None else format(s['extra_fraction_mean'], '+.1%')}")
    out["command"] = "python benchmarks/transfer_compute_saved.py " + " ".join(sys.argv[1:] if argv is None else argv)
    atomic_write_text(a.json, json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
