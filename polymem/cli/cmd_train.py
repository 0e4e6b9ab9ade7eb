"""``polymem train``: train a small causal LM with a memory site from scratch and write its table as an asset."""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from polymem._io import atomic_write_json
from polymem.cli._display import escape
from polymem.cli._needs import check_needs
from polymem.cli._options import (
    apply_threads, BatchSize, BlockSize, Bf16, CorpusFiles, Device, DModel, Gate, HashKind, HeadDim, Heads, JsonOut, Lr,
    MaxEvalTokens, MaxN, NHead, NLayer, Precision, PrecisionOpt, Slots, Softmax, TableLrMult, Threads,
    TrainSteps, corpus_source, local_path, parse_count, tokenizer_spec,
    refuse_unused,
)

console = Console()


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                    TimeElapsedColumn(), TimeRemainingColumn(), console=console)


def train(
    corpus: CorpusFiles,
    out: Annotated[Path, typer.Option("--out", "-o", parser=local_path("a local asset directory or NAME.safetensors"), help="Asset to write (a zarr folder; NAME.safetensors for a single-file table).")],
    tokenizer: Annotated[Optional[str], typer.Option("--tokenizer", "-t", parser=tokenizer_spec, help="Tokenizer of a small model trained from scratch: a name (cl100k_base, mistral-v1, bytes, …), hf:NAME, or a tokenizer file. Not with --model.")] = None,
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="Train the table on this pretrained model instead, its backbone frozen: smollm2-135m, gemma3-270m, a .gguf file, a checkpoint folder or hf:ORG/NAME (needs polymem[models]; its own tokenizer).")] = None,
    site: Annotated[Optional[Path], typer.Option("--site", parser=local_path("a local folder"), help="With --model: where the trained site (projection, gate) goes (default: OUT.site).")] = None,
    steps: TrainSteps = None,
    batch_size: BatchSize = None,
    block_size: BlockSize = 256,
    n_layer: NLayer = 4,
    d_model: DModel = 256,
    n_head: NHead = 4,
    layers: Annotated[Optional[str], typer.Option(help="Blocks that get a memory site before them, comma-separated (default 1; 2 with --model).")] = None,
    max_n: MaxN = 3,
    params: Annotated[Optional[str], typer.Option("--params", help="Table size in scalars (rows × head dim): 12M, 1.5G, 12000000 … (default 12M; 20M with --model).")] = None,
    heads: Heads = 8,
    slots: Slots = 4,
    head_dim: HeadDim = 32,
    gate: Annotated[Gate, typer.Option(help="scalar (PageGram, init 0.5) or context (Engram).")] = Gate("scalar"),
    conv: Annotated[bool, typer.Option(help="Engram's causal depthwise conv after the gate.")] = False,
    lr: Lr = 2e-3,
    table_lr_mult: TableLrMult = 70.0,
    seed: Annotated[int, typer.Option(help="Model init and data order.")] = 0,
    heldout_every: Annotated[Optional[int], typer.Option(min=0, help="Every k-th document is held out (never trained on); 0 trains on every document (default 10; 0 with --heldout).")] = None,
    heldout: Annotated[Optional[list[Path]], typer.Option("--heldout", parser=corpus_source, help="With --model: score these documents instead of a held-out share of the corpus; every corpus document trains.")] = None,
    max_eval_tokens: MaxEvalTokens = None,
    precision: PrecisionOpt = Precision("auto"),
    bf16: Bf16 = None,
    threads: Threads = None,
    device: Device = "auto",
    hash_kind: Annotated[HashKind, typer.Option("--hash", help="bytes (tokenizer-agnostic byte hash) or xor (Engram's token-id XOR hash: a tokenizer-bound table, re-addressable with `polymem convert`).")] = HashKind("bytes"),
    table_lr: Annotated[float, typer.Option(min=0.0, help="With --model: table learning rate (row-wise RMS rule).")] = 0.14,
    site_lr: Annotated[float, typer.Option(min=0.0, help="With --model: AdamW learning rate of the site's projection and gate.")] = 1e-3,
    softmax: Annotated[Softmax, typer.Option(help="With --model: the training loss over the ids the corpus uses (corpus; fast on large vocabularies) or the whole vocabulary (full). Scores are always exact.")] = Softmax("corpus"),
    eval_tokens: Annotated[int, typer.Option(min=1, help="With --model: held-out tokens scored before and after training.")] = 16384,
    checkpoint_every: Annotated[int, typer.Option(min=0, help="Write the training state to OUT.ckpt every this many steps (0: never); a run started again with the same flags continues from it, with any number of processes (torchrun), and it is removed once OUT is written. Each one writes the whole table (float32) beside the last, so the disk briefly holds two copies; the summary says how long they took.")] = 50,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing --out.")] = False,
    json_out: JsonOut = None,
    byte_head: Annotated[int, typer.Option("--byte-head", min=0, help="With --model: train a byte decoder with the rows, predicting this many bytes (1..16) after each n-gram, saved beside the site for a recipient's next_bytes arm (docs/real-models.md#carrying-content); 0: none. Such a run writes no checkpoints.")] = 0,
    byte_polish_steps: Annotated[int, typer.Option("--byte-polish-steps", min=0, help="With --byte-head: after the table, train the byte decoder alone this many more steps over the training text (rows frozen, no model forward; 512 positions a step), so that it reads what the rows hold; 0: none.")] = 1000,
) -> None:
    """Train a memory table and write it as an asset with provenance: with a small causal LM trained from
    scratch (--tokenizer), or on a pretrained model whose backbone stays frozen (--model)."""
    check_needs("train", locals())

    import torch

    from polymem.errors import PolymemError
    from polymem.cli._precision import precision_option, say_precision
    from polymem.recipes.train import MemoryConfig, TrainConfig, train_donor
    from polymem._io import check_outputs_not_inputs

    default_site = out.with_name(out.name + ".site") if model is not None and site is None else None
    check_outputs_not_inputs({"--out": out, "--site": site or default_site, "--json": json_out},
                             [("corpus", c) for c in corpus] + [("tokenizer", tokenizer), ("model", model)])
    if not byte_head:
        refuse_unused("without --byte-head", {"byte_polish_steps": (byte_polish_steps, 1000)})
    if byte_head:
        from polymem.torch.bytehead import check_bytes

        check_bytes(byte_head, "--byte-head")
        checkpoint_every = 0  # the decoder's state is not in a checkpoint
    if checkpoint_every > 0:  # a linked OUT.ckpt is said now, not after the run trained and wrote its asset
        from polymem.recipes.checkpoint import check_checkpoint_path

        check_checkpoint_path(out.with_name(out.name + ".ckpt"))
    for what, p in (("--out", out), ("--site", site or default_site)):
        if p is not None and p.exists() and not overwrite:  # said now, not after the model loads and trains
            raise PolymemError(f"{what} {str(p)!r} exists; pass --overwrite to replace it, or another {what}")
    if (tokenizer is None) == (model is None):
        raise PolymemError("pass --tokenizer (a small model trained from scratch) or --model (a pretrained model, "
                           "which brings its own tokenizer), not " + ("both" if model else "neither"))
    if heldout_every == 1 or (heldout and heldout_every):
        raise PolymemError(f"--heldout-every {heldout_every} is not accepted" + (" with --heldout (the given documents are "
                           "scored and every corpus document trains)" if heldout else "") + "; accepted: 0 (train on "
                           "every document) or >= 2 (every k-th held out), e.g. --heldout-every 0")
    heldout_every = (0 if heldout else 10) if heldout_every is None else heldout_every
    apply_threads(threads, console)
    if model is not None:
        refuse_unused("with --model (a pretrained backbone, frozen)", {
            "conv": (conv, False), "lr": (lr, 2e-3), "table_lr_mult": (table_lr_mult, 70.0),
            "bf16": (bf16, None), "max_eval_tokens": (max_eval_tokens, None),
            "n_layer": (n_layer, 4), "d_model": (d_model, 256), "n_head": (n_head, 4)})
        if hash_kind != "bytes":
            raise PolymemError("--hash xor trains a tokenizer-bound table from scratch; with --model use --hash bytes")
        from polymem.recipes.frozen import FrozenTrainConfig

        fcfg = FrozenTrainConfig(steps=steps or 80, batch_size=batch_size or 4, block_size=block_size,
                                 layers=_layers(layers or "2"), max_n=max_n, params=parse_count(params or "20M"),
                                 heads=heads, slots=slots, head_dim=head_dim, gate=gate.value, table_lr=table_lr,
                                 site_lr=site_lr, seed=seed, softmax=softmax.value)
        _train_model(model, corpus, out, site, fcfg, heldout_every=heldout_every, eval_tokens=eval_tokens, heldout=heldout,
                     checkpoint_every=checkpoint_every, precision=precision.value,
                     overwrite=overwrite, json_out=json_out, device=device, byte_head=byte_head,
                     byte_polish=byte_polish_steps)
        return
    refuse_unused("without --model", {"byte_head": (byte_head, 0), "byte_polish_steps": (byte_polish_steps, 1000), "site": (site, None), "heldout": (heldout, None), "table_lr": (table_lr, 0.14), "site_lr": (site_lr, 1e-3),
                                      "softmax": (softmax, "corpus"), "eval_tokens": (eval_tokens, 16384)})
    steps = steps or 620
    batch_size = batch_size or 8
    layers = layers or "1"
    params = params or "12M"
    layer_ids = _layers(layers)
    cfg = TrainConfig(steps=steps, batch_size=batch_size, block_size=block_size, n_layer=n_layer, n_head=n_head,
                      d_model=d_model, lr=lr, table_lr_mult=table_lr_mult, seed=seed,
                      precision=precision_option(precision.value, bf16), device=device)
    mem = MemoryConfig(layers=layer_ids, max_n=max_n, params=parse_count(params), heads=heads, slots=slots,
                       head_dim=head_dim, gate=gate.value, conv=conv)
    from polymem.torch.tables import check_table_memory

    if not _join(device, {"--corpus": [[str(c), os.path.getsize(c) if os.path.isfile(c) else None] for c in corpus],
                          "--tokenizer": tokenizer, "training": asdict(cfg), "memory": asdict(mem), "--out": str(out),
                          "--hash": hash_kind.value, "--checkpoint-every": checkpoint_every}, mem.layout(), batch_size):
        check_table_memory(mem.layout(), trainable=True)  # before the corpus is read and the model built
    say_precision(cfg)
    with _progress() as prog:
        task = prog.add_task("train", total=steps, info="")

        every = max(1, steps // 20)

        def on_step(i: int, loss: float) -> None:
            prog.update(task, completed=i + 1, info=f"step loss {loss:.3f}")
            if not console.is_terminal and ((i + 1) % every == 0 or i + 1 == steps):  # a log line under nohup
                console.print(f"step {i + 1}/{steps} loss on this step's batch {loss:.3f} "
                              f"({prog.tasks[0].elapsed or 0:.0f} s)")

        summary = train_donor(tokenizer, corpus, out, cfg=cfg, mem=mem, heldout_every=heldout_every,
                              max_eval_tokens=max_eval_tokens, overwrite=overwrite, on_step=on_step,
                              on_phase=lambda s: prog.update(task, description=escape(s), info=""), hash=hash_kind.value,
                              checkpoint_every=checkpoint_every)
    _print_summary(summary, cfg)
    if json_out and not console.quiet:
        atomic_write_json(json_out, summary, indent=1)
    console.print(f"next: does the table help a model with another tokenizer? polymem transfer --asset "
                  f"{escape(str(summary['path']))} --tokenizer mistral-v1 --corpus ... (docs/transfer.md)",
                  highlight=False, soft_wrap=True)
    from polymem.torch.sharded import finish

    finish(exit_process=True)


def _print_summary(summary: dict, cfg) -> None:
    """The donor's summary, one labelled row per figure (the JSON keeps every key unrounded)."""
    s, last = summary, min(20, cfg.steps)
    on, off = s["heldout_bpb"], s["heldout_bpb_memory_off"]
    t = Table(title=f"donor table {escape(str(s['path']))}", show_header=False, title_justify="left")
    for k, v in (("tokenizer", escape(s["tokenizer"])),
                 ("training tokens seen", f"{cfg.steps * cfg.batch_size * cfg.block_size:,} (training split: "
                                          f"{s['train_tokens_available']:,})"),
                 ("corpus read", _read_line(s["corpus_read"])),
                 ("held-out tokens", f"{s['heldout_tokens']:,}" + ("" if s.get("heldout_every", 1) else
                                                                 " (nothing held out: the training documents)")),
                 ("table rows touched", f"{s['rows_touched']:,} of {s['rows']:,}"),
                 (f"training loss, mean of the last {last} steps (JSON: final_loss)", f"{s['final_loss']:.3f} nats/token"),
                 ("held-out bits per byte, with the table", f"{on:.4f}"),
                 ("held-out bits per byte, table switched off", f"{off:.4f} (same model)"),
                 ("training speed", f"{s['tokens_per_s']:,.0f} tokens/s ({s['precision']})"),
                 ("time", f"{s['elapsed_s']:.0f} s")):
        t.add_row(k, v)
    _checkpoint_rows(t, s, cfg.steps)
    _process_rows(t, s)
    console.print(t)
    verdict = "lowers" if on < off else "does not lower"
    console.print(f"verdict: the table {verdict} held-out bits per byte: {on - off:+.4f} ({(on - off) / off:+.2%}) "
                  "against the same model with it switched off", highlight=False)


def _read_line(r: dict) -> str:
    """How much of its training stream a run read, in words."""
    return f"{r['share_read']:.1%} of {r['train_tokens']:,} tokens, {r['passes']:.2f} passes"


def _layers(text: str) -> tuple[int, ...]:
    from polymem.errors import PolymemError

    try:
        ids = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        ids = ()
    if not ids:
        raise PolymemError(f"--layers {text!r} must be comma-separated block indices, e.g. 1 or 1,3")
    return ids


def _train_model(model: str, corpus: list[Path], out: Path, site: Path | None, cfg, *, heldout_every: int,
                 eval_tokens: int, overwrite: bool, json_out: Path | None, device: str = "auto",
                 checkpoint_every: int = 0, heldout: list[Path] | None = None, precision: str = "auto",
                 byte_head: int = 0, byte_polish: int | None = None) -> None:
    from polymem.models import load_model
    from polymem.recipes.frozen import train_table
    from polymem.torch.device import resolve_device

    from polymem.torch.tables import check_table_memory

    dev = resolve_device(device)  # a missing CUDA device is said before the model loads
    if not _join(device, {"--model": model, "--corpus": [[str(c), os.path.getsize(c) if os.path.isfile(c) else None]
                                                         for c in corpus], "training": asdict(cfg), "--out": str(out),
                          "--heldout-every": heldout_every, "--eval-tokens": eval_tokens,
                          "--checkpoint-every": checkpoint_every, "--heldout": [str(p) for p in heldout or []]},
                 cfg.layout(), cfg.batch_size):
        check_table_memory(cfg.layout(), trainable=True)  # and a table that cannot fit
    held_texts = None
    if heldout:
        from polymem.recipes.data import read_documents

        held_texts = read_documents(heldout)  # an unreadable file is said before the model loads

    from polymem.cli._precision import backbone_precision

    prec = backbone_precision(precision, dev)
    console.print(f"loading {escape(model)} … (backbone frozen; table {cfg.params:,} scalars, site before block(s) "
                  f"{', '.join(map(str, cfg.layers))}, training softmax: {cfg.softmax})", highlight=False)
    lm = load_model(model, device=str(dev), precision=prec)
    console.print(escape(lm.load_line()), highlight=False)
    with _progress() as prog:
        task = prog.add_task("train", total=cfg.steps, info="")
        every = max(1, cfg.steps // 20)

        def on_step(i: int, loss: float) -> None:
            prog.update(task, completed=i + 1, info=f"step loss {loss:.3f}")
            if not console.is_terminal and ((i + 1) % every == 0 or i + 1 == cfg.steps):
                console.print(f"step {i + 1}/{cfg.steps} loss on this step's batch {loss:.3f} "
                              f"({prog.tasks[0].elapsed or 0:.0f} s)")

        summary = train_table(lm, corpus, out, cfg=cfg, site_dir=site, heldout_every=heldout_every,
                              eval_tokens=eval_tokens, overwrite=overwrite, on_step=on_step, checkpoint_every=checkpoint_every,
                              heldout_texts=held_texts, byte_head=byte_head, byte_polish=byte_polish,
                              on_phase=lambda s: prog.update(task, description=escape(s)))
    t = Table(title=f"table {escape(summary['path'])} trained on {escape(summary['model'])} (site: "
                    f"{escape(summary['site'])})", show_header=False, title_justify="left")
    rows = [("tokens seen", f"{summary['tokens_seen']:,}"), ("corpus read", _read_line(summary["corpus_read"])),
            ("scored", summary["scored_set"]),
            ("rows touched", f"{summary['rows_touched']:,} of {summary['rows']:,}"),
            ("held-out bits per byte, model alone", f"{summary['heldout_bpb_before']:.4f}"),
            ("held-out bits per byte, with the table", f"{summary['heldout_bpb_after']:.4f}"),
            ("change", f"{summary['heldout_bpb_after'] - summary['heldout_bpb_before']:+.4f} "
                       f"({(summary['heldout_bpb_after'] - summary['heldout_bpb_before']) / summary['heldout_bpb_before']:+.2%})"),
            ("held-out text scored", f"{summary['heldout_documents']} documents, {summary['heldout_tokens']:,} tokens, "
                                     f"{summary['heldout_bytes']:,} bytes"),
            (f"training loss, mean of the last {min(20, cfg.steps)} steps (JSON: final_loss)",
             f"{summary['final_loss']:.3f} nats/token"),
            ("training speed", f"{summary['tokens_per_s']:.0f} tokens/s"), ("time", f"{summary['elapsed_s']:.0f} s")]
    bh = summary.get("byte_head")
    if bh:
        pol = bh.get("polish")
        rows.append(("byte decoder", f"{bh['bytes']} bytes after each n-gram; byte loss {bh['byte_loss_last10']:.3f} nats "
                     "(last 10 steps)" + (f", then {pol['steps']:,} steps alone: {pol['byte_loss_before']['own']:.3f} → "
                                          f"{pol['byte_loss_after']['own']:.3f} on the training text ({pol['seconds']:.0f} s)"
                                          if pol else "")))
    for k, v in rows:
        t.add_row(k, v)
    _checkpoint_rows(t, summary, cfg.steps)
    _process_rows(t, summary)
    console.print(t)
    if json_out and not console.quiet:
        atomic_write_json(json_out, summary, indent=1)
    from polymem.torch.sharded import finish

    finish(exit_process=True)


def _join(device: str, run: dict, layout, batch_size: int) -> bool:
    """Under torchrun: join the processes' group, check they were all given this run, and print how the table
    is split (process 0 only: the others' console goes quiet). False (nothing done) in a single process."""
    from polymem.torch.sharded import check_same_everywhere, init_from_env, page_bounds

    if not init_from_env(device):
        return False
    import torch.distributed as dist

    from polymem.asset._together import shard_pages

    world = dist.get_world_size()
    page_bounds(layout, world, shard_pages(layout, world)[1])  # a table too small for the world is refused here
    check_same_everywhere(run)
    if dist.get_rank() != 0:
        console.quiet = True
    console.print(f"{world} processes: the table's {layout.num_rows:,} rows sharded by shards of the asset, each "
                  f"process holding ~{layout.num_rows // world:,} rows and their optimizer state; the global batch of "
                  f"{batch_size} sequences split across them", highlight=False)
    return True


def _checkpoint_rows(t, summary: dict, steps: int) -> None:
    if summary.get("resumed_at_step"):
        t.add_row("continued from", f"the checkpoint at step {summary['resumed_at_step']} of {steps}")
    ck = summary.get("checkpoints") or {}
    if ck.get("written"):
        t.add_row("checkpoints written (not counted in the speed)", f"{ck['written']}, {ck['seconds']:.1f} s")


def _process_rows(t, summary: dict) -> None:
    mem = summary.get("process_memory") or []
    for i, m in enumerate(mem if len(mem) > 1 else []):
        t.add_row(f"process {i}: rows held + their optimizer state, peak RSS",
                  f"{m['table_bytes'] / 2**20:,.1f} + {m['optimizer_bytes'] / 2**20:,.1f} MiB, {m['peak_rss_bytes'] / 2**20:,.0f} MiB")


def register(app: typer.Typer) -> None:
    app.command("train")(train)
