"""``polymem transfer --model``: a donor table on a pretrained recipient, in arms against controls (the
command's options are declared in :mod:`polymem.cli.cmd_transfer`; this is its pretrained-recipient path)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from polymem.cli._display import escape
from polymem.cli._options import apply_threads
from polymem.cli._transfer_options import ModelTransfer
from polymem.recipes.arms import ARM_SPECS

console = Console()


def transfer_model(opts: ModelTransfer) -> None:
    """The pretrained-recipient path of ``polymem transfer``: what the options say checked against the machine
    (output paths, matplotlib, the device), then the arms, or with ``opts.content`` the study of what the donor
    read (:func:`_content`)."""
    from polymem.torch.device import resolve_device

    from polymem._io import atomic_write_json, check_output_paths
    from polymem.cli._precision import backbone_precision
    from polymem.cli.cmd_eval import progress_bar
    from polymem.models import load_model
    from polymem.recipes.pretrained import Experiment, run_transfer
    from polymem.recipes.pretrained_plot import plot_result

    r, run = opts.recipient, opts.run
    check_output_paths(run.json_out, run.plot)
    if run.plot is not None:
        from polymem._optional import pyplot

        pyplot("transfer --plot")  # a missing matplotlib is said now, not after the training
    dev = resolve_device(r.device)  # a missing CUDA device is said before the model loads
    apply_threads(run.threads, console)
    prec = backbone_precision(r.precision, dev)
    if opts.content is not None:
        _content(opts, device=str(dev), precision=prec)
        return
    asset, steps = opts.donor.asset, r.budget.steps
    assert asset is not None  # refused by ModelTransfer when there is no --content-split
    console.print(f"loading {escape(r.model)} …", highlight=False)
    lm = load_model(r.model, device=str(dev), precision=prec)
    console.print(escape(lm.load_line()), highlight=False)
    dlm = None
    if r.site.init == "aligned":
        dlm = _donor_model(asset, opts.donor.model, str(dev), precision=prec)
    console.print("preparing (donor table, corpus, scoring sets" + (", alignment" if dlm else "") + ") …", highlight=False)
    exp = Experiment(lm, asset, opts.data, cfg=r.budget, site=r.site, donor_lm=dlm)
    del dlm
    for i, f in enumerate(exp.alignment_report() or []):
        console.print(f"alignment, site {i}: held-out R² {f['r2_heldout']:.3f} on {f['heldout_positions']:,} of "
                      f"{f['positions']:,} paired positions ({f['documents']} documents)", highlight=False)
    trained = [a for a in run.arms if ARM_SPECS[a].trains is not None]
    with progress_bar(console) as prog:
        task = prog.add_task("transfer", total=len(trained) * len(run.seeds) * steps, info="")
        state = {"done": 0}

        def on_event(kind: str, **k: Any) -> None:
            if kind == "run":
                prog.update(task, description=escape(f"{k['arm']} seed {k['seed']}"))
            elif kind == "skip":
                if ARM_SPECS[k["arm"]].trains is not None:
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

        result = run_transfer(exp, arms=run.arms, seeds=run.seeds, eval_at=r.points, out_dir=run.folder,
                              on_event=on_event)
    print_result(result)
    if run.json_out:
        atomic_write_json(run.json_out, result, indent=1)
        console.print(f"wrote {escape(str(run.json_out))}", soft_wrap=True)
    if run.plot:
        console.print(f"wrote {escape(str(plot_result(result, run.plot)))}", soft_wrap=True)


def _content(opts: ModelTransfer, *, device: str, precision: str = "fp32") -> None:
    """``transfer --model --content-split``: the split and the donor's provenance checked before any model loads,
    then :func:`polymem.recipes.content.run_content_transfer`."""
    from dataclasses import replace

    from polymem.cli.cmd_eval import progress_bar
    from polymem.errors import PolymemError
    from polymem.models import load_model
    from polymem.recipes.content import content_parts, content_record, run_content_transfer, write_content_results
    from polymem.recipes.data import read_documents

    r, run, content, donor_model = opts.recipient, opts.run, opts.content, opts.donor.model
    assert content is not None  # transfer_model calls this with a study only
    cfg, model = r.budget, r.model
    docs = read_documents(list(opts.data.corpus))
    parts = content_parts(docs, content.split)  # an empty part is refused here
    n = {p: len(v) for p, v in parts["record"]["indices"].items()}
    if content.donor_asset is not None:
        from polymem.recipes.content import check_donor_read

        check_donor_read(content.donor_asset, parts["texts"]["donor"])
        dlm = _donor_model(content.donor_asset, donor_model, device, "its own scores", precision=precision)
    else:
        if donor_model is None:
            raise PolymemError("--content-split needs the donor's model (--donor-model SPEC, trained here on the donor "
                               "part) or a donor trained on that part (--asset)")
        console.print(f"loading the donor's model {escape(donor_model)} …", highlight=False)
        dlm = load_model(donor_model, device=device, precision=precision)
    console.print(f"split {content.split.text()} (seed {content.split.seed}) of {len(docs)} documents: "
                  f"{n['donor']} read by the donor only, {n['recipient']} by the recipient, {n['unseen']} by nobody",
                  highlight=False)
    console.print(f"loading {escape(model)} …", highlight=False)
    lm = load_model(model, device=device, precision=precision)
    console.print(escape(lm.load_line()), highlight=False)
    total = len([a for a in run.arms if ARM_SPECS[a].trains is not None]) * len(run.seeds) * cfg.steps
    with progress_bar(console) as prog:
        task = prog.add_task("content transfer", total=total, info="")
        state = {"done": 0}
        every = max(1, (content.donor_cfg.steps if content.donor_cfg is not None else 1) // 8)

        def on_event(kind: str, **k: Any) -> None:
            if kind == "phase":
                prog.update(task, description=escape(str(k["what"])))
            elif kind == "donor_step":
                prog.update(task, info=f"donor step {k['step'] + 1} loss {k['loss']:.3f}")
                if not console.is_terminal and (k["step"] + 1) % every == 0:  # a log line under nohup
                    prog.console.print(f"  donor step {k['step'] + 1}: training loss {k['loss']:.3f} "
                                       f"({prog.tasks[0].elapsed or 0:.0f} s)", highlight=False)
            elif kind == "run":
                prog.update(task, description=escape(f"{k['arm']} seed {k['seed']}"))
            elif kind == "step":
                state["done"] += 1
                prog.update(task, completed=state["done"], info=f"loss {k['loss']:.3f}")
            elif kind in ("result", "skip"):
                if kind == "skip" and ARM_SPECS[k["arm"]].trains is not None:
                    state["done"] += cfg.steps
                    prog.update(task, completed=state["done"])
                prog.console.print(f"  {k['arm']:<15} seed {k['seed']}: {k['bpb']:.4f} bits/byte on donor-read documents"
                                   + (" (done before)" if kind == "skip" else ""), highlight=False)

        summary = run_content_transfer(lm, dlm, replace(opts.data, corpus=(), texts=docs), cfg=cfg, content=content,
                                       arms=run.arms, seeds=run.seeds, eval_at=r.points, out_dir=run.folder,
                                       site=r.site, on_event=on_event)
    print_content(summary)
    if run.json_out:
        write_content_results(run.json_out, content_record(summary))
        console.print(f"wrote {escape(str(run.json_out))} (this direction: {escape(summary['donor_model'])} -> "
                      f"{escape(summary['recipient_model'])})", soft_wrap=True)


def print_content(summary: dict[str, Any]) -> None:
    """Per arm and for the donor: change on donor-read and unseen documents, content part [interval], share."""
    import numpy as np

    def pct(v: list[float]) -> str:
        return f"{100 * float(np.mean(v)):+.1f} %"

    t = Table(title=escape(f"what the donor read: {summary['recipient_model']} with a table trained by "
                           f"{summary['donor_model']} (mean over seeds {summary['seeds']}; bits per byte, change vs the "
                           "same model alone)"), title_justify="left")
    for c in ("model and memory", "donor-read", "unseen", "content part [95 % interval]", "recovered"):
        t.add_column(c, justify="left" if c == "model and memory" else "right")
    own = summary["donor_own"]
    t.add_row(escape(f"{summary['donor_model']} + its own table and site (the donor)"), pct(own["read"]),
              pct(own["unseen"]), f"{100 * own['diff'][0]:+.1f} [{100 * own['lo'][0]:+.1f}, {100 * own['hi'][0]:+.1f}]",
              "(the ceiling)")
    for arm, c in summary["arms"].items():
        rec = [r for r in c["recovered"] if r is not None]
        t.add_row(escape(f"{summary['recipient_model']}: {arm}"), pct(c["read"]), pct(c["unseen"]),
                  f"{100 * c['mean']:+.1f} [{100 * min(c['lo']):+.1f}, {100 * max(c['hi']):+.1f}]",
                  f"{100 * float(np.mean(rec)):.0f} %" if rec else "-")
    console.print(t)
    taught = [a for a in summary["transfer"]["arms"] if ARM_SPECS[a].teach == "written"]
    if taught:
        t0 = summary["transfer"]["arms"][taught[0]]["teach"][0] or {}
        console.print(f"the donor's text ({', '.join(taught)}): {t0.get('new_tokens', 0):,} new tokens kept of "
                      f"{t0.get('written_tokens') or t0.get('new_tokens', 0):,} written from {t0.get('prompts', 0)} prompts, {t0.get('generate_s', 0):.0f} s to write "
                      f"({t0.get('total_s', 0):.0f} s with the donor's chunk likelihoods); {t0.get('chunks', 0):,} "
                      "byte-aligned chunks", highlight=False)
    own = [a for a in summary["transfer"]["arms"] if ARM_SPECS[a].teach == "own"]
    if own:
        t0 = summary["transfer"]["arms"][own[0]]["teach"][0] or {}
        console.print(f"the donor's predictions on the recipient's part ({', '.join(own)}): {t0.get('scored_tokens', 0):,} "
                      f"donor tokens scored in {t0.get('total_s', 0):.0f} s; {t0.get('chunks', 0):,} byte-aligned "
                      "chunks", highlight=False)
    s = summary["split"]
    console.print(f"documents: {len(s['indices']['donor'])} donor-read, {len(s['indices']['recipient'])} recipient's, "
                  f"{len(s['indices']['unseen'])} unseen (split seed {s['seed']}); content part: change on donor-read "
                  "minus change on unseen, in points (negative: the memory knows what the donor read); interval over "
                  "documents, the widest of the seeds'", highlight=False, soft_wrap=True)


def donor_model_spec(asset: str, spec: str | None) -> str | None:
    """The donor model an aligned start loads: ``spec``, else the one the donor asset's provenance names (None when
    it names none, or the asset cannot be opened: the command says why when it opens it). An input of the run."""
    from polymem.errors import PolymemError
    from polymem.torch.tablefile import open_table

    if spec is not None:
        return spec
    try:
        prov = getattr(open_table(asset), "provenance", {}) or {}
    except (PolymemError, OSError):
        return None
    m = prov.get("model") if isinstance(prov, dict) else None
    got = (m.get("spec") or m.get("name")) if isinstance(m, dict) else None
    return got if isinstance(got, str) else None


def _donor_model(asset: str, spec: str | None, device: str, why: str = "for the aligned start",
                 precision: str = "fp32") -> Any:
    """The donor's model for an aligned start: ``spec``, else the model the donor asset's provenance names (the
    spec it was loaded from, else its name). Its tokenizer must be the one the table was trained with."""
    from polymem.errors import PolymemError, SpecMismatchError
    from polymem.models import load_model
    from polymem.torch.tablefile import open_table

    prov = getattr(open_table(asset), "provenance", {}) or {}
    if spec is None:
        m = prov.get("model") or {}
        spec = m.get("spec") or m.get("name")
        if not spec:
            raise PolymemError(f"the donor asset {asset!r} names no model in its provenance; pass --donor-model SPEC "
                               "(the model the table was trained with)")
    console.print(f"loading the donor's model {escape(spec)} ({why}) …", highlight=False)
    dlm = load_model(spec, device=device, precision=precision)
    console.print(escape(dlm.load_line()), highlight=False)
    want = (prov.get("tokenizer") or {}).get("fingerprint")
    if want and want != dlm.tokenizer.fingerprint:
        raise SpecMismatchError(f"the donor table was trained with tokenizer {(prov.get('tokenizer') or {}).get('name')!r} "
                                f"({str(want)[:16]}…), {spec} reads with {dlm.tokenizer.name!r} "
                                f"({dlm.tokenizer.fingerprint[:16]}…); pass --donor-model with the table's own model")
    return dlm


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
    curves = result["curves"]
    if curves:
        toks = next(iter(curves.values()))["tokens"]
        c = Table(title=f"learning curve on {escape(result['in_domain'])} (mean over seeds), by recipient tokens",
                  title_justify="left")
        c.add_column("arm")
        for t in toks:
            c.add_column(f"{t:,}", justify="right")
        for arm, v in curves.items():
            c.add_row(arm, *[f"{float(np.mean([b[i] for b in v['bpb']])):.4f}" for i in range(len(toks))])
        console.print(c)
    for f in result.get("alignment") or []:
        console.print(f"aligned start: held-out R² of the hidden-state map {f['r2_heldout']:.3f} "
                      f"({f['positions']:,} paired positions)", highlight=False)
    verdicts = result.get("verdicts") or []
    if verdicts:
        console.print(f"verdicts (per-seed paired 95 % intervals over documents; {len(result['seeds'])} seed(s)):",
                      highlight=False)
        for line in verdicts:
            console.print("  " + escape(line), highlight=False, soft_wrap=True)
    hit = result.get("donor_rows_hit", {}).get("per_order")
    if hit:
        console.print("recipient's row reads that land on rows the donor wrote: "
                      + ", ".join(f"order {n} {v:.0%}" for n, v in hit.items()), highlight=False)
