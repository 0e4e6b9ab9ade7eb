"""``polymem transfer``: attach a frozen donor table to recipient models with another tokenizer, against controls."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from polymem.cli._display import escape
from polymem.cli._needs import check_needs
from polymem.cli._options import (
    BatchSize, BlockSize, Bf16, CorpusFiles, Device, DModel, DonorInit, Gate, JsonOut, Lr, MaxEvalTokens, NHead, NLayer, PlotOut,
    PrecisionOpt, Precision, Softmax, TableLrMult, Threads, TransferSteps, ValueInit, corpus_source, local_path,
    apply_threads, refuse_unused, tokenizer_spec,
)

console = Console()
_SCRATCH = "From-scratch recipients (--tokenizer), a study"


def _in_panel(alias: Any, panel: str) -> Any:
    """A shared option alias shown under ``panel`` in this command's --help (the alias itself is unchanged)."""
    import copy
    from typing import get_args

    base, info = get_args(alias)[:2]
    info = copy.copy(info)
    info.rich_help_panel = panel
    info.help = f"From scratch (--tokenizer): {info.help}"
    return Annotated[base, info]


if TYPE_CHECKING:
    SNLayer = NLayer
    SDModel = DModel
    SNHead = NHead
    SLr = Lr
    STableLrMult = TableLrMult
    SMaxEvalTokens = MaxEvalTokens
    SPrecisionOpt = PrecisionOpt
    SBf16 = Bf16
else:
    SNLayer, SDModel, SNHead, SLr, STableLrMult = (_in_panel(a, _SCRATCH) for a in (NLayer, DModel, NHead, Lr, TableLrMult))
    SMaxEvalTokens, SPrecisionOpt, SBf16 = (_in_panel(a, _SCRATCH) for a in (MaxEvalTokens, PrecisionOpt, Bf16))


def transfer(
    corpus: CorpusFiles,
    asset: Annotated[Optional[str], typer.Option("--asset", "-a", help="Donor asset (from `polymem train`), a path or URL. With --content-split: optional, a donor trained on exactly the donor part (else one is trained).")] = None,
    model: Annotated[Optional[str], typer.Option("--model", "-m", rich_help_panel="Pretrained recipient (--model), the main path", help="A pretrained recipient instead (smollm2-135m, gemma3-270m, a .gguf file, a checkpoint folder, hf:ORG/NAME), backbone frozen; arms none, random, null, donor, donor_finetune, in_place. Needs --out-dir.")] = None,
    tokenizer: Annotated[Optional[str], typer.Option("--tokenizer", "-t", parser=tokenizer_spec, rich_help_panel="From-scratch recipients (--tokenizer), a study", help="Recipient tokenizer spec (another family than the donor's); recipients are small models trained from scratch. Not with --model.")] = None,
    eval_corpus: Annotated[Optional[list[Path]], typer.Option("--eval-corpus", parser=corpus_source, help="Score the held-out split of these documents instead of --corpus's (default: --corpus); with --model, in addition to it (one scoring set per file).")] = None,
    arms: Annotated[Optional[str], typer.Option(help="Comma-separated arms: none, random, donor (adds donor_memory_off), donor_finetune, scratch (default: all). With --model: none, random, null, donor, donor_finetune, in_place (default: these), and by name stitch and next_bytes, next_bytes_conf, next_bytes_mix, next_bytes_fit, donor_next_bytes, donor_next_bytes_mix, donor_next_bytes_mix_all (the donor's rows decoded into the bytes that follow them; all but next_bytes_fit need a donor trained with a byte decoder, --donor-byte-head), and with --content-split teach and distill (the donor model writes text with its table), distill_own and distill_own_mix (the donor's predictions on the recipient's part), donor_next_bytes_mix_polished and donor_next_bytes_mix_polished_all (the donor's decoder trained on over its own part first; docs/real-models.md#carrying-content).")] = None,
    seeds: Annotated[int, typer.Option(min=1, help="Number of seeds (0..seeds-1); each seed fixes init and data order for all arms.")] = 3,
    steps: TransferSteps = None,
    batch_size: BatchSize = None,
    block_size: BlockSize = 256,
    max_n: Annotated[Optional[int], typer.Option("--max-n", min=1, max=32, help="Recipient orders 1..N (default: the donor's).")] = None,
    eval_every: Annotated[Optional[int], typer.Option(min=1, help="Score held-out bpb every this many steps (learning curves; default: only at the end).")] = None,
    threads: Threads = None,
    device: Device = "auto",
    json_out: JsonOut = None,
    plot: PlotOut = None,
    out_dir: Annotated[Optional[Path], typer.Option("--out-dir", parser=local_path("a local folder"), rich_help_panel="Pretrained recipient (--model), the main path", help="With --model: one result file per (arm, seed), written as each ends; a re-run skips what is there (resume).")] = None,
    seed_list: Annotated[Optional[str], typer.Option("--seed-list", rich_help_panel="Pretrained recipient (--model), the main path", help="With --model: these seeds (e.g. 0,1) instead of 0..seeds-1; processes sharing an --out-dir may split the seeds.")] = None,
    eval_at: Annotated[Optional[str], typer.Option("--eval-at", rich_help_panel="Pretrained recipient (--model), the main path", help="With --model: score the in-domain set after these steps, e.g. 4,12,24,36 (a learning curve from 0 recipient tokens; with --eval-every, both).")] = None,
    eval_tokens: Annotated[int, typer.Option(min=64, rich_help_panel="Pretrained recipient (--model), the main path", help="With --model: held-out tokens per scoring set (the first held-out documents).")] = 4096,
    init: Annotated[Optional[DonorInit], typer.Option("--init", rich_help_panel="Pretrained recipient (--model), the main path", help="With --model: how the projection of the arms that read the donor's rows starts: zero (step 0 is the model alone), orthogonal, or aligned (the donor site's projection mapped into the recipient's hidden space by a ridge fit between the two models; loads the donor's model too). Default: zero.")] = None,
    gate: Annotated[Optional[Gate], typer.Option("--gate", rich_help_panel="Pretrained recipient (--model), the main path", help="With --model: the sites' gate in every arm: scalar, context (Engram) or count (context, and rows weighted by how often the donor trained them). Default: the donor's.")] = None,
    donor_model: Annotated[Optional[str], typer.Option("--donor-model", rich_help_panel="Pretrained recipient (--model), the main path", help="With --init aligned: the donor's model (default: the one named in the donor asset's provenance).")] = None,
    donor_site: Annotated[Optional[Path], typer.Option("--donor-site", parser=local_path("a site folder"), rich_help_panel="Pretrained recipient (--model), the main path", help="With --init aligned: the donor's site folder (default: the asset's path + .site, as `polymem train --model` writes it).")] = None,
    content_split: Annotated[Optional[str], typer.Option("--content-split", rich_help_panel="Pretrained recipient (--model), the main path", help="With --model: split --corpus by document into donor-only, recipient-only and unseen parts with these shares (e.g. 0.3,0.5,0.2); the donor (--donor-model) trains on its part, the arms on theirs, and every arm and the donor itself are scored on donor-read and unseen documents (docs/real-models.md#carrying-content).")] = None,
    split_seed: Annotated[int, typer.Option("--split-seed", min=0, rich_help_panel="Pretrained recipient (--model), the main path", help="With --content-split: the seed of the split (recorded in the results).")] = 0,
    donor_steps: Annotated[int, typer.Option("--donor-steps", min=1, rich_help_panel="Pretrained recipient (--model), the main path", help="With --content-split: the donor's training steps on its part (batch and block as the arms').")] = 80,
    donor_params: Annotated[str, typer.Option("--donor-params", rich_help_panel="Pretrained recipient (--model), the main path", help="With --content-split: the donor table's size in scalars (heads 8, head dim 32; site before --layers, default block 2).")] = "20M",
    donor_byte_head: Annotated[int, typer.Option("--donor-byte-head", rich_help_panel="Pretrained recipient (--model), the main path", help="With --content-split: the donor trains a byte decoder with its rows, predicting this many bytes after each n-gram (1..16; 0: none), which the next_bytes arm reads (docs/real-models.md#carrying-content).")] = 0,
    teach_tokens: Annotated[int, typer.Option("--teach-tokens", min=1, rich_help_panel="Pretrained recipient (--model), the main path", help="With --content-split and the teach or distill arm: the new tokens the donor model writes, with its table, from the starts of the recipient's documents (the text those arms learn from).")] = 4096,
    teach_prompts: Annotated[str, typer.Option("--teach-prompts", rich_help_panel="Pretrained recipient (--model), the main path", help="With --content-split and the teach or distill arm: whose documents' starts prompt the donor: recipient (the method) or donor (a diagnostic upper bound: the starts of the documents the donor read, which a recipient does not have).")] = "recipient",
    teach_select: Annotated[float, typer.Option("--teach-select", min=1.0, rich_help_panel="Pretrained recipient (--model), the main path", help="With --content-split and the teach or distill arm: the donor writes this many times --teach-tokens and keeps the texts on which its table lowers its own loss most (1: keeps all).")] = 1.0,
    site_lr: Annotated[float, typer.Option(min=0.0, rich_help_panel="Pretrained recipient (--model), the main path", help="With --model: AdamW learning rate of the sites.")] = 1e-3,
    table_lr: Annotated[float, typer.Option(min=0.0, rich_help_panel="Pretrained recipient (--model), the main path", help="With --model: table learning rate (row-wise RMS rule) of the null, donor_finetune and in_place arms.")] = 0.14,
    softmax: Annotated[Softmax, typer.Option(rich_help_panel="Pretrained recipient (--model), the main path", help="With --model: training loss over the ids the corpus uses (corpus) or the whole vocabulary (full); scores are exact.")] = Softmax("corpus"),
    layers: Annotated[Optional[str], typer.Option(rich_help_panel="Pretrained recipient (--model), the main path", help="With --model: blocks that get the site (default: the donor's).")] = None,
    domain: Annotated[Optional[str], typer.Option(rich_help_panel="From-scratch recipients (--tokenizer), a study", help="From scratch (--tokenizer): A name for the domain in the JSON (default: the eval corpus file name).")] = None,
    n_layer: SNLayer = 4,
    d_model: SDModel = 256,
    n_head: SNHead = 4,
    lr: SLr = 2e-3,
    table_lr_mult: STableLrMult = 70.0,
    finetune_table_lr_mult: Annotated[Optional[float], typer.Option(min=0.0, rich_help_panel="From-scratch recipients (--tokenizer), a study", help="From scratch (--tokenizer): Table lr multiplier for donor_finetune only (default: --table-lr-mult).")] = None,
    value_init: Annotated[ValueInit, typer.Option(rich_help_panel="From-scratch recipients (--tokenizer), a study", help="From scratch (--tokenizer): Recipient W_V init for the donor/random/donor_finetune tables: zero (step 0 = no memory) or orthogonal (PageGram's gain).")] = ValueInit("zero"),
    scratch: Annotated[bool, typer.Option(rich_help_panel="From-scratch recipients (--tokenizer), a study", help="From scratch (--tokenizer): Deprecated: add scratch to --arms.")] = False,
    max_eval_tokens: SMaxEvalTokens = None,
    precision: SPrecisionOpt = Precision("auto"),
    bf16: SBf16 = None,
    jobs: Annotated[int, typer.Option(min=1, rich_help_panel="From-scratch recipients (--tokenizer), a study", help="From scratch (--tokenizer): Worker processes taking (seed, arm) runs seed by seed (with one seed, its arms side by side); 2 suits a 2-core CPU with --threads 1. With --json, NAME.partial.json holds the seeds complete so far.")] = 1,
) -> None:
    """A donor table on recipients with another tokenizer, in arms against controls, with identical data order,
    budget and initialisation per seed. The main path is a pretrained recipient (--model: its backbone frozen;
    arms none, random, null, donor, donor_finetune, in_place; curves from 0 recipient tokens, scores out of
    domain, paired intervals and one verdict line per comparison). The from-scratch study (--tokenizer: small
    recipients trained from zero) has its own options below. To keep a recipient's site, use `polymem attach`."""
    check_needs("transfer", locals())

    import numpy as np
    import torch

    from polymem.cli._precision import precision_option, say_precision
    from polymem.recipes.train import TrainConfig
    from polymem.errors import PolymemError
    from polymem.recipes.transfer import _check_arms, plot_curves, plot_transfer, run_transfer, write_json
    from polymem._io import check_outputs_not_inputs

    # --init aligned reads the donor's site (ASSET.site by default) and model: inputs too
    from polymem.cli._transfer_model import donor_model_spec

    aligned = init is not None and init.value == "aligned" and asset is not None
    check_outputs_not_inputs({"--json": json_out, "--plot": plot, "--out-dir": out_dir},
                             [("asset", asset), ("tokenizer", tokenizer), ("model", model),
                              ("donor model", donor_model_spec(asset, donor_model) if aligned and asset else None),
                              ("donor site", (donor_site or Path(f"{asset}.site")) if aligned else None)]
                             + [("corpus", c) for c in [*corpus, *(eval_corpus or [])]])
    if (tokenizer is None) == (model is None):
        raise PolymemError("pass --tokenizer (recipients trained from scratch) or --model (a pretrained recipient, "
                           "which brings its own tokenizer), not " + ("both" if model else "neither"))
    if model is not None:
        refuse_unused("with --model (a pretrained recipient, frozen, in one process)", {
            "domain": (domain, None), "jobs": (jobs, 1), "value_init": (value_init, "zero"),
            "finetune_table_lr_mult": (finetune_table_lr_mult, None), "max_eval_tokens": (max_eval_tokens, None),
            "scratch": (scratch, False), "n_layer": (n_layer, 4),
            "d_model": (d_model, 256), "n_head": (n_head, 4), "lr": (lr, 2e-3),
            "table_lr_mult": (table_lr_mult, 70.0), "bf16": (bf16, None)})
        from polymem.cli._transfer_model import transfer_model
        from polymem.cli._transfer_options import (ContentStudyOptions, DonorOptions, ModelTransfer, RecipientOptions,
                                                   RunOptions, seed_ids)
        from polymem.cli.cmd_train import _layers
        from polymem.recipes.frozen import FrozenTrainConfig
        from polymem.recipes.options import ExperimentData, RecipientSite
        from polymem.recipes.pretrained import ARMS

        study = ContentStudyOptions(split=content_split, split_seed=split_seed, donor_steps=donor_steps,
                                    donor_params=donor_params, teach_tokens=teach_tokens, teach_select=teach_select,
                                    teach_prompts=teach_prompts, byte_head=donor_byte_head)
        run = RunOptions(out_dir=out_dir, arms=tuple((arms or ",".join(ARMS)).split(",")),
                         seeds=seed_ids(seeds, seed_list), threads=threads, json_out=json_out, plot=plot)
        site = RecipientSite(layers=_layers(layers) if layers else None, max_n=max_n, gate=gate.value if gate else None,
                             init=init.value if init else "zero", donor_site=donor_site)
        budget = FrozenTrainConfig(steps=steps or 40, batch_size=batch_size or 4, block_size=block_size,
                                   site_lr=site_lr, table_lr=table_lr, softmax=softmax.value)
        recipient = RecipientOptions(model=model, budget=budget, site=site, eval_every=eval_every, eval_at=eval_at,
                                     device=device, precision=precision.value)
        transfer_model(ModelTransfer(recipient=recipient, donor=DonorOptions(asset=asset, model=donor_model),
                                     data=ExperimentData(corpus=corpus, eval_corpora=eval_corpus or [],
                                                         eval_tokens=eval_tokens),
                                     run=run, content=study.study(asset, budget, site.layers)))
        return
    refuse_unused("without --model", {
        "out_dir": (out_dir, None), "seed_list": (seed_list, None), "eval_tokens": (eval_tokens, 4096),
        "site_lr": (site_lr, 1e-3), "table_lr": (table_lr, 0.14), "softmax": (softmax, "corpus"), "layers": (layers, None),
        "init": (init, None), "gate": (gate, None), "donor_model": (donor_model, None), "donor_site": (donor_site, None),
        "eval_at": (eval_at, None), "content_split": (content_split, None), "split_seed": (split_seed, 0),
        "donor_steps": (donor_steps, 80), "donor_params": (donor_params, "20M"), "teach_tokens": (teach_tokens, 4096),
        "teach_select": (teach_select, 1.0), "teach_prompts": (teach_prompts, "recipient"),
        "donor_byte_head": (donor_byte_head, 0)})
    if asset is None:
        raise PolymemError("--asset is needed: the donor table the recipients read (from `polymem train`)")
    steps = steps or 400
    batch_size = batch_size or 8
    arm_list = _check_arms((arms or "none,random,donor,donor_finetune,scratch").split(",") + (["scratch"] if scratch else []))
    if scratch:
        console.print("warning: --scratch is deprecated; scratch is in --arms by default", style="yellow")
    from polymem._cpus import choose_threads

    if jobs == 1:
        threads = apply_threads(threads, console)
    elif threads is None:  # the worker processes share the CPUs the default would give one process
        threads = max(1, choose_threads().threads // jobs)
    cfg = TrainConfig(steps=steps, batch_size=batch_size, block_size=block_size, n_layer=n_layer, n_head=n_head,
                      d_model=d_model, lr=lr, table_lr_mult=table_lr_mult, precision=precision_option(precision.value, bf16),
                      device=device)
    say_precision(cfg)
    n_arms = len(arm_list)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=console) as prog:
        task = prog.add_task("transfer", total=n_arms * seeds * steps, info="")
        state: dict[str, Any] = {"done": 0, "run": ""}

        def on_event(kind: str, **k) -> None:
            if kind == "phase":
                prog.update(task, description=escape(k["name"]))
            elif kind == "run":
                state["run"] = f"{k['arm']} seed {k['seed']}"
                prog.update(task, description=escape(state["run"]) if jobs == 1 else "recipients")
            elif kind == "step":
                state["done"] += 1
                prog.update(task, completed=state["done"], info=f"loss {k['loss']:.3f}")
            elif kind == "eval":
                if not console.is_terminal:  # a log line under nohup
                    console.print(f"  {k['arm']} seed {k['seed']} tokens {k['tokens']:,}: {k['bpb']:.4f} bits/byte "
                                  f"({prog.tasks[0].elapsed or 0:.0f} s)")
            elif kind == "result":
                prog.console.print(f"  {k['arm']:<17} seed {k['seed']}: {k['bpb']:.4f} bits/byte")

        partial = json_out.with_name(json_out.stem + ".partial.json") if json_out else None
        result = run_transfer(asset, tokenizer, corpus, checkpoint=partial, cfg=cfg, seeds=list(range(seeds)), max_n=max_n, arms=arm_list,
                              max_eval_tokens=max_eval_tokens, on_event=on_event, jobs=jobs, value_init=value_init.value,
                              threads=threads, eval_every=eval_every, eval_corpus=eval_corpus or None, domain=domain,
                              finetune_table_lr_mult=finetune_table_lr_mult)
    t = Table(title=escape(f"held-out bits/byte after {result['tokens']:,} tokens: {result['donor']['tokenizer']} donor -> "
                    f"{result['recipient']['tokenizer']} recipient ({result['domain']['name']})"), title_justify="left")
    t.add_column("arm")
    for s in result["seeds"]:
        t.add_column(f"seed {s}", justify="right")
    t.add_column("mean", justify="right")
    for arm, v in result["arms"].items():
        t.add_row(arm, *[f"{x:.4f}" for x in v["bpb"]], f"{np.mean(v['bpb']):.4f}")
    console.print(t)
    from polymem.cli._transfer_report import print_analysis

    print_analysis(result, console)
    if json_out:
        console.print(f"wrote {escape(str(write_json(result, json_out)))}", soft_wrap=True)
        if partial is not None and partial.exists():
            partial.unlink()
    if plot:
        many = len(next(iter(result["curves"].values()))["tokens"]) > 1
        console.print(f"wrote {escape(str((plot_curves if many else plot_transfer)(result, plot)))}", soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("transfer")(transfer)
