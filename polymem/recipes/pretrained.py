"""A donor table on a pretrained recipient with another tokenizer, against the controls that make a claim hold.

The recipient's backbone is frozen in every arm; per seed, every arm sees the same data order, budget and site
initialisation (``1000 + seed``), and only the memory differs (each arm's properties are one row of
:data:`polymem.recipes.arms.ARM_SPECS`, which :func:`run_arm` reads):

* ``none``           — the model alone (nothing trains; its score is the same for every seed);
* ``random``         — a frozen random table of the donor's layout and row-norm distribution, fresh projection;
* ``null``           — a trained table of a single row (every n-gram reads it): capacity 1, no n-gram content;
* ``donor``          — the frozen donor table behind a fresh projection;
* ``donor_finetune`` — the donor's rows as the start, trained on with the recipient (row-wise RMS rule);
* ``in_place``       — a table of the donor's layout trained from zero on the recipient;
* ``stitch``         — (asked for by name, not in the default set) the frozen donor table read through the donor's
  own site, frozen, with a learned linear stitch between the two residual streams (:mod:`polymem.torch.stitch`;
  needs the donor's site folder).
* ``teach``, ``distill`` — (by name, in the content study only) the donor's rows fine-tuned with a fresh site on
  text the donor model writes with its own table, on hard targets (``teach``) and also matching the donor's
  chunk likelihoods across the tokenizers (``distill``; :mod:`polymem.recipes.teach`).

``donor`` minus ``random`` / ``null`` is what the donor's n-gram content is worth to the recipient;
``donor_finetune`` against ``in_place`` at each budget says whether starting from the donor saves training.

Results are written one file per (arm, seed) into ``out_dir`` as each finishes (atomically), with a key of
everything that determines them; a re-run with the same settings skips what is there, so a stopped run
resumes, and several processes may share the seeds of one run (each writes only its own files; the summary a
run writes covers the seeds it was given, so a last run with every seed — which trains nothing — gathers them).

Not here: the training step (:mod:`polymem.recipes.frozen`), scoring (:mod:`polymem.models.evaluate`), the arms'
registry (:mod:`polymem.recipes.arms`), the options an experiment is made of (:mod:`polymem.recipes.options`), the
CLI (``polymem transfer --model``).
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
# the arms (one row each in polymem.recipes.arms) and the options an Experiment is made of, importable from here too
from polymem.recipes.arms import ARM_SPECS, ARMS, EXTRA_ARMS, arm_spec, arm_table, check_arms, taught
from polymem.recipes.frozen import FrozenTrainConfig
from polymem.recipes.options import DONOR_INITS, ExperimentData, RecipientSite

# the fields of FrozenTrainConfig a transfer run uses (the table geometry and layers come from the donor)
_BUDGET_FIELDS = ("steps", "batch_size", "block_size", "table_lr", "site_lr", "warmup_frac", "decay_frac",
                  "grad_clip", "softmax")


def eval_points(eval_at: Sequence[int], steps: int) -> list[int]:
    """The steps after which the in-domain set is scored: those of ``eval_at`` within the run, and the last."""
    return sorted({int(s) for s in eval_at if 0 < int(s) <= steps} | {int(steps)})


class Experiment:
    """The recipient, the donor table, the training stream and the scoring sets, prepared once."""

    def __init__(self, lm: Any, donor: Any, data: ExperimentData, *, cfg: FrozenTrainConfig,
                 site: RecipientSite = RecipientSite(), donor_lm: Any = None) -> None:
        """``donor``: the donor asset (a path, URL or an opened table); ``data``: what trains and what is scored;
        ``cfg``: the budget; ``site``: the recipient's sites (by default where and how the donor's are, with a
        zero projection start). ``donor_lm``: the donor's model, which ``site.init="aligned"`` needs (the donor
        site's projection is mapped into the recipient's hidden space, :mod:`polymem.recipes.align`)."""
        from polymem.hash.token_hashes import TokenHashes
        from polymem.models.evaluate import Scorer
        from polymem.recipes.frozen import _bounded_texts, corpus_stream
        from polymem.torch.tablefile import open_table
        from polymem.recipes.data import read_documents, split_documents

        self.lm, self.cfg, self.window = lm, cfg, int(data.window)
        self.asset = a = open_table(donor) if not hasattr(donor, "to_numpy") else donor
        self.donor_path = str(getattr(a, "path", donor))
        self.prov = dict(getattr(a, "provenance", {}) or {})
        mem = self.prov.get("memory_config", {})
        self.layers = tuple(site.layers or mem.get("layers") or cfg.layers)
        self.max_n = int(site.max_n or max(a.orders))
        self.gate = site.gate or mem.get("gate", cfg.gate)
        self.init = init = site.init
        donor_site = site.donor_site
        self.donor_site = Path(donor_site) if donor_site is not None else Path(self.donor_path + ".site")
        self.counts = a.row_counts() if callable(getattr(a, "row_counts", None)) else None
        self.spec, self.layout, self.orders = a.spec, a.layout, tuple(int(o) for o in a.orders)
        self.donor_tab = torch.from_numpy(np.ascontiguousarray(a.to_numpy(), dtype=np.float32))
        self.cache = TokenHashes.build(lm.tokenizer, a.spec)
        # the donor's held-out split by default: on the donor's own corpus, never score what the donor trained on;
        # 0: every document of ``corpus`` trains, and the scoring sets are ``eval_corpora`` / ``eval_texts`` only
        corpus, texts, eval_tokens = list(data.corpus), data.texts, data.eval_tokens
        heldout_every = int(data.heldout_every if data.heldout_every is not None
                            else (self.prov.get("heldout_every") or 10))
        self.heldout_every = heldout_every
        self.data = corpus_stream(lm, corpus, texts=texts, heldout_every=heldout_every)
        self.corpus = [str(p) for p in corpus] if texts is None else ["(texts)"]
        sets: dict[str, list[str]] = {}
        first = Path(self.corpus[0]).name.split(".")[0] if texts is None else "texts"
        self.doc_tokens = int(data.doc_tokens or max(eval_tokens // 8, 1))
        if self.data.heldout_texts:
            sets[first] = _bounded_texts(lm, self.data.heldout_texts, eval_tokens, doc_tokens=self.doc_tokens)

        def add(name: str, tx: list[str], where: str) -> None:
            if name in sets:
                raise PolymemError(f"two scoring sets are named {name!r} ({where}); scoring sets are named by file "
                                   "name — rename or copy one of the files")
            sets[name] = _bounded_texts(lm, tx, eval_tokens, doc_tokens=self.doc_tokens)

        for p in data.eval_corpora:
            _, held = split_documents(read_documents([p]), heldout_every or 10)
            add(Path(str(p)).name.split(".")[0], held, str(p))
        for name, tx in (data.eval_texts or {}).items():
            add(name, list(tx), "eval_texts")
        if not sets:
            raise PolymemError("heldout_every=0 trains on every document and no scoring set was given; pass "
                               "eval_texts or eval_corpora (--eval-corpus)")
        self.in_domain = first if first in sets else next(iter(sets))  # the set learning curves are scored on
        from polymem.models.evaluate import token_byte_lengths

        lengths = token_byte_lengths(lm.tokenizer)  # once for every scoring set
        self.scorers = {k: Scorer(lm, v, window=self.window, lengths=lengths) for k, v in sets.items()}
        self.eval_texts = sets
        self.alignment: dict[str, Any] | None = None
        self.teach: Any = None  # the donor's text and chunk targets (polymem.recipes.teach.TeachData), teach arms
        self.teach_own: Any = None  # the recipient's part with the donor's chunk targets (TeachData), arms taught "own"
        self.polished: Any = None  # (the donor's decoder trained on over its own part, its record): "polished" arms
        self.teach_cfg: Any = None  # how it was written (polymem.recipes.teach.TeachConfig)
        if init == "aligned":
            self.alignment = self._align(donor_lm, donor_site)

    def _align(self, donor_lm: Any, donor_site: str | Path | None) -> dict[str, Any]:
        """The donor site's projection and gate, and the ridge map from the donor's hidden states to the
        recipient's at the site layers, fit on the training split of the corpus (both models read it)."""
        from polymem.recipes.align import fit_alignment
        from polymem.torch.sitefile import read_site

        if donor_lm is None:
            raise PolymemError("init='aligned' needs the donor's model (donor_lm; on the command line --donor-model, "
                               "by default the model named in the donor asset's provenance)")
        site_dir = Path(donor_site) if donor_site is not None else Path(self.donor_path + ".site")
        header, tensors = read_site(site_dir)
        if header["table"]["fingerprint"] != self.asset_fingerprint():
            raise PolymemError(f"{str(site_dir)!r} was trained with table {header['table']['fingerprint']}, the donor "
                               f"asset is {self.asset_fingerprint()}; pass the site written with that asset (--donor-site)")
        names = list(header["layers"])
        if len(names) != len(self.layers):
            raise PolymemError(f"the donor site has {len(names)} site(s) ({names}), this run puts {len(self.layers)} "
                               f"on the recipient (layers {list(self.layers)}); pass --layers with {len(names)} block(s)")
        fits = []
        for name, layer in zip(names, self.layers):
            key = name.replace(".", "/")
            w = tensors.get(f"sites.{key}.value.weight")
            if w is None:
                raise PolymemError(f"{str(site_dir)!r} holds no projection for site {name!r}; it is not a polymem site")
            g = tensors.get(f"sites.{key}.gate")
            f = fit_alignment(donor_lm, self.lm, self.data.train_texts, donor_layer=int(name.rsplit(".", 1)[-1]),
                              recipient_layer=int(layer))
            fits.append({**f, "donor_value": w.float(), "donor_gate": float(g) if g is not None else 0.5})
        return {"site": str(site_dir), "donor_model": donor_lm.name, "fits": fits}

    def alignment_report(self) -> list[dict[str, Any]] | None:
        """Per site: the map's held-out R², positions and documents (what the docs quote); None without one."""
        if self.alignment is None:
            return None
        return [{k: v for k, v in f.items() if k not in ("A", "b", "donor_value")} for f in self.alignment["fits"]]

    def key(self, points: Sequence[int] = ()) -> str:
        """What determines every (arm, seed) result: recipient, donor table, data, budget, scoring sets and the
        steps scored; nothing that does not (paths of identical files, a seed set on the config)."""
        d = self.lm.describe()
        src = {k: v for k, v in d["source"].items() if not (k == "path" and "sha256" in d["source"])}
        budget = {k: v for k, v in asdict(self.cfg).items() if k in _BUDGET_FIELDS}
        h = hashlib.sha256()
        h.update(json.dumps({
            "model": {"name": d["name"], "architecture": d["architecture"], "params": d["params"], "source": src,
                      **({"precision": "bf16"} if d.get("precision") == "bf16" else {})},  # fp32 keys as they were
            "donor": self.asset_fingerprint(), "budget": budget, "layers": list(self.layers),
            "max_n": self.max_n, "gate": self.gate, "window": self.window, "points": [int(p) for p in points],
            "init": self.init, "alignment": None if self.alignment is None else {
                "donor_model": self.alignment["donor_model"],
                "A": [hashlib.sha256(np.ascontiguousarray(f["A"]).tobytes()).hexdigest() for f in self.alignment["fits"]],
                "scales": list(ALIGNED_SCALES)},
            "train_tokens": int(self.data.train.size),
            "train_sha": hashlib.sha256(self.data.train.tobytes()).hexdigest(),
            "eval": {k: hashlib.sha256("\x00".join(v).encode()).hexdigest() for k, v in self.eval_texts.items()},
        }, sort_keys=True, default=str).encode())
        return h.hexdigest()[:24]

    def arm_key(self, arm: str, points: Sequence[int] = ()) -> str:
        """:meth:`key`, and for the arms that learn from the donor's text, that text too."""
        spec = arm_spec(arm)
        if spec.decoder == "polished" and self.polished is None:
            raise PolymemError(f"the {arm} arm reads the donor's decoder trained on over the donor's own documents, "
                               "which only the content study has (--content-split with --donor-byte-head); drop it "
                               "from --arms or add --content-split")
        if spec.teach and taught(self, spec) is None:
            raise PolymemError(f"the {arm} arm learns from the donor model's predictions on text (the text it writes, or "
                               "the recipient's part), which only the content study has (--content-split with "
                               "--donor-model); drop it from --arms or add --content-split")
        return self.key(points) + self._decoder_key(spec) + (spec.key(self) if spec.key is not None else "")

    def _decoder_key(self, spec: Any) -> str:
        """Arms reading the donor's byte decoder: its polish, when its site records one (``polymem train --model
        --byte-head``), so that results of another decoder over the same table are not reused."""
        f = self.donor_site / "site.json"
        reads = (spec.reader or spec.run) and f.is_file()
        pol = (json.loads(f.read_text()).get("byte_head") or {}).get("polish") if reads else None
        return f"-dpolish{pol.get('steps')}" if isinstance(pol, dict) else ""

    def asset_fingerprint(self) -> str:
        if not hasattr(self, "_fp"):
            from polymem.torch.tables import table_fingerprint

            self._fp = table_fingerprint(self.donor_tab, self.spec, self.layout)
        return self._fp

    def score(self, which: Sequence[str] | None = None) -> dict[str, float]:
        return {k: v["bpb"] for k, v in self.score_docs(which).items()}

    def score_docs(self, which: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
        """Per scoring set: ``bpb`` and the bits and bytes of each document (for paired intervals)."""
        out = {}
        for k in (which or self.scorers):
            r = self.scorers[k].score()
            bits = [(d["bpb"] or 0.0) * d["bytes"] for d in r["per_doc"]]
            out[k] = {"bpb": r["bpb"], "doc_bits": bits, "doc_bytes": [d["bytes"] for d in r["per_doc"]]}
        return out

    def base_scores(self) -> dict[str, float]:
        """The model alone on every scoring set (deterministic: scored once per process)."""
        return {k: v["bpb"] for k, v in self.base_docs().items()}

    def base_docs(self) -> dict[str, dict[str, Any]]:
        if not hasattr(self, "_base"):
            self._base = self.score_docs()
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


ALIGNED_SCALES = (0.0, 0.125, 0.25, 0.5, 1.0)  # what the aligned projection is scaled by, chosen per seed


def _aligned_start(exp: Experiment, handle: Any, seed: int) -> dict[str, Any]:
    """Set each site's projection to the donor's, mapped into the recipient (:func:`aligned_projection`), then
    scale it by the one of ``ALIGNED_SCALES`` with the lowest loss on one batch of training windows (forward
    passes only, no gradient step; 0 when the mapped projection only hurts, so the start is never worse than the
    model alone on that batch). Returns the scale, the losses and the tokens it read."""
    from polymem.models.evaluate import token_nats
    from polymem.recipes.align import aligned_projection
    from polymem.recipes.frozen import window_batch

    assert exp.alignment is not None
    ws = []
    with torch.no_grad():
        for site, f in zip(handle.sites.values(), exp.alignment["fits"]):
            g_r = float(site.gate.detach()) if hasattr(site, "gate") else 0.5
            ws.append(aligned_projection(f["donor_value"], f["donor_gate"], f["A"], g_r).to(site.value.weight.device))
        T, B = exp.cfg.block_size, exp.cfg.batch_size
        starts = np.random.default_rng(10_000 + int(seed)).integers(0, exp.data.train.size - T - 1, size=B)
        x, y = window_batch(exp.data.train, starts, T, exp.lm.bos_id)
        dev = next(exp.lm.model.parameters()).device
        losses: dict[float, float] = {}
        for c in ALIGNED_SCALES:
            for site, w in zip(handle.sites.values(), ws):
                site.value.weight.copy_(w * c)
            losses[c] = float(token_nats(exp.lm.model, x.to(dev), y.to(dev)).mean())
        best = min(ALIGNED_SCALES, key=lambda c: (losses[c], c))
        for site, w in zip(handle.sites.values(), ws):
            site.value.weight.copy_(w * best)
    return {"scale": best, "losses": {str(c): v for c, v in losses.items()}, "tokens": int(B * T)}


def _stitch(exp: Experiment, handle: Any, seed: int) -> None:
    """Replace ``handle``'s sites by the donor's own sites, frozen, each behind a fresh stitch
    (:class:`polymem.torch.stitch.StitchedSite`); the donor's sites and the recipient's are paired in layer order."""
    from polymem.torch.stitch import StitchedSite, donor_sites

    try:
        donors = donor_sites(exp.donor_site, exp.layout, exp.asset_fingerprint())
    except FileNotFoundError:
        handle.detach()
        raise PolymemError(f"the stitch arm reads the donor's own site, and {str(exp.donor_site)!r} holds none; pass "
                           "the donor's site folder (--donor-site), as `polymem train --model` writes it") from None
    keys = list(handle.sites.keys())
    if len(donors) != len(keys) or any(d.cfg.max_n != exp.max_n for d in donors):
        handle.detach()
        raise PolymemError(f"the donor's site has {len(donors)} site(s) reading orders 1..{donors[0].cfg.max_n if donors else '?'}; "
                           f"this run puts {len(keys)} reading 1..{exp.max_n}: pass --layers with {len(donors)} block(s) "
                           "and the donor's --max-n")
    for i, (k, d) in enumerate(zip(keys, donors)):
        old = handle.sites[k]
        handle.sites[k] = StitchedSite(d, old.cfg.d_model, seed=1000 + int(seed) + i).to(old.value.weight.device)


def _docs(r: dict[str, Any]) -> dict[str, Any]:
    return {"bits": [float(x) for x in r["doc_bits"]], "bytes": [int(x) for x in r["doc_bytes"]]}


def run_arm(exp: Experiment, arm: str, seed: int, *, eval_at: Sequence[int],
            on_event: Callable[..., None] | None = None) -> dict[str, Any]:
    """Train one arm for one seed; its curve on the in-domain set (from 0 recipient tokens) and its final
    scores on every set, with each document's bits (``docs``) for paired intervals."""
    from polymem.recipes.frozen import train_site
    from polymem.torch.attach import attach

    ev = on_event or (lambda *a, **k: None)
    cfg = FrozenTrainConfig(**{**asdict(exp.cfg), "seed": int(seed)})
    points = eval_points(eval_at, cfg.steps)
    per_tok = cfg.batch_size * cfg.block_size
    t0 = time.perf_counter()
    base = exp.base_docs()
    ind = exp.in_domain
    spec = arm_spec(arm)
    if spec.rows == "none":
        return {"arm": arm, "seed": int(seed), "curve_tokens": [0] + [p * per_tok for p in points],
                "curve_bpb": [base[ind]["bpb"]] * (len(points) + 1),
                "curve_docs": [_docs(base[ind])] * (len(points) + 1),
                "bpb": {k: v["bpb"] for k, v in base.items()}, "docs": {k: _docs(v) for k, v in base.items()},
                "train_s": 0.0, "elapsed_s": time.perf_counter() - t0}
    if spec.run is not None:  # an arm with a training of its own (the next-bytes arms)
        return spec.run(exp, arm, seed, eval_at=eval_at, on_event=on_event)
    table, mode, vinit = arm_table(arm, exp.donor_tab, spec=exp.spec, layout=exp.layout, orders=exp.orders, seed=seed,
                                   init=exp.init, counts=exp.counts)
    handle = attach(exp.lm.model, table, exp.cache, layers=list(exp.layers), train=mode, max_n=exp.max_n,
                    gate=exp.gate, init_seed=1000 + int(seed), value_init=vinit)
    if spec.stitch:
        _stitch(exp, handle, seed)
    td = taught(exp, spec) if spec.teach else None
    stream = td.stream if td is not None else exp.data.train  # what the arm reads, and its loss's extra term
    aux = spec.aux(exp) if spec.aux is not None else None
    curve_t: list[int] = [0]
    curve: list[float] = []
    curve_docs: list[dict[str, Any]] = []
    try:
        start = None
        if vinit == "aligned":
            start = _aligned_start(exp, handle, seed)
            r0 = exp.score_docs([ind])[ind]  # the donor's rows through the aligned projection, before any training
        else:
            r0 = base[ind]  # a zero projection or a zero table: step 0 is the model alone
        curve.append(r0["bpb"])
        curve_docs.append(_docs(r0))
        ev("eval", arm=arm, seed=seed, tokens=0, bpb=curve[-1])

        def on_eval(steps_done: int, tokens: int) -> None:
            r = exp.score_docs([ind])[ind]
            curve_t.append(int(tokens))
            curve.append(r["bpb"])
            curve_docs.append(_docs(r))
            ev("eval", arm=arm, seed=seed, tokens=tokens, bpb=curve[-1])

        head = exp.polished[0] if spec.decoder == "polished" else _donor_decoder(exp) if spec.reader else None
        reader = (_byte_reader(exp, handle, head, cfg.softmax, mix=spec.reader == "mix",
                               hits=spec.hits)
                  if spec.reader else None)
        res = train_site(exp.lm, handle, stream, cfg, eval_at=points, on_eval=on_eval, aux=aux,
                         on_step=lambda i, loss: ev("step", arm=arm, seed=seed, step=i, loss=loss),
                         extra=[reader.w] if reader else (), extra_lr=_reader_lr() if reader else None)
        others = [k for k in exp.scorers if k != ind]
        final = exp.score_docs(others) if others else {}
        out: dict[str, Any] = {"arm": arm, "seed": int(seed), "curve_tokens": curve_t, "curve_bpb": curve,
                               "curve_docs": curve_docs,
                               "bpb": {ind: curve[-1], **{k: v["bpb"] for k, v in final.items()}},
                               "docs": {ind: curve_docs[-1], **{k: _docs(v) for k, v in final.items()}},
                               "train_s": res["train_s"], "tokens_per_s": res["tokens_per_s"],
                               "final_loss": float(np.mean(res["losses"][-10:])),
                               "gate": [float(s.gate.detach()) for s in handle.sites.values() if hasattr(s, "gate")]}
        if start is not None:
            out["aligned_start"] = start
        if reader is not None:
            out["next_bytes"] = {**reader.record(), "reader_s": reader.seconds,
                                 **({"polish": exp.polished[1]} if spec.decoder == "polished" else {})}
        if spec.frozen_donor and not torch.equal(handle.table.weight.detach().cpu(), exp.donor_tab):
            raise RuntimeError("the frozen donor table changed during training (a bug; please report)")
        if td is not None:
            out["teach"] = {"chunks": td.chunks, "stream_tokens": int(td.stream.size), **td.cost}
        if spec.fine_tunes_donor:
            w = handle.table.weight.detach().cpu()
            out["table_drift"] = {"rows_changed": int(((w - exp.donor_tab).abs().sum(1) > 0).sum()),
                                  "relative_change": float((w - exp.donor_tab).norm() / exp.donor_tab.norm().clamp_min(1e-12))}
    finally:
        handle.detach()
    out["elapsed_s"] = time.perf_counter() - t0
    return out


def train_recipient_site(exp: Experiment, out: str | Path, *, seed: int = 0, overwrite: bool = False,
                         on_step: Callable[[int, float], None] | None = None, byte_head: Any = None,
                         mix: bool = True, hits: str = "all") -> dict[str, Any]:
    """Train a site of ``exp``'s recipient over the frozen donor table (the ``donor`` arm, with ``exp``'s init and
    gate) and save it to ``out``: a site folder naming the donor asset, which ``polymem eval --site`` and
    :func:`polymem.torch.attach.load_attached` take. Returns held-out bits per byte (in-domain set) of the model
    alone, at step 0 and after training. ``byte_head``: the donor's byte decoder; its reader's order weights
    (:class:`polymem.torch.bytesite.SiteBytes`) train with the site on the same steps and are saved with it;
    ``mix``: the reader interpolates its token probabilities with the model's (else it adds its scores); ``hits``:
    it reads an n-gram whose rows were written in "any" of the K heads, or only in "all" of them."""
    import shutil

    from polymem.recipes.frozen import train_site
    from polymem.recipes.nextbytes import W_LR
    from polymem.torch.attach import attach

    out = Path(out)
    if out.exists() and not overwrite:
        raise PolymemError(f"{str(out)!r} exists; pass --overwrite (overwrite=True) or another --out")
    cfg = FrozenTrainConfig(**{**asdict(exp.cfg), "seed": int(seed)})
    table, mode, vinit = arm_table("donor", exp.donor_tab, spec=exp.spec, layout=exp.layout, orders=exp.orders,
                                   seed=seed, init=exp.init, counts=exp.counts)
    if not str(exp.donor_path).startswith(("s3://", "gs://", "http://", "https://")):
        table.source = {"kind": "asset", "path": str(Path(exp.donor_path).resolve()), "dtype": "float32"}
    else:
        table.source = {"kind": "asset", "path": str(exp.donor_path), "dtype": "float32"}
    ind = exp.in_domain
    alone = exp.base_scores()[ind]
    handle = attach(exp.lm.model, table, exp.cache, layers=list(exp.layers), train=mode, max_n=exp.max_n,
                    gate=exp.gate, init_seed=1000 + int(seed), value_init=vinit)
    try:
        scale = _aligned_start(exp, handle, seed)["scale"] if vinit == "aligned" else None
        start = exp.score([ind])[ind] if vinit == "aligned" else alone
        reader = _byte_reader(exp, handle, byte_head, cfg.softmax, mix=mix, hits=hits)
        res = train_site(exp.lm, handle, exp.data.train, cfg, on_step=on_step, extra=[reader.w] if reader else (),
                         extra_lr=W_LR if reader else None)
        nb = {**reader.record(), "reader_s": reader.seconds, "w_lr": W_LR} if reader else None
        after = exp.score([ind])[ind]
        tmp = out.with_name(out.name + ".tmp-attach")
        if tmp.exists():
            shutil.rmtree(tmp)
        handle.save(tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)  # the folder appears whole
        params = sum(p.numel() for p in handle.sites.parameters())
    finally:
        handle.detach()
    return {"site": str(out), "asset": exp.donor_path, "model": exp.lm.name, "init": exp.init, "gate": exp.gate,
            "tokens": cfg.tokens, "heldout_bpb_alone": alone, "heldout_bpb_start": start, "heldout_bpb": after,
            "scored_set": ind, "site_parameters": int(params), "train_s": res["train_s"], "aligned_scale": scale,
            "alignment": exp.alignment_report(), **({"next_bytes": nb} if nb else {})}


def _donor_decoder(exp: Experiment) -> Any:
    from polymem.torch.bytehead import load_byte_head

    return load_byte_head(exp.donor_site, option="the donor_next_bytes arm")


def _reader_lr() -> float:
    from polymem.recipes.nextbytes import W_LR

    return W_LR


def _byte_reader(exp: Experiment, handle: Any, head: Any, softmax: str, mix: bool = False, hits: str = "any") -> Any:
    """The donor decoder's reader on ``handle`` (its weights from 0), or None without a decoder."""
    if head is None:
        return None
    from polymem.torch.bytesite import SiteBytes

    cut = np.unique(exp.data.train) if softmax == "corpus" else None  # the ids train_site's cut output layer keeps
    reader = SiteBytes(handle, exp.lm.model, exp.lm.tokenizer, head, cut_ids=cut, mix=mix, hits=hits)
    reader.install()
    return reader


def run_transfer(exp: Experiment, *, arms: Sequence[str], seeds: Sequence[int], eval_at: Sequence[int],
                 out_dir: str | Path, on_event: Callable[..., None] | None = None) -> dict[str, Any]:
    """Every (arm, seed) not yet in ``out_dir``, then the summary over ``arms`` × ``seeds`` (written as
    summary.json, and returned)."""
    from polymem._io import atomic_write_json

    ev = on_event or (lambda *a, **k: None)
    arms = check_arms(arms)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pts = eval_points(eval_at, exp.cfg.steps)
    runs: dict[tuple[str, int], dict[str, Any]] = {}
    for seed in seeds:
        for arm in arms:
            f = out / f"{arm}-seed{int(seed)}.json"
            key = exp.arm_key(arm, pts)
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
    """One (arm, seed) result, its shape checked: a file edited or cut short is refused, never summarised."""
    from polymem._io import MAX_JSON_BYTES, read_bounded

    try:
        got = json.loads(read_bounded(path, what="transfer result", max_bytes=MAX_JSON_BYTES, error=PolymemError,
                                      fix="remove it and run again").decode("utf-8"))
    except PolymemError:
        raise
    except (OSError, ValueError, RecursionError) as e:
        raise PolymemError(f"{str(path)!r} is not a readable result ({type(e).__name__}: {str(e)[:100]}); remove it and "
                           "run again") from None

    def num(x: Any) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x

    def docs(d: Any) -> bool:
        return (isinstance(d, dict) and isinstance(d.get("bits"), list) and isinstance(d.get("bytes"), list)
                and len(d["bits"]) == len(d["bytes"]) and all(num(x) for x in d["bits"])
                and all(isinstance(x, int) and x >= 0 for x in d["bytes"]))

    ok = (isinstance(got, dict) and isinstance(got.get("key"), str) and isinstance(got.get("curve_tokens"), list)
          and isinstance(got.get("curve_bpb"), list) and len(got["curve_tokens"]) == len(got["curve_bpb"])
          and all(num(x) for x in got["curve_bpb"]) and isinstance(got.get("bpb"), dict)
          and all(num(v) for v in got["bpb"].values()) and isinstance(got.get("docs"), dict)
          and all(docs(v) for v in got["docs"].values()) and isinstance(got.get("curve_docs"), list)
          and all(docs(v) for v in got["curve_docs"]))
    if not ok:
        raise PolymemError(f"{str(path)!r} is not a transfer result of this polymem (a field missing or of the wrong "
                           "type: edited, cut short or older); remove it and run again")
    return got


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
        if ARM_SPECS[arm].teach:
            res["arms"][arm]["teach"] = [r.get("teach") for r in rs]
        if ARM_SPECS[arm].fine_tunes_donor:
            res["arms"][arm]["table_drift"] = [r.get("table_drift") for r in rs]
        res["curves"][arm] = {"tokens": rs[0]["curve_tokens"], "bpb": [r["curve_bpb"] for r in rs]}
    gains = {arm: {k: {"bpb": [base[k] - v for v in res["arms"][arm]["bpb"][k]],
                       "share_of_base": [(base[k] - v) / base[k] for v in res["arms"][arm]["bpb"][k]]}
                   for k in sets} for arm in arms}
    from polymem.recipes.verdicts import compare_arms, paired_margins

    paired = paired_margins(arms, res)
    comparisons = compare_arms(arms, seeds, runs, exp.in_domain, sets)
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
        "comparisons": comparisons, "verdicts": [c["line"] for c in comparisons],
        "init": exp.init, "gate": exp.gate, "alignment": exp.alignment_report(),
        "donor_rows_hit": exp.donor_rows_hit(),
        "config": {**asdict(exp.cfg), "layers": list(exp.layers), "max_n": exp.max_n, "gate": exp.gate,
                   "window": exp.window, "train_stream_tokens": int(exp.data.train.size),
                   "corpus": exp.corpus},
        "key": runs[(arms[0], seeds[0])].get("key"),
    }
