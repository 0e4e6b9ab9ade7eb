"""``polymem attach``: give a pretrained model a site over a frozen table trained with another model (another
tokenizer): the site's projection (and gate) train on the model, the table does not; the site is saved for
``polymem eval --site`` and for :func:`polymem.torch.attach.load_attached`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

from polymem.cli._display import escape
from polymem.cli._needs import check_needs
from polymem.cli._options import (BackbonePrecision, BlockSize, CorpusFiles, Device, DonorInit, Gate, JsonOut, ModelOpt,
                                  NextBytes, ByteHits, ByteReader, Precision, SiteBatchSize, Softmax, Threads, apply_threads, local_path)

console = Console()


def attach_cmd(
    model: ModelOpt,
    asset: Annotated[str, typer.Option("--asset", "-a", help="The frozen table (an asset from `polymem train --model`, trained with any tokenizer), a path or URL.")],
    corpus: CorpusFiles,
    out: Annotated[Path, typer.Option("--out", "-o", parser=local_path("a local folder"), help="Where the site folder goes (site.json, site.safetensors); it names the table by fingerprint and path.")],
    steps: Annotated[int, typer.Option(min=1, help="Optimizer steps of the site.")] = 36,
    init: Annotated[DonorInit, typer.Option("--init", help="The projection's start: aligned (the donor site's projection mapped into this model's hidden space; loads the donor's model for the fit), zero or orthogonal.")] = DonorInit("aligned"),
    gate: Annotated[Optional[Gate], typer.Option("--gate", help="scalar, context or count (context, rows weighted by how often the donor trained them). Default: the donor's.")] = None,
    donor_model: Annotated[Optional[str], typer.Option("--donor-model", help="With --init aligned: the table's model (default: the one its provenance names).")] = None,
    donor_site: Annotated[Optional[Path], typer.Option("--donor-site", parser=local_path("a site folder"), help="With --init aligned, and for --next-bytes: the table's own site (default: the asset's path + .site).")] = None,
    next_bytes: Annotated[NextBytes, typer.Option("--next-bytes", help="auto: when the donor's site holds a byte decoder (`polymem train --model ... --byte-head 8`), also read the donor's rows as the bytes that follow them, added to the next-token logits with one weight per order trained with the site (docs/real-models.md, `polymem attach`); on: require the decoder; off: the site alone.")] = NextBytes("auto"),
    next_bytes_reader: Annotated[ByteReader, typer.Option("--next-bytes-reader", help="How next bytes joins the model's prediction: mix (the decoded bytes' token probabilities interpolated with the model's, one weight per order; a wrong memory costs at most log(1 - the weights)) or add (their log-probability ratios added to the logits).")] = ByteReader("mix"),
    next_bytes_hits: Annotated[ByteHits, typer.Option("--next-bytes-hits", help="Which n-grams next bytes reads: all (only those whose rows were written in every one of the table's heads, so that an n-gram the donor never read, whose rows other n-grams wrote in only some heads, reads nothing) or any (written in any head; with a polished decoder it cost 5–6.5 % on other topics in our measurements).")] = ByteHits("all"),
    layers: Annotated[Optional[str], typer.Option(help="Blocks that get the site (default: the donor's).")] = None,
    site_lr: Annotated[float, typer.Option(min=0.0, help="AdamW learning rate of the site.")] = 3e-3,
    batch_size: SiteBatchSize = 4,
    block_size: BlockSize = 256,
    softmax: Annotated[Softmax, typer.Option(help="Training loss over the ids the corpus uses (corpus) or the whole vocabulary (full).")] = Softmax("corpus"),
    eval_tokens: Annotated[int, typer.Option(min=64, help="Held-out tokens scored before and after (the corpus's held-out split).")] = 4096,
    seed: Annotated[int, typer.Option(min=0, max=2**32 - 1, help="Data order and the site's init.")] = 0,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing --out.")] = False,
    precision: BackbonePrecision = Precision("auto"),
    bundle: Annotated[Optional[Path], typer.Option("--bundle", parser=local_path("a local folder"), help="Also write one folder holding the site, a copy of the table and a README card with this run's scores (polymem bundle; push/pull move it).")] = None,
    threads: Threads = None,
    device: Device = "auto",
    json_out: JsonOut = None,
) -> None:
    """Train a site for MODEL over a frozen table made with another model (and tokenizer), and save it: the
    headline use of a portable table (`polymem eval --model MODEL --site OUT` scores it)."""
    check_needs("attach", locals())
    import torch

    from polymem._io import atomic_write_json, check_outputs_not_inputs
    from polymem.cli._transfer_model import _donor_model, donor_model_spec
    from polymem.cli.cmd_eval import progress_bar
    from polymem.cli.cmd_train import _layers
    from polymem.errors import PolymemError
    from polymem.models import load_model
    from polymem.recipes.frozen import FrozenTrainConfig
    from polymem.recipes.options import ExperimentData, RecipientSite
    from polymem.recipes.pretrained import Experiment, train_recipient_site
    from polymem.torch.device import resolve_device
    from polymem.torch.tablefile import open_table

    start: str = init.value
    gate_s: str | None = gate.value if gate is not None else None
    # the aligned start reads the donor's site (ASSET.site by default) and its model (by default the one the asset's
    # provenance names): inputs, even with --overwrite
    aligned = start == "aligned"
    head = _donor_decoder(donor_site or Path(f"{asset}.site"), next_bytes.value)  # None: the site alone
    donor_read = (donor_site or Path(f"{asset}.site")) if aligned or head is not None else None
    check_outputs_not_inputs({"--out": out, "--json": json_out, "--bundle": bundle},
                             [("asset", asset), ("model", model), ("donor site", donor_read),
                              ("donor model", donor_model_spec(asset, donor_model) if aligned else None)]
                             + [("corpus", c) for c in corpus])
    for p in (out, bundle):
        if p is not None and p.exists() and not overwrite:
            raise PolymemError(f"{str(p)!r} exists; pass --overwrite or another folder")
    if bundle is not None and bundle.absolute() == out.absolute():
        raise PolymemError("--bundle and --out name one folder; give the bundle its own")
    if start != "aligned" and (donor_model or (donor_site and head is None)):
        raise PolymemError("--donor-model and --donor-site are read only with --init aligned (--donor-site also for "
                           "its byte decoder, --next-bytes); drop them")
    dev = resolve_device(device)
    tab = open_table(asset)  # a missing or broken table is said before any model loads
    if head is not None:
        _check_decoder(head, tab)
    apply_threads(threads, console)
    cfg = FrozenTrainConfig(steps=steps, batch_size=batch_size, block_size=block_size, site_lr=site_lr,
                            softmax=softmax.value, seed=seed)
    from polymem.cli._precision import backbone_precision

    prec = backbone_precision(precision.value, dev)
    dlm = _donor_model(asset, donor_model, str(dev), precision=prec) if start == "aligned" else None
    console.print(f"loading {escape(model)} …", highlight=False)
    lm = load_model(model, device=str(dev), precision=prec)
    console.print(escape(lm.load_line()), highlight=False)
    exp = Experiment(lm, asset, ExperimentData(corpus=corpus, eval_tokens=eval_tokens), cfg=cfg, donor_lm=dlm,
                     site=RecipientSite(layers=_layers(layers) if layers else None, gate=gate_s, init=start,
                                        donor_site=donor_site))
    del dlm
    for f in exp.alignment_report() or []:
        console.print(f"alignment: held-out R² {f['r2_heldout']:.3f} on {f['heldout_positions']:,} of {f['positions']:,} "
                      f"paired positions", highlight=False)
    if head is not None:
        console.print(f"next bytes: on (the donor's byte decoder, {head.j} bytes after each n-gram of orders "
                      f"1..{head.orders}, {'mixed with' if next_bytes_reader.value == 'mix' else 'added to'} the model's "
                      f"prediction, reading the n-grams written in {next_bytes_hits.value} of the table's heads, trains "
                      f"its {head.orders} order weights with the site; it costs "
                      f"{'0.4–2.1' if next_bytes_hits.value == 'all' else '0.5–6.5'} % on other topics in our "
                      "measurements: --next-bytes off for the site alone)", highlight=False, soft_wrap=True)
    with progress_bar(console) as prog:
        task = prog.add_task("training the site", total=steps, info="")

        def on_step(i: int, loss: float) -> None:
            prog.update(task, completed=i + 1, info=f"step loss {loss:.3f}")

        res: dict[str, Any] = train_recipient_site(exp, out, seed=seed, overwrite=overwrite, on_step=on_step,
                                                   byte_head=head, mix=next_bytes_reader.value == "mix",
                                                   hits=next_bytes_hits.value)
    a, s0, s1 = res["heldout_bpb_alone"], res["heldout_bpb_start"], res["heldout_bpb"]
    sc = exp.scorers[res["scored_set"]]
    res["heldout_documents"], res["heldout_tokens"], res["heldout_bytes"] = len(sc.docs), sc.num_tokens, sc.num_bytes
    console.print(f"start: {_start_line(res)}; gate {escape(str(res['gate']))}", highlight=False, soft_wrap=True)
    console.print(f"held-out bits per byte on {escape(res['scored_set'])} ({len(sc.docs)} documents, {sc.num_tokens:,} "
                  f"tokens, {sc.num_bytes:,} bytes: each document's first {exp.doc_tokens:,} tokens, up to "
                  f"{eval_tokens:,}; every {exp.heldout_every}th document): model alone {a:.4f}, with the table at "
                  f"step 0 {s0:.4f}, after {res['tokens']:,} tokens{' with next bytes' if 'next_bytes' in res else ''} "
                  f"{s1:.4f} ({(s1 - a) / a:+.2%})", highlight=False,
                  soft_wrap=True)
    if "next_bytes" in res:
        console.print(_next_bytes_line(res), highlight=False, soft_wrap=True)
    console.print(f"wrote {escape(str(out))} ({res['site_parameters']:,} site parameters; the table stays in "
                  f"{escape(str(asset))})", soft_wrap=True, highlight=False)
    if bundle is not None:
        from polymem.torch.bundle import bundle_site

        bundle_site(out, bundle, table=asset, overwrite=overwrite, scores={
            f"held-out bits per byte on {res['scored_set']}, model alone": a,
            f"held-out bits per byte on {res['scored_set']}, with this site": s1,
            "site trained on (tokens)": res["tokens"]})
        console.print(f"wrote {escape(str(bundle))} (the site, its table and README.md)", soft_wrap=True, highlight=False)
    if json_out:
        atomic_write_json(json_out, res, indent=1)
        console.print(f"wrote {escape(str(json_out))}", soft_wrap=True)


def _start_line(res: dict) -> str:
    """What the site started from, in words (the JSON has it as init and aligned_scale)."""
    if res.get("init") != "aligned":
        return f"{res.get('init')} projection"
    scale = res.get("aligned_scale")
    if not scale:
        return ("aligned, scaled by 0 — the model alone scored best on the first training batch, so the mapped "
                "projection was not used (step 0 is the model alone)")
    return f"aligned (the donor's projection mapped into this model's hidden space), scaled by {scale:g}"


def _donor_decoder(site: Path, mode: str) -> Any:
    """The donor's byte decoder for ``--next-bytes`` (read, and its file checked, before any model loads), or None:
    off, or auto and the donor's site holds none."""
    if mode == "off":
        return None
    from polymem._io import read_json
    from polymem.errors import PolymemError
    from polymem.torch.bytehead import load_byte_head

    try:
        header = read_json(site / "site.json", what="site header", fix="pass the donor's site folder (--donor-site)") \
            if (site / "site.json").is_file() else None
    except PolymemError:
        if mode == "on":
            raise
        header = None  # auto: a donor site that cannot be read has no decoder to offer (--init aligned says why)
    if not (isinstance(header, dict) and isinstance(header.get("byte_head"), dict)):
        if mode == "auto":
            return None
        raise PolymemError(f"--next-bytes on reads the donor's byte decoder, and {str(site)!r} holds none; train the "
                           "donor with one (`polymem train --model ... --byte-head 8`, its site folder then holds "
                           "bytes.safetensors), pass its site folder with --donor-site, or pass --next-bytes off")
    return load_byte_head(site, option="--next-bytes")


def _check_decoder(head: Any, table: Any) -> None:
    """The decoder reads the table's rows: its orders and row width must be the table's."""
    from polymem.errors import PolymemError

    lay = table.layout
    if head.orders != max(table.orders) or head.heads != lay.heads or head.head_dim != lay.head_dim:
        raise PolymemError(f"the donor's byte decoder reads orders 1..{head.orders} of {head.heads} × {head.head_dim} "
                           f"rows; the table has orders 1..{max(table.orders)} of {lay.heads} × {lay.head_dim}: pass "
                           "the site folder trained with this table (--donor-site), or --next-bytes off")


def _next_bytes_line(res: dict) -> str:
    """The byte reader's learned weights and cost, in words (the JSON has them under next_bytes)."""
    nb = res["next_bytes"]
    w = ", ".join(f"{x:+.3f}" for x in nb["weights"])
    share = nb["reader_s"] / res["train_s"] if res["train_s"] > 0 else 0.0
    return (f"next bytes: order weights w = [{w}] (orders 1..{len(nb['weights'])}); cost: its forward took "
            f"{nb['reader_s']:.2f} s of the {res['train_s']:.2f} s of training ({share:.0%})")


def register(app: typer.Typer) -> None:
    app.command("attach")(attach_cmd)
