"""Benchmark: decoding with a memory table bigger than memory, served by the page service.

    nice -n 10 python benchmarks/bench_serving.py --asset /work/bench/serve-2b.nf4 --params 2G \
        --json serving.json --md serving.md

(docs/benchmarks/serving.md has the commands behind the figures it reports, and their raw JSON.)

A tiny HF LlamaForCausalLM (d=512, 8 layers, random init from a config, Mistral v0.1 tokenizer: vocab 32000),
one site before block 2, greedy generate(). Arms, each in its own subprocess (peak RSS = ru_maxrss):

  none      the model without memory
  memory    an in-memory fp32 table (TrainableTable, frozen) of the same layout but --memory-params rows
            (a 2B fp32 table is 8 GB, more than this shared machine can hold next to the others)
  sync      the NF4 asset served with prefetch=False: pages read inside the site's forward
  prefetch  the NF4 asset served with prefetch=True: reads start in the model's pre-hook, before block 0
            (pages in the OS page cache read there, the others by the asset's I/O thread), on the compiled
            lane (one call to look up and read, one to decode out of the cache)
  general   the same without the lane (plan, cache copies, reads and decoding as separate steps: what it
            was before the lane, and what CUDA consumers get)
  pool      the same, with the pages that must come from storage read by the pool of reader threads instead
            of the I/O thread (the previous design, kept for URLs and hosts without numba)

Each arm runs warm (the asset's pages in the OS page cache) and cold (posix_fadvise(DONTNEED) on every shard
before each measured run; the page service starts empty in both). Per arm: decode ms/token at batch 1 and 8
(mean over the steps of a --new-tokens sampled generate(), median of --repeat runs), prefill seconds of a 512-token
prompt (generate(max_new_tokens=1), batch 1), peak RSS, the service's counters, and the CPU time the model's
thread spends in the table's own code per decode step (the pre-hook's prefetch + the site's gather; robust to a
busy machine, unlike whole-token times). Rounds interleave the arms so machine noise hits all of them alike.
torch.set_num_threads(1).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench_asset import evict  # posix_fadvise(DONTNEED) on each file; benchmarks/ is on sys.path

ARMS = ("none", "memory", "sync", "prefetch", "general", "pool")
HERE = Path(__file__).resolve()


# ----------------------------------------------------------------------------------------- the asset
def make_asset(path: Path, params: int) -> None:
    """An NF4 asset of ``params`` random parameters, written shard by shard (never whole in RAM)."""
    from polymem import HashSpec, Layout, MemoryAsset

    layout = Layout.for_params(params)
    rng = np.random.default_rng(0)

    def source(a: int, b: int) -> np.ndarray:
        return rng.standard_normal((b - a, layout.rows_per_page, layout.head_dim), dtype=np.float32)

    t0 = time.perf_counter()
    MemoryAsset._write_new(path, HashSpec(), layout, source, dtype="nf4", orders=(1, 2, 3),
                           provenance={"note": "random content, bench_serving.py"}, overwrite=False,
                           chunks_per_shard=None)
    print(f"created {path} ({layout.num_rows * layout.head_dim / 1e9:.2f}B params) in {time.perf_counter() - t0:.0f} s",
          file=sys.stderr)


def shard_files(asset) -> list[Path]:
    g = asset.geometry
    return [Path(asset.path) / g.shard_key(s) for s in range(g.num_shards)]




def touch(paths: list[Path]) -> None:
    """Read every shard once so the OS page cache holds the whole asset (warm runs)."""
    for p in paths:
        with open(p, "rb") as f:
            while f.read(1 << 24):
                pass


# ----------------------------------------------------------------------------------------- one arm
class _Clock:
    """A generate() streamer that timestamps every put (the prompt first, then one per new token)."""

    def __init__(self) -> None:
        self.t: list[float] = []
        self.cpu: list[float] = []

    def put(self, value) -> None:
        self.t.append(time.perf_counter())
        self.cpu.append(time.process_time())  # CPU seconds of every thread of the process

    def end(self) -> None:
        pass


def run_arm(args) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import polymem
    from polymem import HashSpec, Layout, MemoryAsset
    from polymem.samples import sample_text
    from polymem.torch import TrainableTable, attach

    torch.set_num_threads(1)
    tok = polymem.load_tokenizer("mistral-v1")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=tok.vocab_size, hidden_size=512, intermediate_size=1376, num_hidden_layers=8,
                      num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=2048)
    model = LlamaForCausalLM(cfg).eval()
    cache = polymem.TokenHashes.build(tok, HashSpec())
    ids = np.asarray(tok.encode(sample_text() * 8), dtype=np.int64)
    asset = MemoryAsset.open(args.asset)
    shards = shard_files(asset)
    memory_table = None
    arms = args.arm.split(",")  # one arm, or (--paired) several measured turn about in this one process
    if "memory" in arms:
        L = asset.layout
        small = Layout(pages=int(args.memory_params) // (L.heads * L.slots * L.head_dim), heads=L.heads,
                       slots=L.slots, head_dim=L.head_dim)
        w = torch.randn(small.num_rows, small.head_dim, generator=torch.Generator().manual_seed(0))
        memory_table = TrainableTable(w, spec=HashSpec(), layout=small, trainable=False)
        del w

    caps: dict = {}

    def attached(arm: str):
        if arm == "none":
            return None
        table = memory_table if arm == "memory" else asset
        h = attach(model, table, cache, layers=[2], in_memory=False, prefetch=arm in ("prefetch", "general", "pool"),
                   cache_mb=args.cache_mb, value_init="orthogonal")
        if arm != "memory":  # (the service may outlive a turn: set its switches for this arm every time)
            svc = h.table.service
            io_thread, lane = caps.setdefault("asset", (svc.io_thread, svc.lane))
            svc.io_thread = io_thread and arm != "pool"
            svc.lane = lane and arm not in ("general", "pool")
        return h

    def prompt(batch: int, length: int, offset: int) -> torch.Tensor:
        rows = [ids[offset + 997 * b: offset + 997 * b + length] for b in range(batch)]
        return torch.from_numpy(np.stack(rows))

    def timed(h) -> list[float]:
        """CPU seconds the model's thread spends in the table's own code (the pre-hook's prefetch and the site's
        gather: planning, cache copies, reads made in that thread, decoding) per forward: the part of a token's
        time the memory arm adds in that thread, measured where it happens, so a busy machine barely moves it
        (time the site sleeps waiting for reader threads is ``wait_s``; their CPU is in the process CPU time)."""
        spent: list[float] = []
        if h is None:
            return spent
        t = h.table
        has_pf = getattr(t, "prefetch", None) is not None  # the pre-hook calls it, then the site calls gather
        for name in ("prefetch", "gather"):
            fn = getattr(t, name, None)
            if fn is None:
                continue

            def wrap(*a, _fn=fn, _name=name, **k):
                t0 = time.thread_time()
                try:
                    return _fn(*a, **k)
                finally:
                    d = time.thread_time() - t0
                    if _name == "gather" and has_pf and spent:
                        spent[-1] += d
                    else:
                        spent.append(d)
            setattr(t, name, wrap)
        return spent

    def generate(p: torch.Tensor, new: int, cold: bool, arm: str = arms[0]) -> tuple[float, float, float, dict, float]:
        h = attached(arm)  # a fresh page service: its cache starts empty, warm or cold
        spent = timed(h)
        if cold:
            evict(shards)
        clock = _Clock()
        t0 = time.perf_counter()
        torch.manual_seed(1234)  # sampled tokens (a random model's greedy output repeats itself, which would
        with torch.no_grad():   # make every page a cache hit); near-uniform samples hit new n-grams each step
            model.generate(p, max_new_tokens=new, min_new_tokens=new, do_sample=True, top_k=0, top_p=1.0,
                           temperature=1.0, pad_token_id=0, eos_token_id=None, streamer=clock if new > 1 else None)
        t1 = time.perf_counter()
        st = h.stats() if h is not None else {}
        if h is not None:
            h.detach()
        steps = np.diff(clock.t[1:]) if new > 1 else np.array([])  # new-token to new-token intervals
        cpu = np.diff(clock.cpu[1:]) if new > 1 else np.array([])
        nan = float("nan")
        table = float(np.mean(spent[1:])) if len(spent) > 1 else (0.0 if h is None else nan)  # decode steps
        return (t1 - t0, float(steps.mean()) if steps.size else nan, float(cpu.mean()) if cpu.size else nan, st,
                table)

    if args.cache == "warm":
        touch(shards)
    if args.paired:  # the arms turn about, the same prompt for each in a turn: ratios of a turn share the machine
        res: dict = {"arms": arms, "cache": args.cache}
        for batch in (int(b) for b in args.paired_batches.split(",")):
            for arm in arms:
                generate(prompt(batch, 16, 0), 8, False, arm)  # warm-up
            per: dict[str, list[float]] = {a: [] for a in arms}
            for r in range(args.repeat):
                for arm in arms[r % len(arms):] + arms[: r % len(arms)]:
                    per[arm].append(1e3 * generate(prompt(batch, 16, 50 * (r + 1)), args.new_tokens,
                                                   args.cache == "cold", arm)[1])
            res[f"decode_ms_b{batch}"] = per
        res["loadavg"] = os.getloadavg()[0]
        return res
    out: dict = {"arm": args.arm, "cache": args.cache}
    for batch in (1, 8):
        generate(prompt(batch, 16, 0), 8, False)  # warm-up (allocations, first-call paths)
        runs, cpus, tables = [], [], []
        stats = {}
        for r in range(args.repeat):
            _, per_tok, cpu, stats, table = generate(prompt(batch, 16, 50 * (r + 1)), args.new_tokens,
                                                     args.cache == "cold")
            runs.append(per_tok)
            cpus.append(cpu)
            tables.append(table)
        out[f"table_ms_b{batch}"] = 1e3 * statistics.median(tables)
        out[f"decode_ms_b{batch}"] = 1e3 * statistics.median(runs)
        out[f"decode_cpu_ms_b{batch}"] = 1e3 * statistics.median(cpus)
        out[f"decode_runs_ms_b{batch}"] = [1e3 * x for x in runs]
        out[f"stats_b{batch}"] = {k: v for k, v in stats.items() if k in (
            "hits", "misses", "joined", "reads", "nowait_reads", "bytes_read", "wait_s", "cache_peak_bytes",
            "capacity_bytes")}
    pre = []
    for r in range(args.repeat):
        total = generate(prompt(1, 512, 3000 + 7 * r), 1, args.cache == "cold")[0]
        pre.append(total)
    out["prefill_s"] = statistics.median(pre)
    out["maxrss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["loadavg"] = os.getloadavg()[0]  # the machine is shared: how busy it was
    return out


# ----------------------------------------------------------------------------------------- gather overhead
def overhead(args) -> str:
    """CPU µs per forward of the table alone (rows of random n-grams, K heads each, 3 orders): in-memory
    index_select vs the page service (all chunks cached; and with every chunk read from the OS page cache).
    Less sensitive to a busy machine than whole-model timings: process CPU time, many calls."""
    import torch

    from polymem import HashSpec, Layout, MemoryAsset
    from polymem.torch import AssetTable, TrainableTable

    torch.set_num_threads(1)
    asset = MemoryAsset.open(args.asset)
    L = asset.layout
    small = Layout(pages=int(20e6) // (L.heads * L.slots * L.head_dim), heads=L.heads, slots=L.slots, head_dim=L.head_dim)
    mem = TrainableTable(torch.randn(small.num_rows, small.head_dim), spec=HashSpec(), layout=small, trainable=False)
    rng = np.random.default_rng(0)

    def rows_for(layout, B):
        p = rng.integers(0, layout.pages, size=(B, 1, 3))
        k = np.arange(layout.heads)
        slot = rng.integers(0, layout.slots, size=(B, 1, 3, layout.heads))
        return torch.from_numpy((p[..., None] * layout.heads + k) * layout.slots + slot)

    lines = ["| batch | table | CPU µs per forward, chunks cached | CPU µs per forward, chunks read (OS cache) |",
             "|---:|---|---:|---:|"]
    n = 200
    for B in (1, 8):
        for name in ("memory", "sync", "prefetch"):
            res = []
            for cached in (True, False):
                t = mem if name == "memory" else AssetTable(asset, prefetch=name == "prefetch", cache_mb=256 if cached else 0)
                R = [rows_for(t.layout, B) for _ in range(n)]
                for r in R[:20] + (R if cached else []):  # warm-up; fill the cache
                    t.gather(r)
                c0 = time.process_time()
                for r in R:
                    if name == "prefetch":
                        t.prefetch(r)
                    t.gather(r)
                res.append(1e6 * (time.process_time() - c0) / n)
                if name != "memory":
                    t.close()
            lines.append(f"| {B} | {name} | {res[0]:.0f} | {res[1]:.0f} |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------- driver
def cpu_info() -> str:
    try:
        txt = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        return platform.processor()
    model = next((ln.split(":", 1)[1].strip() for ln in txt.splitlines() if ln.startswith("Model name")), "?")
    flags = next((ln.split(":", 1)[1].split() for ln in txt.splitlines() if ln.startswith("Flags")), [])
    simd = [f for f in flags if f.startswith(("avx", "amx", "fma"))]
    return f"{model}, {os.cpu_count()} cores, flags: {' '.join(simd) or 'none of avx/amx/fma'}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--asset", required=True, help="NF4 asset to serve (created if missing)")
    ap.add_argument("--params", default="2G", help="size of the asset to create (e.g. 2G)")
    ap.add_argument("--memory-params", type=float, default=250e6, help="rows of the in-memory arm's fp32 table")
    ap.add_argument("--cache-mb", type=float, default=256.0)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3, help="measured runs per arm and size (median)")
    ap.add_argument("--rounds", type=int, default=2, help="subprocess rounds per arm (arms interleaved)")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--paired-batches", default="1,8", help="batch sizes of the paired turns (e.g. 1)")
    ap.add_argument("--paired", type=int, default=0, metavar="N",
                    help="also N turns of all arms in one process per cache state (same prompt per turn): "
                         "per-turn ratios, robust to the machine's slow drifts")
    ap.add_argument("--caches", default="warm,cold")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--md", type=Path)
    ap.add_argument("--overhead", action="store_true", help="only the per-forward CPU cost of the table (markdown)")
    ap.add_argument("--arm", help=argparse.SUPPRESS)
    ap.add_argument("--cache", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.arm:
        print(json.dumps(run_arm(args)))
        return
    if args.overhead:
        print(overhead(args))
        return
    from polymem.cli._options import parse_count

    if not Path(args.asset).exists():
        make_asset(Path(args.asset), parse_count(args.params))
    results: dict[tuple[str, str], list[dict]] = {}
    for rnd in range(args.rounds):
        for cache in args.caches.split(","):
            for arm in args.arms.split(","):
                cmd = [sys.executable, str(HERE), "--asset", args.asset, "--arm", arm, "--cache", cache,
                       "--memory-params", str(args.memory_params), "--cache-mb", str(args.cache_mb),
                       "--new-tokens", str(args.new_tokens), "--repeat", str(args.repeat)]
                t0 = time.perf_counter()
                res = subprocess.run(cmd, capture_output=True, text=True)
                if res.returncode:
                    raise SystemExit(f"arm {arm}/{cache} failed:\n{res.stderr[-3000:]}")
                r = json.loads(res.stdout.strip().splitlines()[-1])
                results.setdefault((arm, cache), []).append(r)
                print(f"round {rnd} {cache:4} {arm:8} b1 {r['decode_ms_b1']:.2f} ms/tok (cpu {r['decode_cpu_ms_b1']:.2f})  "
                      f"b8 {r['decode_ms_b8']:.2f} (cpu {r['decode_cpu_ms_b8']:.2f}) "
                      f"ms/tok  prefill {r['prefill_s']:.3f} s  rss {r['maxrss_mib']:.0f} MiB "
                      f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
                write(args, results)  # after every arm: a stopped run keeps what it measured
    paired: dict[str, dict] = {}
    for cache in args.caches.split(",") if args.paired else []:
        cmd = [sys.executable, str(HERE), "--asset", args.asset, "--arm", args.arms, "--cache", cache, "--paired",
               str(args.paired), "--paired-batches", args.paired_batches, "--memory-params", str(args.memory_params),
               "--cache-mb", str(args.cache_mb),
               "--new-tokens", str(args.new_tokens), "--repeat", str(args.paired)]
        t0 = time.perf_counter()
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode:
            raise SystemExit(f"paired {cache} failed:\n{res.stderr[-3000:]}")
        paired[cache] = json.loads(res.stdout.strip().splitlines()[-1])
        print(f"paired {cache}: {args.paired} turns ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
        write(args, results, paired)


def paired_ratios(p: dict, arm: str, base: str, batch: int) -> list[float]:
    """Per-turn ratios arm / base of decode ms per token (one turn = every arm once, the same prompt)."""
    d = p[f"decode_ms_b{batch}"]
    return [a / b for a, b in zip(d[arm], d[base])]


def write(args, results: dict, paired: dict | None = None) -> None:
    summary = summarise(results)
    from polymem import MemoryAsset

    a = MemoryAsset.open(args.asset)
    meta = {
        "machine": cpu_info(), "python": platform.python_version(),
        "asset": {"path": str(args.asset), "dtype": a.dtype, "params": a.layout.num_rows * a.layout.head_dim,
                  "bytes": sum(p.stat().st_size for p in shard_files(a)), "layout": a.layout.to_dict()},
        "memory_arm_params": int(args.memory_params), "cache_mb": args.cache_mb, "new_tokens": args.new_tokens,
        "repeat": args.repeat, "rounds": args.rounds, "paired": args.paired, "command": " ".join(sys.argv),
        "loadavg_1min_per_arm": [r.get("loadavg") for rs in results.values() for r in rs],
    }
    doc = {"meta": meta, "summary": summary, "runs": {f"{k[0]}/{k[1]}": v for k, v in results.items()},
           "paired": paired or {}}
    from polymem._io import atomic_write_json, atomic_write_text

    if args.json:
        atomic_write_json(args.json, doc, indent=1)
    md = markdown(doc)
    if args.md:
        atomic_write_text(args.md, md)


def summarise(results: dict) -> dict:
    out: dict = {}
    for (arm, cache), rs in results.items():
        med = lambda k: statistics.median(r[k] for r in rs)  # noqa: E731
        out[f"{arm}/{cache}"] = {"decode_ms_b1": med("decode_ms_b1"), "decode_ms_b8": med("decode_ms_b8"),
                                 "decode_cpu_ms_b1": med("decode_cpu_ms_b1"), "decode_cpu_ms_b8": med("decode_cpu_ms_b8"),
                                 "table_ms_b1": med("table_ms_b1"), "table_ms_b8": med("table_ms_b8"),
                                 "prefill_s": med("prefill_s"), "maxrss_mib": max(r["maxrss_mib"] for r in rs),
                                 "stats_b1": rs[-1].get("stats_b1", {}), "stats_b8": rs[-1].get("stats_b8", {})}
    return out


def markdown(doc: dict) -> str:
    s, m = doc["summary"], doc["meta"]
    if not s:  # --rounds 0: only the paired turns
        return markdown_paired(doc, [])
    lines = [
        "| cache | arm | ms/token b1 | × memory | ms/token b8 | × memory | CPU ms/token b1 | × memory | CPU ms/token b8 | × memory | prefill 512 (s) | peak RSS (MiB) | RSS − none |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for cache in ("warm", "cold"):
        base = s.get(f"memory/{cache}")
        none = s.get(f"none/{cache}")
        for arm in ARMS:
            r = s.get(f"{arm}/{cache}")
            if r is None:
                continue
            x1 = f"{r['decode_ms_b1'] / base['decode_ms_b1']:.3f}" if base else "–"
            x8 = f"{r['decode_ms_b8'] / base['decode_ms_b8']:.3f}" if base else "–"
            drss = f"{r['maxrss_mib'] - none['maxrss_mib']:+.0f}" if none else "–"
            c1 = f"{r['decode_cpu_ms_b1'] / base['decode_cpu_ms_b1']:.3f}" if base else "–"
            c8 = f"{r['decode_cpu_ms_b8'] / base['decode_cpu_ms_b8']:.3f}" if base else "–"
            lines.append(f"| {cache} | {arm} | {r['decode_ms_b1']:.2f} | {x1} | {r['decode_ms_b8']:.2f} | {x8} | "
                         f"{r['decode_cpu_ms_b1']:.2f} | {c1} | {r['decode_cpu_ms_b8']:.2f} | {c8} | "
                         f"{r['prefill_s']:.3f} | {r['maxrss_mib']:.0f} | {drss} |")
    lines += ["", "CPU time of the model's thread in the table's own code per decode step (pre-hook prefetch + site "
              "gather; median of runs) and what it adds over the in-memory table, relative to the in-memory arm's "
              "CPU time per token (an estimate that leaves out waits and the reader threads' share of the cores):", "",
              "| cache | arm | table CPU ms/step b1 | est. × memory b1 | table CPU ms/step b8 | est. × memory b8 |",
              "|---|---|---:|---:|---:|---:|"]
    for cache in ("warm", "cold"):
        base = s.get(f"memory/{cache}")
        for arm in ARMS:
            r = s.get(f"{arm}/{cache}")
            if r is None or "table_ms_b1" not in r or arm == "none":
                continue
            est = []
            for b in (1, 8):
                est.append(f"{1 + (r[f'table_ms_b{b}'] - base[f'table_ms_b{b}']) / base[f'decode_cpu_ms_b{b}']:.4f}"
                           if base and "table_ms_b1" in base else "–")
            lines.append(f"| {cache} | {arm} | {r['table_ms_b1']:.3f} | {est[0]} | {r['table_ms_b8']:.3f} | {est[1]} |")
    lines.append("")
    return markdown_paired(doc, lines)


def markdown_paired(doc: dict, lines: list[str]) -> str:
    m = doc["meta"]
    pd = doc.get("paired") or {}
    if pd:
        n = max(len(v[p["arms"][0]]) for p in pd.values() for k, v in p.items() if k.startswith("decode_ms_b"))
        lines += [f"Arms taking turns in one process ({n} turns per cache state, the same prompt for every arm in a "
                  "turn, the order rotated turn by turn): median ms/token, and the median and quartiles of the "
                  "per-turn ratios to the in-memory table (a turn's arms ran within seconds of each other):", "",
                  "| cache | arm | ms/token b1 | × memory b1 (median [q1, q3]) | ms/token b8 | × memory b8 (median [q1, q3]) |",
                  "|---|---|---:|---:|---:|---:|"]
        for cache, p in pd.items():
            for arm in p["arms"]:
                cells = []
                for b in (1, 8):
                    if f"decode_ms_b{b}" not in p:
                        cells += ["–", "–"]
                        continue
                    cells.append(f"{statistics.median(p[f'decode_ms_b{b}'][arm]):.2f}")
                    if "memory" in p["arms"]:
                        q = statistics.quantiles(paired_ratios(p, arm, "memory", b), n=4)
                        cells.append(f"{statistics.median(paired_ratios(p, arm, 'memory', b)):.3f} "
                                     f"[{q[0]:.3f}, {q[2]:.3f}]")
                    else:
                        cells.append("–")
                lines.append(f"| {cache} | {arm} | " + " | ".join(cells) + " |")
        lines.append("")
    loads = [x for x in m["loadavg_1min_per_arm"] if x is not None] + [p["loadavg"] for p in pd.values()]
    lines.append(f"Machine: {m['machine']}. Asset: {m['asset']['dtype']}, {m['asset']['params'] / 1e9:.2f}B params, "
                 f"{m['asset']['bytes'] / 2**30:.2f} GiB; in-memory arm: {m['memory_arm_params'] / 1e6:.0f}M-param fp32 "
                 f"table; cache_mb={m['cache_mb']:g}; {m['new_tokens']} new tokens; {m['rounds']} rounds × "
                 f"{m['repeat']} runs per arm process{'; ' + str(m['paired']) + ' paired turns' if m.get('paired') else ''}. 1-minute load average during the arms: "
                 f"{min(loads):.1f}–{max(loads):.1f} on {os.cpu_count()} cores. "
                 f"Command: `{m['command']}`")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
