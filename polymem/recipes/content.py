"""What the donor read, does the recipient know? A transfer study that splits a corpus by document.

The other transfer studies score text neither model trained on, where a donor table can only help through the
domain's general statistics. Here the corpus is split by document, seeded, into three parts:

* ``donor``     — read only by the donor (its table and site train on them, every document, several passes);
* ``recipient`` — the recipient's arms train on them (:mod:`polymem.recipes.pretrained`, unchanged);
* ``unseen``    — read by nobody.

Every arm, and the donor model with its own table and site, is scored on donor-read and on unseen documents.
Per arm: the relative change of bits per byte against the same model alone on each set, and the
**content-specific part**, the change on donor-read minus the change on unseen documents, with a 95 % bootstrap
interval over documents (:func:`polymem.recipes.stats.content_bootstrap`; negative: the memory knows what the
donor read). The donor's own content part is the ceiling; each arm's share of it is what it recovered.

Resumable in pieces under one folder: ``split.json`` (the split; another split in the same folder is refused),
``donor.pmem`` and ``donor.pmem.site`` (the donor, kept once written), ``arms/ARM-seedS.json`` (as ``transfer
--model``), ``donor-own.json`` (the donor's own scores), then ``content-summary.json``.

Not here: the arms' training (:mod:`polymem.recipes.pretrained`), the donor's training
(:func:`polymem.recipes.frozen.train_table`), the CLI (``polymem transfer --model --content-split``).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from polymem._io import read_json, read_keyed
from polymem.errors import PolymemError
from polymem.recipes.arms import ARM_SPECS, METHODS, check_arms
from polymem.recipes.frozen import FrozenTrainConfig
from polymem.recipes.options import ExperimentData, RecipientSite

PARTS = ("donor", "recipient", "unseen")


@dataclass(frozen=True, kw_only=True)
class ContentSplit:
    """Shares of the corpus's documents in each part (each > 0, together <= 1; documents left over are not
    used) and the seed of the permutation that deals them."""

    donor: float = 0.3
    recipient: float = 0.5
    unseen: float = 0.2
    seed: int = 0

    def __post_init__(self) -> None:
        f = (self.donor, self.recipient, self.unseen)
        if not all(0 < x <= 1 for x in f) or sum(f) > 1 + 1e-9:
            raise PolymemError(f"content split {self.text()!r}: each share must be in (0, 1] and together at most 1; "
                               "e.g. 0.3,0.5,0.2 (donor, recipient, unseen)")

    def text(self) -> str:
        return f"{self.donor:g},{self.recipient:g},{self.unseen:g}"

    @classmethod
    def parse(cls, text: str, seed: int = 0) -> "ContentSplit":
        """``"0.3,0.5,0.2"``: the donor's, the recipient's and the unseen share."""
        try:
            f = [float(x) for x in text.split(",")]
        except ValueError:
            f = []
        if len(f) != 3:
            raise PolymemError(f"--content-split {text!r} must be three shares of the documents, donor,recipient,unseen, "
                               "e.g. --content-split 0.3,0.5,0.2")
        return cls(donor=f[0], recipient=f[1], unseen=f[2], seed=int(seed))

    def assign(self, n_docs: int) -> dict[str, list[int]]:
        """Document indices of each part (sorted): a seeded permutation dealt in order donor, recipient, unseen,
        each part ``round(share * n_docs)`` documents. A part left empty is refused."""
        n = int(n_docs)
        sizes = [int(np.floor(f * n + 0.5)) for f in (self.donor, self.recipient, self.unseen)]
        while sum(sizes) > n:  # rounding up three times can ask for one document more than there are
            sizes[int(np.argmax(sizes))] -= 1
        empty = [p for p, k in zip(PARTS, sizes) if k == 0]
        if empty:
            need = int(np.ceil(0.5 / min(self.donor, self.recipient, self.unseen)))
            raise PolymemError(f"content split {self.text()} of {n} document(s) leaves the {' and '.join(empty)} part "
                               f"empty; give a corpus of at least {need} documents or a larger share to that part")
        perm = np.random.default_rng(self.seed).permutation(n)
        out, at = {}, 0
        for p, k in zip(PARTS, sizes):
            out[p] = sorted(int(i) for i in perm[at:at + k])
            at += k
        return out


@dataclass(frozen=True, kw_only=True)
class ContentOptions:
    """How a content-split transfer run gets its donor and measures it."""

    split: ContentSplit
    donor_cfg: FrozenTrainConfig | None = None  # how the donor trains on its part (None: with donor_asset)
    donor_asset: str | None = None  # a donor trained before on exactly the donor part (its provenance says so)
    resamples: int = 2000  # bootstrap resamples of the content part's interval
    teach: Any = None  # how the donor writes text for the teach and distill arms (TeachConfig; None: its defaults)
    byte_head: int = 0  # J > 0: the donor trains a byte decoder with its rows (polymem.recipes.nextbytes)
    byte_weight: float = 1.0  # the weight of its loss


def content_parts(docs: Sequence[str], split: ContentSplit) -> dict[str, Any]:
    """The three parts' texts and a record of the split (shares, seed, indices, each part's digest)."""
    from polymem.recipes.frozen import documents_digest

    idx = split.assign(len(docs))
    texts = {p: [docs[i] for i in idx[p]] for p in PARTS}
    rec = {"shares": {p: getattr(split, p) for p in PARTS}, "seed": split.seed, "documents": len(docs),
           "indices": idx, "digests": {p: documents_digest(texts[p]) for p in PARTS}}
    return {"texts": texts, "record": rec}


def check_donor_read(asset: str | Path, donor_texts: Sequence[str]) -> None:
    """Refuse a donor whose provenance does not say it trained on exactly ``donor_texts`` (every document)."""
    from polymem.recipes.frozen import documents_digest
    from polymem.torch.tablefile import open_table

    prov = dict(getattr(open_table(asset), "provenance", {}) or {})
    got, want = prov.get("train_documents"), documents_digest(donor_texts)
    if got != want:
        said = (f"{got.get('documents')} other document(s)" if isinstance(got, dict) else "nothing about what it read")
        raise PolymemError(f"the donor {str(asset)!r} did not read the donor part of this split (its provenance says "
                           f"{said}; the part is {want['documents']} document(s)); train it on that part with "
                           "`polymem train --model M --heldout-every 0`, or drop --asset to have the donor trained here")


def _check_split_record(out: Path, rec: dict[str, Any]) -> None:
    from polymem._io import atomic_write_json

    f = out / "split.json"
    if os.path.lexists(f):
        old = read_json(f, what="the split record", error=PolymemError, fix="remove that folder to start over")
        if old != json.loads(json.dumps(rec)):
            raise PolymemError(f"{str(out)!r} holds a run of another split or corpus ({str(f)!r}); pass another "
                               "--out-dir, or remove that folder to start over")
        return
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(f, rec, indent=1)


def prepare_donor(donor_lm: Any, parts: dict[str, Any], opts: ContentOptions, out_dir: str | Path, *,
                  eval_tokens: int, window: int, on_step: Callable[[int, float], None] | None = None,
                  on_phase: Callable[[str], None] | None = None) -> tuple[Path, Path]:
    """The donor's asset and site: ``opts.donor_asset`` (checked to have read the donor part), else the one in
    ``out_dir`` from an earlier run (checked the same way, and for the same training settings), else trained
    now on every document of the donor part, scoring the unseen part. Returns (asset, site folder)."""
    from polymem.recipes.frozen import train_table
    from polymem.torch.tablefile import open_table

    texts = parts["texts"]
    if opts.donor_asset is not None:
        check_donor_read(opts.donor_asset, texts["donor"])
        return Path(opts.donor_asset), Path(str(opts.donor_asset) + ".site")
    if opts.donor_cfg is None:
        raise PolymemError("a content-split run needs the donor's training settings (donor_cfg) or a donor asset")
    out = Path(out_dir) / "donor.pmem"
    site = Path(str(out) + ".site")
    if out.exists() and (site / "site.json").is_file():
        check_donor_read(out, texts["donor"])
        prov = dict(getattr(open_table(out), "provenance", {}) or {})
        want = json.loads(json.dumps(asdict(opts.donor_cfg)))
        bh = (prov.get("byte_head") or {}).get("bytes", 0), (prov.get("byte_head") or {}).get("weight", opts.byte_weight)
        if (prov.get("frozen_train_config") != want or (prov.get("model") or {}).get("name") != donor_lm.name
                or bh != (opts.byte_head, opts.byte_weight)):
            raise PolymemError(f"{str(out)!r} was trained with other settings or another model; pass another "
                               "--out-dir, or remove that folder to start over")
        return out, site
    train_table(donor_lm, [], out, cfg=opts.donor_cfg, site_dir=site, texts=texts["donor"], heldout_every=0,
                heldout_texts=texts["unseen"], eval_tokens=eval_tokens, window=window, overwrite=True,
                on_step=on_step, on_phase=on_phase, byte_head=opts.byte_head, byte_weight=opts.byte_weight,
                byte_polish=0)  # the study's arms polish it themselves (donor_next_bytes_mix_polished), to compare
    return out, site


def donor_own(donor_lm: Any, asset: str | Path, site: str | Path, sets: dict[str, list[str]], *, window: int,
              out_dir: str | Path) -> dict[str, Any]:
    """The donor model alone and with its own table and site, each document's bits on every scoring set (the
    ceiling of what a recipient can recover). Kept in ``out_dir/donor-own.json`` with a key of the donor and
    the sets; a re-run with the same key reads it back."""
    from polymem._io import atomic_write_json
    from polymem.models.evaluate import Scorer
    from polymem.torch.attach import load_attached
    from polymem.torch.tablefile import open_table
    from polymem.torch.tables import table_fingerprint

    import torch

    a = open_table(asset)
    tab = torch.from_numpy(np.ascontiguousarray(a.to_numpy(), dtype=np.float32))
    key = hashlib.sha256(json.dumps({
        "model": donor_lm.name, "table": table_fingerprint(tab, a.spec, a.layout),
        "site": hashlib.sha256((Path(site) / "site.json").read_bytes()).hexdigest(), "window": int(window),
        "sets": {k: hashlib.sha256("\x00".join(v).encode()).hexdigest() for k, v in sets.items()}},
        sort_keys=True).encode()).hexdigest()[:24]
    f = Path(out_dir) / "donor-own.json"
    got = read_keyed(f, key, what="the donor's own scores")
    if got is not None:
        return got
    scorers = {k: Scorer(donor_lm, v, window=window) for k, v in sets.items()}

    def docs(r: dict[str, Any]) -> dict[str, Any]:
        return {"bpb": r["bpb"], "bits": [(d["bpb"] or 0.0) * d["bytes"] for d in r["per_doc"]],
                "bytes": [d["bytes"] for d in r["per_doc"]]}

    alone = {k: docs(s.score()) for k, s in scorers.items()}
    h = load_attached(donor_lm.model, site, asset, tokenizer=donor_lm.tokenizer)
    try:
        with_table = {k: docs(s.score()) for k, s in scorers.items()}
    finally:
        h.detach()
    out = {"key": key, "model": donor_lm.name, "asset": str(asset), "alone": alone, "with_table": with_table}
    atomic_write_json(f, out, indent=1)
    return out


def content_summary(exp: Any, transfer: dict[str, Any], runs_dir: str | Path, own: dict[str, Any],
                    split: dict[str, Any], *, resamples: int = 2000, donor_seed: int = 0) -> dict[str, Any]:
    """Per arm and for the donor itself: the change on donor-read and unseen documents, the content part with
    its interval per seed, and (arms) the share of the donor's own content part recovered."""
    from polymem.recipes.pretrained import _read
    from polymem.recipes.stats import content_bootstrap

    seeds, arms = list(transfer["seeds"]), list(transfer["arms"])
    base = exp.base_docs()
    own_c = content_bootstrap(([own["with_table"]["read"]["bits"]], own["alone"]["read"]["bits"]),
                              ([own["with_table"]["unseen"]["bits"]], own["alone"]["unseen"]["bits"]),
                              resamples=resamples)
    ceiling = own_c["diff"][0]
    per_arm: dict[str, Any] = {}
    for arm in arms:
        rs = [_read(Path(runs_dir) / f"{arm}-seed{int(s)}.json") for s in seeds]
        c = content_bootstrap(([r["docs"]["read"]["bits"] for r in rs], base["read"]["doc_bits"]),
                              ([r["docs"]["unseen"]["bits"] for r in rs], base["unseen"]["doc_bits"]),
                              resamples=resamples)
        # a share of the donor's content part: defined where the donor's own is a gain (negative)
        c["recovered"] = [d / ceiling + 0.0 if ceiling < 0 else None for d in c["diff"]]  # + 0.0: no -0.0
        c["method"] = METHODS.get(arm, arm)
        per_arm[arm] = c
    return {"donor_model": own["model"], "recipient_model": exp.lm.name, "seeds": seeds, "donor_seed": int(donor_seed),
            "split": split, "donor_own": own_c, "arms": per_arm, "transfer": transfer,
            "definition": "change: (bits per byte with the memory - alone) / alone on a set; content part: change on "
                          "donor-read documents minus change on unseen ones (negative: the memory knows what the donor "
                          "read), 95 % bootstrap interval over documents; recovered: an arm's content part over the "
                          "donor's own"}


def content_record(summary: dict[str, Any]) -> dict[str, Any]:
    """One direction of ``docs/results/content-transfer.json``: relative changes against the model alone
    (negative = better) per seed on donor-read and unseen documents, for the donor itself and every arm."""
    own = summary["donor_own"]
    return {"donor": summary["donor_model"], "recipient": summary["recipient_model"], "seeds": summary["seeds"],
            "split": {k: summary["split"][k] for k in ("shares", "seed", "documents")},
            "donor_own": {"read": own["read"], "unseen": own["unseen"], "content": own["diff"],
                          "content_lo": own["lo"], "content_hi": own["hi"]},
            "arms": {arm: {"read": c["read"], "unseen": c["unseen"], "content": c["diff"], "content_lo": c["lo"],
                           "content_hi": c["hi"], "recovered": c["recovered"], "method": c["method"]}
                     for arm, c in summary["arms"].items()}}


def write_content_results(path: str | Path, record: dict[str, Any]) -> dict[str, Any]:
    """Add one direction to the results file at ``path`` (``{"directions": [...]}``), replacing the entry of
    the same donor and recipient; written atomically. Returns what was written."""
    from polymem._io import atomic_write_json

    p = Path(path)
    doc: dict[str, Any] = {"directions": []}
    if os.path.lexists(p):
        got = read_json(p, what="the results file", error=PolymemError, fix="remove it or pass another path")
        if not isinstance(got, dict) or not isinstance(got.get("directions"), list):
            raise PolymemError(f"{str(p)!r} is not a content-transfer results file (no \"directions\" list); pass "
                               "another path")
        doc = got
    doc["directions"] = [d for d in doc["directions"] if not (isinstance(d, dict) and d.get("donor") == record["donor"]
                                                                and d.get("recipient") == record["recipient"])]
    doc["directions"].append(record)
    atomic_write_json(p, doc, indent=1)
    return doc


def run_content_transfer(lm: Any, donor_lm: Any, data: ExperimentData, *, cfg: FrozenTrainConfig,
                         content: ContentOptions, arms: Sequence[str], seeds: Sequence[int], eval_at: Sequence[int],
                         out_dir: str | Path, site: RecipientSite = RecipientSite(),
                         on_event: Callable[..., None] | None = None) -> dict[str, Any]:
    """The whole study for one direction (donor model -> recipient ``lm``): split, donor, arms, the donor's own
    scores, the content summary (written to ``out_dir/content-summary.json`` and returned).

    ``data``: the documents that are split (``texts``, else the ``corpus`` files), more scoring sets
    (``eval_corpora``), the tokens per scoring set and the window; the split decides what trains and what is
    scored, so its ``heldout_every``, ``eval_texts`` and ``doc_tokens`` are refused. ``site``: the recipient's
    sites (its ``donor_site`` is the one trained here with the donor)."""
    from dataclasses import replace

    from polymem._io import atomic_write_json
    from polymem.recipes.data import read_documents
    from polymem.recipes.pretrained import Experiment, run_transfer

    if data.heldout_every or data.eval_texts or data.doc_tokens:
        raise PolymemError("the content study scores the parts of its split: heldout_every, eval_texts and doc_tokens "
                           "of its ExperimentData are not read; drop them")
    ev = on_event or (lambda *a, **k: None)
    out = Path(out_dir)
    docs = list(data.texts) if data.texts is not None else read_documents(list(data.corpus))
    parts = content_parts(docs, content.split)
    if content.donor_asset is not None:  # said before anything trains
        check_donor_read(content.donor_asset, parts["texts"]["donor"])
    _check_split_record(out, parts["record"])
    ev("phase", what="donor")
    window = data.window
    asset, dsite = prepare_donor(donor_lm, parts, content, out, eval_tokens=data.eval_tokens, window=window,
                                 on_step=lambda i, loss: ev("donor_step", step=i, loss=loss))
    t = parts["texts"]
    edata = ExperimentData(texts=t["recipient"], heldout_every=0, eval_corpora=data.eval_corpora,
                           eval_texts={"read": t["donor"], "unseen": t["unseen"]}, eval_tokens=data.eval_tokens,
                           window=window)
    exp = Experiment(lm, str(asset), edata, cfg=cfg, donor_lm=donor_lm if site.init == "aligned" else None,
                     site=replace(site, donor_site=dsite))
    texts = {ARM_SPECS[a].teach for a in check_arms(arms)} - {None}
    if texts:
        from polymem.recipes.teach import TeachConfig, load_donor_text, load_own_targets, teach_data

        exp.teach_cfg = content.teach or TeachConfig()
    if "written" in texts:
        ev("phase", what="the donor writes")
        exp.teach = teach_data(lm, load_donor_text(donor_lm, asset, dsite, t[exp.teach_cfg.prompts_from],
                                                   exp.teach_cfg, out))
    if any(ARM_SPECS[a].decoder == "polished" for a in check_arms(arms)):
        from polymem.recipes.frozen import corpus_stream
        from polymem.torch.bytehead import load_byte_head, polish_decoder

        if "polish" in (read_json(Path(dsite) / "site.json", what="the donor's site header").get("byte_head") or {}):
            raise PolymemError(f"the donor's byte decoder in {str(dsite)!r} was trained on alone already (its site.json "
                               "records a polish): the donor_next_bytes_mix_polished arms would polish it twice; run "
                               "donor_next_bytes_mix (or _all), which read it as it is")

        def stream(texts: Sequence[str]) -> np.ndarray:  # as the donor's training reads them: EOS between documents
            return corpus_stream(donor_lm, [], texts=list(texts), heldout_every=0).train

        ev("phase", what="the donor trains its byte decoder on")
        exp.polished = polish_decoder(load_byte_head(dsite, option="the polished arm"), exp.donor_tab, exp.spec,
                                      exp.layout, donor_lm.tokenizer, stream(t["donor"]), check=stream(t["unseen"]))
    if "own" in texts:
        ev("phase", what="the donor scores the recipient's part")
        exp.teach_own = teach_data(lm, load_own_targets(donor_lm, asset, dsite, t["recipient"], out))
    ev("phase", what="arms")
    transfer = run_transfer(exp, arms=arms, seeds=seeds, eval_at=eval_at, out_dir=out / "arms", on_event=ev)
    ev("phase", what="donor_own")
    own = donor_own(donor_lm, asset, dsite, {k: exp.eval_texts[k] for k in ("read", "unseen")}, window=window,
                    out_dir=out)
    donor_seed = content.donor_cfg.seed if content.donor_cfg is not None else 0
    summary = content_summary(exp, transfer, out / "arms", own, parts["record"], resamples=content.resamples,
                              donor_seed=donor_seed)
    atomic_write_json(out / "content-summary.json", summary, indent=1)
    return summary
