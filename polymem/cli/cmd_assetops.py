"""``polymem convert``, ``polymem subset``, ``polymem merge``: assets as portable artifacts (polymem/asset/ops.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from polymem.errors import PolymemError

console = Console()
err_console = Console(stderr=True)


def _fail(e: Exception) -> None:
    err_console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


class _Bar:
    def __init__(self) -> None:
        self.p = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          console=err_console, transient=True)
        self.tasks: dict[str, Any] = {}

    def __call__(self, phase: str, done: int, total: int) -> None:
        if phase not in self.tasks:
            self.tasks[phase] = self.p.add_task(phase, total=max(total, 1))
        self.p.update(self.tasks[phase], completed=done, total=max(total, 1))

    def __enter__(self) -> "_Bar":
        self.p.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.p.__exit__(*exc)


def _write_json(path: Optional[Path], obj: dict[str, Any]) -> None:
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(obj, indent=1) + "\n")


def convert(
    src: Annotated[str, typer.Argument(help="Tokenizer-bound table: a `polymem train --hash xor` asset/table file, or an Engram safetensors table (docs/asset-format.md §10).")],
    tokenizer: Annotated[str, typer.Option("--tokenizer", "-t", help="The source's tokenizer (its fingerprint must match).")],
    corpus: Annotated[list[Path], typer.Option("--corpus", "-c", exists=True, help="Text to replay (files/folders, .txt/.md/.jsonl[.gz]); repeatable.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Byte-addressed asset to write.")],
    pages: Annotated[Optional[int], typer.Option(min=1, help="Target pages P (default: about the source's row count).")] = None,
    slots: Annotated[int, typer.Option(min=1, help="Target slots S per head per page.")] = 4,
    kind: Annotated[str, typer.Option(help="Target layout kind: page-local, flat, independent-heads.")] = "page-local",
    dtype: Annotated[str, typer.Option(help="Target dtype: float32, float16, bfloat16, nf4.")] = "float32",
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing OUTPUT.")] = False,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Write the report as JSON here.")] = None,
) -> None:
    """Re-address a tokenizer-bound (token-id) table by bytes: replay a corpus, average the source rows each byte n-gram reads."""
    from polymem.asset.ops import convert as run, open_id_table
    from polymem.hash.layout import Layout

    try:
        layout = None
        if pages is not None:
            idt = open_id_table(src)
            layout = Layout(pages=pages, heads=idt.spec.heads, slots=slots, head_dim=idt.table.shape[1], kind=kind)
            src_arg: Any = idt
        else:
            src_arg = src
        with _Bar() as bar:
            rep = run(src_arg, tokenizer, corpus, output, layout=layout, dtype=dtype, overwrite=overwrite, progress=bar)
    except PolymemError as e:
        _fail(e)
    t = Table(title=f"{src} -> {output}", show_header=False, title_justify="left")
    t.add_row("documents / tokens", f"{rep.documents:,} / {rep.tokens:,}")
    t.add_row("n-gram occurrences (orders " + ",".join(map(str, rep.orders)) + ")", f"{rep.occurrences:,}")
    t.add_row("share of n-gram occurrences carried", f"{rep.share_carried:.4f} ({rep.share_carried_nonzero:.4f} from non-zero source rows)")
    t.add_row("rows written", f"{rep.rows_written:,} of {rep.target_rows:,} ({rep.rows_nonzero:,} non-zero)")
    t.add_row("target layout", f"{rep.layout['kind']} P={rep.layout['pages']:,} K={rep.layout['heads']} S={rep.layout['slots']} r={rep.layout['head_dim']}")
    t.add_row("seconds", f"{rep.seconds:.1f}")
    console.print(t)
    _write_json(json_out, rep.to_dict())


def subset(
    asset: Annotated[str, typer.Argument(help="Source asset.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Sparse asset to write.")],
    tokenizer: Annotated[Optional[str], typer.Option("--tokenizer", "-t", help="Tokenizer that reads the corpus.")] = None,
    corpus: Annotated[Optional[list[Path]], typer.Option("--corpus", "-c", exists=True, help="Keep the pages this text's n-grams touch; repeatable.")] = None,
    min_count: Annotated[Optional[int], typer.Option("--min-count", min=0, help="Keep pages with a row updated at least C times (needs row counts).")] = None,
    heldout: Annotated[Optional[list[Path]], typer.Option("--heldout", exists=True, help="Report the share of lookups served on this text too.")] = None,
    keep_counts: Annotated[bool, typer.Option("--keep-counts", help="Carry the row counts (a full-size array).")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing OUTPUT.")] = False,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Write the report as JSON here.")] = None,
) -> None:
    """Keep only the pages a corpus touches (and/or with well-trained rows); absent pages are not stored (read as zeros)."""
    from polymem.asset.ops import subset as run

    try:
        with _Bar() as bar:
            rep = run(asset, output, tokenizer=tokenizer, corpus=corpus, min_count=min_count, heldout=heldout,
                      overwrite=overwrite, keep_counts=keep_counts, progress=bar)
    except PolymemError as e:
        _fail(e)
    t = Table(title=f"{asset} -> {output} (sparse)", show_header=False, title_justify="left")
    t.add_row("pages kept", f"{rep.pages_kept:,} of {rep.pages_total:,} ({100 * rep.pages_kept / rep.pages_total:.2f}%); touched {rep.pages_touched:,}")
    t.add_row("bytes on disk", f"{_human(rep.bytes_subset)} (full asset {_human(rep.bytes_full)}, {rep.bytes_subset / max(rep.bytes_full, 1):.4f}×)")
    for name, d in rep.lookups.items():
        t.add_row(f"lookups served ({name})", f"{d['share_served']:.4f} of {d['lookups']:,}; non-zero lookups kept {d['share_nonzero_served']:.4f}")
    console.print(t)
    _write_json(json_out, rep.to_dict())


def merge(
    assets: Annotated[list[str], typer.Argument(help="Assets with the same hash spec and layout (2 or more).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Merged asset to write.")],
    how: Annotated[str, typer.Option("--how", help="count-weighted (by row update counts), mean (of non-zero rows), first (first non-zero row).")] = "count-weighted",
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing OUTPUT.")] = False,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Write the report as JSON here.")] = None,
) -> None:
    """Combine donors of one hash spec and layout into one table, rows weighted by their update counts."""
    from polymem.asset.ops import merge as run

    try:
        with _Bar() as bar:
            rep = run(assets, output, how=how, overwrite=overwrite, progress=bar)
    except PolymemError as e:
        _fail(e)
    console.print(f"merged {len(rep.inputs)} assets ({rep.how}) -> {rep.path}: {rep.rows_nonzero:,} non-zero rows; "
                  f"non-zero rows per input {rep.rows_from}; {rep.seconds:.1f} s", highlight=False)
    _write_json(json_out, rep.to_dict())


def register(app: typer.Typer) -> None:
    app.command("convert")(convert)
    app.command("subset")(subset)
    app.command("merge")(merge)
