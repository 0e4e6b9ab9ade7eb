"""Benchmark: storage reads per token of page-local vs Engram-style independent heads vs flat (Table 6 of the PageGram report).

    python benchmarks/bench_iosim.py /path/to/pydocs.jsonl.gz --tokenizer cl100k_base \
        --params 2B,6B,20B --orders 2,3 --cache-frac 0.01,0.02,0.05,0.1 --cache-mb 1024 \
        --json docs/benchmarks/iosim.json --plot docs/benchmarks/iosim.png

Tokenises the corpus once, then replays the token stream through the three equal-parameter layouts of each
table size (NF4, K=8, S=4, r=64 by default: 4 KiB blocks of 3 pages) with an LRU block cache of each size.
No table is written: the simulator needs only the geometry. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import time



def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("corpus", nargs="+")
    ap.add_argument("--tokenizer", default="cl100k_base")
    ap.add_argument("--params", default="2B,6B,20B")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--dtype", default="nf4")
    ap.add_argument("--orders", default="2,3")
    ap.add_argument("--cache-frac", default="0.01,0.02,0.05,0.1", help="cache sizes as fractions of the table")
    ap.add_argument("--cache-mb", default="1024", help="absolute cache sizes in MiB (the PageGram report: 1 GiB)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None, help="PNG: reads/token vs cache size (one panel per table size)")
    args = ap.parse_args()

    from polymem import HashSpec, Layout, TokenHashes
    from polymem.asset._format import geometry
    from polymem.cli._options import parse_count
    from polymem.corpus import Corpus
    from polymem.analysis.iosim import simulate
    from polymem.tokenizers import load_tokenizer

    t0 = time.perf_counter()
    tok = load_tokenizer(args.tokenizer)
    docs = [tok.encode(d.text) for d in Corpus(args.corpus)]
    T = sum(len(d) for d in docs)
    t_tok = time.perf_counter() - t0
    print(f"{len(docs)} documents, {T:,} {tok.name} tokens (tokenised in {t_tok:.1f} s)")
    cache = TokenHashes.build(tok, HashSpec())
    orders = tuple(int(x) for x in args.orders.split(","))
    fracs = [float(x) for x in args.cache_frac.split(",") if x]
    mbs = [int(x) for x in args.cache_mb.split(",") if x]
    out = {"tokenizer": tok.name, "corpus": args.corpus, "tokens": T, "documents": len(docs), "runs": []}
    lines = ["| table | cache | page-local | independent heads | flat | indep. / page-local |", "|---|---|---|---|---|---|"]
    for ptxt in args.params.split(","):
        base = Layout.for_params(parse_count(ptxt), heads=args.heads, slots=args.slots, head_dim=args.head_dim)
        g = geometry(base, args.dtype)
        table_bytes = g.num_chunks * g.chunk_bytes
        sizes = [int(f * table_bytes) for f in fracs] + [m << 20 for m in mbs]
        labels = [f"{f:.0%} ({f * table_bytes / 2**20:,.0f} MiB)" for f in fracs] + [f"{m:,} MiB ({(m << 20) / table_bytes:.1%})" for m in mbs]
        t0 = time.perf_counter()
        sim = simulate(docs, cache, base, orders=orders, dtype=args.dtype, cache_bytes=sizes)
        secs = time.perf_counter() - t0
        by = {r.kind: r for r in sim.results}
        name = f"{ptxt} ({table_bytes / 2**30:.2f} GiB {args.dtype})"
        print(f"\n{name}: P={base.pages:,} pages, {g.num_chunks:,} blocks of {g.chunk_bytes} B; simulated in {secs:.1f} s")
        pl, ih, fl = by["page-local"], by["independent-heads"], by["flat"]
        lines.append(f"| {name} | uncached | {pl.uncached_per_token:.2f} | {ih.uncached_per_token:.2f} | "
                     f"{fl.uncached_per_token:.2f} | {ih.uncached_per_token / pl.uncached_per_token:.1f}× |")
        print(lines[-1])
        for i, lab in enumerate(labels):
            a, b, c = pl.per_token()[i], ih.per_token()[i], fl.per_token()[i]
            lines.append(f"| {name} | {lab} | {a:.3f} | {b:.3f} | {c:.3f} | {b / a if a else float('inf'):.1f}× |")
            print(lines[-1])
        out["runs"].append({**sim.to_dict(), "name": ptxt, "labels": labels, "seconds": secs})
    print("\n" + "\n".join(lines))
    out["markdown"] = "\n".join(lines)
    if args.json:
        from polymem._io import atomic_write_json

        atomic_write_json(args.json, out)
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        runs = out["runs"]
        fig, axes = plt.subplots(1, len(runs), figsize=(4.2 * len(runs), 3.8), squeeze=False)
        for ax, run in zip(axes[0], runs):
            for i, res in enumerate(run["results"]):
                pts = sorted((c["bytes"] / 2**20, c["reads_per_token"]) for c in res["cache"])
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=f"C{i}", label=res["kind"])
                ax.axhline(res["uncached_reads_per_token"], color=f"C{i}", ls="--", lw=0.8)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_title(f"{run['name']} params ({run['table_bytes'] / 2**30:.1f} GiB {run['dtype']})", fontsize=9)
            ax.set_xlabel("LRU page cache (MiB)")
            ax.grid(True, which="both", alpha=0.3)
        axes[0][0].set_ylabel("storage reads per token (dashed: uncached)")
        axes[0][0].legend(fontsize=8)
        fig.suptitle(f"{T:,} {tok.name} tokens; orders {args.orders}; K={args.heads} S={args.slots} r={args.head_dim}", fontsize=9)
        fig.tight_layout()
        from polymem._io import atomic_path

        with atomic_path(args.plot) as tmp:
            fig.savefig(tmp, dpi=110)


if __name__ == "__main__":
    main()
