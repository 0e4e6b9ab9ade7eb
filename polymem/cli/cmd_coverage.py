"""`polymem coverage`: how much of a target tokenizer's n-gram memory a donor tokenizer's table can serve."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from polymem.cli._needs import check_needs
from polymem.cli._options import StorageOptionsOpt, local_path, sample_corpus, tokenizer_spec

_local_file = local_path("a local file")


class _InvalidUtf8(str, Enum):
    REPLACE = "replace"  # (upper case: a member named replace would hide str.replace)
    SKIP = "skip"


class _StdinFormat(str, Enum):
    text = "text"
    jsonl = "jsonl"


def register(app: typer.Typer) -> None:
    app.command("coverage")(coverage_cmd)


def coverage_cmd(
    paths: Annotated[list[str], typer.Argument(
        parser=sample_corpus,
        help="Text files, directories (recursively: .txt .md .jsonl and .gz of these), .jsonl(.gz) files with a "
             "text field, - for stdin, or sample:pydocs (shipped). One document per file or per JSONL line.",
        metavar="PATH")],
    target: Annotated[str, typer.Option("--target", "-t", parser=tokenizer_spec, help="The tokenizer whose n-grams "
                                        "should be served (e.g. mistral-v1, gemma3-270m, a tokenizer.json, a .model, "
                                        "a .tiktoken).")],
    reference: Annotated[str, typer.Option("--reference", "-r", parser=tokenizer_spec, help="The donor tokenizer "
                                           "whose table would serve them (e.g. cl100k_base, smollm2-135m).")],
    max_n: Annotated[int, typer.Option("--max-n", help="Measure target (and reference) n-gram orders 1..max-n "
                                       "(1-32; the Tokenizer-Agnostic Engram paper uses 7).")] = 7,
    json_out: Annotated[Path | None, typer.Option("--json", parser=_local_file, help="Write the report as JSON to "
                                                  "this file (- for stdout); schema in docs/coverage.md.")] = None,
    csv_out: Annotated[Path | None, typer.Option("--csv", parser=_local_file, help="Write one row per target order as CSV.")] = None,
    plot_out: Annotated[Path | None, typer.Option("--plot", parser=_local_file, help="Write a stacked-bar PNG like Fig. 2 of the Tokenizer-Agnostic Engram paper.")]
    = None,
    workers: Annotated[int, typer.Option("--workers", "-j", min=1, help="Count on N threads of this process "
                                         "(the SentencePiece and tiktoken tokenizers and the kernels release the "
                                         "GIL; no Dask needed); 1 = one after the other.")] = 1,
    processes: Annotated[bool, typer.Option("--processes", help="With --workers N: a local Dask cluster of N "
                                            "worker processes instead of threads (no shared interpreter; ~3 s of "
                                            "start-up; needs polymem[dask]).")] = False,
    dask: Annotated[str | None, typer.Option("--dask", metavar="ADDRESS", help="Count on an existing Dask "
                                             "cluster, e.g. tcp://scheduler:8786.")] = None,
    dask_timeout: Annotated[float, typer.Option("--dask-timeout", min=0.1, max=3600, metavar="SECONDS",
                                                help="With --dask: give up connecting after this long.")] = 30.0,
    partition_mb: Annotated[float | None, typer.Option("--partition-mb", help="MB of text per partition (the "
                                                       "unit of work and of memory; default 4 in one process, 2 "
                                                       "with --workers or on Dask).")] = None,
    scratch: Annotated[str | None, typer.Option("--scratch", metavar="DIR|URL", help="Where the occurrence pass "
                                                "writes its key files (default: a temporary directory here; "
                                                "a multi-machine cluster needs a shared path or s3:// URL).")]
    = None,
    storage_options: StorageOptionsOpt = None,
    text_field: Annotated[str, typer.Option("--text-field", help="The JSONL field holding the text.")] = "text",
    exact_bytes: Annotated[bool, typer.Option("--exact-bytes", help="Compare n-grams as byte strings instead of "
                                              "64-bit hashes (slow reference path; same results).")] = False,
    occurrence: Annotated[bool, typer.Option("--occurrence/--no-occurrence", help="Also measure the "
                                             "occurrence-weighted corpus-level coverage (keeps the corpus's "
                                             "distinct reference n-gram hashes in memory).")] = True,
    invalid_utf8: Annotated[_InvalidUtf8, typer.Option("--invalid-utf8", help="Invalid UTF-8 in a document: "
                                                       "replace with U+FFFD (counted) or skip the document.")]
    = _InvalidUtf8.REPLACE,
    stdin_format: Annotated[_StdinFormat, typer.Option("--stdin-format", help="What - reads: one text document, "
                                                       "or JSONL lines.")] = _StdinFormat.text,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar or table.")] = False,
) -> None:
    """How many of the TARGET tokenizer's n-grams did the REFERENCE tokenizer ever write? (Table 2 of the Tokenizer-Agnostic Engram paper)

    Per document, the share of the target's unique n-grams (per order n) found among the reference's n-grams
    of any order, compared by their bytes; plus the breakdown by reference order, the occurrence-weighted
    corpus-level share, and the same measure under Engram's XOR token-id hash. See docs/coverage.md.
    """
    check_needs("coverage", locals())

    from rich.console import Console

    from polymem._io import check_outputs_not_inputs
    from polymem.analysis.coverage import check_max_n, coverage
    from polymem.cli._display import escape
    from polymem.corpus import Corpus

    check_outputs_not_inputs({"--json": json_out, "--csv": csv_out, "--plot": plot_out},
                             [("corpus", p) for p in paths] + [("tokenizer", target), ("tokenizer", reference)])
    check_max_n(max_n)
    if dask is not None and workers != 1:
        raise typer.BadParameter(f"--dask {dask} and --workers {workers} both choose where to count; pass one "
                                 "(--dask for an existing cluster, --workers N for threads of this process)",
                                 param_hint="'--dask' / '--workers'")
    if processes and dask is not None:
        raise typer.BadParameter(f"--processes chooses how --workers N runs a local cluster; the cluster at {dask} "
                                 "has the workers it has: drop --processes", param_hint="'--processes'")
    if processes and workers == 1:
        raise typer.BadParameter("--processes chooses how --workers N runs its N workers; add --workers N (N ≥ 2) "
                                 "or drop --processes", param_hint="'--processes'")
    from polymem.cli._options import parse_storage_options

    options = parse_storage_options(storage_options)
    to_stdout = str(json_out) == "-"
    out = Console(stderr=to_stdout)
    err = Console(stderr=True)
    corpus = Corpus(paths, text_field=text_field, invalid_utf8=invalid_utf8.value,
                    stdin_format=stdin_format.value)
    with _client(dask, dask_timeout) as client, _progress(err, quiet) as update:
        report = coverage(target, reference, corpus, max_n, exact_bytes=exact_bytes, occurrence=occurrence,
                          workers=workers, processes=processes, client=client, partition_mb=partition_mb,
                          scratch=scratch, storage_options=options, progress=update)
    if to_stdout:
        sys.stdout.write(report.to_json() + "\n")
    elif json_out:
        report.to_json(json_out)
    if csv_out:
        report.to_csv(csv_out)
    if plot_out:
        report.plot(plot_out)
    if not quiet:
        render(report, out)
        for what, path in (("JSON", None if to_stdout else json_out), ("CSV", csv_out), ("plot", plot_out)):
            if path:
                out.print(f"[dim]{what} written to {escape(str(path))}[/]", soft_wrap=True)


@contextlib.contextmanager
def _client(address: str | None, timeout: float) -> Iterator[Any]:
    """A distributed.Client connected to ``address`` within ``timeout`` seconds (None: no client)."""
    if address is None:
        yield None
        return
    from polymem.analysis.coverage.dist import connect

    with connect(address, timeout=timeout) as client:
        yield client


class _progress:
    """A rich progress line (documents, docs/s, MB, MB/s) on stderr; a no-op callback when quiet."""

    def __init__(self, console: Any, quiet: bool) -> None:
        self.console, self.quiet = console, quiet

    def __enter__(self) -> Any:
        if self.quiet:
            return None
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.p = Progress(SpinnerColumn(), TextColumn("{task.description}"), TextColumn("{task.fields[stats]}"),
                          TimeElapsedColumn(), console=self.console, transient=True)
        self.p.__enter__()
        self.task = self.p.add_task("counting", stats="")
        self.t0 = time.perf_counter()

        def update(docs: int, nbytes: int) -> None:
            dt = max(time.perf_counter() - self.t0, 1e-9)
            self.p.update(self.task, stats=f"{docs} docs ({docs / dt:.1f}/s), {nbytes / 1e6:.1f} MB "
                                           f"({nbytes / 1e6 / dt:.2f} MB/s)")

        return update

    def __exit__(self, *exc: Any) -> None:
        if not self.quiet:
            self.p.__exit__(*exc)


# the headline measures, named once for `polymem coverage` and `polymem demo` (docs/coverage.md defines them)
MEASURES = ("per-doc mean", "occurrence", "XOR ids")
MEASURES_CAPTION = ("per-doc mean: share of each document's distinct target n-grams found among the reference's; "
                    "occurrence: share of target n-gram positions served (what a transferred table reads); "
                    "XOR ids: per-doc mean under Engram's token-id XOR hash")


def render(report: Any, console: Any) -> None:
    """The terminal view: headline table, by-reference-order table, fidelity and skipped summary."""
    from rich.table import Table

    from polymem.cli._display import controls, escape

    def f(v: float | None) -> str:
        return "–" if v is None else f"{v:.3f}"

    N = report.max_n
    t = Table(title=escape(f"coverage of {report.target.name} n-grams by {report.reference.name} "
                           f"({report.docs} docs, {report.method})"), title_justify="left",
              caption=MEASURES_CAPTION + "; pooled: per-doc mean over all documents as one", caption_justify="left")
    for col in ("n", MEASURES[0], "pooled", MEASURES[1], MEASURES[2], "unique target n-grams"):
        t.add_column(col, justify="right")
    for i in range(N):
        occ = None if report.occurrence_weighted is None else report.occurrence_weighted[i]
        t.add_row(str(i + 1), f(report.per_doc_mean[i]), f(report.pooled[i]), f(occ), f(report.xor_baseline[i]),
                  f"{report.unique_target_ngrams[i]:,}")
    console.print(t)
    b = Table(title="by smallest reference order m (per-doc mean; rows sum to the per-doc mean)",
              title_justify="left")
    b.add_column("target n", justify="right")
    for m in range(N):
        b.add_column(f"m={m + 1}", justify="right")
    for i in range(N):
        b.add_row(str(i + 1), *(f(report.by_reference_n[i][m]) for m in range(N)))
    console.print(b)
    tok = report.tokens
    console.print(
        controls(f"{report.docs} documents, {report.bytes / 1e6:.2f} MB; tokens: {report.target.name} {tok['target']:,}, "
                 f"{report.reference.name} {tok['reference']:,}; {report.elapsed_s:.1f} s with {report.workers} worker(s)"),
        markup=False,
    )
    for side in ("target", "reference"):
        fid = report.fidelity[side]
        name = getattr(report, side).name
        state = ("[green]byte-faithful[/]" if fid["faithful"]
                 else f"[red]NOT byte-faithful[/] ({escape(str(fid['first_mismatch']))})")
        extra = f", {fid['dummy_prefix']} with a dummy-prefix space" if fid["dummy_prefix"] else ""
        console.print(f"fidelity {side} {escape(name)}: {state} on {fid['docs']} docs ({fid['exact']} exact{extra})")
    if report.replaced_utf8:
        console.print(f"[yellow]{report.replaced_utf8} document(s) had invalid UTF-8, replaced by U+FFFD[/]")
    if report.skipped:
        console.print(f"[yellow]skipped {len(report.skipped)}:[/]")
        for s in report.skipped[:10]:
            console.print(f"  {controls(s['source'])}: {controls(s['reason'])}", highlight=False, markup=False)
        if len(report.skipped) > 10:
            console.print(f"  … and {len(report.skipped) - 10} more (all listed in --json)")
