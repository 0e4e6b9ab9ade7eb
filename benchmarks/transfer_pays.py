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
    p.add_argument("runs", nargs="+", type=Path, help="`polymem transfer --model … --json` outputs (any number per "
                   "direction), or a transfer-pays.json this script wrote (its runs merge with the new ones)")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--markdown", type=Path, help="also write the tables docs/real-models.md quotes")
    a = p.parse_args(argv)
    directions = []
    for f in a.runs:
        try:
            s = json.loads(f.read_text())
            if "directions" in s:  # a record this script wrote: its directions merge with the runs
                directions += s["directions"]
            else:
                directions.append(direction_record(s))
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"error: {f} is not a `polymem transfer --model --json` result ({type(e).__name__}: {e})", file=sys.stderr)
            return 2
    directions = merge_directions(directions)
    atomic_write_json(a.out, {"directions": directions}, indent=1)
    for d in directions:
        print(f"{d['donor']} -> {d['recipient']}: seeds {d['seeds']}, budgets {d['budgets']}")
        for line in d["verdicts"]:
            print(f"  {line}")
    print(f"wrote {a.out}")
    if a.markdown:
        a.markdown.write_text("\n\n".join(markdown(d) for d in directions) + "\n")
        print(f"wrote {a.markdown}")
    return 0


def merge_directions(records: list[dict]) -> list[dict]:
    """Runs of one direction over different arms and seeds (e.g. three arms on three seeds, the controls on other
    seeds) as one record: each arm's values seed by seed (``arm_seeds`` says which seeds each arm has; a seed run
    twice keeps its first value), the verdicts and comparisons of all. A record already merged (with
    ``arm_seeds``) merges like a run, so new runs can be added to docs/results/transfer-pays.json."""
    out: dict[tuple[str, str], dict] = {}
    for r in records:
        key = (r["donor"], r["recipient"])
        if "arm_seeds" not in r:
            tag = f"[seeds {','.join(str(x) for x in r['seeds'])}] "
            r = {**r, "arm_seeds": {arm: list(r["seeds"]) for arm in r["arms"]},
                 "verdicts": [tag + v for v in r["verdicts"]]}
        if key not in out:
            out[key] = json.loads(json.dumps(r))
            continue
        m = out[key]
        if r["budgets"] != m["budgets"] or r["ood"] != m["ood"]:
            raise ValueError(f"{key}: runs with other budgets or scoring sets cannot be merged")
        for arm, v in r["arms"].items():
            have = m["arm_seeds"].get(arm, [])
            if arm not in m["arms"]:
                m["arms"][arm] = {"curve": {}, "ood": {}}
            mine = m["arms"][arm]
            for seed_i, seed in enumerate(r["arm_seeds"][arm]):
                if seed in have:
                    continue
                for part in ("curve", "ood"):
                    for k, vals in v[part].items():
                        mine[part].setdefault(k, [])
                        old = dict(zip(have, mine[part][k]))
                        old[seed] = vals[seed_i]
                        mine[part][k] = [old[x] for x in sorted(old)]
                have = sorted({*have, seed})
            m["arm_seeds"][arm] = have
        m["seeds"] = sorted(set(m["seeds"]) | set(r["seeds"]))
        m["verdicts"] = m["verdicts"] + [v for v in r["verdicts"] if v not in m["verdicts"]]
        m["comparisons"] = m["comparisons"] + [c for c in r["comparisons"] if c not in m["comparisons"]]
    return list(out.values())


ARMS = ("none", "random", "null", "donor", "donor_finetune", "in_place")


def _cell(v: list[float]) -> str:
    m = sum(v) / len(v)
    return f"{m:.4f}" if len(v) == 1 or min(v) == max(v) else f"{m:.4f} ({min(v):.4f}–{max(v):.4f})"


def markdown(d: dict) -> str:
    """One direction as a table: mean (min–max over seeds) bits per byte by recipient tokens, and the change out of
    domain against the model alone."""
    arms = [a for a in ARMS if a in d["arms"]]
    budgets = [str(b) for b in d["budgets"]]
    none_ood = {k: sum(v) / len(v) for k, v in d["arms"]["none"]["ood"].items()} if "none" in d["arms"] else {}
    head = ["arm"] + [f"{int(b):,}" for b in budgets] + list(d["ood"])
    seeds = d.get("arm_seeds", {})
    rows = [f"**{d['donor']} → {d['recipient']}**, in domain {d['in_domain']}; seeds per arm: "
            + ", ".join(f"{arm} {seeds.get(arm, d['seeds'])}" for arm in arms), "",
            "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm in arms:
        c = d["arms"][arm]["curve"]
        cells = [_cell(c[b]) if b in c and c[b] else "" for b in budgets]
        for k in d["ood"]:
            v = d["arms"][arm]["ood"].get(k) or []
            if arm == "none" or not v or k not in none_ood:
                cells.append(f"{sum(v) / len(v):.4f}" if v else "")
            else:
                ch = [100 * (x / none_ood[k] - 1) for x in v]
                cells.append(f"{sum(ch) / len(ch):+.2f} % ({min(ch):+.2f}…{max(ch):+.2f})")
        rows.append(f"| {arm} | " + " | ".join(cells) + " |")
    rows += [""] + [f"- {line}" for line in d["verdicts"]]
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
