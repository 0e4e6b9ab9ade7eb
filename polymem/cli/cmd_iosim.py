"""``polymem iosim``: page reads per token of a corpus through equal-parameter layouts (Table 6 of the PageGram report)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Iterator, Optional

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from polymem.cli._display import escape
from polymem.cli._needs import check_needs
from polymem.cli.cmd_engines import Engine
from polymem.cli._options import AssetDtype, Dtype, HeadDim, Heads, JsonOut, Orders, Params, PlotOut, Slots, Tokenizer, parse_count, parse_orders, sample_corpus
from polymem._io import atomic_write_json
from polymem.errors import PolymemError

if TYPE_CHECKING:
    from polymem.analysis.iosim_engines import EngineIoSimulation

console = Console()


def iosim(
    paths: Annotated[list[str], typer.Argument(parser=sample_corpus, help="Corpus: text files, directories, .jsonl(.gz) files, - for stdin, or sample:pydocs (shipped).")],
    cache_mb: Annotated[str, typer.Option("--cache-mb", help="LRU page-cache sizes in MiB, comma-separated, e.g. 64,256,1024.")],
    tokenizer: Tokenizer = None,  # type: ignore[assignment]  # --engine brings its own
    asset: Annotated[Optional[str], typer.Option("--asset", help="Take layout, dtype, orders and hash spec from this asset.")] = None,
    engine: Annotated[Optional[Engine], typer.Option("--engine", help="Replay an engine's released table (its tokenizer, addressing and layouts on disk) against a page-local table of the same bytes; --slots sets the page-local S. Without -t: DeepSeek-V4's tokenizer, or Qwen3.5's for qwen3.8-ple (the closest available offline). docs/iosim.md.")] = None,
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
    check_needs("iosim", locals())
    if engine is not None:
        return _engine_iosim(engine.value, paths, tokenizer, cache_mb, asset=asset, slots=slots,
                             max_tokens=max_tokens, json_out=json_out, plot_out=plot_out)
    if tokenizer is None:
        raise typer.BadParameter("pass a tokenizer (or --engine NAME, which brings its own)", param_hint="--tokenizer")

    from polymem import HashSpec, Layout, MemoryAsset, TokenHashes
    from polymem.corpus import Corpus
    from polymem.analysis.iosim import plot, simulate
    from polymem.tokenizers import load_tokenizer
    from polymem._io import check_outputs_not_inputs

    check_outputs_not_inputs({"--json": json_out, "--plot": plot_out},
                             [("corpus", p) for p in paths] + [("tokenizer", tokenizer), ("asset", asset)])

    sizes = _cache_sizes(cache_mb)
    if asset:
        a = MemoryAsset.open(asset)
        base, spec, dt, ords = a.layout, a.spec, a.dtype, a.orders
    else:
        base = Layout.for_params(parse_count(params), heads=heads, slots=slots, head_dim=head_dim)
        spec, dt, ords = HashSpec(), dtype.value, parse_orders(orders)
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
    if r0.tokens == 0:
        first = f"; first skipped: {corpus.skipped[0].source!r}: {corpus.skipped[0].reason}" if corpus.skipped else ""
        raise PolymemError(f"no tokens to replay: the corpus {', '.join(repr(str(p)) for p in paths)} gave no text "
                           f"({len(corpus.skipped)} document(s) skipped{first}); pass files with text")
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
    _print_ratios({r.kind: r for r in sim.results}, sizes)
    console.print(f"simulated in {secs:.1f} s", highlight=False)
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


def _engine_iosim(name: str, paths: list[str], tokenizer: Optional[str], cache_mb: str, *, asset: Optional[str],
                  slots: int, max_tokens: Optional[int], json_out: Optional[Path], plot_out: Optional[Path]) -> None:
    """``iosim --engine NAME``: the engine's released layouts against a page-local table of the same bytes."""
    from polymem import TokenHashes
    from polymem.analysis.iosim_engines import OFFLINE_TOKENIZERS, engine_replay, simulate_engine
    from polymem.corpus import Corpus
    from polymem._io import check_outputs_not_inputs

    for flag, value in (("--asset", asset), ("--plot", plot_out)):
        if value:
            raise typer.BadParameter("not with --engine (the engine fixes the table; --json keeps the figures)",
                                     param_hint=flag)
    check_outputs_not_inputs({"--json": json_out}, [("corpus", p) for p in paths] + [("tokenizer", tokenizer)])
    sizes = _cache_sizes(cache_mb)
    a, tok = engine_replay(name, tokenizer)
    note = OFFLINE_TOKENIZERS[name][1] if tokenizer is None else None
    if note:
        console.print(f"tokenizer: {tok.name}, {note}", highlight=False)
    corpus = Corpus(paths)
    t0 = time.perf_counter()
    sim = simulate_engine((tok.encode(doc.text) for doc in corpus), a, TokenHashes.build(tok), slots=slots,
                          cache_bytes=[m << 20 for m in sizes], max_tokens=max_tokens)
    r0 = sim.results[0]
    if r0.tokens == 0:
        raise PolymemError(f"no tokens to replay: the corpus {', '.join(repr(str(p)) for p in paths)} gave no text; "
                           "pass files with text")
    _print_engine_table(sim, f"4 KiB page reads per token — {name} (layers {', '.join(map(str, a.layer_ids))}), "
                             f"{r0.tokens:,} tokens of {tok.name}, page-local K={a.heads} S={slots}", sizes)
    console.print(f"simulated in {time.perf_counter() - t0:.1f} s", highlight=False)
    if json_out:
        about = {"name": tok.name, "fingerprint": tok.fingerprint} | ({"note": note} if note else {})
        atomic_write_json(json_out, sim.to_dict() | {"tokenizer": about, "corpus": [str(p) for p in paths]})
        console.print(f"wrote {escape(str(json_out))}", soft_wrap=True)


def _print_engine_table(sim: "EngineIoSimulation", title: str, sizes: list[int]) -> None:
    """Rows: the engine's layouts and page-local; columns: table GiB, rows and reads per token; then each
    engine layout ÷ page-local, per column."""
    t = Table(title=escape(title), title_justify="left")
    for col in ("layout", "table GiB", "rows / token", "uncached", *(f"{m:,} MiB" for m in sizes)):
        t.add_column(col, justify="left" if col == "layout" else "right")
    for r in sim.results:
        t.add_row(r.kind, f"{r.table_bytes / 2**30:,.2f}", f"{r.rows / r.tokens:.1f}", f"{r.uncached_per_token:.2f}",
                  *(f"{v:.2f}" for v in r.per_token()))
    console.print(t)
    local = sim.results[-1]
    where = ["uncached", *(f"with {m:,} MiB" for m in sizes)]
    for r in sim.results[:-1]:
        ratios = [x / y if y else float("inf") for x, y in zip([r.uncached_per_token, *r.per_token()],
                                                               [local.uncached_per_token, *local.per_token()])]
        console.print(f"page reads per token, {r.kind} ÷ page-local: "
                      + ", ".join(f"{x:.1f}× {w}" for x, w in zip(ratios, where)), highlight=False)


def _print_ratios(by: dict, sizes: list[int]) -> None:
    """Engram-style independent heads against page-local, per column of the table, and a verdict line:

        storage reads per token, independent-heads ÷ page-local: 8.0× uncached, 9.2× with 64 MiB, ...
        verdict: page-local reads 8.6–9.4× fewer pages than independent-heads with a page cache
    """
    if "page-local" not in by or "independent-heads" not in by:
        return
    p, i = by["page-local"], by["independent-heads"]
    cached = [a / b if b else float("inf") for b, a in zip(p.per_token(), i.per_token())]
    cols = [("uncached", i.uncached_per_token / p.uncached_per_token if p.uncached_per_token else float("inf"))]
    cols += [(f"with {m:,} MiB", x) for m, x in zip(sizes, cached)]
    console.print("storage reads per token, independent-heads ÷ page-local: "
                  + ", ".join(f"{x:.1f}× {where}" for where, x in cols), highlight=False)
    lo, hi = min(x for _, x in cols[1:] or cols), max(x for _, x in cols[1:] or cols)
    span = f"{lo:.1f}×" if f"{lo:.1f}" == f"{hi:.1f}" else f"{lo:.1f}–{hi:.1f}×"
    what = "with a page cache" if sizes else "uncached"
    console.print(f"verdict: page-local reads {span} fewer pages than independent-heads {what}" if lo >= 1 else
                  f"verdict: independent-heads reads fewer pages here ({span} of page-local's {what})", highlight=False)


MAX_CACHE_MB = 1 << 30  # 1 PiB: far above any table; a larger number is a typo (1e30)


def _cache_sizes(text: str) -> list[int]:
    """--cache-mb '64,256,1024' -> [64, 256, 1024], each a count in 1..MAX_CACHE_MB."""
    sizes = [parse_count(x, "--cache-mb") for x in text.split(",") if x.strip()]
    if not sizes:
        raise PolymemError(f"--cache-mb {text!r} names no cache size; pass e.g. 64,256,1024")
    too_big = [s for s in sizes if s > MAX_CACHE_MB]
    if too_big:
        raise PolymemError(f"--cache-mb {text!r}: {too_big[0]:.3g} MiB is more than {MAX_CACHE_MB:,} MiB (1 PiB); "
                           "a cache as large as the table already holds all of it: pass e.g. 64,256,1024")
    return sizes


def register(app: typer.Typer) -> None:
    app.command("iosim")(iosim)
