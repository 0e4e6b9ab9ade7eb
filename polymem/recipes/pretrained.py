"""A donor table on a pretrained recipient with another tokenizer, against the controls that make a claim hold.

The recipient's backbone is frozen in every arm; per seed, every arm sees the same data order, budget and site
initialisation (``1000 + seed``), and only the memory differs:

* ``none``           — the model alone (nothing trains; its score is the same for every seed);
* ``random``         — a frozen random table of the donor's layout and row-norm distribution, fresh projection;
* ``null``           — a trained table of a single row (every n-gram reads it): capacity 1, no n-gram content;
* ``donor``          — the frozen donor table behind a fresh projection;
* ``donor_finetune`` — the donor's rows as the start, trained on with the recipient (row-wise RMS rule);
* ``in_place``       — a table of the donor's layout trained from zero on the recipient.

``donor`` minus ``random`` / ``null`` is what the donor's n-gram content is worth to the recipient;
``donor_finetune`` against ``in_place`` at each budget says whether starting from the donor saves training.

Results are written one file per (arm, seed) into ``out_dir`` as each finishes (atomically), with a key of
everything that determines them; a re-run with the same settings skips what is there, so a stopped run
resumes, and several processes may share the seeds of one run (each writes only its own files; the summary a
run writes covers the seeds it was given, so a last run with every seed — which trains nothing — gathers them).

Not here: the training step (:mod:`polymem.recipes.frozen`), scoring (:mod:`polymem.models.evaluate`), the CLI
(``polymem transfer --model``).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from polymem.errors import PolymemError
from polymem.recipes.frozen import FrozenTrainConfig

ARMS = ("none", "random", "null", "donor", "donor_finetune", "in_place")
# the fields of FrozenTrainConfig a transfer run uses (the table geometry and layers come from the donor)
_BUDGET_FIELDS = ("steps", "batch_size", "block_size", "table_lr", "site_lr", "warmup_frac", "decay_frac",
                  "grad_clip", "softmax")


def eval_points(eval_at: Sequence[int], steps: int) -> list[int]:
    """The steps after which the in-domain set is scored: those of ``eval_at`` within the run, and the last."""
    return sorted({int(s) for s in eval_at if 0 < int(s) <= steps} | {int(steps)})


def check_arms(arms: Sequence[str]) -> list[str]:
    arms = [a.strip() for a in arms if a.strip()]
    bad = [a for a in arms if a not in ARMS]
    if bad or not arms:
        raise PolymemError(f"arms {bad or arms!r} unknown; accepted: {', '.join(ARMS)}, e.g. --arms {','.join(ARMS)}")
    return [a for a in ARMS if a in arms]


def arm_table(arm: str, donor: torch.Tensor, *, spec: Any, layout: Any, orders: tuple[int, ...], seed: int):
    """(table, train mode, value_init) of one arm (``none``: (None, None, None))."""
    from polymem.torch.tables import SingleRowTable, TrainableTable, random_like

    if arm == "none":
        return None, None, None
    if arm == "random":
        return TrainableTable(random_like(donor, seed=7919 + int(seed)), spec=spec, layout=layout, orders=orders,
                              trainable=False), "projection", "zero"
    if arm == "null":
        return SingleRowTable(spec=spec, layout=layout, orders=orders), "table", "orthogonal"
    if arm == "donor":
        return TrainableTable(donor, spec=spec, layout=layout, orders=orders, trainable=False), "projection", "zero"
    if arm == "donor_finetune":
        return TrainableTable(donor, spec=spec, layout=layout, orders=orders, trainable=True), "table", "zero"
    if arm == "in_place":
        return TrainableTable(None, spec=spec, layout=layout, orders=orders), "table", "orthogonal"
    check_arms([arm])
    raise AssertionError(arm)


class Experiment:
    """The recipient, the donor table, the training stream and the scoring sets, prepared once."""

    def __init__(self, lm: Any, donor: Any, corpus: Sequence[str | Path], *, cfg: FrozenTrainConfig,
                 eval_corpora: Sequence[str | Path] = (), heldout_every: int | None = None, eval_tokens: int = 4096,
                 window: int = 512, layers: Sequence[int] | None = None, max_n: int | None = None,
                 texts: Sequence[str] | None = None, eval_texts: dict[str, Sequence[str]] | None = None) -> None:
        from polymem.hash.token_hashes import TokenHashes
        from polymem.models.evaluate import Scorer
        from polymem.recipes.frozen import _bounded_texts, corpus_stream
        from polymem.torch.tablefile import open_table
        from polymem.recipes.data import read_documents, split_documents

        self.lm, self.cfg, self.window = lm, cfg, int(window)
        self.asset = a = open_table(donor) if not hasattr(donor, "to_numpy") else donor
        self.donor_path = str(getattr(a, "path", donor))
        self.prov = dict(getattr(a, "provenance", {}) or {})
        mem = self.prov.get("memory_config", {})
        self.layers = tuple(layers or mem.get("layers") or cfg.layers)
        self.max_n = int(max_n or max(a.orders))
        self.gate = mem.get("gate", cfg.gate)
        self.spec, self.layout, self.orders = a.spec, a.layout, tuple(int(o) for o in a.orders)
        self.donor_tab = torch.from_numpy(np.ascontiguousarray(a.to_numpy(), dtype=np.float32))
        self.cache = TokenHashes.build(lm.tokenizer, a.spec)
        # the donor's held-out split by default: on the donor's own corpus, never score what the donor trained on
        heldout_every = int(heldout_every or self.prov.get("heldout_every") or 10)
        self.heldout_every = heldout_every
        self.data = corpus_stream(lm, corpus, texts=texts, heldout_every=heldout_every)
        self.corpus = [str(p) for p in corpus] if texts is None else ["(texts)"]
        sets: dict[str, list[str]] = {}
        first = Path(self.corpus[0]).name.split(".")[0] if texts is None else "texts"
        sets[first] = _bounded_texts(lm, self.data.heldout_texts, eval_tokens)
        def add(name: str, tx: list[str], where: str) -> None:
            if name in sets:
                raise PolymemError(f"two scoring sets are named {name!r} ({where}); scoring sets are named by file "
                                   "name — rename or copy one of the files")
            sets[name] = _bounded_texts(lm, tx, eval_tokens)

        for p in eval_corpora:
            _, held = split_documents(read_documents([p]), heldout_every)
            add(Path(str(p)).name.split(".")[0], held, str(p))
        for name, tx in (eval_texts or {}).items():
            add(name, list(tx), "eval_texts")
        self.in_domain = first
        from polymem.models.evaluate import token_byte_lengths

        lengths = token_byte_lengths(lm.tokenizer)  # once for every scoring set
        self.scorers = {k: Scorer(lm, v, window=window, lengths=lengths) for k, v in sets.items()}
        self.eval_texts = sets

    def key(self, points: Sequence[int] = ()) -> str:
        """What determines every (arm, seed) result: recipient, donor table, data, budget, scoring sets and the
        steps scored; nothing that does not (paths of identical files, a seed set on the config)."""
        d = self.lm.describe()
        src = {k: v for k, v in d["source"].items() if not (k == "path" and "sha256" in d["source"])}
        budget = {k: v for k, v in asdict(self.cfg).items() if k in _BUDGET_FIELDS}
        h = hashlib.sha256()
        h.update(json.dumps({
            "model": {"name": d["name"], "architecture": d["architecture"], "params": d["params"], "source": src},
            "donor": self.asset_fingerprint(), "budget": budget, "layers": list(self.layers),
            "max_n": self.max_n, "gate": self.gate, "window": self.window, "points": [int(p) for p in points],
            "train_tokens": int(self.data.train.size),
            "train_sha": hashlib.sha256(self.data.train.tobytes()).hexdigest(),
            "eval": {k: hashlib.sha256("\x00".join(v).encode()).hexdigest() for k, v in self.eval_texts.items()},
        }, sort_keys=True, default=str).encode())
        return h.hexdigest()[:24]

    def asset_fingerprint(self) -> str:
        if not hasattr(self, "_fp"):
            from polymem.torch.tables import table_fingerprint

            self._fp = table_fingerprint(self.donor_tab, self.spec, self.layout)
        return self._fp

    def score(self, which: Sequence[str] | None = None) -> dict[str, float]:
        return {k: self.scorers[k].score()["bpb"] for k in (which or self.scorers)}

    def base_scores(self) -> dict[str, float]:
        """The model alone on every scoring set (deterministic: scored once per process)."""
        if not hasattr(self, "_base"):
            self._base = self.score()
        return dict(self._base)

    def donor_rows_hit(self) -> dict[str, Any]:
        """Share of the in-domain held-out n-gram rows (per order, recipient tokens) that the donor wrote (a non-zero
        row): how much of what the recipient reads the donor's training reached."""
        ids = [d for d in self.scorers[self.in_domain].docs]
        nz = self.donor_tab.abs().sum(1) > 0
        hit = np.zeros(self.max_n)
        tot = np.zeros(self.max_n)
        for d in ids:
            rows = self.cache.ngram_rows(d, self.layout, self.max_n)  # [T, N, K]
            for n in range(self.max_n):
                r = rows[:, n, :]
                v = r >= 0
                hit[n] += float(nz[torch.from_numpy(r[v])].sum())
                tot[n] += float(v.sum())
        return {"per_order": {str(n + 1): float(hit[n] / max(tot[n], 1)) for n in range(self.max_n)},
                "definition": "share of the recipient's held-out (order, head) row reads that land on a donor row "
                              "its training wrote (non-zero)"}


def run_arm(exp: Experiment, arm: str, seed: int, *, eval_at: Sequence[int],
            on_event: Callable[..., None] | None = None) -> dict[str, Any]:
    """Train one arm for one seed; its curve on the in-domain set and its final scores on every set."""
    from polymem.recipes.frozen import train_site
    from polymem.torch.attach import attach

    ev = on_event or (lambda *a, **k: None)
    cfg = FrozenTrainConfig(**{**asdict(exp.cfg), "seed": int(seed)})
    points = eval_points(eval_at, cfg.steps)
    per_tok = cfg.batch_size * cfg.block_size
    t0 = time.perf_counter()
    if arm == "none":
        scores = exp.base_scores()
        return {"arm": arm, "seed": int(seed), "curve_tokens": [p * per_tok for p in points],
                "curve_bpb": [scores[exp.in_domain]] * len(points), "bpb": scores, "train_s": 0.0,
                "elapsed_s": time.perf_counter() - t0}
    table, mode, vinit = arm_table(arm, exp.donor_tab, spec=exp.spec, layout=exp.layout, orders=exp.orders, seed=seed)
    handle = attach(exp.lm.model, table, exp.cache, layers=list(exp.layers), train=mode, max_n=exp.max_n,
                    gate=exp.gate, init_seed=1000 + int(seed), value_init=vinit)
    curve_t: list[int] = []
    curve: list[float] = []
    try:
        def on_eval(steps_done: int, tokens: int) -> None:
            curve_t.append(int(tokens))
            curve.append(exp.score([exp.in_domain])[exp.in_domain])
            ev("eval", arm=arm, seed=seed, tokens=tokens, bpb=curve[-1])

        res = train_site(exp.lm, handle, exp.data.train, cfg, eval_at=points, on_eval=on_eval,
                         on_step=lambda i, loss: ev("step", arm=arm, seed=seed, step=i, loss=loss))
        others = [k for k in exp.scorers if k != exp.in_domain]
        final = {exp.in_domain: curve[-1], **(exp.score(others) if others else {})}
        out: dict[str, Any] = {"arm": arm, "seed": int(seed), "curve_tokens": curve_t, "curve_bpb": curve,
                               "bpb": final, "train_s": res["train_s"], "tokens_per_s": res["tokens_per_s"],
                               "final_loss": float(np.mean(res["losses"][-10:])),
                               "gate": [float(s.gate.detach()) for s in handle.sites.values() if hasattr(s, "gate")]}
        if arm == "donor" and not torch.equal(handle.table.weight.detach().cpu(), exp.donor_tab):
            raise RuntimeError("the frozen donor table changed during training (a bug; please report)")
        if arm == "donor_finetune":
            w = handle.table.weight.detach().cpu()
            out["table_drift"] = {"rows_changed": int(((w - exp.donor_tab).abs().sum(1) > 0).sum()),
                                  "relative_change": float((w - exp.donor_tab).norm() / exp.donor_tab.norm().clamp_min(1e-12))}
    finally:
        handle.detach()
    out["elapsed_s"] = time.perf_counter() - t0
    return out


def run_transfer(exp: Experiment, *, arms: Sequence[str], seeds: Sequence[int], eval_at: Sequence[int],
                 out_dir: str | Path, on_event: Callable[..., None] | None = None) -> dict[str, Any]:
    """Every (arm, seed) not yet in ``out_dir``, then the summary over ``arms`` × ``seeds`` (written as
    summary.json, and returned)."""
    from polymem._io import atomic_write_json

    ev = on_event or (lambda *a, **k: None)
    arms = check_arms(arms)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    key = exp.key(eval_points(eval_at, exp.cfg.steps))
    runs: dict[tuple[str, int], dict[str, Any]] = {}
    for seed in seeds:
        for arm in arms:
            f = out / f"{arm}-seed{int(seed)}.json"
            if f.is_file():
                got = _read(f)
                if got.get("key") != key:
                    raise PolymemError(
                        f"{str(f)!r} holds a result of other settings (key {got.get('key')!r}, this run {key!r}: "
                        "another model, donor, corpus, budget, scoring set or --eval-every); pass another --out-dir, or remove "
                        "that folder to start over")
                runs[(arm, int(seed))] = got
                ev("skip", arm=arm, seed=seed, bpb=got["bpb"][exp.in_domain])
                continue
            ev("run", arm=arm, seed=seed, steps=exp.cfg.steps)
            r = run_arm(exp, arm, int(seed), eval_at=eval_at, on_event=ev)
            r["key"] = key
            atomic_write_json(f, r, indent=1)
            runs[(arm, int(seed))] = r
            ev("result", arm=arm, seed=seed, bpb=r["bpb"][exp.in_domain])
    summary = summarize(exp, arms, [int(s) for s in seeds], runs)
    atomic_write_json(out / "summary.json", summary, indent=1)
    return summary


def _read(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise PolymemError(f"{str(path)!r} is not a readable result ({e}); remove it and run again") from None


def summarize(exp: Experiment, arms: Sequence[str], seeds: Sequence[int],
              runs: dict[tuple[str, int], dict[str, Any]]) -> dict[str, Any]:
    """Per arm: held-out bpb per scoring set and seed (in the order of ``seeds``), curves, paired comparisons."""
    sets = list(exp.scorers)
    base = runs[("none", seeds[0])]["bpb"] if "none" in arms else exp.base_scores()
    res: dict[str, Any] = {"arms": {}, "curves": {}}
    for arm in arms:
        rs = [runs[(arm, s)] for s in seeds]
        res["arms"][arm] = {"bpb": {k: [r["bpb"][k] for r in rs] for k in sets},
                            "train_s": [r.get("train_s", 0.0) for r in rs],
                            "elapsed_s": [r.get("elapsed_s", 0.0) for r in rs]}
        if arm == "donor_finetune":
            res["arms"][arm]["table_drift"] = [r.get("table_drift") for r in rs]
        res["curves"][arm] = {"tokens": rs[0]["curve_tokens"], "bpb": [r["curve_bpb"] for r in rs]}
    gains = {arm: {k: {"bpb": [base[k] - v for v in res["arms"][arm]["bpb"][k]],
                       "share_of_base": [(base[k] - v) / base[k] for v in res["arms"][arm]["bpb"][k]]}
                   for k in sets} for arm in arms}
    paired: dict[str, Any] = {}
    if "donor" in arms:
        for ctl in ("random", "null", "none"):
            if ctl in arms:
                paired[f"donor_vs_{ctl}"] = {k: {"margin_bpb": [c - d for c, d in zip(res["arms"][ctl]["bpb"][k], res["arms"]["donor"]["bpb"][k])]}
                                             for k in sets}
                for k in sets:
                    m = paired[f"donor_vs_{ctl}"][k]["margin_bpb"]
                    paired[f"donor_vs_{ctl}"][k]["donor_better_every_seed"] = bool(all(x > 0 for x in m))
    if "donor_finetune" in arms and "in_place" in arms:
        ft, ip = res["curves"]["donor_finetune"]["bpb"], res["curves"]["in_place"]["bpb"]
        paired["donor_finetune_vs_in_place"] = {
            "tokens": res["curves"]["in_place"]["tokens"],
            "margin_bpb": [[b - a for a, b in zip(fs, ips)] for fs, ips in zip(ft, ip)],  # [seed][budget] in_place - finetune
            "finetune_at_most_in_place_everywhere": bool(all(a <= b for fs, ips in zip(ft, ip) for a, b in zip(fs, ips)))}
    prov = exp.prov
    return {
        "recipient_model": exp.lm.name, "donor_model": (prov.get("model") or {}).get("name"),
        "recipient": exp.lm.describe(),
        "donor": {"asset": exp.donor_path, "fingerprint": exp.asset_fingerprint(),
                  "model": prov.get("model"), "tokenizer": prov.get("tokenizer"), "corpus": prov.get("corpus"),
                  "tokens_seen": prov.get("tokens_seen"), "layout": exp.layout.to_dict(), "orders": list(exp.orders),
                  "heldout_bpb_model_alone": prov.get("heldout_bpb_memory_off"),
                  "heldout_bpb_with_table": prov.get("heldout_bpb")},
        "seeds": list(seeds), "scoring_sets": {k: {"documents": len(exp.eval_texts[k]), "tokens": exp.scorers[k].num_tokens,
                                                  "bytes": exp.scorers[k].num_bytes} for k in sets},
        "in_domain": exp.in_domain, "base_bpb": base, **res, "gains": gains, "paired": paired,
        "donor_rows_hit": exp.donor_rows_hit(),
        "config": {**asdict(exp.cfg), "layers": list(exp.layers), "max_n": exp.max_n, "gate": exp.gate,
                   "window": exp.window, "train_stream_tokens": int(exp.data.train.size),
                   "corpus": exp.corpus},
        "key": runs[(arms[0], seeds[0])].get("key"),
    }


COLORS = {"none": "#7f7f7f", "random": "#bcbd22", "null": "#ff7f0e", "donor": "#1f77b4",
          "donor_finetune": "#d62728", "in_place": "#2ca02c"}


def plot_result(result: dict[str, Any], path: str | Path) -> Path:
    """Left: in-domain learning curves (mean over seeds, min–max band). Right: final bpb per arm and scoring set."""
    from polymem._optional import pyplot, save_figure

    plt = pyplot("transfer --plot")
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2))
    base = result["base_bpb"][result["in_domain"]]
    for arm, c in result["curves"].items():  # every arm starts as the model alone (zero projection or zero table)
        t = np.asarray([0] + list(c["tokens"]), dtype=float) / 1e3
        y = np.asarray([[base] + list(b) for b in c["bpb"]], dtype=float)
        ax.plot(t, y.mean(0), marker="o", ms=3, color=COLORS.get(arm), label=arm)
        if y.shape[0] > 1:
            ax.fill_between(t, y.min(0), y.max(0), color=COLORS.get(arm), alpha=0.15, lw=0)
    ax.set_xlabel("recipient training tokens (thousands)")
    ax.set_ylabel(f"held-out bits per byte, {result['in_domain']} (lower is better)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    sets = list(result["base_bpb"])
    arms = list(result["arms"])
    w = 0.8 / max(len(arms), 1)
    for i, arm in enumerate(arms):
        for j, k in enumerate(sets):
            v = result["arms"][arm]["bpb"][k]
            x = j + (i - (len(arms) - 1) / 2) * w
            bx.bar(x, float(np.mean(v)), w, color=COLORS.get(arm), label=arm if j == 0 else None)
            bx.scatter([x] * len(v), v, color="k", s=6, zorder=3)
    bx.set_xticks(range(len(sets)), sets)
    lo = min(min(min(v) for v in a["bpb"].values()) for a in result["arms"].values())
    hi = max(max(max(v) for v in a["bpb"].values()) for a in result["arms"].values())
    bx.set_ylim(lo - 0.15 * (hi - lo + 1e-3), hi + 0.1 * (hi - lo + 1e-3))
    bx.set_ylabel("held-out bits per byte at the end (dots: seeds)")
    fig.suptitle(f"{result['donor_model']} table -> {result['recipient_model']} (frozen backbone), seeds {result['seeds']}",
                 fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)
