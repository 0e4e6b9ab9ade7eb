"""``polymem convert``, ``polymem subset``, ``polymem merge``: assets as portable artifacts (polymem/ops/).

``polymem convert`` takes two kinds of source and picks the library entry here: an imported engine table goes to
:func:`polymem.engines.convert.convert_engine`, a tokenizer-bound table to :func:`polymem.ops.convert`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from polymem._io import atomic_write_json, check_outputs_not_inputs
from polymem.cli._display import escape
from polymem.cli._needs import check_needs
from polymem.cli._options import corpus_source, local_path, tokenizer_spec
from polymem.errors import PolymemError

console = Console()
err_console = Console(stderr=True)
_local_asset, _local_file = local_path("a local asset directory"), local_path("a local file")


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
        atomic_write_json(path, obj, indent=1)


def convert(
    src: Annotated[str, typer.Argument(help="Tokenizer-bound table: a `polymem train --hash xor` asset/table file, an Engram safetensors table (docs/asset-format.md §10), or an engine table from `polymem import` (docs/engines.md).")],
    corpus: Annotated[list[Path], typer.Option("--corpus", "-c", parser=corpus_source, help="Text to replay (files/folders, .txt/.md/.jsonl[.gz]); repeatable.")],
    output: Annotated[Path, typer.Option("--output", "-o", parser=_local_asset, help="Byte-addressed asset to write.")],
    tokenizer: Annotated[Optional[str], typer.Option("--tokenizer", "-t", parser=tokenizer_spec, help="The source's tokenizer (its fingerprint must match); optional for a DeepSeek engine table (DeepSeek-V4's, offline).")] = None,
    layer: Annotated[Optional[int], typer.Option("--layer", help="Engine tables: the engine's layer to convert (default: the first).")] = None,
    pages: Annotated[Optional[int], typer.Option(min=1, help="Target pages P (default: about the source's row count).")] = None,
    slots: Annotated[int, typer.Option(min=1, help="Target slots S per head per page.")] = 4,
    kind: Annotated[str, typer.Option(help="Target layout kind: page-local, flat, independent-heads.")] = "page-local",
    dtype: Annotated[str, typer.Option(help="Target dtype: float32, float16, bfloat16, nf4.")] = "float32",
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing OUTPUT.")] = False,
    json_out: Annotated[Optional[Path], typer.Option("--json", parser=_local_file, help="Write the report as JSON here.")] = None,
) -> None:
    """Re-address a tokenizer-bound (token-id) table by bytes: replay a corpus, average the source rows each byte n-gram reads."""
    check_needs("convert", locals())

    from polymem.engines.convert import as_engine_table, convert_engine
    from polymem.hash.layout import Layout
    from polymem.ops.convert import convert as run
    from polymem.ops.engram import convert_source

    check_outputs_not_inputs({"--output": output, "--json": json_out},
                             [("asset", src), ("tokenizer", tokenizer)] + [("corpus", c) for c in corpus])
    try:
        engine = as_engine_table(src)
        if engine is None and layer is not None:
            raise PolymemError(f"--layer {layer} picks a layer of an engine table (`polymem import`); this source is "
                               "not one, and has one table: drop --layer")
        layout = None
        src_arg: Any = src if engine is None else engine
        if pages is not None:
            if engine is not None:
                heads, head_dim = engine.spec.addressing.heads, engine.layout.head_dim
            else:
                src_arg, heads, head_dim = convert_source(src)
            layout = Layout(pages=pages, heads=heads, slots=slots, head_dim=head_dim, kind=kind)
        rep: Any
        with _Bar() as bar:
            if engine is not None:
                rep = convert_engine(engine, corpus, output, tokenizer=tokenizer, layer=layer, layout=layout,
                                     dtype=dtype, overwrite=overwrite, progress=bar)
            else:
                rep = run(src_arg, tokenizer, corpus, output, layout=layout, dtype=dtype, overwrite=overwrite,
                          progress=bar)
    except PolymemError as e:
        _fail(e)
    t = Table(title=escape(f"{src} -> {output}"), show_header=False, title_justify="left")
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
    output: Annotated[Path, typer.Option("--output", "-o", parser=_local_asset, help="Sparse asset to write.")],
    tokenizer: Annotated[Optional[str], typer.Option("--tokenizer", "-t", parser=tokenizer_spec, help="Tokenizer that reads the corpus.")] = None,
    corpus: Annotated[Optional[list[Path]], typer.Option("--corpus", "-c", parser=corpus_source, help="Keep the pages this text's n-grams touch; repeatable.")] = None,
    min_count: Annotated[Optional[int], typer.Option("--min-count", min=0, help="Keep pages with a row updated at least C times (needs row counts).")] = None,
    heldout: Annotated[Optional[list[Path]], typer.Option("--heldout", parser=corpus_source, help="Report the share of lookups served on this text too.")] = None,
    keep_counts: Annotated[bool, typer.Option("--keep-counts", help="Carry the row counts (a full-size array).")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing OUTPUT.")] = False,
    json_out: Annotated[Optional[Path], typer.Option("--json", parser=_local_file, help="Write the report as JSON here.")] = None,
) -> None:
    """Keep only the pages a corpus touches (and/or with well-trained rows); absent pages are not stored (read as zeros)."""
    check_needs("subset", locals())

    from polymem.ops.subset import subset as run

    check_outputs_not_inputs({"--output": output, "--json": json_out}, [("asset", asset), ("tokenizer", tokenizer)]
                             + [("corpus", c) for c in [*(corpus or []), *(heldout or [])]])
    try:
        with _Bar() as bar:
            rep = run(asset, output, tokenizer=tokenizer, corpus=corpus, min_count=min_count, heldout=heldout,
                      overwrite=overwrite, keep_counts=keep_counts, progress=bar)
    except PolymemError as e:
        _fail(e)
    t = Table(title=escape(f"{asset} -> {output} (sparse)"), show_header=False, title_justify="left")
    t.add_row("pages kept", f"{rep.pages_kept:,} of {rep.pages_total:,} ({100 * rep.pages_kept / rep.pages_total:.2f}%); touched {rep.pages_touched:,}")
    t.add_row("bytes on disk", f"{_human(rep.bytes_subset)} (full asset {_human(rep.bytes_full)}, {rep.bytes_subset / max(rep.bytes_full, 1):.4f}×)")
    for name, d in rep.lookups.items():
        t.add_row(f"lookups served ({name})", f"{d['share_served']:.4f} of {d['lookups']:,}; non-zero lookups kept {d['share_nonzero_served']:.4f}")
    console.print(t)
    _write_json(json_out, rep.to_dict())


def merge(
    assets: Annotated[list[str], typer.Argument(help="Assets with the same hash spec and layout (2 or more).")],
    output: Annotated[Path, typer.Option("--output", "-o", parser=_local_asset, help="Merged asset to write.")],
    how: Annotated[str, typer.Option("--how", help="count-weighted (by row update counts), mean (of non-zero rows), first (first non-zero row).")] = "count-weighted",
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing OUTPUT.")] = False,
    json_out: Annotated[Optional[Path], typer.Option("--json", parser=_local_file, help="Write the report as JSON here.")] = None,
) -> None:
    """Combine donors of one hash spec and layout into one table, rows weighted by their update counts."""
    check_needs("merge", locals())

    from polymem.ops.merge import merge as run

    check_outputs_not_inputs({"--output": output, "--json": json_out}, [("asset", a) for a in assets])
    try:
        with _Bar() as bar:
            rep = run(assets, output, how=how, overwrite=overwrite, progress=bar)
    except PolymemError as e:
        _fail(e)
    console.print(f"merged {len(rep.inputs)} assets ({rep.how}) -> {escape(rep.path)}: {rep.rows_nonzero:,} non-zero rows; "
                  f"non-zero rows per input {rep.rows_from}; {rep.seconds:.1f} s", highlight=False)
    _write_json(json_out, rep.to_dict())


def register(app: typer.Typer) -> None:
    app.command("convert")(convert)
    app.command("subset")(subset)
    app.command("merge")(merge)
