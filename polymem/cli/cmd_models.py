"""``polymem models`` (builtin model names and the model cache, with sizes) and ``polymem models clear``."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from polymem.cli._display import escape
from polymem.cli._needs import check_needs

console = Console()
models_app = typer.Typer(help="Pretrained models by name, and what polymem caches for them on disk.",
                         no_args_is_help=False)


def _size(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB" if n < 2**30 else f"{n / 2**30:,.2f} GiB"


@models_app.callback(invoke_without_command=True)
def list_models(ctx: typer.Context) -> None:
    """List the builtin model names (and whether their package is installed) and every model cache entry with its
    size: assembled GGUFs, converted tokenizers, de-quantised weights."""
    check_needs("models", locals())

    if ctx.invoked_subcommand is not None:
        return
    import importlib.util

    from polymem.models.cache import list_entries, models_dir
    from polymem.models.registry import BUILTIN_MODELS

    t = Table(title="builtin model names (also: a .gguf file, a checkpoint folder, hf:ORG/NAME)", title_justify="left")
    for col in ("name", "what", "package"):
        t.add_column(col)
    for m in BUILTIN_MODELS.values():
        there = importlib.util.find_spec(m.module) is not None
        t.add_row(m.name, escape(m.description), "installed" if there else f"missing: {escape(m.install)}")
    console.print(t)
    found = list_entries()
    where = escape(str(models_dir()))
    if not found:
        console.print(f"the model cache {where} is empty: the first load of a model fills it", highlight=False)
        return
    t = Table(title=f"model cache {where} ({_size(sum(e.bytes for e in found))} in {len(found)} entries)",
              title_justify="left")
    for col, just in (("kind", "left"), ("key", "left"), ("source", "left"), ("size", "right"), ("detail", "left")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for e in found:
        t.add_row(e.kind, escape(e.key[:20] + "…" if len(e.key) > 21 else e.key), escape(e.source), _size(e.bytes),
                  escape(e.detail))
    console.print(t)


@models_app.command("clear")
def clear_cmd(
    entries: Annotated[Optional[list[str]], typer.Argument(help="Entries to remove: a key (or its first 8+ characters) or a source file name. None: every weights and tokenizers entry and every leftover.")] = None,
    include_gguf: Annotated[bool, typer.Option("--all", help="Also remove the assembled GGUF files (rebuilt from their packages on next use).")] = False,
) -> None:
    """Remove model cache entries (each is rebuilt from its source on the next load)."""
    check_needs("models clear", locals())

    from polymem.models.cache import clear, models_dir

    gone = clear(entries or None, include_gguf=include_gguf)
    freed = sum(e.bytes for e in gone)
    console.print(f"removed {len(gone)} entr{'y' if len(gone) == 1 else 'ies'} ({_size(freed)}) from "
                  f"{escape(str(models_dir()))}", highlight=False)


def register(app: typer.Typer) -> None:
    app.add_typer(models_app, name="models")
