"""``polymem transfer``: attach a frozen donor table to recipient models with another tokenizer, against controls."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from polymem.cli._options import (
    BatchSize, BlockSize, Bf16, CorpusFiles, Device, DModel, JsonOut, Lr, MaxEvalTokens, NHead, NLayer, PlotOut,
    Steps, TableLrMult, Threads, ValueInit,
)

console = Console()


def transfer(
    asset: Annotated[str, typer.Option("--asset", "-a", help="Donor asset (from `polymem train`), a path or URL.")],
    tokenizer: Annotated[str, typer.Option("--tokenizer", "-t", help="Recipient tokenizer spec (another family than the donor's).")],
    corpus: CorpusFiles,
    seeds: Annotated[int, typer.Option(min=1, help="Number of seeds (0..seeds-1); each seed fixes init and data order for all arms.")] = 2,
    steps: Steps = 400,
    batch_size: BatchSize = 8,
    block_size: BlockSize = 256,
    n_layer: NLayer = 4,
    d_model: DModel = 256,
    n_head: NHead = 4,
    max_n: Annotated[Optional[int], typer.Option("--max-n", min=1, max=32, help="Recipient orders 1..N (default: the donor's).")] = None,
    lr: Lr = 2e-3,
    table_lr_mult: TableLrMult = 70.0,
    value_init: Annotated[ValueInit, typer.Option(help="Recipient W_V init for the frozen tables: zero (step 0 = no memory) or orthogonal (PageGram's gain).")] = ValueInit("zero"),
    scratch: Annotated[bool, typer.Option(help="Also run a table trained from scratch with the recipient tokenizer.")] = False,
    max_eval_tokens: MaxEvalTokens = None,
    bf16: Bf16 = True,
    jobs: Annotated[int, typer.Option(min=1, help="Worker processes (one seed each); 2 suits a 2-core CPU with --threads 1.")] = 1,
    threads: Threads = None,
    device: Device = "auto",
    json_out: JsonOut = None,
    plot: PlotOut = None,
) -> None:
    """Train recipients (no memory / frozen random table / frozen donor table [/ scratch table]) with identical
    backbone, init, data order and steps; report held-out bits per byte per arm and seed."""
    import numpy as np
    import torch

    from polymem.torch.train import TrainConfig
    from polymem.torch.transfer import plot_transfer, run_transfer_jobs, write_json

    if threads:
        torch.set_num_threads(threads)
    cfg = TrainConfig(steps=steps, batch_size=batch_size, block_size=block_size, n_layer=n_layer, n_head=n_head,
                      d_model=d_model, lr=lr, table_lr_mult=table_lr_mult, bf16=bf16, device=device)
    n_arms = 3 + int(scratch)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=console) as prog:
        task = prog.add_task("transfer", total=n_arms * seeds * steps, info="")
        state = {"done": 0, "run": ""}

        def on_event(kind: str, **k) -> None:
            if kind == "phase":
                prog.update(task, description=escape(k["name"]))
            elif kind == "run":
                state["run"] = f"{k['arm']} seed {k['seed']}"
                prog.update(task, description=escape(state["run"]) if jobs == 1 else "recipients")
            elif kind == "step":
                state["done"] += 1
                prog.update(task, completed=state["done"], info=f"loss {k['loss']:.3f}")
                if not console.is_terminal and (k["step"] + 1) % max(1, steps // 5) == 0:  # a log line under nohup
                    console.print(f"  {k['arm']} seed {k['seed']} step {k['step'] + 1}/{steps} loss {k['loss']:.3f} "
                                  f"({prog.tasks[0].elapsed or 0:.0f} s)")
            elif kind == "result":
                prog.console.print(f"  {k['arm']:<17} seed {k['seed']}: {k['bpb']:.4f} bits/byte")

        result = run_transfer_jobs(asset, tokenizer, corpus, cfg=cfg, seeds=list(range(seeds)), max_n=max_n,
                                   scratch=scratch, max_eval_tokens=max_eval_tokens, on_event=on_event, jobs=jobs,
                                   value_init=value_init.value,
                                   threads=threads)
    t = Table(title=escape(f"held-out bits/byte: {result['donor']['tokenizer']} donor -> {result['recipient']['tokenizer']} recipient"),
              title_justify="left")
    t.add_column("arm")
    for s in result["seeds"]:
        t.add_column(f"seed {s}", justify="right")
    t.add_column("mean", justify="right")
    for arm, v in result["arms"].items():
        t.add_row(arm, *[f"{x:.4f}" for x in v["bpb"]], f"{np.mean(v['bpb']):.4f}")
    console.print(t)
    m = result["margins"]
    console.print(f"random − donor: {', '.join(f'{x:+.4f}' for x in m['random_minus_donor'])}   "
                  f"none − donor: {', '.join(f'{x:+.4f}' for x in m['none_minus_donor'])}   "
                  f"target (donor beats both on every seed): {'[green]met[/]' if result['target_met'] else '[red]not met[/]'}")
    cov = result["coverage"].get("trained_hashes")
    if cov:
        console.print("coverage of recipient held-out n-grams by donor-trained hashes: "
                      + ", ".join(f"n={n} {v:.0%}" for n, v in cov["per_n"].items()))
    if json_out:
        console.print(f"wrote {escape(str(write_json(result, json_out)))}", soft_wrap=True)
    if plot:
        console.print(f"wrote {escape(str(plot_transfer(result, plot)))}", soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("transfer")(transfer)
