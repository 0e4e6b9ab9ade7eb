"""``polymem import`` / ``polymem export``: the released engines' n-gram tables in and out of assets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console

from polymem.cli._display import escape
from polymem.cli._needs import check_needs
from polymem.cli._options import Choice, _choices

console = Console()
if TYPE_CHECKING:  # members made from data are invisible to mypy: see polymem.cli._options.Choice
    Engine = Choice
else:
    Engine = _choices("Engine", ("deepseek-v4.1", "qwen3.8-ple"))  # = polymem.engines.ENGINES


def import_(
    source: Annotated[Path, typer.Argument(exists=True, help="The checkpoint: a directory (with model.safetensors"
                                           ".index.json, or *.safetensors) or one .safetensors file; for DeepSeek "
                                           "also ds4's GGUF (a .gguf file, or a directory of them).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="The asset directory to write.")],
    engine: Annotated[Engine, typer.Option("--engine", help="Whose table it is.")],
    tokenizer: Annotated[Optional[str], typer.Option(
        "--tokenizer", help="The engine's tokenizer.json (DeepSeek: default DeepSeek-V4's, offline; Qwen: read for "
        "the EOS id).")] = None,
    eos_id: Annotated[Optional[int], typer.Option("--eos-id", min=0, help="Qwen: the end-of-text id.")] = None,
    spec: Annotated[Optional[Path], typer.Option("--spec", exists=True, dir_okay=False, help="An addressing spec "
                                                 "(JSON of EngineAddressing.to_json()) instead of the engine's "
                                                 "published one.")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing asset at OUTPUT.")] = False,
) -> None:
    """Import an engine's table (DeepSeek-V4.1 Engram FP8 rows from safetensors or ds4's GGUF, Qwen3.8 PLE BF16
    or FP8 shards) as one asset that records the engine's addressing; streamed, with bounded memory."""
    check_needs("import", locals())
    from polymem._io import check_outputs_not_inputs
    from polymem.engines import EngineAddressing, addressing
    from polymem.engines.io import import_table

    check_outputs_not_inputs({"--output": output}, [("source", source)])
    if spec is not None:
        a = EngineAddressing.from_json(json.loads(spec.read_text()))
    else:
        a = addressing(engine.value, tokenizer=tokenizer, **({"eos_id": eos_id} if eos_id is not None else {}))
    if a.name != engine.value:
        raise typer.BadParameter(f"--spec is for engine {a.name!r}, not {engine.value!r}", param_hint="--spec")
    asset = import_table(source, output, addressing=a, overwrite=overwrite)
    g, fmt = asset.geometry, asset.provenance["engine_source"]["format"]
    console.print(f"[green]OK[/] {escape(str(source))} ({fmt}) -> {escape(str(output))}: {a.name}, layers "
                  f"{list(a.layer_ids)}, {asset.layout.num_rows:,} rows of {asset.layout.head_dim} ({asset.dtype}), "
                  f"{g.num_shards} shard(s)", highlight=False, soft_wrap=True)


def export(
    asset: Annotated[Path, typer.Argument(exists=True, file_okay=False, help="An asset written by `polymem import`.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="The directory to write the tensors into.")],
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
