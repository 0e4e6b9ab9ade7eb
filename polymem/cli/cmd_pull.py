"""``polymem pull URL DIR``: stage a remote asset locally, every checksum verified before it is used."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from polymem.cli._display import escape
from polymem.cli._needs import check_needs
from polymem.cli._options import local_path

console = Console()


def pull(
    url: Annotated[str, typer.Argument(help="The asset: an fsspec URL (s3://…, gs://…, https://…, memory://…) or a directory.")],
    directory: Annotated[Path, typer.Argument(parser=local_path("a local directory (pull copies the asset to this "
                                                                "machine)"),
                                              help="Local directory to create (renamed into place once verified).")],
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing asset at DIR.")] = False,
    workers: Annotated[int, typer.Option("--workers", min=1, max=64, help="Files copied in parallel.")] = 4,
) -> None:
    """Copy an asset to local disk: every shard's sha256 is checked while it streams, the copy is validated,
    and only then renamed to DIR (on any failure DIR is untouched and the partial copy removed)."""
    check_needs("pull", locals())

    from polymem._io import check_outputs_not_inputs
    from polymem.ops.pull import pull as _pull

    check_outputs_not_inputs({"DIR": directory}, [("asset", url)])

    total = [0, 0]

    def progress(key: str, nbytes: int) -> None:
        total[0] += 1
        total[1] += nbytes

    a = _pull(url, directory, overwrite=overwrite, workers=workers, progress=progress)
    console.print(
        f"[green]OK[/] {escape(url)} -> {escape(str(directory))}: {total[0]} files, {total[1] / 2**20:.1f} MiB, "
        f"{a.geometry.num_shards} shard(s) match their sha256",
        highlight=False, soft_wrap=True,
    )


def register(app: typer.Typer) -> None:
    app.command("pull")(pull)
