"""The numba kernels compiled for this CPU vs for an AVX2-only CPU (``NUMBA_CPU_NAME=haswell``), side by side.

    python benchmarks/bench_isa.py --corpus ../shared/corpus/pydocs.jsonl.gz --docs 120 --rounds 2 \
        --json docs/benchmarks/isa.json

numba compiles for the host CPU by default (here with AVX-512); ``NUMBA_CPU_NAME=haswell`` makes LLVM generate
code for Haswell (AVX2, FMA, no AVX-512), which is what a user's AVX2-only CPU would run. Each measurement runs in
a fresh child process with its own empty ``NUMBA_CACHE_DIR`` (so a cached host build is never reused), host and
haswell alternating round by round on the same token ids. Timed (best of --repeats, after a warm-up call that
compiles): the hashing kernels of benchmarks/bench_hash.py (hashes + page-local rows, orders 1..3 and 1..7, per
65,536-token batch; hashes only, 1..7) and the coverage kernel of benchmarks/bench_coverage.py
(``polymem.analysis.coverage.coverage``, mistral-v1 target vs cl100k_base reference, N = 1..7, 1 worker).
Reported: M tokens/s per ISA and haswell / host.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def child(corpus: str, n_docs: int, repeats: int) -> dict:
    import gzip

    import numpy as np

    from polymem import HashSpec, Layout, TokenHashes
    from polymem.tokenizers import load_tokenizer

    with gzip.open(corpus, "rt", encoding="utf-8") as f:
        docs = [json.loads(line)["text"] for _, line in zip(range(n_docs), f)]
    tok = load_tokenizer("cl100k_base")
    cache = TokenHashes.build(tok, HashSpec())
    ids = np.concatenate([tok.encode(d) for d in docs])
    layout = Layout.for_params(200_000_000, heads=8, slots=4, head_dim=64)
    bs = 65536

    def best(fn) -> float:
        fn()  # compile + warm
        out = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t)
        return min(out)

    def batched(f):
        return lambda: [f(ids[s:s + bs]) for s in range(0, ids.size, bs)]

    res = {"tokens": int(ids.size)}
    for name, f in [("rows_1..3", lambda x: cache.ngram_rows(x, layout, 3)),
                    ("rows_1..7", lambda x: cache.ngram_rows(x, layout, 7)),
                    ("hashes_1..7", lambda x: cache.ngram_hashes(x, 7))]:
        res[name] = ids.size / best(batched(f)) / 1e6
    from polymem.analysis.coverage import coverage

    mis = load_tokenizer("mistral-v1")
    t_cov = best(lambda: coverage(mis, tok, docs, max_n=7))
    res["coverage_docs_per_s"] = len(docs) / t_cov
    res["coverage_MB_per_s"] = sum(len(d.encode()) for d in docs) / t_cov / 1e6
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--docs", type=int, default=120)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.corpus, a.docs, a.repeats)))
        return
    runs: dict[str, list[dict]] = {"host": [], "haswell": []}
    for rnd in range(a.rounds):
        for isa in runs:
            env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CPU")}
            with tempfile.TemporaryDirectory() as cache_dir:
                env["NUMBA_CACHE_DIR"] = cache_dir
                if isa == "haswell":
                    env["NUMBA_CPU_NAME"] = "haswell"
                out = subprocess.run([sys.executable, __file__, "--corpus", a.corpus, "--docs", str(a.docs),
                                      "--repeats", str(a.repeats), "--child"], env=env, capture_output=True, text=True)
            if out.returncode != 0:
                raise SystemExit(f"the {isa} child failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
            r = json.loads(out.stdout.strip().splitlines()[-1])
            runs[isa].append(r)
            print(f"round {rnd} {isa}: {r}", flush=True)
    keys = [k for k in runs["host"][0] if k != "tokens"]
    med = {isa: {k: statistics.median(r[k] for r in v) for k in keys} for isa, v in runs.items()}
    res = {"median": med, "haswell_over_host": {k: med["haswell"][k] / med["host"][k] for k in keys}, "runs": runs,
           "tokens": runs["host"][0]["tokens"], "docs": a.docs, "rounds": a.rounds, "repeats": a.repeats,
           "cpu_flags_avx512": _has("avx512f"), "command": " ".join(sys.argv)}
    print(json.dumps({k: res[k] for k in ("median", "haswell_over_host")}, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


def _has(flag: str) -> bool:
    try:
        return flag in open("/proc/cpuinfo").read().split()
    except OSError:
        return False


if __name__ == "__main__":
    main()
