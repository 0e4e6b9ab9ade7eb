"""Training throughput in fp32 vs bf16 autocast on this CPU (the choice `--precision auto` makes, measured).

    python benchmarks/bench_precision.py --corpus ../shared/corpus/pydocs.jsonl.gz --tokenizer mistral-v1 \
        --steps 4 --rounds 3 --threads 1 --json docs/results/bench_precision.json

The transfer recipe's backbone (GPT d=256, 4 layers, seq 256, batch 8) with a 12M-scalar memory table trained in
place (train="all"). fp32 and bf16 alternate within each round (the CPU is shared, so the median of the rounds is
reported). Prints and records the CPU's bf16-relevant flags and what `--precision auto` picks here.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from polymem.torch.attach import attach
from polymem.torch.precision import NATIVE_BF16_CPU_FLAGS, host_cpu_flags, resolve_precision
from polymem.recipes.train import MemoryConfig, TokenData, TrainConfig, build_model, read_documents, split_documents, train_loop


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--tokenizer", default="mistral-v1")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    train, held = split_documents(read_documents([a.corpus]), 10)
    data = TokenData.build(a.tokenizer, train, held)
    mem = MemoryConfig()
    speeds: dict[str, list[float]] = {"fp32": [], "bf16": []}
    for rnd in range(a.rounds):
        for prec in speeds:
            cfg = TrainConfig(steps=a.steps, precision=prec)
            model = build_model(data, cfg)
            h = attach(model, mem.layout(), data.cache, layers=[1], train="all", max_n=mem.max_n)
            t = time.perf_counter()
            out = train_loop(model, h, data, cfg)
            speeds[prec].append(out["tokens_per_s"])
            print(f"round {rnd} {prec}: {out['tokens_per_s']:7.0f} tok/s ({time.perf_counter() - t:.1f} s)", flush=True)
            h.detach()
    flags = host_cpu_flags() or frozenset()
    med = {k: statistics.median(v) for k, v in speeds.items()}
    res = {
        "tokens_per_s_median": med, "tokens_per_s_all": speeds, "bf16_over_fp32": med["bf16"] / med["fp32"],
        "auto_choice": resolve_precision("auto", "cpu"),
        "cpu": {"model": platform.processor() or _model_name(), "native_bf16_flags": sorted(flags & set(NATIVE_BF16_CPU_FLAGS)),
                "avx512f": "avx512f" in flags, "avx2": "avx2" in flags, "amx_tile": "amx_tile" in flags},
        "config": {"steps": a.steps, "rounds": a.rounds, "tokenizer": data.name, "n_used": int(data.used_ids.size),
                   "d_model": 256, "n_layer": 4, "batch": 8, "block": 256, "table_params": mem.params},
        "torch": torch.__version__, "threads": torch.get_num_threads(), "python": platform.python_version(),
    }
    print(json.dumps({k: res[k] for k in ("tokens_per_s_median", "bf16_over_fp32", "auto_choice", "cpu")}, indent=1))
    if a.json:
        from polymem._io import atomic_write_json

        atomic_write_json(a.json, res, indent=1)


def _model_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    main()
