"""``polymem train``: train a small causal LM with a memory site from scratch and write its table as an asset."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from polymem._io import atomic_write_json
from polymem.cli._options import (
    BatchSize, BlockSize, Bf16, CorpusFiles, Device, DModel, Gate, HeadDim, Heads, JsonOut, Lr, MaxEvalTokens, MaxN,
    NHead, NLayer, Precision, PrecisionOpt, Slots, Steps, TableLrMult, Threads, Tokenizer, parse_count,
)

console = Console()


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                    TimeElapsedColumn(), TimeRemainingColumn(), console=console)


def train(
    tokenizer: Tokenizer,
    corpus: CorpusFiles,
    out: Annotated[Path, typer.Option("--out", "-o", help="Asset to write (a zarr folder; NAME.safetensors for a single-file table).")],
    steps: Steps = 620,
    batch_size: BatchSize = 8,
    block_size: BlockSize = 256,
    n_layer: NLayer = 4,
    d_model: DModel = 256,
    n_head: NHead = 4,
    layers: Annotated[str, typer.Option(help="Blocks that get a memory site before them, comma-separated.")] = "1",
    max_n: MaxN = 3,
    params: Annotated[str, typer.Option("--params", help="Table size in scalars (rows × head dim): 12M, 1.5G, 12000000 …")] = "12M",
    heads: Heads = 8,
    slots: Slots = 4,
    head_dim: HeadDim = 32,
    gate: Annotated[Gate, typer.Option(help="scalar (PageGram, init 0.5) or context (Engram).")] = Gate("scalar"),
    conv: Annotated[bool, typer.Option(help="Engram's causal depthwise conv after the gate.")] = False,
    lr: Lr = 2e-3,
    table_lr_mult: TableLrMult = 70.0,
    seed: Annotated[int, typer.Option(help="Model init and data order.")] = 0,
    heldout_every: Annotated[int, typer.Option(min=2, help="Every k-th document is held out (never trained on).")] = 10,
    max_eval_tokens: MaxEvalTokens = None,
    precision: PrecisionOpt = Precision("auto"),
    bf16: Bf16 = None,
    threads: Threads = None,
    device: Device = "auto",
    hash_kind: Annotated[str, typer.Option("--hash", help="bytes (tokenizer-agnostic byte hash) or xor (Engram's token-id XOR hash: a tokenizer-bound table, re-addressable with `polymem convert`).")] = "bytes",
    overwrite: Annotated[bool, typer.Option(help="Replace an existing --out.")] = False,
    json_out: JsonOut = None,
) -> None:
    """Train a small causal LM with memory site(s) from scratch and write the table as an asset with provenance."""
    import torch

    from polymem.errors import PolymemError
    from polymem.cli._precision import precision_option, say_precision
    from polymem.torch.train import MemoryConfig, TrainConfig, train_donor
    from polymem._io import check_output_path, check_output_paths

    check_output_path(out, directory=out.suffix != ".safetensors")
    check_output_paths(json_out)
    if threads:
        torch.set_num_threads(threads)
    if hash_kind not in ("bytes", "xor"):
        console.print(f"[red]--hash {hash_kind!r} is unknown; accepted: bytes, xor[/]", highlight=False)
        raise typer.Exit(2)
    try:
        layer_ids = tuple(int(x) for x in layers.split(",") if x.strip())
    except ValueError:
        raise PolymemError(f"--layers {layers!r} must be comma-separated block indices, e.g. 1 or 1,3") from None
    cfg = TrainConfig(steps=steps, batch_size=batch_size, block_size=block_size, n_layer=n_layer, n_head=n_head,
                      d_model=d_model, lr=lr, table_lr_mult=table_lr_mult, seed=seed,
                      precision=precision_option(precision.value, bf16), device=device)
    mem = MemoryConfig(layers=layer_ids, max_n=max_n, params=parse_count(params), heads=heads, slots=slots,
                       head_dim=head_dim, gate=gate.value, conv=conv)
    say_precision(cfg)
    with _progress() as prog:
        task = prog.add_task("train", total=steps, info="")

        every = max(1, steps // 20)

        def on_step(i: int, loss: float) -> None:
            prog.update(task, completed=i + 1, info=f"loss {loss:.3f}")
            if not console.is_terminal and ((i + 1) % every == 0 or i + 1 == steps):  # a log line under nohup
                console.print(f"step {i + 1}/{steps} loss {loss:.3f} ({prog.tasks[0].elapsed or 0:.0f} s)")

        summary = train_donor(tokenizer, corpus, out, cfg=cfg, mem=mem, heldout_every=heldout_every,
                              max_eval_tokens=max_eval_tokens, overwrite=overwrite, on_step=on_step,
                              on_phase=lambda s: prog.update(task, description=escape(s)), hash=hash_kind)
    t = Table(title=f"donor table {escape(str(summary['path']))}", show_header=False, title_justify="left")
    for k in ("tokenizer", "train_tokens_available", "heldout_tokens", "rows", "rows_touched", "final_loss",
              "heldout_bpb", "heldout_bpb_memory_off", "tokens_per_s", "precision", "elapsed_s"):
        v = summary[k]
        t.add_row(k, f"{v:.4f}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else escape(str(v)))
    console.print(t)
    if json_out:
        atomic_write_json(json_out, summary, indent=1)


def register(app: typer.Typer) -> None:
    app.command("train")(train)
