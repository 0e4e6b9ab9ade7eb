"""Carrying what the donor read through text: the donor model, with its own table and site, writes text, and the
recipient learns from that text — on hard targets (the ``teach`` arm), or also by matching the donor's
likelihoods across the two tokenizers (the ``distill`` arm).

**The donor's text.** Prompts are the starts of the recipient's own documents (their first ``prompt_tokens``
donor tokens, short ones first, so that the donor's table, not the prompt, steers what follows); the donor with its
table and site continues each one (:func:`polymem.models.generate.generate`, low temperature) until ``tokens`` new
tokens are written. No prompt is taken from the documents the donor read: what leads into them is the donor's
own continuation.

**Distillation across tokenizers** follows the idea of approximate likelihood matching (Minixhofer, Vulić and
Ponti, "Universal Cross-Tokenizer Distillation via Approximate Likelihood Matching", 2025): compare the two
models only on *chunks* of text that both tokenizations start and end on the same byte boundary. A chunk's
likelihood under either model is the product of its tokens' probabilities (each model over its own
tokenization), and the loss is the binary cross-entropy between the donor's and the recipient's chunk
probabilities (the "binarised" divergence: the chunk, or anything else). The donor's chunk log-likelihoods are
computed once, with its table, over each whole document; the recipient's over its training windows, so a chunk
that a window cuts is left out.

Simplifications, said plainly: one tokenization path per model (its own encoding of the text, not a sum over
all), no debiasing of chunk ends, no hidden-state term; the donor conditions on the whole document, the
recipient on its window.

Not here: the arms' training loop (:func:`polymem.recipes.frozen.train_site`, with :func:`chunk_loss` as its
extra term), the study (:mod:`polymem.recipes.content`).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from polymem._io import read_keyed
from polymem.errors import PolymemError

PROMPT_SOURCES = ("recipient", "donor")


@dataclass(frozen=True, kw_only=True)
class TeachConfig:
    """How the donor writes the text its recipients learn from."""

    tokens: int = 4096  # new tokens the donor writes in all (the generation budget)
    new_tokens: int = 128  # new tokens per prompt
    prompt_tokens: tuple[int, ...] = (2, 6)  # each recipient document's first 2 and 6 donor tokens are prompts
    temperature: float = 0.7  # below 1: the donor's likely text, where its table pushes hardest (0.5 repeats itself)
    top_p: float = 0.95
    seed: int = 0
    batch: int = 16  # prompts of equal token length decoded together
    select: float = 1.0  # write select x tokens and keep the texts the donor's table knows best (see donor_text)
    # whose documents' starts are the prompts: "recipient" (the method), or "donor" (a diagnostic, not a method:
    # the starts of the documents the donor read, which a recipient does not have; an upper bound)
    prompts_from: str = "recipient"
    distill_weight: float = 1.0  # weight of the chunk-likelihood term against the hard targets (distill arm)

    def __post_init__(self) -> None:
        if not (isinstance(self.tokens, int) and self.tokens >= 1):
            raise PolymemError(f"teach tokens={self.tokens!r} must be a whole number >= 1 (the new tokens the donor "
                               "writes in all), e.g. --teach-tokens 4096")
        if self.prompts_from not in PROMPT_SOURCES:
            raise PolymemError(f"teach prompts_from={self.prompts_from!r} is unknown; accepted: {', '.join(PROMPT_SOURCES)}, "
                               "e.g. --teach-prompts recipient")
        if not (isinstance(self.select, (int, float)) and self.select >= 1):
            raise PolymemError(f"teach select={self.select!r} must be a number >= 1 (how many times the budget the donor "
                               "writes before keeping the texts its table knows best; 1 keeps all), e.g. --teach-select 2")


TEACH_BYTES_PER_TOKEN = 64  # teach.json per token the donor writes: its text, byte end and nats (one per line)


def check_teach_disk(cfg: TeachConfig, out_dir: str | Path | None) -> None:
    """A generation budget whose text would not fit on the disk of ``out_dir`` (or of the working directory) is
    refused before any model loads: the donor writes ``select × tokens`` tokens, kept in ``teach.json``."""
    import shutil

    where = Path(out_dir if out_dir is not None else ".").resolve()
    while not where.exists() and where != where.parent:
        where = where.parent
    need = int(cfg.tokens * cfg.select * TEACH_BYTES_PER_TOKEN)
    free = shutil.disk_usage(where).free
    if need > free:
        raise PolymemError(f"--teach-tokens {cfg.tokens:,} (x --teach-select {cfg.select:g}) would write about "
                           f"{need / 2**20:,.0f} MiB of donor text to {str(where)!r}, which has {free / 2**20:,.0f} MiB "
                           f"free; pass a smaller --teach-tokens (about {TEACH_BYTES_PER_TOKEN} bytes a token) or "
                           "another --out-dir")


def teach_prompts(texts: Sequence[str], cfg: TeachConfig, tokenizer: Any) -> list[str]:
    """As many prompts as the budget needs (``ceil(tokens / new_tokens)``), dealt from the documents' starts (cut
    after a whole number of the donor's tokens, so that prompts of one length decode together): every
    document's shortest start first, then the next length, again from the first document when all are used (a
    sampled continuation differs each time)."""
    tb = tokenizer.all_token_bytes()

    def start(t: str, k: int) -> str:
        return b"".join(tb[int(i)] or b"" for i in tokenizer.encode(t)[:k]).decode("utf-8", "ignore")

    starts = [p for k in sorted(cfg.prompt_tokens) for p in (start(t, k) for t in texts) if p.strip()]
    if not starts:
        raise PolymemError("the recipient's documents are empty; the teach and distill arms need text to prompt from")
    need = -(-int(cfg.tokens * cfg.select) // cfg.new_tokens)
    return [starts[i % len(starts)] for i in range(need)]


def _ends(tok: Any, ids: Sequence[int], n_bytes: int) -> np.ndarray | None:
    """Byte offset where each token ends, or None when the tokens' bytes do not add up to the text's (a tokenizer
    that normalises the text: no byte alignment)."""
    tb = tok.all_token_bytes()
    lens = [len(tb[i] or b"") for i in ids]
    ends = np.cumsum(np.asarray(lens, dtype=np.int64))
    return ends if ends.size and int(ends[-1]) == n_bytes else None


@torch.no_grad()
def donor_token_nats(lm: Any, ids: Sequence[int], handle: Any = None) -> np.ndarray:
    """Each token's nats under ``lm`` (with its attached site when ``handle`` is given), the first predicted from
    BOS; NaN for the first token of a model without BOS."""
    from polymem.models.evaluate import token_nats

    if handle is not None:
        handle.reset()
    dev = next(lm.model.parameters()).device
    ids_t = torch.tensor([list(ids)], dtype=torch.long)
    if lm.bos_id is not None:
        x = torch.cat([torch.tensor([[int(lm.bos_id)]]), ids_t[:, :-1]], dim=1)
        return token_nats(lm.model, x.to(dev), ids_t.to(dev))[0].cpu().double().numpy()
    out = np.full(len(ids), np.nan)
    if len(ids) > 1:
        out[1:] = token_nats(lm.model, ids_t[:, :-1].to(dev), ids_t[:, 1:].to(dev))[0].cpu().double().numpy()
    return out


def donor_text(donor_lm: Any, asset: str | Path, site: str | Path, prompts: Sequence[str], cfg: TeachConfig,
               ) -> dict[str, Any]:
    """The donor with its own table and site continues each prompt; then, with the table still on, each whole
    text's donor tokens (byte ends and nats) for distillation. Returns the texts and the cost (new tokens,
    seconds).

    With ``cfg.select`` > 1 the donor writes that many times the budget, scores each text again without its
    table, and keeps the texts on which its table lowers its loss most (relative), up to ``cfg.tokens`` new
    tokens: on the documents it read the table's gain is large, on other text small, so this keeps what the
    table knows."""
    from polymem.models.generate import Decoding, generate
    from polymem.torch.attach import load_attached

    h = load_attached(donor_lm.model, site, asset, tokenizer=donor_lm.tokenizer)
    t0 = time.perf_counter()
    try:
        g = generate(donor_lm, prompts, Decoding(max_new_tokens=cfg.new_tokens, temperature=cfg.temperature,
                                                  top_p=cfg.top_p, seed=cfg.seed), batch=cfg.batch, handle=h)
        gen_s = time.perf_counter() - t0
        docs = _scored(donor_lm, [r.prompt + r.text for r in g["results"]], h)
    finally:
        h.detach()
    written = [len(r.new_ids) for r in g["results"]]
    if cfg.select > 1:
        for d in docs:
            if d["donor_nats"] is None:
                d["table_gain"] = float("-inf")
                continue
            ids = [int(t) for t in donor_lm.tokenizer.encode(d["text"])]
            alone = float(np.nansum(donor_token_nats(donor_lm, ids)))
            d["table_gain"] = (alone - float(np.nansum(d["donor_nats"]))) / max(alone, 1e-9)
        keep, n = [], 0
        for i in sorted(range(len(docs)), key=lambda i: -docs[i]["table_gain"]):
            if n >= cfg.tokens:
                break
            keep.append(i)
            n += written[i]
        docs, written = [docs[i] for i in sorted(keep)], [written[i] for i in sorted(keep)]
    return {"docs": docs, "new_tokens": int(sum(written)), "written_tokens": int(sum(len(r.new_ids) for r in g["results"])),
            "prompts": len(prompts), "generate_s": gen_s, "total_s": time.perf_counter() - t0,
            "tokens_per_s": g["tokens_per_s"]}


OWN_PIECE = 1024  # donor tokens scored in one pass over a recipient document (a longer one is cut into pieces)


def _scored(donor_lm: Any, texts: Sequence[str], handle: Any) -> list[dict[str, Any]]:
    """Each text with its donor tokens' byte ends and nats (with the donor's table, through ``handle``); None for
    both where the donor's tokens do not spell the text's bytes. A text of more than :data:`OWN_PIECE` tokens is
    scored in pieces, each from the model's start, the first token of each later piece left unscored (NaN), so
    that no chunk target spans a cut."""
    docs = []
    for text in texts:
        ids = [int(t) for t in donor_lm.tokenizer.encode(text)]
        ends = _ends(donor_lm.tokenizer, ids, len(text.encode("utf-8")))
        nats = None
        if ends is not None:
            parts = [donor_token_nats(donor_lm, ids[i:i + OWN_PIECE], handle) for i in range(0, len(ids), OWN_PIECE)]
            for p in parts[1:]:
                p[0] = np.nan
            nats = np.concatenate(parts) if parts else np.zeros(0)
        docs.append({"text": text, "donor_ends": None if ends is None else [int(e) for e in ends],
                     "donor_nats": None if nats is None else [float(v) for v in nats]})
    return docs


def _key(donor_lm: Any, asset: str | Path, site: str | Path, **more: Any) -> str:
    """What the donor's text or targets depend on: the donor model, its table and site, and ``more``."""
    from polymem.torch.tablefile import open_table
    from polymem.torch.tables import table_fingerprint

    a = open_table(asset)
    tab = torch.from_numpy(np.ascontiguousarray(a.to_numpy(), dtype=np.float32))
    return hashlib.sha256(json.dumps({
        "model": donor_lm.name, "asset": table_fingerprint(tab, a.spec, a.layout),
        "site": hashlib.sha256((Path(site) / "site.json").read_bytes()).hexdigest(), **more},
        sort_keys=True).encode()).hexdigest()[:24]


def load_own_targets(donor_lm: Any, asset: str | Path, site: str | Path, recipient_texts: Sequence[str],
                     out_dir: str | Path) -> dict[str, Any]:
    """The donor model, with its table and site, scores the recipient's own documents (distillation on the
    recipient's text: the ``distill_own`` arms): each document's donor tokens, byte ends and nats, in the shape
    :func:`teach_data` reads. Kept in ``out_dir/own-targets.json`` with a key of the donor and the texts; a re-run
    with the same key reads it back."""
    from polymem._io import atomic_write_json
    from polymem.torch.attach import load_attached

    key = _key(donor_lm, asset, site, texts=hashlib.sha256("\x00".join(recipient_texts).encode()).hexdigest(),
               piece=OWN_PIECE)
    f = Path(out_dir) / "own-targets.json"
    got = read_keyed(f, key, what="the donor's predictions on the recipient's part")
    if got is not None:
        return got
    h = load_attached(donor_lm.model, site, asset, tokenizer=donor_lm.tokenizer)
    t0 = time.perf_counter()
    try:
        docs = _scored(donor_lm, list(recipient_texts), h)
    finally:
        h.detach()
    out = {"key": key, "docs": docs, "scored_tokens": sum(len(d["donor_ends"] or ()) for d in docs),
           "total_s": time.perf_counter() - t0}
    atomic_write_json(f, out, indent=1)
    return out


def load_donor_text(donor_lm: Any, asset: str | Path, site: str | Path, recipient_texts: Sequence[str],
                    cfg: TeachConfig, out_dir: str | Path) -> dict[str, Any]:
    """:func:`donor_text` kept in ``out_dir/teach.json`` with a key of the donor, its site, the prompts and ``cfg``;
    a re-run with the same key reads it back."""
    from polymem._io import atomic_write_json

    prompts = teach_prompts(recipient_texts, cfg, donor_lm.tokenizer)
    key = _key(donor_lm, asset, site, prompts=hashlib.sha256("\x00".join(prompts).encode()).hexdigest(), cfg=asdict(cfg))
    f = Path(out_dir) / "teach.json"
    got = read_keyed(f, key, what="the donor's text")
    if got is not None:
        return got
    out = {"key": key, "config": asdict(cfg), **donor_text(donor_lm, asset, site, prompts, cfg)}
    atomic_write_json(f, out, indent=1)
    return out


@dataclass
class TeachData:
    """The donor's text as the recipient's training stream, with the donor's chunk targets on it.

    ``stream``: recipient tokens, documents joined by EOS. Per stream position p (a target token): ``teacher[p]``,
    the donor's log-likelihood of the chunk that ends with token p (NaN where no chunk ends there), and
    ``first[p]``, the stream position of that chunk's first token."""

    stream: np.ndarray  # int64 [N]
    teacher: np.ndarray  # float64 [N]
    first: np.ndarray  # int64 [N]
    digest: str  # what the arms' results depend on
    chunks: int  # aligned chunks with a donor target
    cost: dict[str, Any]


def teach_data(lm: Any, got: dict[str, Any]) -> TeachData:
    """Tokenize the donor's texts with the recipient ``lm`` and align the donor's chunks to its tokens."""
    parts, teach, first = [], [], []
    at = 0
    for d in got["docs"]:
        text = d["text"]
        ids = np.asarray(lm.tokenizer.encode(text), dtype=np.int64)
        t = np.full(ids.size, np.nan)
        fi = np.arange(ids.size, dtype=np.int64) + at
        r_ends = _ends(lm.tokenizer, ids.tolist(), len(text.encode("utf-8")))
        if r_ends is not None and d.get("donor_ends") is not None:
            d_ends = np.asarray(d["donor_ends"], dtype=np.int64)
            d_cum = np.concatenate([[0.0], np.cumsum(-np.asarray(d["donor_nats"], dtype=np.float64))])  # log-lik to each end
            d_at = {int(e): i + 1 for i, e in enumerate(d_ends)}  # byte end -> donor tokens up to it
            prev_b, prev_j = 0, 0  # the last common boundary: byte offset, recipient token index after it
            for j, e in enumerate(r_ends.tolist()):
                k = d_at.get(int(e))
                if k is None:
                    continue
                k0 = d_at.get(prev_b, 0)
                t[j] = d_cum[k] - d_cum[k0]  # NaN when the chunk holds the donor's unscored first token
                fi[prev_j:j + 1] = at + prev_j
                prev_b, prev_j = int(e), j + 1
        parts.append(ids)
        teach.append(t)
        first.append(fi)
        at += ids.size
        if lm.eos_id is not None:
            parts.append(np.array([lm.eos_id], dtype=np.int64))
            teach.append(np.array([np.nan]))
            first.append(np.array([at], dtype=np.int64))
            at += 1
    stream = np.concatenate(parts)
    teacher = np.concatenate(teach)
    return TeachData(stream=stream, teacher=teacher, first=np.concatenate(first),
                     digest=hashlib.sha256(stream.tobytes() + np.nan_to_num(teacher, nan=1.0).tobytes()).hexdigest()[:24],
                     chunks=int(np.isfinite(teacher).sum()),
                     cost={k: got.get(k) for k in ("new_tokens", "written_tokens", "prompts", "generate_s", "total_s",
                                                    "tokens_per_s", "scored_tokens") if k in got})


def chunk_loss(data: TeachData, nats: torch.Tensor, starts: np.ndarray, bos: int | None) -> torch.Tensor:
    """The binarised chunk-likelihood loss on one batch: ``nats`` [B, T] the recipient's per-token nats on the
    windows starting at stream positions ``starts`` [B] (targets ``stream[s : s + T]`` with BOS, else
    ``stream[s + 1 : s + T + 1]``). Mean over the chunks wholly inside a window; 0 when there is none."""
    B, T = nats.shape
    off = 0 if bos is not None else 1
    pos = starts[:, None] + off + np.arange(T)[None, :]  # [B, T] stream position of each target
    tgt = torch.from_numpy(data.teacher[pos])  # [B, T]
    i0 = torch.from_numpy(data.first[pos] - (starts[:, None] + off))  # [B, T] chunk's first index in the window
    ok = torch.isfinite(tgt) & (i0 >= 0)
    if not bool(ok.any()):
        return nats.sum() * 0.0
    cs = torch.cumsum(-nats, dim=1)  # [B, T] recipient log-likelihood up to each target
    before = torch.where(i0 > 0, cs.gather(1, (i0 - 1).clamp_min(0).to(cs.device)), torch.zeros_like(cs))
    s = (cs - before)[ok.to(cs.device)].clamp(max=-1e-6)  # the recipient's chunk log-likelihood
    t = tgt[ok].to(s).clamp(max=-1e-6)
    p = t.exp()
    # binary cross-entropy of the recipient's chunk probability against the donor's (its minimum is the donor's
    # entropy; the gradient is that of the binary KL)
    return -(p * s + (1 - p) * torch.log(-torch.expm1(s))).mean()
