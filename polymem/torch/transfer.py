"""Cross-tokenizer transfer of a donor table, against the controls that make a claim hold (DESIGN §5, seed 002
Table 4).

For each seed, recipient models with one backbone (same init, same data order, same steps) are trained from
scratch with the recipient's tokenizer in arms:

* ``none``    — no memory;
* ``random``  — a frozen random table of the donor's shape and row-norm distribution behind a fresh projection;
* ``donor``   — the frozen donor table behind a fresh projection (identical projection init to ``random``);
* ``scratch`` — optional: a table of the donor's layout trained from zero with the recipient's tokenizer;

then scored in held-out bits per byte; the donor arm is also scored with its memory switched off
(``donor_memory_off``). Only the donor-minus-random gap is transfer: a random table plus a trained projection is
already an n-gram feature. Coverage of the recipient's held-out n-grams by the donor is reported with it.

Not here: training the donor (:func:`polymem.torch.train.train_donor`), rendering (:mod:`polymem.cli.cmd_transfer`).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from polymem.errors import PolymemError
from polymem.torch.train import (TokenData, TrainConfig, batch_starts, build_model, evaluate_bpb, read_documents,
                           split_documents, train_loop)

ARMS = ("none", "random", "donor", "scratch")


def trained_hash_coverage(donor: TokenData, recipient: TokenData, *, donor_max_n: int, max_n: int,
                          donor_train: dict[str, Any] | None = None) -> dict[str, Any]:
    """Share of recipient held-out n-gram positions (per order n) whose byte hash the donor wrote rows for.

    With ``donor_train`` (the donor's ``train_config`` from its provenance: steps, batch_size, block_size, seed) the
    donor's exact training windows are replayed, so only n-grams the donor actually trained on count; without
    it, every n-gram of the donor tokenizer's training split counts (an upper bound)."""
    if donor_train:
        T = int(donor_train["block_size"])
        starts = batch_starts(donor.train.size, block_size=T, batch_size=int(donor_train["batch_size"]),
                              steps=int(donor_train["steps"]), seed=int(donor_train["seed"]))
        windows = donor.train[starts.reshape(-1)[:, None] + np.arange(T)[None, :]]  # [steps·B, T]
        h, v = donor.cache.ngram_hashes(windows, donor_max_n)  # [W, T, n]
        basis = "n-grams inside the donor's replayed training windows"
    else:
        h, v = donor.cache.ngram_hashes(donor.train, donor_max_n)  # [N, n]
        basis = "all n-grams of the donor tokenizer's training split (upper bound)"
    seen = np.unique(h[v])
    rh, rv = recipient.cache.ngram_hashes(recipient.heldout, max_n)  # [M, n]
    per_n = {}
    hit_all, tot_all = 0, 0
    for n in range(max_n):
        hv = rh[:, n][rv[:, n]]
        hit = int(np.isin(hv, seen).sum())
        per_n[str(n + 1)] = hit / max(hv.size, 1)
        hit_all, tot_all = hit_all + hit, tot_all + hv.size
    return {"per_n": per_n, "all_orders": hit_all / max(tot_all, 1), "basis": basis,
            "definition": "share of recipient held-out n-gram positions whose byte hash the donor trained on"}


def _byte_coverage(recipient_tok: Any, donor_tok: Any, texts: Sequence[str], max_n: int) -> dict[str, Any] | None:
    try:
        from polymem.analysis.coverage import coverage
    except ImportError:
        return None
    try:
        rep = coverage(recipient_tok, donor_tok, list(texts), max_n=max_n)
    except Exception as e:  # noqa: BLE001 - coverage is a report extra; never lose the transfer result over it
        return {"error": f"{type(e).__name__}: {e}"}
    out: dict[str, Any] = {}
    for k in ("per_doc_mean", "pooled", "occurrence_weighted"):
        val = getattr(rep, k, None)
        if val is not None:
            out[k] = val.tolist() if isinstance(val, np.ndarray) else val
    if not out and hasattr(rep, "to_dict"):
        out = rep.to_dict()
    return out


def run_transfer(
    asset: Any, tokenizer: Any, corpus: Sequence[str | Path], *, cfg: TrainConfig = TrainConfig(steps=400),
    seeds: Sequence[int] = (0, 1), max_n: int | None = None, scratch: bool = False, heldout_every: int | None = None,
    max_eval_tokens: int | None = None, layers: Sequence[int] | None = None, gate: str | None = None,
    value_init: str | None = None, on_event: Callable[..., None] | None = None,
) -> dict[str, Any]:
    """Run every arm for every seed; returns the result dict (``arms -> name -> {"bpb": [per seed]}``, …)."""
    from polymem.tokenizers import load_tokenizer
    from polymem.torch.attach import attach
    from polymem.torch.tables import TrainableTable, random_like
    from polymem.torch.tablefile import open_table

    ev = on_event or (lambda *a, **k: None)
    t0 = time.perf_counter()
    a = open_table(asset) if not hasattr(asset, "to_numpy") else asset
    prov = dict(getattr(a, "provenance", {}) or {})
    mem_cfg = prov.get("memory_config", {})
    layers = tuple(layers or mem_cfg.get("layers", (1,)))
    gate = gate or mem_cfg.get("gate", "scalar")
    heldout_every = heldout_every or int(prov.get("heldout_every", 10))
    donor_n = max(a.orders)
    max_n = max_n or donor_n
    donor_tab = torch.from_numpy(np.ascontiguousarray(a.to_numpy(), dtype=np.float32))
    ev("phase", name="reading corpus")
    train_texts, held_texts = split_documents(read_documents(corpus), heldout_every)
    ev("phase", name="tokenizing")
    data = TokenData.build(tokenizer, train_texts, held_texts, spec=a.spec)
    donor_tok_info = prov.get("tokenizer", {})
    coverage: dict[str, Any] = {}
    if donor_tok_info.get("name"):
        ev("phase", name="coverage")
        try:
            dtok = load_tokenizer(donor_tok_info["name"])
        except PolymemError:
            dtok = None
        if dtok is not None and dtok.fingerprint == donor_tok_info.get("fingerprint"):
            ddata = TokenData.build(dtok, train_texts, held_texts[:0] or held_texts[:1], spec=a.spec)
            stream_ok = prov.get("train_stream_tokens") in (None, int(ddata.train.size))
            coverage["trained_hashes"] = trained_hash_coverage(
                ddata, data, donor_max_n=donor_n, max_n=max_n,
                donor_train=prov.get("train_config") if stream_ok else None)
            bc = _byte_coverage(data.tokenizer, dtok, held_texts, max_n=7)
            if bc is not None:
                coverage["byte_equivalent"] = bc
        else:
            coverage["note"] = f"donor tokenizer {donor_tok_info.get('name')!r} not loadable with the recorded fingerprint; coverage skipped"
    arms = ["none", "random", "donor"] + (["scratch"] if scratch else [])
    res: dict[str, list[float]] = {k: [] for k in arms + ["donor_memory_off"]}
    speed: dict[str, list[float]] = {k: [] for k in arms}
    for seed in seeds:
        c = TrainConfig(**{**asdict(cfg), "seed": int(seed)})
        for arm in arms:
            ev("run", arm=arm, seed=seed, steps=c.steps)
            model = build_model(data, c, seed=seed)
            handle = None
            if arm in ("random", "donor", "scratch"):
                if arm == "scratch":
                    table = TrainableTable(None, spec=a.spec, layout=a.layout, orders=tuple(range(1, max_n + 1)))
                    mode = "all"
                else:
                    w = donor_tab if arm == "donor" else random_like(donor_tab, seed=7919 + int(seed))
                    table = TrainableTable(w, spec=a.spec, layout=a.layout, orders=tuple(a.orders), trainable=False)
                    mode = "projection"
                handle = attach(model, table, data.cache, layers=list(layers), train=mode, max_n=max_n, gate=gate,
                                init_seed=1000 + int(seed), freeze_model=False,
                                value_init=None if arm == "scratch" else value_init)
            out = train_loop(model, handle, data, c, on_step=lambda i, loss: ev("step", step=i, loss=loss, arm=arm, seed=seed))
            speed[arm].append(out["tokens_per_s"])
            bpb = evaluate_bpb(model, data, c, max_tokens=max_eval_tokens)
            res[arm].append(bpb)
            ev("result", arm=arm, seed=seed, bpb=bpb)
            if arm == "donor":
                with handle.disabled():
                    off = evaluate_bpb(model, data, c, max_tokens=max_eval_tokens)
                res["donor_memory_off"].append(off)
                ev("result", arm="donor_memory_off", seed=seed, bpb=off)
            if handle is not None:
                if arm == "donor":
                    if not torch.equal(handle.table.weight.detach().cpu(), donor_tab):
                        raise RuntimeError("the frozen donor table changed during training (a bug; please report)")
                handle.detach()
    gap_r = [r - d for r, d in zip(res["random"], res["donor"])]
    gap_n = [n - d for n, d in zip(res["none"], res["donor"])]
    tokens = cfg.steps * cfg.batch_size * cfg.block_size
    return {
        "arms": {k: {"bpb": v} for k, v in res.items()},
        "seeds": [int(s) for s in seeds], "steps": cfg.steps, "tokens": tokens,
        "donor": {"tokenizer": donor_tok_info.get("name"), "fingerprint": donor_tok_info.get("fingerprint"),
                  "asset": str(getattr(a, "path", asset)), "layout": a.layout.to_dict(), "orders": list(a.orders),
                  "heldout_bpb": prov.get("heldout_bpb"), "heldout_bpb_memory_off": prov.get("heldout_bpb_memory_off"),
                  "tokens_seen": prov.get("tokens_seen")},
        "recipient": {"tokenizer": data.name, "fingerprint": data.cache.fingerprint, "max_n": max_n,
                      "layers": list(layers), "gate": gate, "value_init": value_init or "zero",
                      "train_tokens_available": int(data.train.size),
                      "heldout_tokens": int(data.heldout.size)},
        "coverage": coverage,
        "margins": {"random_minus_donor": gap_r, "none_minus_donor": gap_n},
        "target_met": bool(all(g > 0 for g in gap_r) and all(g > 0 for g in gap_n)),
        "train_tokens_per_s": {k: float(np.mean(v)) for k, v in speed.items()},
        "config": asdict(cfg), "max_eval_tokens": max_eval_tokens,
        "elapsed_s": time.perf_counter() - t0,
    }


def _seed_worker(args: tuple) -> dict[str, Any]:
    asset, tokenizer, corpus, kw, seed, threads, queue = args
    if threads:
        torch.set_num_threads(threads)
    ev = (lambda kind, **k: queue.put((kind, k))) if queue is not None else None
    return run_transfer(asset, tokenizer, corpus, seeds=[seed], on_event=ev, **kw)


def run_transfer_jobs(
    asset: Any, tokenizer: Any, corpus: Sequence[str | Path], *, seeds: Sequence[int] = (0, 1), jobs: int = 1,
    threads: int | None = None, on_event: Callable[..., None] | None = None, **kw: Any,
) -> dict[str, Any]:
    """:func:`run_transfer` with seeds spread over ``jobs`` worker processes (one seed each; results merged in
    seed order). Two single-threaded processes use a 2-core CPU better than one process with two threads."""
    if jobs <= 1 or len(seeds) <= 1:
        return run_transfer(asset, tokenizer, corpus, seeds=seeds, on_event=on_event, **kw)
    import multiprocessing as mp
    import queue as _queue
    from concurrent.futures import ProcessPoolExecutor

    t0 = time.perf_counter()
    ctx = mp.get_context("spawn")
    with ctx.Manager() as mgr, ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        q = mgr.Queue() if on_event is not None else None
        futs = [pool.submit(_seed_worker, (str(asset), tokenizer, [str(c) for c in corpus], kw, int(s), threads, q))
                for s in seeds]
        while not all(f.done() for f in futs):
            try:
                kind, k = q.get(timeout=0.5) if q is not None else (None, None)
            except _queue.Empty:
                continue
            if kind is not None:
                on_event(kind, **k)
            elif q is None:
                time.sleep(0.5)
        while q is not None and not q.empty():
            kind, k = q.get()
            on_event(kind, **k)
        parts = [f.result() for f in futs]
    out = parts[0]
    for p in parts[1:]:
        for arm, v in p["arms"].items():
            out["arms"][arm]["bpb"] += v["bpb"]
        for m in out["margins"]:
            out["margins"][m] += p["margins"][m]
        for arm, v in p["train_tokens_per_s"].items():
            out["train_tokens_per_s"][arm] = (out["train_tokens_per_s"][arm] + v) / 2
    out["seeds"] = [int(s) for s in seeds]
    g = out["margins"]
    out["target_met"] = bool(all(x > 0 for x in g["random_minus_donor"]) and all(x > 0 for x in g["none_minus_donor"]))
    out["jobs"] = jobs
    out["elapsed_s"] = time.perf_counter() - t0
    return out


def plot_transfer(result: dict[str, Any], path: str | Path) -> Path:
    """Bars: mean held-out bpb per arm, with one dot per seed."""
    from polymem._optional import pyplot

    plt = pyplot("transfer --plot")

    names = [k for k in ("none", "random", "donor", "donor_memory_off", "scratch") if result["arms"].get(k, {}).get("bpb")]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for i, k in enumerate(names):
        v = result["arms"][k]["bpb"]
        ax.bar(i, float(np.mean(v)), color="#9db4d0" if k != "donor" else "#3b6ea5")
        ax.scatter([i] * len(v), v, color="k", s=12, zorder=3)
    ax.set_xticks(range(len(names)), names)
    lo = min(min(result["arms"][k]["bpb"]) for k in names)
    hi = max(max(result["arms"][k]["bpb"]) for k in names)
    ax.set_ylim(lo - 0.1 * (hi - lo + 0.05), hi + 0.1 * (hi - lo + 0.05))
    ax.set_ylabel("held-out bits per byte (lower is better)")
    d, r = result["donor"], result["recipient"]
    ax.set_title(f"{d['tokenizer']} donor -> {r['tokenizer']} recipient, {result['steps']} steps, seeds {result['seeds']}", fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_json(result: dict[str, Any], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    return path
