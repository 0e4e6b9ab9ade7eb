"""The ``polymem`` typer app. Command groups live in ``polymem/cli/cmd_*.py``; each defines
``register(app: typer.Typer) -> None`` and is registered here in name order."""

from __future__ import annotations

import importlib
import pkgutil
import sys

import typer

import polymem.cli as _cli_pkg
from polymem.errors import PolymemError

app = typer.Typer(
    name="polymem",
    help="Tokenizer-agnostic hashed n-gram memory tables, addressed by the bytes of an n-gram.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help text is plain: a docstring with [brackets] must not break `polymem --help`
)

for _m in sorted(m.name for m in pkgutil.iter_modules(_cli_pkg.__path__) if m.name.startswith("cmd_")):
    importlib.import_module(f"polymem.cli.{_m}").register(app)


def main() -> None:
    """Console entry point: library errors become one red line on stderr and exit code 2."""
    try:
        app()
    except PolymemError as e:
        from rich.console import Console
        from rich.markup import escape

        Console(stderr=True).print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
