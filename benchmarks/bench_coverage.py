"""Benchmark: `polymem coverage` on a corpus vs tokenising it with both tokenizers alone, in the same run.

    python benchmarks/bench_coverage.py ../shared/corpus/pydocs.jsonl.gz --target mistral-v1 \
        --reference cl100k_base --max-n 7 --repeat 3 --json docs/benchmarks/coverage.json \
        --plot docs/benchmarks/coverage.png

Each round times, back to back on the same machine state:
  tokenize     read the corpus and encode every document with both tokenizers (nothing else)
  coverage     polymem.coverage(...) with 1 worker: reading, encoding, hashing, counting, fidelity, merge
  unique-only  the same with occurrence=False (no corpus-wide reference set)
  workers=N    the same as `coverage` with N worker processes
Tokenizers are loaded once before the rounds (their load time is in neither side) and the numba kernels are
compiled by a warm-up call. Ratios are per round (same-round baseline), then the median over rounds; both wall
time and CPU time (user + system, this process and its workers) are reported, since on a shared machine the
wall-clock ratio moves with other people's load.
Prints the coverage table beside the Tokenizer-Agnostic Engram paper's wikitext figures and a markdown timing table.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import time
import warnings
from pathlib import Path

PAPER_MISTRAL_WIKITEXT = [0.80, 0.81, 0.80, 0.78, 0.75, 0.74, 0.70]  # Tokenizer-Agnostic Engram Module, Table 2, cl100k_base reference


def machine() -> dict[str, object]:
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        model = next((ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if ln.startswith("Model name")), "?")
    except OSError:
        model = platform.processor() or "?"
    import numba
    import numpy
    import sentencepiece
    import tiktoken

    import polymem

    return {"cpu": model, "cores": os.cpu_count(), "python": platform.python_version(), "numpy": numpy.__version__,
            "numba": numba.__version__, "tiktoken": tiktoken.__version__, "sentencepiece": sentencepiece.__version__,
            "polymem": polymem.__version__}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("corpus", nargs="+")
    ap.add_argument("--target", default="mistral-v1")
    ap.add_argument("--reference", default="cl100k_base")
    ap.add_argument("--max-n", type=int, default=7)
    ap.add_argument("--workers", type=int, default=2, help="worker count for the parallel run")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None)
    args = ap.parse_args()

    import polymem
    from polymem.corpus import Corpus
    from polymem.tokenizers import load_tokenizer

    warnings.simplefilter("ignore")  # tiktoken's offline-fallback notice
    tok_t, tok_r = load_tokenizer(args.target), load_tokenizer(args.reference)
    polymem.coverage(tok_t, tok_r, ["warm-up: compile the kernels"], max_n=args.max_n, workers=1)

    def cpu() -> float:  # this process and its reaped children (the workers), user + system
        s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime

    cpu_s: dict[str, float] = {}

    def tokenize_only() -> float:
        t0, c0 = time.perf_counter(), cpu()
        for doc in Corpus(args.corpus):
            tok_t.encode(doc.text)
            tok_r.encode(doc.text)
        cpu_s["tokenize"] = cpu() - c0
        return time.perf_counter() - t0

    def run(name: str, **kw: object) -> tuple[float, object]:
        t0, c0 = time.perf_counter(), cpu()
        rep = polymem.coverage(tok_t, tok_r, Corpus(args.corpus), max_n=args.max_n, **kw)
        cpu_s[name] = cpu() - c0
        return time.perf_counter() - t0, rep

    rounds = []
    report = None
    for r in range(args.repeat):
        load0 = os.getloadavg()[0]
        base = tokenize_only()
        t1, report = run("coverage", workers=1)
        t_u, _ = run("unique_only", workers=1, occurrence=False)
        t_w, rep_w = run("workers", workers=args.workers)
        same = [round(a, 12) for a in rep_w.per_doc_mean] == [round(a, 12) for a in report.per_doc_mean]  # type: ignore[attr-defined]
        assert same, "workers changed the result"
        rounds.append({"tokenize_s": base, "coverage_s": t1, "unique_only_s": t_u, "workers_s": t_w,
                       "load_before": load0, "load_after": os.getloadavg()[0],
                       **{f"cpu_{k}_s": v for k, v in cpu_s.items()},
                       "encode_s_in_coverage": report.timing["encode_s"],  # type: ignore[attr-defined]
                       "count_s_in_coverage": report.timing["count_s"]})  # type: ignore[attr-defined]
        print(f"round {r + 1}: tokenize {base:.2f} s, coverage {t1:.2f} s ({t1 / base:.2f}x), unique-only "
              f"{t_u:.2f} s ({t_u / base:.2f}x), {args.workers} workers {t_w:.2f} s (speed-up {t1 / t_w:.2f}x); "
              f"load {load0:.1f}->{rounds[-1]['load_after']:.1f}; CPU s: "
              + ", ".join(f"{k} {v:.2f}" for k, v in cpu_s.items()), flush=True)

    def med(key: str) -> float:
        return statistics.median(x[key] for x in rounds)

    def med_ratio(a: str, b: str) -> float:
        return statistics.median(x[a] / x[b] for x in rounds)

    rep = report
    assert rep is not None
    summary = {
        "tokenize_s": med("tokenize_s"), "coverage_s": med("coverage_s"), "unique_only_s": med("unique_only_s"),
        "workers_s": med("workers_s"),
        "coverage_over_tokenize": med_ratio("coverage_s", "tokenize_s"),
        "unique_only_over_tokenize": med_ratio("unique_only_s", "tokenize_s"),
        "workers_speedup": med_ratio("coverage_s", "workers_s"),
        "cpu_coverage_over_tokenize": med_ratio("cpu_coverage_s", "cpu_tokenize_s"),
        "cpu_unique_only_over_tokenize": med_ratio("cpu_unique_only_s", "cpu_tokenize_s"),
        "cpu_workers_over_coverage": med_ratio("cpu_workers_s", "cpu_coverage_s"),
    }
    out = {"corpus": args.corpus, "target": args.target, "reference": args.reference, "max_n": args.max_n,
           "workers": args.workers, "machine": machine(), "rounds": rounds, "summary": summary,
           "report": rep.to_dict(), "paper_mistral_wikitext": PAPER_MISTRAL_WIKITEXT}

    def f(v: float | None) -> str:
        return "–" if v is None else f"{v:.2f}"

    N = args.max_n
    print()
    print(f"{rep.docs} documents, {rep.bytes / 1e6:.1f} MB; {rep.tokens['target']:,} {rep.target.name} tokens, "
          f"{rep.tokens['reference']:,} {rep.reference.name} tokens")
    print("| target n | " + " | ".join(str(n) for n in range(1, N + 1)) + " |")
    print("|---|" + "---|" * N)
    rows = [("paper, Mistral / cl100k_base, wikitext val (per-doc mean)", PAPER_MISTRAL_WIKITEXT[:N]),
            ("per-doc mean (Table 2's measure)", rep.per_doc_mean), ("pooled", rep.pooled),
            ("occurrence-weighted, corpus level", rep.occurrence_weighted), ("XOR token-id hash", rep.xor_baseline)]
    for name, vals in rows:
        print(f"| {name} | " + " | ".join(f(v) for v in vals) + " |")
    print()
    print("| run | wall s (median) | wall × tokenize | CPU × tokenize |")
    print("|---|---|---|---|")
    print(f"| tokenize only (both tokenizers) | {summary['tokenize_s']:.2f} | 1.00 | 1.00 |")
    print(f"| coverage, 1 worker | {summary['coverage_s']:.2f} | {summary['coverage_over_tokenize']:.2f} | "
          f"{summary['cpu_coverage_over_tokenize']:.2f} |")
    print(f"| coverage --no-occurrence, 1 worker | {summary['unique_only_s']:.2f} | "
          f"{summary['unique_only_over_tokenize']:.2f} | {summary['cpu_unique_only_over_tokenize']:.2f} |")
    print(f"| coverage, {args.workers} workers | {summary['workers_s']:.2f} | "
          f"{summary['workers_s'] / summary['tokenize_s']:.2f} (speed-up {summary['workers_speedup']:.2f}× over 1 "
          f"worker) | CPU {summary['cpu_workers_over_coverage']:.2f}× the 1-worker run's |")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        from polymem._io import atomic_write_json

        atomic_write_json(args.json, out)
    if args.plot:
        rep.plot(args.plot)


if __name__ == "__main__":
    main()
