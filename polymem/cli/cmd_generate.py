"""``polymem generate``: decode text with a pretrained model, alone or with its trained site and table, the table
held in memory or read from disk through the page service; ends with tokens/s and the table's read costs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from polymem.cli._display import escape, escape_text
from polymem.cli._needs import check_needs
from polymem.cli._options import BackbonePrecision, Device, JsonOut, ModelOpt, Precision, Threads, apply_threads, local_path

console = Console()


def generate_cmd(
    model: ModelOpt,
    prompt: Annotated[Optional[list[str]], typer.Option("--prompt", "-p", help="A prompt; repeatable.")] = None,
    prompts: Annotated[Optional[Path], typer.Option("--prompts", parser=local_path("a local file", exists=True, file=True), help="A UTF-8 text file, one prompt per line (blank lines skipped).")] = None,
    site: Annotated[Optional[Path], typer.Option("--site", parser=local_path("a local site folder", exists=True), help="A site folder (from `polymem train --model`, `polymem attach` or handle.save); without it, the model alone.")] = None,
    asset: Annotated[Optional[str], typer.Option("--asset", help="The table asset the site reads (default: the path the site records).")] = None,
    table: Annotated[str, typer.Option("--table", help="memory: the whole table in RAM; disk: read through the page service, pages prefetched ahead of each step.")] = "memory",
    cache_mb: Annotated[float, typer.Option("--cache-mb", min=0, help="With --table disk: this process's own RAM for cached pages (MiB). Pages are read with pread, so the OS page cache holds one copy for every process on the host; 0 keeps none of the process's own (every read from the OS cache).")] = 256.0,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", "-n", min=1, max=1_000_000, help="New tokens per prompt at most (a row stops early at the model's EOS).")] = 64,
    temperature: Annotated[float, typer.Option(min=0, help="0: greedy; above 0: sampled from softmax(logits / T).")] = 0.0,
    top_p: Annotated[float, typer.Option("--top-p", min=0, max=1, help="With --temperature > 0: nucleus sampling mass.")] = 1.0,
    seed: Annotated[int, typer.Option(min=0, max=2**63 - 1, help="Seed of the sampler.")] = 0,
    batch: Annotated[int, typer.Option(min=1, max=4096, help="Prompts decoded together (prompts of equal token length are batched).")] = 1,
    precision: BackbonePrecision = Precision("auto"),
    threads: Threads = None,
    device: Device = "auto",
    json_out: JsonOut = None,
) -> None:
    """Generate text from prompts with a pretrained model and, with --site, its memory table; streams the text,
    then prints tokens/s, time waiting on table reads per token and the page-cache hit rate."""
    check_needs("generate", locals())
    import torch

    from polymem._io import atomic_write_json, check_outputs_not_inputs
    from polymem.cli.cmd_eval import _site_header, _table_path, check_site_tokenizer
    from polymem.errors import PolymemError
    from polymem.models import load_model
    from polymem.models.generate import Decoding, generate
    from polymem.torch.device import resolve_device

    if table not in ("memory", "disk"):
        raise PolymemError(f"--table {table!r} is not a table placement; use memory or disk")
    if site is None and (asset is not None or table != "memory"):
        raise PolymemError("--asset and --table disk read a site's table; pass --site SITE (or drop them for the model alone)")
    check_outputs_not_inputs({"--json": json_out}, [("model", model), ("site", site), ("asset", asset),
                                                     ("prompts", prompts)])
    from polymem.serve.service import check_cache_mb

    check_cache_mb(cache_mb, "--cache-mb")  # inf or 1e30 said now, not after the model loads
    texts = list(prompt or [])
    if prompts is not None:
        from polymem.models.generate import read_prompts

        texts += read_prompts(prompts)
    if not texts:
        raise PolymemError("no prompt given; pass --prompt TEXT (repeatable) or --prompts FILE (one per line)")
    decoding = Decoding(max_new_tokens, temperature, top_p, seed).check()
    dev = resolve_device(device)
    apply_threads(threads, console)
    header = _site_header(site) if site is not None else None
    tpath = None
    if site is not None and header is not None:
        check_site_tokenizer(site, header, model)
        tpath = _table_path(site, header, asset, "--asset")
        if tpath is None and table == "disk":
            raise PolymemError(f"{str(site)!r} holds its trained table in the site file, which is read into memory; "
                               "--table disk reads a table asset (train with a frozen table, or drop --table disk)")
    from polymem.cli._precision import backbone_precision

    prec = backbone_precision(precision.value, dev)
    console.print(f"loading {escape(model)} …", highlight=False)
    lm = load_model(model, device=str(dev), precision=prec)
    console.print(escape(lm.load_line()), highlight=False)
    handle = None
    if site is not None and header is not None:
        from polymem.torch.attach import load_attached

        handle = load_attached(lm.model, site, tpath, tokenizer=lm.tokenizer, in_memory=table == "memory",
                               serving={"cache_mb": cache_mb})
    stream = len(texts) == 1

    def on_text(i: int, piece: str) -> None:
        if stream:
            console.print(escape_text(piece), end="", highlight=False, soft_wrap=True)

    try:
        res = generate(lm, texts, decoding, batch=batch, handle=handle, on_text=on_text)
        stats = handle.stats() if handle is not None else {}
    finally:
        if handle is not None:
            handle.detach()
    if stream:
        console.print()
    else:
        for i, r in enumerate(res["results"]):
            console.print(f"[bold]\\[{i}][/] {escape_text(r.prompt)}[bold]{escape_text(r.text)}[/]", highlight=False,
                          soft_wrap=True)
    summary = _summary(res, stats, table if site is not None else None)
    console.print(summary["line"], highlight=False, soft_wrap=True)
    if json_out:
        out = {"model": lm.name, "site": str(site) if site else None, "table": summary["table"], "batch": batch,
               "decoding": vars(decoding), **{k: v for k, v in summary.items() if k != "line"},
               "results": [{"prompt": r.prompt, "text": r.text, "prompt_ids": r.prompt_ids, "new_ids": r.new_ids,
                            "stopped": r.stopped} for r in res["results"]]}
        atomic_write_json(json_out, out, indent=1)
        console.print(f"wrote {escape(str(json_out))}", highlight=False)


def _summary(res: dict, svc: dict, table: str | None) -> dict:
    """The closing figures: tokens/s over the decoding steps, and for a table on disk its read costs (``svc``: the
    page service's counters, AttachHandle.stats)."""
    n, tps = res["new_tokens"], res["tokens_per_s"]
    made = sum(len(r.new_ids) for r in res["results"])  # what -n counts and the JSON's new_ids hold
    out = {"generated_tokens": made, "new_tokens": n, "prompt_tokens": res["prompt_tokens"], "prefill_s": res["prefill_s"],
           "decode_s": res["decode_s"], "tokens_per_s": tps, "table": table}
    # the prefill (the prompt's forward) makes each prompt's first token; the rate counts the steps after it
    line = (f"{made:,} new tokens: the first of each prompt from a {res['prefill_s']:.2f} s prefill, {n:,} more in "
            f"{res['decode_s']:.2f} s ({tps:.1f} tokens/s)" if tps else
            f"{made:,} new tokens, all from the prefill (one step per prompt: no rate)")
    if table == "disk" and "hits" in svc:
        looked = svc["hits"] + svc["misses"] + svc.get("joined", 0)
        out.update(read_wait_s=svc["wait_s"], read_wait_ms_per_token=1e3 * svc["wait_s"] / max(n, 1),
                   page_cache_hit_rate=svc["hits"] / looked if looked else None, bytes_read=svc["bytes_read"],
                   reads_from_os_cache=svc["nowait_reads"] / svc["reads"] if svc.get("reads") else None,
                   cache_peak_bytes=svc.get("cache_peak_bytes"))
        line += (f"; table on disk: waited {out['read_wait_ms_per_token']:.3f} ms per token on reads, page-cache hit "
                 f"rate {100 * (out['page_cache_hit_rate'] or 0):.1f} %, {svc['bytes_read'] / 2**20:,.1f} MiB read")
        if out["reads_from_os_cache"] is not None:
            line += f" ({100 * out['reads_from_os_cache']:.0f} % of it already in the OS page cache, shared by the host)"
    elif table == "memory":
        line += "; table in memory"
    out["line"] = line
    return out


def register(app: typer.Typer) -> None:
    app.command("generate")(generate_cmd)
