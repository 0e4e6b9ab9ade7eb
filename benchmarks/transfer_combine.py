"""Combine arms of several `polymem transfer` runs that share seeds and recipient settings (e.g. the same recipient
reading different donor assets) into one table with paired per-seed comparisons (the convert-transfer and
merge experiments).

    python benchmarks/transfer_combine.py --arm converted=i13-converted.json:donor \\
        --arm native=i13-native.json:donor --arm random=i13-converted.json:random \\
        --arm none=i13-converted.json:none --pair converted-random --pair converted-none --pair converted-native \\
        --json docs/results/assetops/convert-transfer.json

Refuses runs whose seeds, steps or recipient tokenizer differ (the per-seed pairing would be meaningless).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from polymem._io import atomic_write_text
from polymem.recipes.curves import paired

SAME = ("seeds", "steps", "tokens", "max_eval_tokens")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arm", action="append", required=True, help="NAME=RUN.json:ARM")
    p.add_argument("--pair", action="append", default=[], help="A-B: paired per-seed difference A - B")
    p.add_argument("--json", required=True)
    a = p.parse_args(argv)
    runs: dict[str, dict] = {}
    arms: dict[str, dict] = {}
    ref = None
    for spec in a.arm:
        name, _, rest = spec.partition("=")
        path, _, arm = rest.rpartition(":")
        if not (name and path and arm):
            raise SystemExit(f"error: --arm {spec!r}: expected NAME=RUN.json:ARM")
        run = runs.setdefault(path, json.loads(Path(path).read_text()))
        key = {k: run.get(k) for k in SAME} | {"recipient": (run.get("recipient") or {}).get("fingerprint"),
                                                "domain": (run.get("domain") or {}).get("eval_corpus")}
        if ref is None:
            ref = key
        elif key != ref:
            diff = {k: (ref[k], key[k]) for k in ref if ref[k] != key[k]}
            raise SystemExit(f"error: {path} differs from the first run in {diff}: combine runs of the same recipient setup")
        if arm not in run["arms"]:
            raise SystemExit(f"error: {path} has no arm {arm!r} (it has {sorted(run['arms'])})")
        arms[name] = {"run": path, "arm": arm, "donor_asset": (run.get("donor") or {}).get("asset"),
                      "bpb": run["arms"][arm]["bpb"]}
        if arm == "donor" and "donor_memory_off" in run["arms"]:
            arms[name]["bpb_memory_off"] = run["arms"]["donor_memory_off"]["bpb"]
    out = {"seeds": ref["seeds"], "steps": ref["steps"], "tokens": ref["tokens"], "arms": arms, "paired": {}}
    print(f"| arm | {' | '.join(f'seed {s}' for s in ref['seeds'])} | mean |\n|---|{'---|' * (len(ref['seeds']) + 1)}")
    for name, v in arms.items():
        print(f"| {name} | {' | '.join(f'{x:.4f}' for x in v['bpb'])} | {sum(v['bpb']) / len(v['bpb']):.4f} |")
    print("\n| a − b | per seed | mean | std | a better |\n|---|---|---|---|---|")
    for pr in a.pair:
        x, _, y = pr.partition("-")
        if x not in arms or y not in arms:
            raise SystemExit(f"error: --pair {pr!r}: arms are {sorted(arms)}")
        s = paired(arms[x]["bpb"], arms[y]["bpb"])
        out["paired"][pr] = s
        std = "n/a (one seed)" if s["std"] is None else f"{s['std']:.4f}"
        print(f"| {x} − {y} | {', '.join(f'{d:+.4f}' for d in s['diff'])} | {s['mean']:+.4f} | "
              f"{std} | {s['a_better']}/{s['n']} |")
    out["command"] = "python benchmarks/transfer_combine.py " + " ".join(sys.argv[1:] if argv is None else argv)
    atomic_write_text(a.json, json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
