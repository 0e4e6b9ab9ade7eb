"""Benchmark: `polymem generate` on the builtin models, with a table of >= 1.5G scalars in memory and on disk.

    python benchmarks/bench_generate.py --asset /work/bench/gen-1.6g.nf4 --params 1.6G --rounds 9 \
        --json docs/benchmarks/generate.json
    python benchmarks/bench_generate.py --asset /work/bench/gen-1.6g.nf4 --shared --cache-mb 32 \
        --json docs/benchmarks/generate-shared.json

Arms (one process per model; the model and its site are loaded once, arms take turns in every round, their
order rotating so machine noise hits all of them alike):

  alone   the model without memory (the site switched off: no hashing, no reads)
  memory  the site over the whole table in RAM (the NF4 asset decoded to float32 once, before the rounds)
  warm    the site over the asset on disk through the page service, every shard in the OS page cache
          (read once before the run); the service starts empty
  cold    the same after posix_fadvise(DONTNEED) on every shard: each page comes from storage
  warm0   warm with --cache-mb 0: the process keeps no page of its own, every read comes from the OS page cache
          (the setting for many processes on one host: one copy of the pages for all of them)

Per arm and batch (1 and 8 prompts of equal token length, --new-tokens greedy tokens each): tokens/s over the
decoding steps after the prefill (`polymem.models.generate.generate`, as the command prints it). The figure per
arm is the median over rounds; the ratios (disk / memory, memory / alone) are medians of the per-round ratios.
Each round also checks that memory, warm and cold decode the same tokens.

The site is a fresh one (random projection, context gate, before block 2) over random NF4 rows: the cost per
token does not depend on what the rows hold. The asset is written once (--params, never whole in RAM).

--shared: two processes decode the same prompts from the asset on disk, one after the other, each with its own
page service (--cache-mb); after each, the shards' pages resident in the OS page cache (mincore). A process's
own memory for the table is its cache (its peak, from the service); the OS page cache holds the pages once for
the host. Reported: one process's table memory (its cache + resident pages) against both processes' (two caches
+ resident pages), and the pages the second process found already in the OS page cache (read without waiting).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))

from bench_asset import evict  # noqa: E402  (posix_fadvise(DONTNEED) on each file)
from bench_serving import make_asset, shard_files, touch  # noqa: E402

ARMS = ("alone", "memory", "warm", "cold", "warm0")


def prompts_of(tok, n: int, length: int) -> list[str]:
    """``n`` distinct pydocs snippets that each tokenize to exactly ``length`` tokens (batched rows must be equal)."""
    import gzip

    from polymem.samples import resolve_sample

    out: list[str] = []
    with gzip.open(resolve_sample("sample:pydocs"), "rt", encoding="utf-8") as f:
        for line in f:
            ids = [int(t) for t in tok.encode(json.loads(line)["text"])]
            for s in range(0, len(ids) - length, 4 * length):
                text = tok.decode_bytes(ids[s:s + length]).decode("utf-8", "ignore")
                if len(tok.encode(text)) == length and text not in out:
                    out.append(text)
                    break
            if len(out) == n:
                return out
    raise SystemExit(f"the sample corpus gave only {len(out)} prompts of {length} tokens")


def cpu_flags() -> str:
    from polymem.torch.precision import host_cpu_flags

    flags = host_cpu_flags() or frozenset()
    return " ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f in flags) or "?"


def setup(args, model_name: str):
    import torch

    from polymem import MemoryAsset
    from polymem.models import load_model
    from polymem.torch import attach

    torch.set_num_threads(args.threads)
    lm = load_model(model_name)
    asset = MemoryAsset.open(args.asset)
    handle = attach(lm.model, asset, lm.tokenizer, layers=(2,), gate="context", in_memory=False,
                    cache_mb=args.cache_mb)
    return lm, asset, handle


def run_model(args, model_name: str) -> dict:
    from polymem.models.generate import Decoding, generate
    from polymem.torch import TrainableTable
    from polymem.torch.tables import AssetTable

    t0 = time.perf_counter()
    lm, asset, handle = setup(args, model_name)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    mem = TrainableTable(asset.to_numpy(), spec=asset.spec, layout=asset.layout, orders=tuple(asset.orders),
                         trainable=False)
    decode_table_s = time.perf_counter() - t0
    shards = shard_files(asset)
    d = Decoding(max_new_tokens=args.new_tokens)
    batches = [int(b) for b in args.batches.split(",")]
    prompts = {b: prompts_of(lm.tokenizer, b, args.prompt_tokens) for b in batches}
    rates: dict[str, dict[str, list[float]]] = {str(b): {a: [] for a in ARMS} for b in batches}
    stats: dict[str, dict[str, list[dict]]] = {str(b): {"warm": [], "cold": [], "warm0": []} for b in batches}
    same = []

    def one(arm: str, b: int) -> list[list[int]]:
        if arm == "alone":
            with handle.disabled():
                r = generate(lm, prompts[b], d, batch=b)
        else:
            if arm == "memory":
                old = handle.swap_table(mem)
            else:
                (evict if arm == "cold" else touch)(shards)
                old = handle.swap_table(AssetTable(asset, cache_mb=0 if arm == "warm0" else args.cache_mb))
            r = generate(lm, prompts[b], d, batch=b, handle=handle)
            new = handle.swap_table(old)
            if arm != "memory":
                stats[str(b)][arm].append({k: v for k, v in new.stats().items() if isinstance(v, (int, float))})
                new.close()
        rates[str(b)][arm].append(r["tokens_per_s"])
        return [x.new_ids for x in r["results"]]

    generate(lm, prompts[batches[0]], Decoding(max_new_tokens=4), batch=batches[0])  # first-call costs
    for rnd in range(args.rounds):
        for b in batches:
            order = ARMS[rnd % len(ARMS):] + ARMS[:rnd % len(ARMS)]
            got = {a: one(a, b) for a in order}
            same.append(got["memory"] == got["warm"] == got["cold"] == got["warm0"])
        print(f"{model_name} round {rnd + 1}/{args.rounds}: " + "; ".join(
            f"b{b} " + " ".join(f"{a} {rates[str(b)][a][-1]:.1f}" for a in ARMS) for b in batches), file=sys.stderr)
    handle.detach()
    summary = {}
    for b in batches:
        r = rates[str(b)]
        ratio = lambda x, y: [p / q for p, q in zip(r[x], r[y])]  # noqa: E731
        summary[str(b)] = {
            "tokens_per_s": {a: statistics.median(r[a]) for a in ARMS},
            "memory_over_alone": statistics.median(ratio("memory", "alone")),
            "warm_over_memory": statistics.median(ratio("warm", "memory")),
            "cold_over_memory": statistics.median(ratio("cold", "memory")),
            "warm0_over_memory": statistics.median(ratio("warm0", "memory")),
            "spread": {k: [min(v), max(v)] for k, v in (("memory_over_alone", ratio("memory", "alone")),
                                                        ("warm_over_memory", ratio("warm", "memory")),
                                                        ("cold_over_memory", ratio("cold", "memory")),
                                                        ("warm0_over_memory", ratio("warm0", "memory")))},
            "read_wait_ms_per_token": {a: statistics.median(1e3 * s["wait_s"] / (args.new_tokens * b)
                                                            for s in stats[str(b)][a]) for a in ("warm", "cold", "warm0")},
            "mib_read_cold": statistics.median(s["bytes_read"] / 2**20 for s in stats[str(b)]["cold"]),
        }
    return {"model": lm.name, "load_s": load_s, "table_decode_s": decode_table_s, "same_tokens_every_round": all(same),
            "rates": rates, "summary": summary}


def resident_bytes(paths: list[Path]) -> int:
    from polymem.serve.reader import resident_bytes as rb

    return sum(rb(p) for p in paths)


def shared_child(args) -> dict:
    """One of the --shared processes: decode the prompts from the asset on disk, report the service's figures."""
    from polymem.models.generate import Decoding, generate

    lm, asset, handle = setup(args, args.models.split(",")[0])
    prompts = prompts_of(lm.tokenizer, 8, args.prompt_tokens)
    generate(lm, prompts, Decoding(max_new_tokens=args.new_tokens), batch=8, handle=handle)
    s = handle.stats()
    handle.detach()
    return {k: s[k] for k in ("cache_peak_bytes", "capacity_bytes", "misses", "reads", "nowait_reads", "bytes_read")}


def run_shared(args) -> dict:
    from polymem import MemoryAsset

    shards = shard_files(MemoryAsset.open(args.asset))
    evict(shards)
    before = resident_bytes(shards)
    cmd = [sys.executable, str(HERE), "--asset", args.asset, "--models", args.models, "--threads", str(args.threads),
           "--cache-mb", str(args.cache_mb), "--new-tokens", str(args.new_tokens), "--prompt-tokens",
           str(args.prompt_tokens), "--child"]
    runs, resident = [], []
    for _ in range(2):
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
        resident.append(resident_bytes(shards))
    one = runs[0]["cache_peak_bytes"] + resident[0] - before
    both = runs[0]["cache_peak_bytes"] + runs[1]["cache_peak_bytes"] + resident[1] - before
    return {"cache_mb": args.cache_mb, "processes": runs, "resident_before": before, "resident_after": resident,
            "one_process_table_bytes": one, "two_processes_table_bytes": both, "ratio": both / one,
            "second_found_in_os_cache": runs[1]["nowait_reads"] / max(runs[1]["reads"], 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--asset", required=True)
    ap.add_argument("--params", default="1.6G", help="Scalars of the asset, written if --asset does not exist.")
    ap.add_argument("--models", default="smollm2-135m,gemma3-270m")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=48)
    ap.add_argument("--cache-mb", type=float, default=256.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--shared", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(shared_child(args)))
        return
    if not Path(args.asset).exists():
        from polymem.cli._options import parse_count

        make_asset(Path(args.asset), parse_count(args.params))
    from polymem import MemoryAsset

    a = MemoryAsset.open(args.asset)
    out = {"command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "machine": platform.node(),
           "cpu": platform.processor() or platform.machine(), "cpu_flags": cpu_flags(), "threads": args.threads,
           "asset": {"path": args.asset, "dtype": str(a.dtype), "scalars": a.layout.num_rows * a.layout.head_dim,
                     "bytes": sum(p.stat().st_size for p in shard_files(a))},
           "new_tokens": args.new_tokens, "prompt_tokens": args.prompt_tokens, "rounds": args.rounds,
           "cache_mb": args.cache_mb}
    if args.shared:
        out["shared"] = run_shared(args)
        print(json.dumps(out["shared"], indent=1))
    else:
        out["models"] = [run_model(args, m) for m in args.models.split(",")]
        for m in out["models"]:
            for b, s in m["summary"].items():
                print(f"{m['model']} b={b}: " + ", ".join(f"{a} {v:.1f}" for a, v in s["tokens_per_s"].items())
                      + f" tokens/s; memory/alone {s['memory_over_alone']:.3f}, warm/memory {s['warm_over_memory']:.3f},"
                      f" cold/memory {s['cold_over_memory']:.3f}, warm0/memory {s['warm0_over_memory']:.3f}; same tokens {m['same_tokens_every_round']}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
