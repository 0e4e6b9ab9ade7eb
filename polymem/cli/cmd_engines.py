"""``polymem import`` / ``polymem export``: the released engines' n-gram tables in and out of assets."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console

from polymem.cli._display import escape
from polymem.cli._needs import check_needs
from polymem.cli._options import Choice, _choices, local_path

console = Console()
if TYPE_CHECKING:  # members made from data are invisible to mypy: see polymem.cli._options.Choice
    Engine = Choice
else:
    Engine = _choices("Engine", ("deepseek-v4.1", "qwen3.8-ple"))  # = polymem.engines.ENGINES


_IMPORT_LOCAL = "(import reads and writes local files only; copy to or from a bucket with its own tools)"
_EXPORT_LOCAL = "(export writes local files only, from a local or remote asset; copy them to a bucket with its tools)"


def import_(
    source: Annotated[Path, typer.Argument(
        parser=local_path(f"a local checkpoint directory or file {_IMPORT_LOCAL}", exists=True),
        help="The checkpoint: a directory (with model.safetensors.index.json, or *.safetensors) or one .safetensors "
             "file; for DeepSeek also ds4's GGUF (a .gguf file, or a directory of them).")],
    output: Annotated[Path, typer.Option(
        "--output", "-o", parser=local_path(f"a local asset directory {_IMPORT_LOCAL}"),
        help="The asset directory to write (local).")],
    engine: Annotated[Engine, typer.Option("--engine", help="Whose table it is.")],
    tokenizer: Annotated[Optional[Path], typer.Option(
        "--tokenizer", parser=local_path(f"a local tokenizer.json {_IMPORT_LOCAL}", exists=True, file=True),
        help="The engine's tokenizer.json (DeepSeek: default DeepSeek-V4's, offline; Qwen: read for the EOS id; "
             "with --spec: checked against the spec's token ids).")] = None,
    eos_id: Annotated[Optional[int], typer.Option("--eos-id", min=0, help="Qwen: the end-of-text id.")] = None,
    spec: Annotated[Optional[Path], typer.Option(
        "--spec", parser=local_path(f"a local addressing spec file {_IMPORT_LOCAL}", exists=True, file=True),
        help="An addressing spec (JSON of EngineAddressing.to_json()) instead of the engine's published one.")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing asset at OUTPUT.")] = False,
) -> None:
    """Import an engine's table (DeepSeek-V4.1 Engram FP8 rows from safetensors or ds4's GGUF, Qwen3.8 PLE BF16
    or FP8 shards) as one asset that records the engine's addressing; streamed, with bounded memory."""
    check_needs("import", locals())
    from polymem._io import check_outputs_not_inputs
    from polymem.engines import EngineAddressing, addressing
    from polymem.engines._files import read_json
    from polymem.engines._tokenizer import check_vocabulary
    from polymem.engines.io import import_table

    # before anything is read or replaced: --overwrite must never delete a checkpoint, spec or tokenizer
    check_outputs_not_inputs({"--output": output}, [("source", source), ("spec", spec), ("tokenizer", tokenizer)])
    if spec is not None:
        a = EngineAddressing.from_json(read_json(spec, "addressing spec (--spec)"))
        if a.name != engine.value:
            raise typer.BadParameter(f"--spec is for engine {a.name!r}, not {engine.value!r}", param_hint="--spec")
        if eos_id is not None and eos_id != a.boundary_id:
            raise typer.BadParameter(f"--eos-id {eos_id} is not the spec's end-of-text id {a.boundary_id}; pass one "
                                     "of --eos-id and --spec, or a spec with that id", param_hint="--eos-id")
        if tokenizer is not None:  # read only to check it: the spec holds the addressing
            check_vocabulary(a, tokenizer)
    else:
        a = addressing(engine.value, tokenizer=tokenizer, **({"eos_id": eos_id} if eos_id is not None else {}))
    asset = import_table(source, output, addressing=a, overwrite=overwrite)
    g, fmt = asset.geometry, asset.provenance["engine_source"]["format"]
    console.print(f"[green]OK[/] {escape(str(source))} ({fmt}) -> {escape(str(output))}: {a.name}, layers "
                  f"{list(a.layer_ids)}, {asset.layout.num_rows:,} rows of {asset.layout.head_dim} ({asset.dtype}), "
                  f"{g.num_shards} shard(s)", highlight=False, soft_wrap=True)


def export(
    asset: Annotated[str, typer.Argument(help="An asset written by `polymem import`: a directory or an fsspec URL "
                                              "(read remotely).")],
    output: Annotated[Path, typer.Option("--output", "-o", parser=local_path(f"a local directory {_EXPORT_LOCAL}"),
                                         help="The directory to write the tensors into (local).")],
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing OUTPUT directory.")] = False,
) -> None:
    """Write an imported engine table back to the files it came from (safetensors, or ds4's GGUF), byte for byte
    (the table's tensors only, in the files, order and metadata they came from)."""
    check_needs("export", locals())
    from polymem._io import check_outputs_not_inputs
    from polymem.engines.io import export_table

    check_outputs_not_inputs({"--output": output}, [("asset", asset)])
    files = export_table(asset, output, overwrite=overwrite)
    console.print(f"[green]OK[/] {escape(str(asset))} -> {escape(str(output))}: {len(files)} file(s)",
                  highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("import")(import_)
    app.command("export")(export)
