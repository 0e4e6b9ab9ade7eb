"""``polymem bundle SITE -o FOLDER`` and ``polymem push FOLDER URL``: a site with its table and a README card in one
folder, and that folder copied to any fsspec URL (``polymem pull URL DIR`` brings it back)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from polymem.cli._display import escape
from polymem.cli._needs import check_needs
from polymem.cli._options import StorageOptionsOpt, local_path, parse_storage_options

console = Console()


def bundle(
    site: Annotated[Path, typer.Argument(parser=local_path("a local site folder", exists=True), help="A site folder (from `polymem train --model`, `polymem attach` or handle.save).")],
    out: Annotated[Path, typer.Option("--out", "-o", parser=local_path("a local folder"), help="The bundle folder to create: the site, its table (table.pmem) and README.md.")],
    asset: Annotated[Optional[str], typer.Option("--asset", help="The table the site reads (default: the one it names: its recorded path, or a table inside or beside it).")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing bundle folder.")] = False,
) -> None:
    """Make one folder of a site, its table (copied, every shard's sha256 checked) and a README card naming the
    model, the tokenizer's fingerprint, the corpus and the scores: it moves, pushes and pulls as one piece."""
    check_needs("bundle", locals())
    from polymem._io import check_outputs_not_inputs
    from polymem.torch.bundle import bundle_site

    check_outputs_not_inputs({"--out": out}, [("site", site), ("asset", asset)])
    done = bundle_site(site, out, table=asset, overwrite=overwrite)
    files = [p for p in done.rglob("*") if p.is_file()]
    table = next((p.name for p in sorted(done.iterdir()) if p.name.startswith("table.")), "the table in site.safetensors")
    console.print(f"[green]OK[/] wrote {escape(str(done))}: {len(files)} files, "
                  f"{sum(p.stat().st_size for p in files) / 2**20:.1f} MiB (site.json, site.safetensors, {table}, "
                  "README.md)", highlight=False, soft_wrap=True)


def push(
    folder: Annotated[Path, typer.Argument(parser=local_path("a local site or bundle folder", exists=True), help="A bundle (polymem bundle) or site folder.")],
    url: Annotated[str, typer.Argument(help="Where it goes: any fsspec URL (s3://…, gs://…, memory://…, file://…, hf://datasets/ORG/NAME/… with huggingface_hub).")],
    storage_options: StorageOptionsOpt = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace a site already at URL.")] = False,
) -> None:
    """Copy a site or bundle folder to an fsspec URL with a manifest of its files' sha256; each file is read back
    and compared. `polymem pull URL DIR` copies it back, checked against the manifest."""
    check_needs("push", locals())
    from polymem.torch.bundle import push as _push

    n = _push(folder, url, storage_options=parse_storage_options(storage_options), overwrite=overwrite)
    console.print(f"[green]OK[/] {escape(str(folder))} -> {escape(url)}: {n} files, each read back and matching its sha256",
                  highlight=False, soft_wrap=True)
    if not _carries_table(folder):
        console.print(f"note: {escape(str(folder))} does not hold its table: whoever pulls it needs that table too "
                      f"(--asset); `polymem bundle {escape(str(folder))} -o FOLDER` makes one folder that does",
                      highlight=False, soft_wrap=True)


def _carries_table(folder: Path) -> bool:
    """Does the site folder hold its table (trained into site.safetensors, or a bundle's table.pmem)?"""
    import json

    from polymem.torch.sitefile import BUNDLED_TABLES

    try:
        table = json.loads((folder / "site.json").read_text(encoding="utf-8")).get("table") or {}
    except (OSError, ValueError, AttributeError):
        return False
    return bool(table.get("saved")) or any((folder / n).exists() for n in BUNDLED_TABLES)


def register(app: typer.Typer) -> None:
    app.command("bundle")(bundle)
    app.command("push")(push)
