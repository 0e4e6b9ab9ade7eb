"""``polymem tokenizers`` (list builtin names) and ``polymem tokenizers check SPEC --text FILE``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from polymem.cli._display import escape
from polymem.cli._needs import check_needs
from polymem.cli._options import local_path, tokenizer_spec

console = Console()
tokenizers_app = typer.Typer(help="Tokenizers polymem can load, and their byte fidelity.", no_args_is_help=False)


@tokenizers_app.callback(invoke_without_command=True)
def list_tokenizers(ctx: typer.Context) -> None:
    """List the builtin tokenizer names (paths and hf:NAME are accepted too)."""
    check_needs("tokenizers", locals())

    if ctx.invoked_subcommand is not None:
        return
    from polymem.tokenizers import known_tokenizers

    from polymem.models.registry import known_models

    t = Table(title="builtin tokenizer names (also: paths to tokenizer.json / .model / .tiktoken, hf:ORG/NAME)")
    t.add_column("name")
    t.add_column("what")
    for name, desc in known_tokenizers():
        t.add_row(escape(name), escape(desc))
    for name, desc in known_models():
        t.add_row(escape(name), escape(f"the tokenizer of {desc} (needs polymem[models] and the model's package)"))
    console.print(t)


@tokenizers_app.command("check")
def check(
    spec: Annotated[str, typer.Argument(parser=tokenizer_spec, help="Tokenizer spec (a builtin model's name too).")],
    text: Annotated[Path, typer.Option("--text", parser=local_path("a local text file", exists=True, file=True), help="UTF-8 text file to tokenize.")],
) -> None:
    """Byte fidelity: do the token bytes concatenate back to the text? Exit 1 if not."""
    check_needs("tokenizers check", locals())

    from polymem.errors import PolymemError
    from polymem.tokenizers import check_fidelity, load_tokenizer

    tok = load_tokenizer(spec)
    try:
        from polymem._io import read_bounded
        from polymem.sources import MAX_DOCUMENT_BYTES

        body = read_bounded(text, what="--text file", max_bytes=MAX_DOCUMENT_BYTES, error=PolymemError,
                            fix="pass a UTF-8 text file").decode("utf-8")
    except UnicodeDecodeError as e:
        raise PolymemError(f"{str(text)!r} is not UTF-8 text ({e}); convert it, e.g. `iconv -t UTF-8`") from None
    rep = check_fidelity(tok, [body])
    n = len(tok.encode(body))
    if rep.faithful:
        how = "exactly" if rep.exact else "after the SentencePiece dummy-prefix space"
        console.print(f"[green]faithful[/]: {escape(tok.name)} gives back the {len(body.encode()):,} bytes {how} ({n:,} tokens)")
        return
    console.print(f"[red]lossy[/]: {escape(tok.name)} does not give back the text: {escape(str(rep.first_mismatch))}")
    if tok.lossy:
        console.print("this tokenizer is known to be lossy (e.g. WordPiece): its n-gram hashes will not match other tokenizers'")
    raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.add_typer(tokenizers_app, name="tokenizers")
