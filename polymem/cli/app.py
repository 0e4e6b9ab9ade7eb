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
    """Console entry point: library errors (bad input, unwritable outputs) become one red line on stderr and
    exit code 2; any other OSError (a disk that fails mid-run, a file removed under us) one line and exit 1."""
    try:
        app()
    except PolymemError as e:
        _error_line(str(e))
        sys.exit(2)
    except OSError as e:
        where = f": {e.filename!r}" if getattr(e, "filename", None) else ""
        _error_line(f"{e.strerror or str(e) or 'I/O error'}{where} ({type(e).__name__})")
        sys.exit(1)


def _error_line(text: str) -> None:
    from rich.console import Console
    from rich.markup import escape

    Console(stderr=True).print(f"[bold red]error:[/] {escape(text)}", highlight=False, soft_wrap=True)


if __name__ == "__main__":
    main()
