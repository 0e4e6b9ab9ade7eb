"""``polymem build-cache`` and ``polymem demo``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from polymem.cli._display import escape
from polymem.cli._needs import check_needs
from polymem.cli._options import JsonOut, Normalizer, NormalizerOpt, Tokenizer, local_path, tokenizer_spec

console = Console()


def build_cache(
    tokenizer: Tokenizer,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", parser=local_path("a local file"), help="Where to write the cache (.npz). Default: the user cache dir.")] = None,
    max_n: Annotated[int, typer.Option("--max-n", min=1, max=32, help="Highest n-gram order to check on the sample (the cache itself serves any order).")] = 7,
    normalizer: NormalizerOpt = Normalizer("none"),
    json_out: JsonOut = None,
) -> None:
    """Hash every token of a tokenizer: C(t), byte length L(t), base powers. Saves a cache and reports it."""
    check_needs("build-cache", locals())

    from polymem import HashSpec, TokenHashes
    from polymem.hash.token_hashes import default_cache_path
    from polymem.samples import sample_text
    from polymem.tokenizers import check_fidelity, load_tokenizer

    from polymem._io import check_output_path, check_outputs_not_inputs
    from polymem.errors import PolymemError

    check_outputs_not_inputs({"--output": output, "--json": json_out}, [("tokenizer", tokenizer)])
    if json_out is not None and output is not None and json_out.absolute() == output.absolute():
        raise PolymemError(f"--json and --output are both {str(output)!r}; give them two paths")
    t0 = time.perf_counter()
    tok = load_tokenizer(tokenizer)
    load_s = time.perf_counter() - t0
    spec = HashSpec(normalizer=normalizer.value)
    check_output_path(output or default_cache_path(tok.name, tok.fingerprint, spec))
    cache = TokenHashes.build(tok, spec)
    fid = check_fidelity(tok, [sample_text()])
    path = cache.save(output or default_cache_path(tok.name, tok.fingerprint, spec))
    sample_ids = tok.encode(sample_text())
    _, valid = cache.ngram_hashes(sample_ids, max_n)

    t = Table(title=f"token cache for {escape(tok.name)}", show_header=False, title_justify="left")
    t.add_row("family", escape(tok.family))
    t.add_row("vocab size", f"{cache.vocab_size:,}")
    t.add_row("special / no-byte ids", f"{cache.num_special:,}")
    t.add_row("longest token", f"{int(cache.L.max())} bytes")
    t.add_row("fingerprint", escape(tok.fingerprint))
    t.add_row("hash spec", f"{spec.spec_id} (byte-poly64 v{spec.version}, normalizer {spec.normalizer})")
    verdict = "faithful" if fid.faithful else f"[red]LOSSY[/] ({escape(str(fid.first_mismatch))})"
    if fid.faithful and fid.dummy_prefix:
        verdict += " (with SentencePiece dummy-prefix space)"
    t.add_row("byte fidelity on sample", verdict)
    t.add_row("sample", f"{len(sample_ids):,} tokens, {int(valid.sum()):,} valid n-grams (n ≤ {max_n})")
    t.add_row("time", f"load {load_s:.2f} s, build {cache.build_seconds * 1000:.0f} ms")
    console.print(t)
    console.print(f"written {escape(str(path))}", soft_wrap=True, highlight=False)
    if json_out is not None:
        from polymem._io import atomic_write_json

        atomic_write_json(json_out, {
            "tokenizer": tok.name, "family": tok.family, "fingerprint": tok.fingerprint, "vocab_size": int(cache.vocab_size),
            "special_ids": int(cache.num_special), "longest_token_bytes": int(cache.L.max()),
            "hash_spec": {"id": spec.spec_id, "version": spec.version, "normalizer": spec.normalizer},
            "faithful": bool(fid.faithful), "first_mismatch": None if fid.faithful else str(fid.first_mismatch),
            "dummy_prefix": bool(fid.dummy_prefix), "sample_tokens": int(len(sample_ids)),
            "sample_valid_ngrams": int(valid.sum()), "max_n": max_n, "load_s": load_s,
            "build_s": cache.build_seconds, "path": str(path)}, indent=1)
        console.print(f"wrote {escape(str(json_out))}", soft_wrap=True, highlight=False)


def demo(
    a: Annotated[str, typer.Option("--a", parser=tokenizer_spec, help="First tokenizer.")] = "cl100k_base",
    b: Annotated[str, typer.Option("--b", parser=tokenizer_spec, help="Second tokenizer (another family).")] = "mistral-v1",
    text: Annotated[Optional[Path], typer.Option(parser=local_path("a local text file", exists=True, file=True), help="Text file (default: the embedded multilingual sample).")] = None,
    max_n: Annotated[int, typer.Option("--max-n", min=1, max=32)] = 7,
) -> None:
    """Build caches for two tokenizers of different families and show that byte-equivalent n-grams hash alike."""
    check_needs("demo", locals())

    from polymem import HashSpec, TokenHashes
    from polymem.analysis.crosscheck import crosscheck
    from polymem.samples import sample_text
    from polymem.tokenizers import check_fidelity, load_tokenizer

    from polymem._io import read_bounded
    from polymem.sources import MAX_DOCUMENT_BYTES
    from polymem.errors import PolymemError

    body = (read_bounded(text, what="--text file", max_bytes=MAX_DOCUMENT_BYTES, error=PolymemError,
                         fix="pass a UTF-8 text file").decode("utf-8") if text else sample_text())
    spec = HashSpec()
    sides = []
    for name in (a, b):
        tok = load_tokenizer(name)
        cache = TokenHashes.build(tok, spec)
        ids = tok.encode(body)
        fid = check_fidelity(tok, [body])
        console.print(
            f"[bold]{escape(tok.name)}[/] ({escape(tok.family)}): vocab {tok.vocab_size:,}, cache built in "
            f"{cache.build_seconds * 1000:.0f} ms, {len(ids):,} tokens on the text, byte fidelity "
            f"{'faithful' if fid.faithful else 'LOSSY'}"
        )
        sides.append((tok, cache, ids))
    (ta, ca, ia), (tb, cb, ib) = sides
    r = crosscheck(ca, ta.all_token_bytes(), ia, cb, tb.all_token_bytes(), ib, max_n)
    table = Table(title=escape(f"byte-equivalent n-grams, {ta.name} vs {tb.name}: same bytes, different order n, same hash"))
    for col in ("bytes", f"n in {ta.name}", f"n in {tb.name}", "hash"):
        table.add_column(escape(col))
    for bts, oa, ob, h in r.examples[:8]:
        table.add_row(escape(repr(bts.decode("utf-8", "replace"))), str(oa), str(ob), f"0x{h:016x}")
    console.print(table)
    console.print(
        f"{r.shared_distinct:,} distinct byte strings occur as an n-gram (n ≤ {max_n}) in both streams; "
        f"{r.pairs:,} byte-equal pairs compared, [bold]{r.mismatched} with different hashes[/]; "
        f"{r.collisions} 64-bit collisions among {r.distinct_ngrams:,} distinct n-grams."
    )
    if r.mismatched or r.collisions:
        raise typer.Exit(1)
    console.print("[green]byte-equivalent n-grams hash alike across tokenizer families.[/]")

    from polymem import coverage

    cov = coverage(tb, ta, [body], max_n=max_n)
    from polymem.cli.cmd_coverage import MEASURES, MEASURES_CAPTION

    ct = Table(title=escape(f"what a {ta.name} table could serve to {tb.name} on this text (polymem coverage)"),
               caption=MEASURES_CAPTION, caption_justify="left")
    ct.add_column("n")
    for col in MEASURES:
        ct.add_column(col, justify="right")
    for n in range(max_n):
        ct.add_row(str(n + 1), f"{cov.per_doc_mean[n]:.2f}", f"{cov.occurrence_weighted[n]:.2f}", f"{cov.xor_baseline[n]:.2f}")
    console.print(ct)


def register(app: typer.Typer) -> None:
    app.command("build-cache")(build_cache)
    app.command("demo")(demo)
