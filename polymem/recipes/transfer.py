"""Cross-tokenizer transfer of a donor table, against the controls that make a claim hold (Table 4 of the
Tokenizer-Agnostic Engram paper).

For each seed, recipient models with one backbone (same init, same data order, same steps) are trained from
scratch with the recipient's tokenizer in arms:

* ``none``    — no memory;
* ``random``  — a frozen random table of the donor's shape and row-norm distribution behind a fresh projection;
* ``donor``   — the frozen donor table behind a fresh projection (identical projection init to ``random``);
* ``donor_finetune`` — the donor's rows as the starting table (same layout and hash spec), trained on with the
  row-wise optimizer (``SparseRowRMS``) next to the backbone;
* ``scratch`` — a table of the donor's layout trained from zero with the recipient's tokenizer;

then scored in held-out bits per byte, at the end or every ``eval_every`` steps (learning curves, read by
:mod:`polymem.recipes.curves`); the donor arm is also scored with its memory switched off
(``donor_memory_off``). Only the donor-minus-random gap is transfer: a random table plus a trained projection is
already an n-gram feature. Coverage of the recipient's held-out n-grams by the donor is reported with it.

Not here: training the donor (:func:`polymem.recipes.train.train_donor`), rendering (:mod:`polymem.cli.cmd_transfer`).
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from polymem.errors import PolymemError
from polymem.recipes.data import read_documents, split_documents
from polymem.recipes.train import TokenData, TrainConfig, batch_starts, build_model, evaluate_bpb, train_loop


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


ARMS = ("none", "random", "donor", "donor_finetune", "scratch")  # trained arms; donor_memory_off is derived
ALL_ARMS = ARMS + ("donor_memory_off",)


def _check_arms(arms: Sequence[str]) -> list[str]:
    arms = [a.strip() for a in arms if a.strip()]
    bad = [a for a in arms if a not in ARMS]
    if bad or not arms:
        raise PolymemError(f"arms {bad or arms!r} unknown; accepted: {', '.join(ARMS)} (donor_memory_off comes with "
                           f"donor), e.g. --arms none,random,donor,donor_finetune,scratch")
    return list(dict.fromkeys(arms))  # the given order (the order they train in), no duplicates


class _Context:
    """Everything one process needs to train the recipients: donor table, corpus tokenized by the recipient."""

    def __init__(self, asset: Any, tokenizer: Any, corpus: Sequence[str | Path], *, eval_corpus: Sequence[str | Path] | None,
                 heldout_every: int | None, max_n: int | None, layers: Sequence[int] | None, gate: str | None,
                 on_event: Callable[..., None]) -> None:
        from polymem.torch.tablefile import open_table

        self.a = a = open_table(asset) if not hasattr(asset, "to_numpy") else asset
        self.asset_name = str(getattr(a, "path", asset))
        self.prov = prov = dict(getattr(a, "provenance", {}) or {})
        mem_cfg = prov.get("memory_config", {})
        self.layers = tuple(layers or mem_cfg.get("layers", (1,)))
        self.gate = gate or mem_cfg.get("gate", "scalar")
        self.heldout_every = heldout_every or int(prov.get("heldout_every", 10))
        self.donor_n = max(a.orders)
        self.max_n = max_n or self.donor_n
        self.donor_tab = torch.from_numpy(np.ascontiguousarray(a.to_numpy(), dtype=np.float32))
        on_event("phase", name="reading corpus")
        self.corpus = [str(p) for p in corpus]
        self.train_texts, held = split_documents(read_documents(corpus), self.heldout_every)
        if eval_corpus:
            _, held = split_documents(read_documents(eval_corpus), self.heldout_every)
        self.held_texts = held
        on_event("phase", name="tokenizing")
        self.data = TokenData.build(tokenizer, self.train_texts, self.held_texts, spec=a.spec)


def _coverage(ctx: _Context, on_event: Callable[..., None]) -> dict[str, Any]:
    from polymem.tokenizers import load_tokenizer

    info = ctx.prov.get("tokenizer", {})
    if not info.get("name"):
        return {"note": "the donor asset records no tokenizer; coverage skipped"}
    on_event("phase", name="coverage")
    try:
        dtok = load_tokenizer(info["name"])
    except PolymemError:
        dtok = None
    if dtok is None or dtok.fingerprint != info.get("fingerprint"):
        return {"note": f"donor tokenizer {info.get('name')!r} not loadable with the recorded fingerprint; coverage skipped"}
    out: dict[str, Any] = {}
    donor_texts = ctx.train_texts
    if not _same_files(ctx.corpus, ctx.prov.get("corpus")):  # another domain: replay the donor's own corpus
        paths = [x.strip() for x in str(ctx.prov.get("corpus", "")).split(",") if x.strip()]
        if paths and all(Path(x).exists() for x in paths):
            donor_texts, _ = split_documents(read_documents(paths), ctx.heldout_every)
        else:
            out["note"] = (f"the donor's corpus {ctx.prov.get('corpus')!r} is not readable from here; the donor-side "
                           f"n-grams are taken from this run's training text instead (not what the donor trained on)")
    ddata = TokenData.build(dtok, donor_texts, ctx.held_texts[:1], spec=ctx.a.spec)
    same_stream = ctx.prov.get("train_stream_tokens") in (None, int(ddata.train.size))
    out["trained_hashes"] = trained_hash_coverage(ddata, ctx.data, donor_max_n=ctx.donor_n, max_n=ctx.max_n,
                                                  donor_train=ctx.prov.get("train_config") if same_stream else None)
    bc = _byte_coverage(ctx.data.tokenizer, dtok, ctx.held_texts, max_n=7)
    if bc is not None:
        out["byte_equivalent"] = bc
    return out


def build_arm(arm: str, data: TokenData, donor_tab: torch.Tensor, *, spec: Any, layout: Any, orders: tuple[int, ...],
              cfg: TrainConfig, seed: int, layers: Sequence[int], gate: str, max_n: int,
              value_init: str | None = None) -> tuple[Any, Any]:
    """(model, handle or None) for one arm and seed: the backbone from ``seed`` (identical across arms), and the
    arm's table attached before ``layers`` with the projection initialised from ``1000 + seed``."""
    from polymem.torch.attach import attach
    from polymem.torch.tables import TrainableTable, random_like

    _check_arms([arm])
    model = build_model(data, cfg, seed=seed)
    if arm == "none":
        return model, None
    if arm == "scratch":
        table = TrainableTable(None, spec=spec, layout=layout, orders=tuple(range(1, max_n + 1)))
        mode, vinit = "all", None  # a zero table needs PageGram's orthogonal W_V to learn
    elif arm == "donor_finetune":  # starts from the donor's rows, keeps training them (SparseRowRMS)
        table = TrainableTable(donor_tab, spec=spec, layout=layout, orders=orders, trainable=True)
        mode, vinit = "all", value_init or "zero"
    else:
        w = donor_tab if arm == "donor" else random_like(donor_tab, seed=7919 + int(seed))
        table = TrainableTable(w, spec=spec, layout=layout, orders=orders, trainable=False)
        mode, vinit = "projection", value_init
    handle = attach(model, table, data.cache, layers=list(layers), train=mode, max_n=max_n, gate=gate,
                    init_seed=1000 + int(seed), freeze_model=False, value_init=vinit)
    return model, handle


def _run_seed(ctx: _Context, seed: int, arms: Sequence[str], cfg: TrainConfig, *, max_eval_tokens: int | None,
              eval_every: int | None, value_init: str | None, finetune_table_lr_mult: float | None,
              on_event: Callable[..., None]) -> dict[str, Any]:
    """Train every arm for one seed: {arm: {"bpb", "curve_tokens", "curve_bpb", "tokens_per_s", ...}}."""
    ev = on_event
    a, data = ctx.a, ctx.data
    out: dict[str, Any] = {}
    base = TrainConfig(**{**asdict(cfg), "seed": int(seed)})
    for arm in arms:
        c = base
        if arm == "donor_finetune" and finetune_table_lr_mult is not None:
            c = TrainConfig(**{**asdict(base), "table_lr_mult": float(finetune_table_lr_mult)})
        ev("run", arm=arm, seed=seed, steps=c.steps)
        model, handle = build_arm(arm, data, ctx.donor_tab, spec=a.spec, layout=a.layout, orders=tuple(a.orders),
                                  cfg=c, seed=seed, layers=ctx.layers, gate=ctx.gate, max_n=ctx.max_n,
                                  value_init=value_init)
        curve_t: list[int] = []
        curve: list[float] = []
        curve_off: list[float] = []

        def on_eval(steps_done: int, tokens: int) -> None:
            curve_t.append(int(tokens))
            curve.append(evaluate_bpb(model, data, c, max_tokens=max_eval_tokens))
            ev("eval", arm=arm, seed=seed, tokens=tokens, bpb=curve[-1])
            if arm == "donor":
                with handle.disabled():
                    curve_off.append(evaluate_bpb(model, data, c, max_tokens=max_eval_tokens))

        res = train_loop(model, handle, data, c, eval_every=eval_every or c.steps, on_eval=on_eval,
                         on_step=lambda i, loss: ev("step", step=i, loss=loss, arm=arm, seed=seed))
        out[arm] = {"bpb": curve[-1], "curve_tokens": curve_t, "curve_bpb": curve, "tokens_per_s": res["tokens_per_s"]}
        ev("result", arm=arm, seed=seed, bpb=curve[-1])
        if arm == "donor":
            out["donor_memory_off"] = {"bpb": curve_off[-1], "curve_tokens": curve_t, "curve_bpb": curve_off}
            ev("result", arm="donor_memory_off", seed=seed, bpb=curve_off[-1])
            if not torch.equal(handle.table.weight.detach().cpu(), ctx.donor_tab):
                raise RuntimeError("the frozen donor table changed during training (a bug; please report)")
        if arm == "donor_finetune":
            w = handle.table.weight.detach().cpu()
            moved = (w - ctx.donor_tab).norm(dim=1)
            out[arm]["table_drift"] = {
                "rows_changed": int((moved > 0).sum()),
                "relative_change": float((w - ctx.donor_tab).norm() / ctx.donor_tab.norm().clamp_min(1e-12)),
                "table_lr_mult": c.table_lr_mult}
        if handle is not None:
            handle.detach()
    return out


def worker_processes(jobs: int, seeds: Sequence[int], arms: Sequence[str]) -> int:
    """Processes a run uses: every (seed, arm) is a task, so one seed's arms run side by side too; never more
    processes than tasks (1: everything in this process)."""
    return max(1, min(int(jobs), len(seeds) * len(arms)))


def run_transfer(
    asset: Any, tokenizer: Any, corpus: Sequence[str | Path], *, cfg: TrainConfig = TrainConfig(steps=400),
    seeds: Sequence[int] = (0, 1), max_n: int | None = None, scratch: bool = False, arms: Sequence[str] | None = None,
    heldout_every: int | None = None, max_eval_tokens: int | None = None, layers: Sequence[int] | None = None,
    gate: str | None = None, value_init: str | None = None, eval_every: int | None = None,
    eval_corpus: Sequence[str | Path] | None = None, domain: str | None = None,
    finetune_table_lr_mult: float | None = None, jobs: int = 1, threads: int | None = None,
    checkpoint: str | Path | None = None, on_event: Callable[..., None] | None = None,
) -> dict[str, Any]:
    """Run every arm for every seed; returns the result dict (``arms -> name -> {"bpb": [per seed]}``, ``curves``, …).

    ``arms``: a subset of :data:`ARMS` (default: none, random, donor, plus scratch when ``scratch``); ``eval_every``:
    a held-out score every this many steps (a learning curve; default: the last step only); ``eval_corpus``: score
    the held-out split of these documents instead of ``corpus``'s (another domain); ``jobs``: worker processes
    taking (seed, arm) tasks seed by seed, whenever there is more than one task (two single-threaded processes use
    a 2-core CPU better than one with two threads); the result's ``"jobs"`` says what ran: ``{"requested",
    "processes", "tasks"}``; ``checkpoint``: with ``jobs`` > 1, the result over the seeds complete so far is written there after
    every finished task (``"partial"`` says how far it got), so a run stopped early still leaves whole seeds."""
    ev = on_event or (lambda *a, **k: None)
    arms = _check_arms(arms if arms is not None else ["none", "random", "donor"] + (["scratch"] if scratch else []))
    if eval_every is not None and eval_every < 1:
        raise PolymemError(f"eval_every={eval_every} must be >= 1 (steps between held-out scores)")
    seeds = [int(s) for s in seeds]
    t0 = time.perf_counter()
    kw: dict[str, Any] = dict(max_eval_tokens=max_eval_tokens, eval_every=eval_every, value_init=value_init,
              finetune_table_lr_mult=finetune_table_lr_mult)
    ctx_kw: dict[str, Any] = dict(eval_corpus=[str(p) for p in eval_corpus] if eval_corpus else None, heldout_every=heldout_every,
                  max_n=max_n, layers=layers, gate=gate)
    precision, why = cfg.precision_choice()
    ev("precision", precision=precision, reason=why)
    processes = worker_processes(jobs, seeds, arms)
    if processes <= 1:
        ctx = _Context(asset, tokenizer, corpus, on_event=ev, **ctx_kw)
        coverage = _coverage(ctx, ev)
        per_seed = [_run_seed(ctx, s, arms, cfg, on_event=ev, **kw) for s in seeds]
    else:
        import multiprocessing as mp
        import queue as _queue
        from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

        mpctx = mp.get_context("spawn")
        raw: dict[int, dict[str, Any]] = {s: {} for s in seeds}
        with mpctx.Manager() as mgr, ProcessPoolExecutor(max_workers=processes, mp_context=mpctx) as pool:
            q = mgr.Queue()
            # seed-major (seed, arm) tasks: whole seeds finish first, so a run stopped early keeps complete seeds
            futs = {pool.submit(_task_worker, (str(getattr(asset, "path", asset)), tokenizer, [str(c) for c in corpus],
                                               ctx_kw, s, arm, cfg, kw, threads, q)): (s, arm)
                    for s in seeds for arm in arms}
            ctx = _Context(asset, tokenizer, corpus, on_event=ev, **ctx_kw)  # meanwhile: coverage, here
            coverage = _coverage(ctx, ev)
            pending = set(futs)
            while pending:
                done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                while True:
                    try:
                        kind, k = q.get_nowait()
                    except _queue.Empty:
                        break
                    ev(kind, **k)
                for f in done:
                    raw[futs[f][0]].update(f.result())
                if done and checkpoint is not None:
                    complete = [s for s in seeds if all(a in raw[s] for a in arms)]
                    if complete:
                        part = summarize(ctx, cfg, complete, arms, [raw[s] for s in complete], coverage=coverage,
                                         domain=domain, corpus=corpus, eval_corpus=eval_corpus,
                                         precision=(precision, why), **kw)
                        part["partial"] = {"seeds_complete": complete, "tasks_done": len(futs) - len(pending),
                                           "tasks": len(futs), "elapsed_s": time.perf_counter() - t0}
                        write_json(part, checkpoint)
        per_seed = [raw[s] for s in seeds]
    out = summarize(ctx, cfg, seeds, arms, per_seed, coverage=coverage, domain=domain, corpus=corpus,
                    eval_corpus=eval_corpus, precision=(precision, why), **kw)
    out["jobs"] = {"requested": jobs, "processes": processes, "tasks": len(seeds) * len(arms)}
    out["elapsed_s"] = time.perf_counter() - t0
    return out


_WORKER_CTX: dict[Any, _Context] = {}


def _task_worker(args: tuple) -> dict[str, Any]:
    """One (seed, arm) in a worker process; the corpus is tokenized once per process."""
    asset, tokenizer, corpus, ctx_kw, seed, arm, cfg, kw, threads, queue = args
    if threads:
        torch.set_num_threads(threads)
    ev = (lambda kind, **k: queue.put((kind, k))) if queue is not None else (lambda *a, **k: None)
    key = (asset, str(tokenizer), tuple(corpus), repr(sorted(ctx_kw.items())))
    if key not in _WORKER_CTX:
        _WORKER_CTX.clear()
        _WORKER_CTX[key] = _Context(asset, tokenizer, corpus, on_event=lambda *a, **k: None, **ctx_kw)
    return _run_seed(_WORKER_CTX[key], seed, [arm], cfg, on_event=ev, **kw)


def run_transfer_jobs(asset: Any, tokenizer: Any, corpus: Sequence[str | Path], **kw: Any) -> dict[str, Any]:
    """Kept for callers of the old name: :func:`run_transfer` with ``jobs``/``threads``."""
    return run_transfer(asset, tokenizer, corpus, **kw)


def summarize(ctx: _Context, cfg: TrainConfig, seeds: Sequence[int], arms: Sequence[str], per_seed: list[dict[str, Any]],
              *, coverage: dict[str, Any], domain: str | None, corpus: Sequence[str | Path],
              eval_corpus: Sequence[str | Path] | None, precision: tuple[str, str], **kw: Any) -> dict[str, Any]:
    """The result dict from per-seed arm results (seed order)."""
    names = [a for a in ALL_ARMS if a in per_seed[0]]
    res = {k: [p[k]["bpb"] for p in per_seed] for k in names}
    curves = {k: {"tokens": per_seed[0][k]["curve_tokens"], "bpb": [p[k]["curve_bpb"] for p in per_seed]} for k in names}
    tokens = cfg.steps * cfg.batch_size * cfg.block_size
    prov, data, a = ctx.prov, ctx.data, ctx.a
    donor_tok_info = prov.get("tokenizer", {})
    out: dict[str, Any] = {
        "arms": {k: {"bpb": v} for k, v in res.items()},
        "seeds": [int(s) for s in seeds], "steps": cfg.steps, "tokens": tokens,
        "curves": curves, "eval_every": kw.get("eval_every") or cfg.steps,
        "domain": {"name": domain or Path(str((eval_corpus or corpus)[0])).name.split(".")[0],
                   "train_corpus": [str(p) for p in corpus],
                   "eval_corpus": [str(p) for p in (eval_corpus or corpus)],
                   "donor_corpus": prov.get("corpus"), "heldout_every": ctx.heldout_every,
                   "heldout_documents": len(ctx.held_texts), "train_documents": len(ctx.train_texts),
                   "in_domain": _same_files(eval_corpus or corpus, prov.get("corpus"))},
        "donor": {"tokenizer": donor_tok_info.get("name"), "fingerprint": donor_tok_info.get("fingerprint"),
                  "asset": ctx.asset_name, "layout": a.layout.to_dict(), "orders": list(a.orders),
                  "heldout_bpb": prov.get("heldout_bpb"), "heldout_bpb_memory_off": prov.get("heldout_bpb_memory_off"),
                  "tokens_seen": prov.get("tokens_seen")},
        "recipient": {"tokenizer": data.name, "fingerprint": data.cache.fingerprint, "family": _family(data.tokenizer),
                      "vocab_size": int(data.cache.vocab_size), "n_used": int(data.used_ids.size), "max_n": ctx.max_n,
                      "layers": list(ctx.layers), "gate": ctx.gate, "value_init": kw.get("value_init") or "zero",
                      "train_tokens_available": int(data.train.size), "heldout_tokens": int(data.heldout.size)},
        "coverage": coverage,
        "precision": {"chosen": precision[0], "reason": precision[1]},
        "train_tokens_per_s": {k: float(np.mean([p[k]["tokens_per_s"] for p in per_seed])) for k in arms},
        "config": asdict(cfg), "max_eval_tokens": kw.get("max_eval_tokens"),
    }
    if "donor_finetune" in per_seed[0]:
        out["donor_finetune"] = {"table_drift": [p["donor_finetune"]["table_drift"] for p in per_seed]}
    if "donor" in res and "random" in res and "none" in res:
        out["margins"] = {"random_minus_donor": [r - d for r, d in zip(res["random"], res["donor"])],
                          "none_minus_donor": [n - d for n, d in zip(res["none"], res["donor"])]}
        out["target_met"] = bool(all(g > 0 for g in out["margins"]["random_minus_donor"])
                                 and all(g > 0 for g in out["margins"]["none_minus_donor"]))
    from polymem.recipes.curves import analyze

    out["analysis"] = analyze(out)
    return out


def _same_files(paths: Sequence[str | Path], donor_corpus: str | None) -> bool | None:
    """Whether ``paths`` name the donor's corpus files (by file name; None when the donor records no corpus)."""
    if not donor_corpus:
        return None
    return sorted(Path(str(p)).name for p in paths) == sorted(Path(x.strip()).name for x in donor_corpus.split(","))


def _family(tok: Any) -> str:
    for attr in ("family", "kind"):
        v = getattr(tok, attr, None)
        if isinstance(v, str):
            return v
    return type(tok).__name__


def plot_transfer(result: dict[str, Any], path: str | Path) -> Path:
    """Bars: mean held-out bpb per arm, with one dot per seed."""
    from polymem._optional import pyplot

    plt = pyplot("transfer --plot")

    names = [k for k in ALL_ARMS if result["arms"].get(k, {}).get("bpb")]
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
    from polymem._optional import save_figure

    return save_figure(fig, path)


COLORS = {"none": "#7f7f7f", "random": "#bcbd22", "donor": "#1f77b4", "donor_finetune": "#d62728",
          "scratch": "#2ca02c", "donor_memory_off": "#9467bd"}


def plot_curves(result: dict[str, Any], path: str | Path, *, title: str | None = None) -> Path:
    """Learning curves: held-out bpb against recipient tokens, one line per arm (mean over seeds), the seeds'
    min–max as a band."""
    from polymem._optional import pyplot

    plt = pyplot("transfer --plot (curves)")

    fig, ax = plt.subplots(figsize=(7.0, 4.2))
    curves = result["curves"]
    top = max([max(c["tokens"], default=0) for c in curves.values()] + [result.get("donor", {}).get("tokens_seen") or 0])
    scale, unit = (1e6, "millions") if top >= 1e6 else (1e3, "thousands")
    for arm in [a for a in ALL_ARMS if a in curves]:
        t = np.asarray(curves[arm]["tokens"], dtype=float) / scale
        y = np.asarray(curves[arm]["bpb"], dtype=float)  # [seeds, points]
        ax.plot(t, y.mean(0), marker="o", ms=3, lw=1.6, color=COLORS.get(arm), label=arm,
                ls="--" if arm == "donor_memory_off" else "-")
        if y.shape[0] > 1:
            ax.fill_between(t, y.min(0), y.max(0), color=COLORS.get(arm), alpha=0.18, lw=0)
    dt = result.get("donor", {}).get("tokens_seen")
    if dt:
        ax.axvline(dt / scale, color="k", lw=0.8, ls=":")
        ax.text(dt / scale, ax.get_ylim()[1], " donor's tokens", fontsize=7, va="top")
    ax.set_xlabel(f"recipient training tokens ({unit})")
    ax.set_ylabel("held-out bits per byte (lower is better)")
    d, r = result["donor"], result["recipient"]
    ax.set_title(title or f"{d['tokenizer']} donor -> {r['tokenizer']} recipient, {result.get('domain', {}).get('name', '')}, "
                 f"seeds {result['seeds']} (band: min-max)", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    from polymem._optional import save_figure

    return save_figure(fig, path)


def write_json(result: dict[str, Any], path: str | Path) -> Path:
    """Write ``result`` as JSON, atomically (:mod:`polymem._io`: never a half-written file)."""
    from polymem._io import atomic_write_json

    return atomic_write_json(path, result, indent=1)
