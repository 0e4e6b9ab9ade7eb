"""``polymem iosim``: page reads per token of a corpus through equal-parameter layouts (Table 6 of the PageGram report)."""

from __future__ import annotations

import time
from typing import Annotated, Iterator, Optional

import numpy as np
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from polymem.cli._options import AssetDtype, Dtype, HeadDim, Heads, JsonOut, Orders, Params, PlotOut, Slots, Tokenizer, parse_count, parse_orders
from polymem._io import atomic_write_json
from polymem.errors import PolymemError

console = Console()


def iosim(
    paths: Annotated[list[str], typer.Argument(help="Corpus: text files, directories, .jsonl(.gz) files, or - for stdin.")],
    tokenizer: Tokenizer,
    cache_mb: Annotated[str, typer.Option("--cache-mb", help="LRU page-cache sizes in MiB, comma-separated, e.g. 64,256,1024.")],
    asset: Annotated[Optional[str], typer.Option("--asset", help="Take layout, dtype, orders and hash spec from this asset.")] = None,
    params: Params = "200M",
    heads: Heads = 8,
    slots: Slots = 4,
    head_dim: HeadDim = 64,
    dtype: Dtype = AssetDtype("nf4"),
    orders: Orders = "1,2,3",
    max_tokens: Annotated[Optional[int], typer.Option("--max-tokens", min=1, help="Stop after this many tokens.")] = None,
    json_out: JsonOut = None,
    plot_out: PlotOut = None,
) -> None:
    """Replay a corpus's token stream through page-local, independent-heads and flat layouts of equal size;
    report storage reads per token uncached and with an LRU page cache of each size."""
    from polymem import HashSpec, Layout, MemoryAsset, TokenHashes
    from polymem.corpus import Corpus
    from polymem.analysis.iosim import plot, simulate
    from polymem.tokenizers import load_tokenizer
    from polymem._io import check_output_paths

    check_output_paths(json_out, plot_out)

    sizes = [parse_count(x, "--cache-mb") for x in cache_mb.split(",") if x.strip()]
    if asset:
        a = MemoryAsset.open(asset)
        base, spec, dt, ords = a.layout, a.spec, a.dtype, a.orders
    else:
        base = Layout.for_params(parse_count(params), heads=heads, slots=slots, head_dim=head_dim)
        spec, dt, ords = HashSpec(), dtype.value, parse_orders(orders)
    if not sizes:
        raise PolymemError(f"--cache-mb {cache_mb!r} names no cache size; pass e.g. 64,256,1024")
    tok = load_tokenizer(tokenizer)
    cache = TokenHashes.build(tok, spec)
    corpus = Corpus(paths)

    def streams() -> Iterator[np.ndarray]:
        for doc in corpus:
            yield tok.encode(doc.text)

    t0 = time.perf_counter()
    sim = simulate(streams(), cache, base, orders=ords, dtype=dt, cache_bytes=[m << 20 for m in sizes],
                   max_tokens=max_tokens)
    secs = time.perf_counter() - t0
    r0 = sim.results[0]
    t = Table(
        title=escape(
            f"storage reads per token — {tok.name}, {r0.tokens:,} tokens, {base.params / 1e6:,.1f}M params "
            f"(P={base.pages:,} K={base.heads} S={base.slots} r={base.head_dim}), {dt}, orders "
            f"{','.join(map(str, sim.orders))}, table {sim.table_bytes / 2**20:,.1f} MiB, "
            f"{sim.block_bytes} B blocks ({sim.pages_per_block} page(s) each)"
        ),
        title_justify="left",
    )
    t.add_column("layout")
    t.add_column("uncached", justify="right")
    for m in sizes:
        t.add_column(f"{m:,} MiB", justify="right")
    for r in sim.results:
        t.add_row(r.kind, f"{r.uncached_per_token:.3f}", *(f"{v:.3f}" for v in r.per_token()))
    console.print(t)
    by = {r.kind: r for r in sim.results}
    if "page-local" in by and "independent-heads" in by and sizes:
        ratios = [
            (i / p if p else float("inf"))
            for p, i in zip(by["page-local"].per_token(), by["independent-heads"].per_token())
        ]
        console.print("independent-heads / page-local reads: " + ", ".join(f"{x:.1f}×" for x in ratios)
                      + f"   ({secs:.1f} s)", highlight=False)
    if corpus.skipped:
        console.print(f"[yellow]skipped {len(corpus.skipped)} document(s)[/] (first: {escape(str(corpus.skipped[0]))})")
    if json_out:
        doc = sim.to_dict() | {"tokenizer": {"name": tok.name, "fingerprint": tok.fingerprint},
                               "corpus": [str(p) for p in paths]}
        atomic_write_json(json_out, doc)
        console.print(f"wrote {escape(str(json_out))}", soft_wrap=True)
    if plot_out:
        plot(sim, str(plot_out))
        console.print(f"wrote {escape(str(plot_out))}", soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("iosim")(iosim)
