"""``polymem transfer --model``: a donor table on a pretrained recipient, in arms against controls (the
command's options are declared in :mod:`polymem.cli.cmd_transfer`; this is its pretrained-recipient path)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from polymem.cli._display import escape

console = Console()


def _seeds(seeds: int, seed_list: str | None) -> list[int]:
    from polymem.errors import PolymemError

    if seed_list is None:
        return list(range(seeds))
    try:
        out = [int(x) for x in seed_list.split(",") if x.strip()]
    except ValueError:
        out = []
    if not out or any(not 0 <= s < 2**32 for s in out):
        raise PolymemError(f"--seed-list {seed_list!r} must be comma-separated seeds in 0..4294967295, e.g. 0,1,2")
    return list(dict.fromkeys(out))


def transfer_model(*, model: str, asset: str, corpus: list[Path], eval_corpus: list[Path], arms: str | None,
                   seeds: int, seed_list: str | None, steps: int, batch_size: int, block_size: int,
                   eval_every: int | None, eval_tokens: int, site_lr: float, table_lr: float, softmax: str,
                   layers: str | None, max_n: int | None, out_dir: Path | None, threads: int | None,
                   json_out: Path | None, plot: Path | None, device: str = "auto") -> None:
    import torch

    from polymem.torch.device import resolve_device

    from polymem._io import atomic_write_json, check_output_paths
    from polymem.cli.cmd_eval import progress_bar
    from polymem.errors import PolymemError
    from polymem.models import load_model
    from polymem.recipes.frozen import FrozenTrainConfig
    from polymem.recipes.pretrained import ARMS, Experiment, check_arms, plot_result, run_transfer

    if out_dir is None:
        raise PolymemError("--model needs --out-dir DIR: each (arm, seed) result is written there as it ends, so a "
                           "stopped run resumes; e.g. --out-dir runs/gemma")
    check_output_paths(json_out, plot)
    if plot is not None:
        from polymem._optional import pyplot

        pyplot("transfer --plot")  # a missing matplotlib is said now, not after the training
    dev = resolve_device(device)  # a missing CUDA device is said before the model loads
    arm_list = check_arms((arms or ",".join(ARMS)).split(","))
    seed_ids = _seeds(seeds, seed_list)
    if threads:
        torch.set_num_threads(threads)
    from polymem.cli.cmd_train import _layers

    cfg = FrozenTrainConfig(steps=steps, batch_size=batch_size, block_size=block_size, site_lr=site_lr,
                            table_lr=table_lr, softmax=softmax)
    every = eval_every or steps
    eval_at = sorted({s for s in range(every, steps + 1, every)} | {steps})
    console.print(f"loading {escape(model)} …", highlight=False)
    lm = load_model(model, device=str(dev))
    console.print(escape(lm.load_line()), highlight=False)
    console.print("preparing (donor table, corpus, scoring sets) …", highlight=False)
    exp = Experiment(lm, asset, corpus, cfg=cfg, eval_corpora=eval_corpus, eval_tokens=eval_tokens,
                     layers=_layers(layers) if layers else None, max_n=max_n)
    trained = [a for a in arm_list if a != "none"]
    with progress_bar(console) as prog:
        task = prog.add_task("transfer", total=len(trained) * len(seed_ids) * steps, info="")
        state = {"done": 0}

        def on_event(kind: str, **k: Any) -> None:
            if kind == "run":
                prog.update(task, description=escape(f"{k['arm']} seed {k['seed']}"))
            elif kind == "skip":
                if k["arm"] != "none":
                    state["done"] += steps
                    prog.update(task, completed=state["done"])
                prog.console.print(f"  {k['arm']:<15} seed {k['seed']}: {k['bpb']:.4f} bits/byte (done before)", highlight=False)
            elif kind == "step":
                state["done"] += 1
                prog.update(task, completed=state["done"], info=f"loss {k['loss']:.3f}")
            elif kind == "eval" and not console.is_terminal:
                prog.console.print(f"  {k['arm']} seed {k['seed']} tokens {k['tokens']:,}: {k['bpb']:.4f} bits/byte "
                                   f"({prog.tasks[0].elapsed or 0:.0f} s)", highlight=False)
            elif kind == "result":
                prog.console.print(f"  {k['arm']:<15} seed {k['seed']}: {k['bpb']:.4f} bits/byte", highlight=False)

        result = run_transfer(exp, arms=arm_list, seeds=seed_ids, eval_at=eval_at, out_dir=out_dir, on_event=on_event)
    print_result(result)
    if json_out:
        atomic_write_json(json_out, result, indent=1)
        console.print(f"wrote {escape(str(json_out))}", soft_wrap=True)
    if plot:
        console.print(f"wrote {escape(str(plot_result(result, plot)))}", soft_wrap=True)


def print_result(result: dict[str, Any]) -> None:
    import numpy as np

    sets = list(result["base_bpb"])
    d = result["donor"]
    t = Table(title=escape(f"held-out bits per byte, {result['recipient_model']} with a table trained on "
                           f"{result['donor_model'] or (d.get('tokenizer') or {}).get('name') or d['asset']} (mean over seeds {result['seeds']}; "
                           f"change vs the model alone)"), title_justify="left")
    t.add_column("arm")
    for k in sets:
        t.add_column(escape(f"{k}{' (in domain)' if k == result['in_domain'] else ''}"), justify="right")
    for arm, v in result["arms"].items():
        cells = []
        for k in sets:
            mean = float(np.mean(v["bpb"][k]))
            g = result["gains"][arm][k]["share_of_base"]
            cells.append(f"{mean:.4f} ({-float(np.mean(g)):+.2%})")
        t.add_row(arm, *cells)
    console.print(t)
    for name, p in result["paired"].items():
        if name == "donor_finetune_vs_in_place":
            verdict = "yes" if p["finetune_at_most_in_place_everywhere"] else "no"
            console.print(f"donor_finetune at or below in_place at every budget and seed: {verdict}", highlight=False)
            continue
        ctl = name.split("_vs_")[1]
        for k, q in p.items():
            m = ", ".join(f"{x:+.4f}" for x in q["margin_bpb"])
            console.print(f"{ctl} minus donor on {escape(k)}, per seed: {m} → donor better on every seed: "
                          f"{'yes' if q['donor_better_every_seed'] else 'no'}", highlight=False)
    hit = result.get("donor_rows_hit", {}).get("per_order")
    if hit:
        console.print("recipient's row reads that land on rows the donor wrote: "
                      + ", ".join(f"order {n} {v:.0%}" for n, v in hit.items()), highlight=False)
