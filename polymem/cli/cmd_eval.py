"""``polymem eval``: held-out bits per byte of a pretrained model on a corpus — alone, with a table, table off."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from polymem.cli._display import escape
from polymem.cli._needs import check_needs
from polymem.cli._options import BackbonePrecision, CorpusFiles, Device, JsonOut, ModelOpt, Precision, Threads, apply_threads, local_path

console = Console()


def progress_bar(con: Console):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                    TimeElapsedColumn(), TimeRemainingColumn(), console=con)


def eval_cmd(
    model: ModelOpt,
    corpus: CorpusFiles,
    site: Annotated[Optional[list[Path]], typer.Option("--site", parser=local_path("a local site folder", exists=True), help="A site folder (from `polymem train --model`, `polymem attach` or handle.save): its projection, and the table it names. Repeatable: every site is scored in one call, against one score of the model alone.")] = None,
    table: Annotated[Optional[str], typer.Option("--asset", "--table", help="The table asset of the one --site (default: the path the site records).")] = None,
    table_off: Annotated[bool, typer.Option("--table-off", help="Also score each site with its table switched off (equals the model alone; a check of the site's wiring).")] = False,
    heldout_every: Annotated[Optional[int], typer.Option(min=1, help="Score every k-th document (the held-out split of `polymem train`); 1 scores every document. Default: a site's own split where its table's provenance names this corpus, else 1.")] = None,
    max_docs: Annotated[Optional[int], typer.Option(min=1, help="Score at most this many documents.")] = None,
    eval_tokens: Annotated[Optional[int], typer.Option("--eval-tokens", min=1, help="Score about N tokens in all: the documents in order, each cut to its first N/8 tokens (the rule train --model, attach and transfer --model score by: the same --eval-tokens on the same split scores the same text). Default: every token.")] = None,
    max_doc_tokens: Annotated[Optional[int], typer.Option("--max-doc-tokens", min=1, help="Score each document's first N tokens only (a cheap sample of long documents; with --eval-tokens, in place of its N/8).")] = None,
    window: Annotated[int, typer.Option(min=2, help="Predicted tokens per window (each window starts from BOS).")] = 512,
    batch: Annotated[int, typer.Option(min=1, help="Windows per forward.")] = 4,
    per_doc: Annotated[bool, typer.Option("--per-doc", help="Print one row per document.")] = False,
    precision: BackbonePrecision = Precision("auto"),
    threads: Threads = None,
    device: Device = "auto",
    json_out: JsonOut = None,
) -> None:
    """Held-out bits per byte of a pretrained model on a corpus, per document and overall: the model alone (scored
    once) and, with --site (repeatable), with each site's table attached (--table-off: and switched off)."""
    check_needs("eval", locals())

    import torch

    from polymem._io import atomic_write_json, check_outputs_not_inputs
    from polymem.cli._precision import backbone_precision
    from polymem.errors import PolymemError
    from polymem.models import load_model
    from polymem.models.evaluate import evaluate
    from polymem.recipes.data import read_named_documents

    sites = list(site or [])
    seen: dict[str, Path] = {}
    for sp in sites:
        key = str(sp.resolve())
        if key in seen:
            raise PolymemError(f"--site {str(sp)!r} is given twice (the same folder as --site {str(seen[key])!r}); "
                               "give each site once")
        seen[key] = sp
    if table is not None and len(sites) != 1:
        raise PolymemError(f"--asset {table!r} names the table of one site; it was given with {len(sites)} --site "
                           "options. Pass exactly one --site with it, or drop --asset (each site reads the table it records)")
    check_outputs_not_inputs({"--json": json_out}, [("model", model), ("asset", table)]
                             + [("site", sp) for sp in sites] + [("corpus", c) for c in corpus])
    from polymem.torch.device import resolve_device

    dev = resolve_device(device)  # a missing CUDA device is said before the model loads
    apply_threads(threads, console)
    headers = [_site_header(sp) for sp in sites]
    for sp, hd in zip(sites, headers):
        check_site_tokenizer(sp, hd, model)
    tpaths = [_table_path(sp, hd, table, "--asset") for sp, hd in zip(sites, headers)]
    heldout_every = _heldout_rule(heldout_every, corpus, sites, tpaths)
    named = read_named_documents(corpus)
    idx = [i for i in range(len(named)) if i % heldout_every == heldout_every - 1][:max_docs]
    if not idx:
        raise PolymemError(f"--heldout-every {heldout_every} leaves no document of {len(named)}; lower it")
    docs, names = [named[i][1] for i in idx], [named[i][0] for i in idx]
    sample = None
    if eval_tokens is not None or max_doc_tokens is not None:  # the scoring rule every command shares
        from polymem.models.evaluate import scoring_set

        sample = (eval_tokens, max_doc_tokens)
    bad = [n for n, d in zip(names, docs) if "\ufffd" in d]
    if bad:
        console.print(f"note: {len(bad)} document(s) hold U+FFFD replacement characters ({escape(', '.join(bad[:3]))}"
                      f"{'…' if len(bad) > 3 else ''}): invalid UTF-8 in the file, read as replacements and scored as such",
                      highlight=False, soft_wrap=True)
    prec = backbone_precision(precision.value, dev)
    console.print(f"loading {escape(model)} …", highlight=False)
    lm = load_model(model, device=str(dev), precision=prec)
    console.print(escape(lm.load_line()), highlight=False)
    if sample is not None:
        picked = scoring_set(lm.tokenizer, docs, eval_tokens, doc_tokens=max_doc_tokens)
        docs, names = [t for _, t in picked], [names[i] for i, _ in picked]
    todo = [(str(sp), _attacher(lm, sp, tp)) for sp, tp in zip(sites, tpaths)]
    with progress_bar(console) as prog:
        task = prog.add_task("scoring", total=None, info="")

        def on_batch(what: str, n: int) -> None:
            prog.update(task, advance=n, info=what)

        res = evaluate(lm, docs, sites=todo, table_off=table_off, window=window, batch=batch, names=names,
                       on_batch=on_batch, on_start=lambda n: prog.update(task, total=n))
    res["eval_tokens"] = eval_tokens
    res["max_doc_tokens"] = max_doc_tokens if max_doc_tokens is not None or eval_tokens is None else max(eval_tokens // 8, 1)
    res["corpus"] = [str(p) for p in corpus]
    res["heldout_every"] = heldout_every
    for got, tp in zip(res.get("sites", []), tpaths):
        got["table"] = str(tp) if tp else "(in the site file)"
    if len(sites) == 1:
        res["site"], res["table"] = res["sites"][0]["site"], res["sites"][0]["table"]
    _print(res, per_doc)
    if json_out:
        atomic_write_json(json_out, res, indent=1)
        console.print(f"wrote {escape(str(json_out))}", highlight=False)


def _heldout_rule(given: int | None, corpus: list[Path], sites: list[Path], tables: list[str | None]) -> int:
    """The held-out split eval scores: ``--heldout-every`` when given, else the split a site's table was trained
    with when its provenance names this corpus (said in one line), else 1 (every document). A split that scores
    documents a site's table trained on is a warning naming the split that would not."""
    from polymem.torch.tablefile import open_table

    splits = set()
    for sp, tp in zip(sites, tables):
        if tp is None:
            continue
        prov = getattr(open_table(tp), "provenance", None) or {}  # a missing or broken table is said before the model loads
        k = prov.get("heldout_every")
        if isinstance(k, int) and not isinstance(k, bool) and k >= 0 and _same_corpus(prov.get("corpus"), corpus):
            splits.add((k, str(sp)))
    if given is None:
        ks = sorted({k for k, _ in splits})
        if len(ks) == 1 and ks[0] >= 1:
            who = ", ".join(sorted({s for _, s in splits}))
            console.print(f"scoring the held-out documents of the table's training split (every {ks[0]}th document of "
                          f"this corpus, as recorded in the provenance of {escape(who)}'s table; --heldout-every to change)",
                          highlight=False, soft_wrap=True)
            return ks[0]
        given = 1
    for k, who_site in sorted(splits):
        if k == 0 or given % k != 0:  # every k-th is held out: only multiples of k score held-out documents alone
            what = "every document" if k == 0 else f"every document but each {k}th"
            console.print(f"warning: --heldout-every {given} scores documents {escape(who_site)}'s table trained on (it read "
                          f"{what} of this corpus){'' if k == 0 else f'; --heldout-every {k} scores only its held-out ones'}",
                          highlight=False, soft_wrap=True)
    return given


def _same_corpus(recorded: object, corpus: list[Path]) -> bool:
    """Does a provenance's corpus (the ", "-joined paths a training run was given) name the same files as
    ``corpus``? Compared as given and as resolved paths."""
    if not isinstance(recorded, str) or not recorded:
        return False

    def norm(x: str) -> set[str]:
        p = Path(x)
        return {x, str(p.resolve())} if p.exists() else {x}

    want = [norm(x) for x in recorded.split(", ")]
    have = [norm(str(c)) for c in corpus]
    return len(want) == len(have) and all(w & h for w, h in zip(want, have))


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


def _table_path(site: Path, header: dict, table: str | None, flag: str = "--table") -> str | None:
    """The table asset a site is scored with: ``table`` (the command's ``flag``), else the one the site names
    (:func:`polymem.torch.sitefile.find_table`: its recorded path, relative to the site or absolute, or a table
    inside or beside it); None when the site folder holds its (trained) table. Called before the model loads, so a
    missing table is one line naming ``flag`` first."""
    from polymem.torch.sitefile import find_table
    from polymem.torch.tablefile import open_table

    if table:
        open_table(table)  # a missing or broken table is said now
        return table
    return find_table(site, header, fix=f"pass {flag} TABLE")


@functools.lru_cache(maxsize=4)
def _builtin_tokenizer(model: str) -> Any:
    """A builtin model's tokenizer, read from its file alone (once per process: eval checks every --site with it)."""
    from polymem.models.cache import model_tokenizer_file
    from polymem.tokenizers import load_tokenizer

    return load_tokenizer(str(model_tokenizer_file(model)))


def check_site_tokenizer(site: Path, header: dict, model: str) -> None:
    """Before a builtin model loads: the site must have been trained with that model's tokenizer (its
    fingerprint, read from the tokenizer alone). Other model specs are checked when the site attaches."""
    from polymem.errors import SpecMismatchError
    from polymem.models.registry import BUILTIN_MODELS

    want = (header.get("tokenizer") or {}) if isinstance(header.get("tokenizer"), dict) else {}
    if model not in BUILTIN_MODELS or not want.get("fingerprint"):
        return
    tok = _builtin_tokenizer(model)
    if tok.fingerprint != want["fingerprint"]:
        raise SpecMismatchError(
            f"{str(site)!r} was trained for tokenizer {want.get('name')!r} (fingerprint {str(want['fingerprint'])[:16]}…), "
            f"{model} reads with {tok.name!r} ({tok.fingerprint[:16]}…): a site belongs to one model. To use its "
            f"table with {model}, train a site for it over the frozen table: polymem attach --model {model} "
            f"--asset TABLE --corpus … --out {model}.site")


def _print(res: dict, per_doc: bool) -> None:
    sites = res.get("sites", [])
    cols: list[tuple[str, dict]] = [("alone", res["alone"])]
    for i, got in enumerate(sites):
        tag = "" if len(sites) == 1 else f" {i + 1}"
        cols.append((f"with table{tag}", got["with_table"]))
        if "table_off" in got:
            cols.append((f"table off{tag}", got["table_off"]))
    a = res["alone"]
    cap = "" if res.get("max_doc_tokens") is None else f", each document's first {res['max_doc_tokens']:,} tokens"
    if res.get("eval_tokens") is not None:
        cap += f" up to {res['eval_tokens']:,} in all"
    t = Table(title=f"{escape(res['model'])}: bits per byte ({res['documents']} documents, {a['tokens']:,} tokens, "
                    f"{a['bytes']:,} bytes scored in {res['windows']} windows of ≤ {res['window']} tokens from "
                    f"{'BOS' if res['bos'] is not None else 'the first token'}{cap}; {res.get('precision', 'fp32')})",
              title_justify="left")
    t.add_column("document")
    t.add_column("bytes", justify="right")
    for name, _ in cols:
        t.add_column(name, justify="right")
    if per_doc:
        for i, d in enumerate(a["per_doc"]):
            t.add_row(escape(str(d["doc"])), f"{d['bytes']:,}",
                      *[("—" if c["per_doc"][i]["bpb"] is None else f"{c['per_doc'][i]['bpb']:.4f}") for _, c in cols])
    t.add_row("all", f"{a['bytes']:,}", *[f"{c['bpb']:.4f}" for _, c in cols])
    console.print(t)
    for i, got in enumerate(sites):
        w = got["with_table"]["bpb"]
        who = "the table" if len(sites) == 1 else f"site {i + 1} ({escape(got['site'])})"
        console.print(f"{who} changes bits per byte by {w - a['bpb']:+.4f} ({(w - a['bpb']) / a['bpb']:+.2%} of the "
                      f"model's {a['bpb']:.4f})", highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_cmd)
