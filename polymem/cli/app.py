"""The ``polymem`` typer app. Command groups live in ``polymem/cli/cmd_*.py``; each defines
``register(app: typer.Typer) -> None`` and is registered here in name order."""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
from typing import Annotated

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

def _print_version(value: bool) -> None:
    if value:
        from polymem import __version__

        print(f"polymem {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                                help="Print polymem's version and exit.")] = False) -> None:
    """Tokenizer-agnostic hashed n-gram memory tables, addressed by the bytes of an n-gram."""


LOG_COLUMNS = 160  # line width of tables and messages written to a file or a pipe (a terminal: its own)

for _m in sorted(m.name for m in pkgutil.iter_modules(_cli_pkg.__path__) if m.name.startswith("cmd_")):
    importlib.import_module(f"polymem.cli.{_m}").register(app)


def main() -> None:
    """Console entry point: library errors (bad input, unwritable outputs) become one red line on stderr and
    exit code 2; any other OSError (a disk that fails mid-run, a file removed under us) one line and exit 1."""
    if not sys.stdout.isatty() and "COLUMNS" not in os.environ:
        os.environ["COLUMNS"] = str(LOG_COLUMNS)  # rich reads it at each print; its default off a terminal is 80
    try:
        app()
    except PolymemError as e:
        _error_line(str(e))
        sys.exit(2)
    except (MemoryError, RuntimeError) as e:
        if not isinstance(e, MemoryError) and "can't allocate memory" not in str(e):
            raise
        first = (str(e).splitlines() or [type(e).__name__])[0][:200]
        _error_line(f"out of memory ({first}); pass a smaller --params or --batch-size, or train across processes "
                    "(torchrun --nproc-per-node N -m polymem train …: each holds 1/N of the table's rows)")
        sys.exit(2)
    except OSError as e:
        where = f": {e.filename!r}" if getattr(e, "filename", None) else ""
        _error_line(f"{e.strerror or str(e) or 'I/O error'}{where} ({type(e).__name__})")
        sys.exit(1)
    except Exception as e:  # noqa: BLE001 - only an object store's credential errors are turned into a line
        if type(e).__name__ not in _CREDENTIAL_ERRORS:
            raise
        _error_line(f"the object store refused the request: {e} ({type(e).__name__}); set credentials (e.g. "
                    "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or AWS_PROFILE), pass them with --storage-options, "
                    "or use anonymous access ('{\"anon\": true}') for a public bucket")
        sys.exit(2)


_CREDENTIAL_ERRORS = {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError",
                      "DefaultCredentialsError", "ClientAuthenticationError"}


def _error_line(text: str) -> None:
    from rich.console import Console
    from polymem.cli._display import escape_lines

    Console(stderr=True).print(f"[bold red]error:[/] {escape_lines(text)}", highlight=False, soft_wrap=True)


if __name__ == "__main__":
    main()
