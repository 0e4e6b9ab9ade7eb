"""Training throughput with a memory site vs without, in one process, interleaved (the CPU is shared, so runs
alternate and the median of several rounds is reported): no memory / memory hashed on device (in the forward,
from token ids) / memory with rows precomputed in the data loader (numba).

    python benchmarks/bench_train.py --corpus ../shared/corpus/pydocs.jsonl.gz --tokenizer cl100k_base \
        --steps 15 --rounds 3 --threads 1 --json docs/results/bench_train.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from polymem.torch.attach import attach
from polymem.recipes.train import MemoryConfig, TokenData, TrainConfig, build_model, read_documents, split_documents, train_loop


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--tokenizer", default="cl100k_base")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--params", type=int, default=12_000_000)
    ap.add_argument("--max-n", type=int, default=3)
    ap.add_argument("--no-bf16", action="store_true")
    ap.add_argument("--threads", type=int, help="torch CPU threads (1 is faster on a busy shared CPU)")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    train, held = split_documents(read_documents([a.corpus]), 10)
    data = TokenData.build(a.tokenizer, train, held)
    cfg = TrainConfig(steps=a.steps, bf16=not a.no_bf16)
    mem = MemoryConfig(params=a.params, max_n=a.max_n)
    arms = {"none": [], "memory_device_hash": [], "memory_loader_hash": []}
    for rnd in range(a.rounds):
        for arm in arms:
            model = build_model(data, cfg)
            h = None if arm == "none" else attach(model, mem.layout(), data.cache, layers=[1], train="all", max_n=a.max_n)
            t = time.perf_counter()
            out = train_loop(model, h, data, cfg, rows_in_loader=arm == "memory_loader_hash")
            arms[arm].append(out["tokens_per_s"])
            print(f"round {rnd} {arm:<20} {out['tokens_per_s']:8.0f} tok/s ({time.perf_counter() - t:.1f} s)", flush=True)
            if h is not None:
                h.detach()
    med = {k: statistics.median(v) for k, v in arms.items()}
    res = {
        "tokens_per_s_median": med, "tokens_per_s_all": arms,
        "overhead_device_hash": 1 - med["memory_device_hash"] / med["none"],
        "overhead_loader_hash": 1 - med["memory_loader_hash"] / med["none"],
        "config": {"steps": a.steps, "rounds": a.rounds, "batch": cfg.batch_size, "block": cfg.block_size,
                   "d_model": cfg.d_model, "n_layer": cfg.n_layer, "table_params": a.params, "max_n": a.max_n,
                   "bf16": cfg.bf16, "tokenizer": data.name, "n_used": int(data.used_ids.size)},
        "torch": torch.__version__, "threads": torch.get_num_threads(), "python": platform.python_version(),
    }
    print(json.dumps({k: res[k] for k in ("tokens_per_s_median", "overhead_device_hash", "overhead_loader_hash")}, indent=1))
    if a.json:
        from polymem._io import atomic_write_json

        atomic_write_json(a.json, res, indent=1)


if __name__ == "__main__":
    main()
