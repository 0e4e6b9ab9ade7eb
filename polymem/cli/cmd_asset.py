"""``polymem init``, ``polymem inspect``, ``polymem verify``, ``polymem quantize``: memory assets on disk."""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from polymem.cli._display import escape
from polymem._paths import is_url
from polymem.cli._needs import check_needs
from polymem.cli._options import (
    StorageOptionsOpt,
    parse_storage_options,
    AssetDtype, Dtype, HeadDim, Heads, LayoutKind, Normalizer, NormalizerOpt, Orders, Params, Slots,
    local_path, parse_count, parse_orders,
)

console = Console()
err_console = Console(stderr=True)

def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n} B"


def init(
    asset: Annotated[str, typer.Argument(help="Directory to create (a zarr v3 group), or a URL such as "
                                         "s3://bucket/t.pmem.")],
    params: Params = "200M",
    heads: Heads = 8,
    slots: Slots = 4,
    head_dim: HeadDim = 64,
    dtype: Dtype = AssetDtype("float32"),
    kind: Annotated[LayoutKind, typer.Option("--kind", help="Layout: page-local (default) or a baseline.")] = LayoutKind("page-local"),
    orders: Orders = "1,2,3",
    normalizer: NormalizerOpt = Normalizer("none"),
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing asset at ASSET.")] = False,
    storage_options: StorageOptionsOpt = None,
) -> None:
    """Create an all-zero memory asset sized from a parameter budget."""
    check_needs("init", locals())

    from polymem import HashSpec, Layout, MemoryAsset, __version__
    from polymem._io import check_output_path

    layout = Layout.for_params(parse_count(params), heads=heads, slots=slots, head_dim=head_dim, kind=kind.value)
    options = parse_storage_options(storage_options)
    if not is_url(asset, remote=True):
        asset = str(check_output_path(asset.removeprefix("file://"), directory=True))
    prov = {"created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "created_by": f"polymem {__version__}"}
    a = MemoryAsset.create(asset, HashSpec(normalizer=normalizer.value), layout, dtype=dtype.value,
                           orders=parse_orders(orders), provenance=prov, overwrite=overwrite, storage_options=options)
    g = a.geometry
    console.print(
        f"created [bold]{escape(asset)}[/]: {layout.kind}, P={layout.pages:,} pages × K={layout.heads} × S={layout.slots} "
        f"rows of r={layout.head_dim} = {layout.params:,} parameters, {a.dtype}, "
        f"{g.num_shards} shard(s), {_human(g.num_chunks * g.chunk_bytes)} of pages", highlight=False,
    )


def _info_rows(a: Any) -> list[tuple[str, str]]:
    L, g = a.layout, a.geometry
    rows = [
        ("format", f"{a.header['format']} v{a.header['version']}"),
        ("hash spec", f"{a.spec.spec_id} (byte-poly64 v{a.spec.version}, normalizer {a.spec.normalizer}, base 0x{a.spec.base:016x})"
         if not a.tokenizer_bound else
         f"{a.spec.spec_id} TOKENIZER-BOUND token-id XOR ({a.spec.origin}) of {a.spec.tokenizer['name']} "
         f"(fingerprint {a.spec.tokenizer['fingerprint'][:16]}…), orders {list(a.spec.orders)}, {a.spec.heads} heads/order"),
        ("layout", f"{L.kind}: P={L.pages:,} pages, K={L.heads} heads, S={L.slots} slots, r={L.head_dim}"),
        ("orders", ", ".join(map(str, a.orders)) + " (joint address space)"),
        ("parameters", f"{L.params:,} ({L.num_rows:,} rows)"),
        ("dtype", f"{a.dtype} (stored as {g.data_type})"),
        ("page", f"{g.page_bytes:,} B; {g.pages_per_chunk} page(s) per {g.chunk_bytes:,} B chunk"),
        ("shards", f"{g.num_shards} × up to {g.chunks_per_shard:,} chunks; pages total {_human(g.num_chunks * g.chunk_bytes)}"),
    ]
    rc = a.header.get("row_counts")
    if rc:
        rows.append(("row counts", f"{rc['total']:,} updates over {rc['rows_nonzero']:,} rows"))
    if a.sparse:
        rows.append(("sparse subset", f"{a.header['sparse']['pages_kept']:,} of {L.pages:,} pages stored"))
    return rows


def inspect(
    asset: Annotated[str, typer.Argument(help="Asset directory or fsspec URL.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the header and counts as JSON.")] = False,
    scan: Annotated[bool, typer.Option("--scan/--no-scan", help="Count non-zero pages (reads the whole table).")] = True,
    storage_options: StorageOptionsOpt = None,
) -> None:
    """Show an asset's hash spec, layout, sizes, provenance and how many pages are non-zero."""
    check_needs("inspect", locals())

    from polymem import MemoryAsset

    a = MemoryAsset.open(asset, storage_options=parse_storage_options(storage_options))
    nz = a.nonzero_pages() if scan else None
    if as_json:
        h = a.header
        h["hash_spec"] = {k: v for k, v in h["hash_spec"].items() if k != "byte_table"} | {"spec_id": a.spec.spec_id}
        print(json.dumps({"path": a.path, "header": h, "nonzero_pages": nz}, indent=2))
        return
    t = Table(title=f"memory asset {escape(str(asset))}", show_header=False, title_justify="left")
    for k, v in _info_rows(a):
        t.add_row(k, escape(v))
    if nz is not None:
        t.add_row("pages non-zero", f"{nz:,} of {a.layout.pages:,} ({100 * nz / a.layout.pages:.2f}%)")
    prov = a.provenance
    t.add_row("provenance", "\n".join(escape(f"{k}: {json.dumps(v)}") for k, v in prov.items()) or "(none)")
    console.print(t)


def verify(
    asset: Annotated[str, typer.Argument(help="Asset directory or fsspec URL.")],
    repair: Annotated[bool, typer.Option("--repair", help="First roll back an interrupted page write and remove stale temporary files (local assets).")] = False,
    storage_options: StorageOptionsOpt = None,
) -> None:
    """Check every checksum and the storage geometry. Exit 1 naming the bad shard or field (for a URL without an
    asset, the orphan objects of an interrupted write)."""
    check_needs("verify", locals())

    from polymem import MemoryAsset
    from polymem.errors import FormatError

    options = parse_storage_options(storage_options)
    if repair:
        done = MemoryAsset.repair(asset)
        for line in done:
            console.print(f"[yellow]repaired[/] {escape(line)}", highlight=False, soft_wrap=True)
        if not done:
            console.print("nothing to repair", highlight=False)
    try:
        a = MemoryAsset.open(asset, storage_options=options)
        problems = a.problems()
    except FormatError as e:
        problems = [str(e)]
    if problems:
        for p in problems:
            err_console.print(f"[bold red]FAIL[/] {escape(p)}", highlight=False, soft_wrap=True)
        raise typer.Exit(1)
    g = a.geometry
    crc = " (and their per-page crc32c)" if a.version >= 2 else f" (format version {a.version}: `polymem upgrade` adds per-page checksums)"
    console.print(f"[green]OK[/] {escape(str(asset))}: attributes, array metadata and {g.num_shards} shard(s) match their sha256{crc}", highlight=False, soft_wrap=True)
    for note in a.notes():
        console.print(f"[yellow]note[/] {escape(note)}", highlight=False, soft_wrap=True)


def quantize(
    asset: Annotated[str, typer.Argument(help="Source asset.")],
    output: Annotated[Optional[str], typer.Option("--output", "-o", help="Where to write the converted asset (a "
                                                  "directory or a URL such as s3://bucket/t-nf4.pmem); required.")]
    = None,
    to: Annotated[AssetDtype, typer.Option("--to", help="Target storage type.")] = AssetDtype("nf4"),
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing asset at OUTPUT.")] = False,
    storage_options: StorageOptionsOpt = None,
    check_model: Annotated[Optional[str], typer.Option("--check-model", help="Score the model with its site over the table and over the quantized copy; refuse the copy if it loses more than --max-loss (needs polymem[models]).")] = None,
    check_corpus: Annotated[Optional[list[Path]], typer.Option("--check-corpus", parser=local_path("a local corpus file or folder", exists=True), help="Held-out documents for --check-model; repeatable.")] = None,
    check_site: Annotated[Optional[Path], typer.Option("--check-site", parser=local_path("a local site folder", exists=True), help="The site that reads this table (default: ASSET.site, as `polymem train --model` writes it).")] = None,
    check_docs: Annotated[int, typer.Option("--check-docs", min=1, help="Documents scored at most.")] = 8,
    max_loss: Annotated[Optional[float], typer.Option("--max-loss", min=0, help="Largest accepted bits-per-byte change, in percent (default: nf4 0.5, fp8 0.2, bf16/fp16 0.1).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Write the copy even if it loses more than --max-loss.")] = False,
) -> None:
    """Convert an asset to another storage type (nf4: 4-bit codes + fp16 scale per head row); report the error per
    row, and with --check-model what the copy costs the model in held-out bits per byte."""
    check_needs("quantize", locals())
    from polymem.errors import PolymemError

    if output is None:
        raise PolymemError(f"quantize needs --output/-o, where to write the {to.value} copy: e.g. `polymem quantize "
                           f"{asset} --to {to.value} -o {Path(asset).stem}-{to.value}.pmem`")

    from polymem import MemoryAsset

    from polymem._io import check_outputs_not_inputs

    options = parse_storage_options(storage_options)
    # with --check-model, the site it reads (ASSET.site by default) and the corpus are inputs too
    site_read = (check_site or Path(f"{asset}.site")) if check_model is not None else None
    check_outputs_not_inputs({"--output": output}, [("asset", asset), ("site", site_read), ("model", check_model)]
                             + [("corpus", c) for c in check_corpus or []])
    src = MemoryAsset.open(asset, storage_options=options)
    if check_model is None and (check_corpus or check_site or max_loss is not None or force):
        raise PolymemError("--check-corpus, --check-site, --max-loss and --force go with --check-model MODEL")
    if check_model is not None:
        out, err = _checked_quantize(src, asset, output, to.value, overwrite, check_model, check_corpus or [],
                                     check_site, check_docs, max_loss, force)
    else:
        out, err = src.quantize(output, to=to.value, overwrite=overwrite, storage_options=options)
    t = Table(title=f"{escape(str(asset))} ({src.dtype}) -> {escape(str(output))} ({out.dtype})", title_justify="left")
    t.add_column("per-row reconstruction error")
    t.add_column("mean", justify="right")
    t.add_column("max", justify="right")
    t.add_row("RMS of (x - x̂)", f"{err.rms_mean:.3g}", f"{err.rms_max:.3g}")
    t.add_row("relative to the row's RMS", f"{err.rel_mean:.3g}", f"{err.rel_max:.3g}")
    console.print(t)
    g0, g1 = src.geometry, out.geometry
    console.print(
        f"{err.rows:,} rows; pages {_human(g0.num_chunks * g0.chunk_bytes)} -> {_human(g1.num_chunks * g1.chunk_bytes)}",
        highlight=False,
    )


def _checked_quantize(src, asset: str, output: str, to: str, overwrite: bool, model: str, corpus: list[Path],
                      site: Path | None, docs: int, max_loss: float | None, force: bool):
    """Quantize into a build folder beside OUTPUT, score the model with its site over both tables, and install the
    copy only if it loses at most ``max_loss`` percent (or ``force``); nothing is written otherwise."""
    from polymem import MemoryAsset
    from polymem.asset import _commit
    from polymem.errors import PolymemError
    from polymem.models import load_model
    from polymem.models.quality import MAX_LOSS, quantization_loss
    from polymem.recipes.data import read_named_documents

    if is_url(output) or is_url(asset):
        raise PolymemError("--check-model works on local assets; quantize and check locally, then copy the result")
    if not corpus:
        raise PolymemError("--check-model needs --check-corpus: held-out text the table's model was not trained on")
    site = site if site is not None else Path(f"{asset}.site")
    if not (site / "site.json").is_file():
        raise PolymemError(f"no site at {str(site)!r} (site.json); pass --check-site, the site trained with this table")
    limit = MAX_LOSS[to] if max_loss is None else max_loss / 100
    texts = [t for _, t in read_named_documents(corpus)][:docs]
    dest = Path(output)
    if dest.exists() and not overwrite:
        raise PolymemError(f"{str(dest)!r} already exists; pass --overwrite or pick another path")
    console.print(f"loading {escape(model)} …", highlight=False)
    lm = load_model(model)
    console.print(escape(lm.load_line()), highlight=False)
    with _commit.building(dest, "check") as tmp:
        out, err = src.quantize(tmp / "asset", to=to)
        q = quantization_loss(lm, site, src, out, texts)
        verdict = "within" if q["loss"] <= limit else "beyond"
        console.print(f"{escape(model)} with {escape(str(site))}, {q['documents']} documents ({q['bytes']:,} bytes): "
                      f"{q['bpb_reference']:.4f} bits per byte over {src.dtype}, {q['bpb_quantized']:.4f} over {to} "
                      f"({100 * q['loss']:+.3f} %, {verdict} the {100 * limit:.2f} % limit)", highlight=False, soft_wrap=True)
        if q["loss"] > limit and not force:
            raise PolymemError(f"the {to} copy loses {100 * q['loss']:+.3f} % bits per byte, more than --max-loss "
                               f"{100 * limit:.2f} %; nothing was written. Keep the {src.dtype} table, try another "
                               "--to, or pass --force to write it anyway")
        out.close()
        _commit.install(tmp / "asset", dest, overwrite=overwrite, lock_timeout=None)
    return MemoryAsset.open(dest), err


def upgrade(
    asset: Annotated[Path, typer.Argument(parser=local_path("a local asset directory (upgrade rewrites it in "
                                                            "place)"), help="Local asset directory of an older format "
                                                                            "version.")],
) -> None:
    """Rewrite an older-format asset in place as the current format (checks every shard first; atomic)."""
    check_needs("upgrade", locals())

    from polymem import MemoryAsset

    before = MemoryAsset.open(asset)
    v0 = before.version
    before.close()
    a = MemoryAsset.upgrade(asset)
    if v0 == a.version:
        console.print(f"{escape(str(asset))}: already format version {a.version}; nothing to do", highlight=False)
    else:
        console.print(f"upgraded {escape(str(asset))}: format version {v0} -> {a.version} (a crc32c per page)", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("init")(init)
    app.command("inspect")(inspect)
    app.command("verify")(verify)
    app.command("quantize")(quantize)
    app.command("upgrade")(upgrade)
