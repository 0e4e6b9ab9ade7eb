"""Benchmark: training a table across processes (`torchrun -m polymem train`), against one process.

    python benchmarks/bench_sharded.py --params 200M --steps 12 --rounds 3 --json docs/benchmarks/sharded.json

Arms, taking turns in every round (the small-model mode, the sample pydocs corpus, the same seed and global batch):

  one     `polymem train` in one process with --threads 2 (the table a TrainableTable: every row and its state)
  two     `torchrun --nproc-per-node 2 -m polymem train` with --threads 1 each (each process holding its rows)

Per arm: tokens/s (training steps only, from the run's JSON), and per process the bytes of table rows it holds,
of their optimizer state (the row-wise rule's two numbers per row) and its peak RSS. The figures: per-process
rows + state at N = 2 against half of N = 1's (goal: within 5 %), and the tokens/s ratio two / one (median over
rounds). Each run writes one checkpoint half way (--checkpoint-every STEPS/2): its seconds, one against two
processes (each writing its own rows). Both arms write their asset; the two tables are compared row by row (max relative difference).
"""

from __future__ import annotations

import argparse
import json
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_flags() -> str:
    from polymem.torch.precision import host_cpu_flags

    flags = host_cpu_flags() or frozenset()
    return " ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f in flags) or "?"


def run(arm: str, args, work: Path) -> dict:
    out, js = work / f"{arm}.pmem", work / f"{arm}.json"
    train = ["-m", "polymem", "train", "--tokenizer", "bytes", "--corpus", "sample:pydocs", "--out", str(out),
             "--overwrite", "--steps", str(args.steps), "--params", args.params, "--batch-size", "8",
             "--block-size", "128", "--precision", "fp32", "--json", str(js),
             "--checkpoint-every", str(max(1, args.steps // 2))]
    if arm == "one":
        cmd = [sys.executable, *train, "--threads", "2"]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
               "--master-port", str(_port()), *train, "--threads", "1"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{arm} failed:\n{r.stderr[-3000:]}")
    s = json.loads(js.read_text())
    return {"tokens_per_s": s["tokens_per_s"], "process_memory": s["process_memory"], "heldout_bpb": s["heldout_bpb"],
            "checkpoint_s": s["checkpoints"]["seconds"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="200M")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    from polymem import MemoryAsset

    res: dict[str, list[dict]] = {"one": [], "two": []}
    with tempfile.TemporaryDirectory(dir=".") as d:
        work = Path(d)
        for rnd in range(args.rounds):
            for arm in (("one", "two") if rnd % 2 == 0 else ("two", "one")):
                res[arm].append(run(arm, args, work))
                print(f"round {rnd + 1} {arm}: {res[arm][-1]['tokens_per_s']:,.0f} tokens/s", file=sys.stderr)
        a = np.asarray(MemoryAsset.open(work / "one.pmem").to_numpy())
        b = np.asarray(MemoryAsset.open(work / "two.pmem").to_numpy())
    norm = np.linalg.norm(a, axis=1)
    live = norm > 0
    rel = float((np.linalg.norm(a - b, axis=1)[live] / norm[live]).max()) if live.any() else 0.0
    one_m, two_m = res["one"][-1]["process_memory"][0], res["two"][-1]["process_memory"]
    one_state = one_m["table_bytes"] + one_m["optimizer_bytes"]
    per_rank = [m["table_bytes"] + m["optimizer_bytes"] for m in two_m]
    out = {
        "command": " ".join(["python", "benchmarks/bench_sharded.py", *sys.argv[1:]]), "machine": platform.node(),
        "cpu_flags": cpu_flags(), "params": args.params, "steps": args.steps, "rounds": args.rounds, "runs": res,
        "one_process_rows_and_state_bytes": one_state, "per_process_rows_and_state_bytes": per_rank,
        "largest_share_over_half_of_one": max(per_rank) / (one_state / 2),
        "peak_rss_bytes": {"one": one_m["peak_rss_bytes"], "two": [m["peak_rss_bytes"] for m in two_m]},
        "tokens_per_s": {arm: statistics.median(r["tokens_per_s"] for r in v) for arm, v in res.items()},
        "two_over_one": statistics.median(t["tokens_per_s"] / o["tokens_per_s"] for t, o in zip(res["two"], res["one"])),
        "checkpoint_s": {arm: statistics.median(r["checkpoint_s"] for r in v) for arm, v in res.items()},
        "checkpoint_two_over_one": statistics.median(t["checkpoint_s"] / o["checkpoint_s"]
                                                     for t, o in zip(res["two"], res["one"])),
        "max_row_relative_difference": rel,
        "heldout_bpb": {arm: v[-1]["heldout_bpb"] for arm, v in res.items()},
    }
    print(json.dumps({k: v for k, v in out.items() if k != "runs"}, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
