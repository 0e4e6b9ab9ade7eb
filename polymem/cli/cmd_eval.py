"""``polymem eval``: held-out bits per byte of a pretrained model on a corpus — alone, with a table, table off."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from polymem.cli._display import escape
from polymem.cli._needs import check_needs
from polymem.cli._options import CorpusFiles, Device, JsonOut, ModelOpt, Threads, local_path

console = Console()


def progress_bar(con: Console):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                    TimeElapsedColumn(), TimeRemainingColumn(), console=con)


def eval_cmd(
    model: ModelOpt,
    corpus: CorpusFiles,
    site: Annotated[Optional[Path], typer.Option("--site", parser=local_path("a local site folder", exists=True), help="A site folder (from `polymem train --model` or handle.save): its projection, and the table it names.")] = None,
    table: Annotated[Optional[str], typer.Option("--table", help="The table asset the site was trained with (default: the path the site records).")] = None,
    heldout_every: Annotated[int, typer.Option(min=1, help="Score every k-th document (the held-out split of `polymem train`); 1 scores every document.")] = 1,
    max_docs: Annotated[Optional[int], typer.Option(min=1, help="Score at most this many documents.")] = None,
    window: Annotated[int, typer.Option(min=2, help="Predicted tokens per window (each window starts from BOS).")] = 512,
    batch: Annotated[int, typer.Option(min=1, help="Windows per forward.")] = 4,
    per_doc: Annotated[bool, typer.Option("--per-doc", help="Print one row per document.")] = False,
    threads: Threads = None,
    device: Device = "auto",
    json_out: JsonOut = None,
) -> None:
    """Held-out bits per byte of a pretrained model on a corpus, per document and overall: the model alone and,
    with --site, with its table attached and with that table switched off."""
    check_needs("eval", locals())

    import torch

    from polymem._io import atomic_write_json, check_outputs_not_inputs
    from polymem.errors import PolymemError
    from polymem.models import load_model
    from polymem.models.evaluate import evaluate
    from polymem.recipes.data import read_named_documents

    check_outputs_not_inputs({"--json": json_out}, [("model", model), ("site", site), ("asset", table)]
                             + [("corpus", c) for c in corpus])
    from polymem.torch.device import resolve_device

    dev = resolve_device(device)  # a missing CUDA device is said before the model loads
    if threads:
        torch.set_num_threads(threads)
    site_header = _site_header(site) if site is not None else None
    if site is not None and site_header is not None:
        check_site_tokenizer(site, site_header, model)
    named = read_named_documents(corpus)
    idx = [i for i in range(len(named)) if i % heldout_every == heldout_every - 1][:max_docs]
    if not idx:
        raise PolymemError(f"--heldout-every {heldout_every} leaves no document of {len(named)}; lower it")
    docs, names = [named[i][1] for i in idx], [named[i][0] for i in idx]
    bad = [n for n, d in zip(names, docs) if "\ufffd" in d]
    if bad:
        console.print(f"note: {len(bad)} document(s) hold U+FFFD replacement characters ({escape(', '.join(bad[:3]))}"
                      f"{'…' if len(bad) > 3 else ''}): invalid UTF-8 in the file, read as replacements and scored as such",
                      highlight=False, soft_wrap=True)
    console.print(f"loading {escape(model)} …", highlight=False)
    lm = load_model(model, device=str(dev))
    console.print(escape(lm.load_line()), highlight=False)
    tpath = _table_path(site, site_header, table) if site is not None and site_header is not None else None
    attach_fn = _attacher(lm, site, tpath) if site is not None else None
    passes = 1 + (2 if site is not None else 0)
    with progress_bar(console) as prog:
        task = prog.add_task("scoring", total=None, info="")

        def on_batch(what: str, n: int) -> None:
            prog.update(task, advance=n, info=what)

        res = evaluate(lm, docs, attach=attach_fn, window=window, batch=batch, names=names, on_batch=on_batch,
                       on_start=lambda n_win: prog.update(task, total=n_win * passes))
    res["corpus"] = [str(p) for p in corpus]
    res["heldout_every"] = heldout_every
    if site is not None:
        res["site"] = str(site)
        res["table"] = str(tpath) if tpath else "(in the site file)"
    _print(res, per_doc)
    if json_out:
        atomic_write_json(json_out, res, indent=1)
        console.print(f"wrote {escape(str(json_out))}", highlight=False)


def _attacher(lm, site: Path, table):
    """A function that attaches the saved site (and its table) to the model and returns the handle."""
    from polymem.torch.attach import load_attached

    return lambda: load_attached(lm.model, site, table, tokenizer=lm.tokenizer)


def _site_header(site: Path) -> dict:
    import os

    from polymem._io import read_json
    from polymem.errors import FormatError, PolymemError

    f = site / "site.json"
    if not os.path.lexists(f):
        raise PolymemError(f"{str(site)!r} has no site.json; pass the folder written by `polymem train --model` (--site)")
    header = read_json(f, what="site header", fix="pass the folder written by `polymem train --model` or handle.save")
    if not isinstance(header, dict) or not isinstance(header.get("table"), dict):
        raise FormatError(f"{str(f)!r} is not a site header (no 'table' object); pass the folder written by "
                          "`polymem train --model` or handle.save")
    return header


def _table_path(site: Path, header: dict, table: str | None) -> str | None:
    """The table asset a site is scored with: ``--table``, else the path its header records; None when the site
    folder holds its (trained) table. A header naming no table path (or naming it as anything but a string) is one
    error line saying to pass --table."""
    from polymem.errors import FormatError, PolymemError

    th = header["table"]
    if table is None and th.get("saved"):
        return None  # the site file holds its (trained) table
    if table:
        return table
    source = th.get("source")
    path = source.get("path") if isinstance(source, dict) else None
    if path is not None and not (isinstance(path, str) and path):
        raise FormatError(f"{str(site)!r}: site.json names the table path {path!r}; expected a non-empty string (the "
                          "table asset's path). Pass --table TABLE")
    if not path:
        raise PolymemError(f"{str(site)!r} names no table path; pass --table")
    return path


def check_site_tokenizer(site: Path, header: dict, model: str) -> None:
    """Before a builtin model loads: the site must have been trained with that model's tokenizer (its
    fingerprint, read from the tokenizer alone). Other model specs are checked when the site attaches."""
    from polymem.errors import SpecMismatchError
    from polymem.models.registry import BUILTIN_MODELS

    want = (header.get("tokenizer") or {}) if isinstance(header.get("tokenizer"), dict) else {}
    if model not in BUILTIN_MODELS or not want.get("fingerprint"):
        return
    from polymem.models.cache import model_tokenizer_file
    from polymem.tokenizers import load_tokenizer

    tok = load_tokenizer(str(model_tokenizer_file(model)))
    if tok.fingerprint != want["fingerprint"]:
        raise SpecMismatchError(
            f"{str(site)!r} was trained for tokenizer {want.get('name')!r} (fingerprint {str(want['fingerprint'])[:16]}…), "
            f"{model} reads with {tok.name!r} ({tok.fingerprint[:16]}…): a site belongs to one model. To use its "
            f"table with {model}, train a site for it over the frozen table: polymem attach --model {model} "
            f"--asset TABLE --corpus … --out {model}.site")


def _print(res: dict, per_doc: bool) -> None:
    cols = [k for k in ("alone", "with_table", "table_off") if k in res]
    t = Table(title=f"{escape(res['model'])}: bits per byte ({res['documents']} documents, {res['windows']} windows of "
                    f"≤ {res['window']} tokens from {'BOS' if res['bos'] is not None else 'the first token'})",
              title_justify="left")
    t.add_column("document")
    t.add_column("bytes", justify="right")
    for c in cols:
        t.add_column(c.replace("_", " "), justify="right")
    if per_doc:
        for i, d in enumerate(res[cols[0]]["per_doc"]):
            t.add_row(escape(str(d["doc"])), f"{d['bytes']:,}",
                      *[("—" if res[c]["per_doc"][i]["bpb"] is None else f"{res[c]['per_doc'][i]['bpb']:.4f}") for c in cols])
    t.add_row("all", f"{res[cols[0]]['bytes']:,}", *[f"{res[c]['bpb']:.4f}" for c in cols])
    console.print(t)
    if "with_table" in res:
        a, w = res["alone"]["bpb"], res["with_table"]["bpb"]
        console.print(f"the table changes bits per byte by {w - a:+.4f} ({(w - a) / a:+.2%} of the model's {a:.4f})",
                      highlight=False)


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_cmd)
