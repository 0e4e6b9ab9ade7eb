"""``polymem pull URL DIR``: stage a remote asset, site or bundle locally, every checksum verified before it is used."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from polymem.cli._display import escape
from polymem.cli._needs import check_needs
from polymem.cli._options import StorageOptionsOpt, local_path, parse_storage_options

console = Console()


def pull(
    url: Annotated[str, typer.Argument(help="An asset, a site or a bundle (polymem bundle / push): an fsspec URL (s3://…, gs://…, https://…, memory://…, hf://…) or a directory.")],
    directory: Annotated[Path, typer.Argument(parser=local_path("a local directory (pull copies the asset to this "
                                                                "machine)"),
                                              help="Local directory to create (renamed into place once verified).")],
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing asset at DIR.")] = False,
    workers: Annotated[int, typer.Option("--workers", min=1, max=64, help="Files copied in parallel.")] = 4,
    storage_options: StorageOptionsOpt = None,
) -> None:
    """Copy an asset, a site or a bundle to local disk: every file's sha256 is checked while it streams (an
    asset's against its header, a site's against the manifest `polymem push` wrote), the copy is validated, and
    only then renamed to DIR (on any failure DIR is untouched and the partial copy removed)."""
    check_needs("pull", locals())

    from polymem._io import check_outputs_not_inputs
    from polymem.ops.pull import pull as _pull

    check_outputs_not_inputs({"DIR": directory}, [("asset", url)])
    so = parse_storage_options(storage_options)
    if _holds_site(url, so):
        from polymem.torch.bundle import pull_site

        out = pull_site(url, directory, storage_options=so, overwrite=overwrite)
        n = [p for p in out.rglob("*") if p.is_file()]
        console.print(f"[green]OK[/] {escape(url)} -> {escape(str(out))}: a site, {len(n)} files, "
                      f"{sum(p.stat().st_size for p in n) / 2**20:.1f} MiB, each matching its sha256",
                      highlight=False, soft_wrap=True)
        return

    total = [0, 0]

    def progress(key: str, nbytes: int) -> None:
        total[0] += 1
        total[1] += nbytes

    a = _pull(url, directory, overwrite=overwrite, workers=workers, progress=progress, storage_options=so)
    console.print(
        f"[green]OK[/] {escape(url)} -> {escape(str(directory))}: {total[0]} files, {total[1] / 2**20:.1f} MiB, "
        f"{a.geometry.num_shards} shard(s) match their sha256",
        highlight=False, soft_wrap=True,
    )


def _holds_site(url: str, storage_options: dict) -> bool:
    """Does ``url`` hold a site or bundle (a site.json at its top) rather than an asset?"""
    from polymem._paths import is_url

    if not is_url(url):
        return (Path(url) / "site.json").is_file()
    import fsspec

    fs, root = fsspec.core.url_to_fs(url, **storage_options)
    return bool(fs.exists(f"{root.rstrip('/')}/site.json"))


def register(app: typer.Typer) -> None:
    app.command("pull")(pull)
