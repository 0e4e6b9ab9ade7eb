"""Held-out bits per byte of a pretrained causal LM, per document and overall.

Each document is tokenized alone (the model's tokenizer, no special tokens) and cut into windows of at most
``window`` predicted tokens. A window starts from the model's BOS token where it has one: the input is
``[BOS] + chunk[:-1]`` and every token of the chunk is predicted, so every token of the document is scored
exactly once. Without a BOS token the first token of a document is context only (never scored) and each window
after the first starts on the previous window's last token. Windows of one batch are right-padded; causal
attention never lets a padded position reach a scored one, and padded targets are not scored.

bits per byte = Σ cross-entropy (nats) / ln 2 / Σ bytes of the scored tokens (their bytes under the tokenizer;
for a byte-faithful tokenizer, the document's UTF-8 bytes). Tokens without bytes (specials) are not scored.

Not here: loading models (:mod:`.registry`), attaching tables (:func:`polymem.attach`), the CLI (``polymem eval``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from polymem.errors import PolymemError


@dataclass(frozen=True)
class Window:
    doc: int  # document index
    inputs: np.ndarray  # int64 [n]
    targets: np.ndarray  # int64 [n]


def token_byte_lengths(tokenizer: Any) -> np.ndarray:
    """int64 [vocab]: bytes of each token id (0 for specials and ids without bytes)."""
    return np.array([len(b) if b else 0 for b in tokenizer.all_token_bytes()], dtype=np.int64)


def document_windows(docs: Sequence[np.ndarray], window: int, bos: int | None) -> list[Window]:
    """The windows of every document (see the module docstring), in document order."""
    if window < 2:
        raise PolymemError(f"window={window} must be >= 2 tokens")
    out: list[Window] = []
    for d, ids in enumerate(docs):
        ids = np.asarray(ids, dtype=np.int64)
        if bos is not None:
            for s in range(0, ids.size, window):
                chunk = ids[s:s + window]
                out.append(Window(d, np.concatenate([[bos], chunk[:-1]]).astype(np.int64), chunk))
        else:
            for s in range(0, max(ids.size - 1, 0), window):
                chunk = ids[s:s + window + 1]
                out.append(Window(d, chunk[:-1], chunk[1:]))
    return out


def _batches(windows: list[Window], batch: int):
    """Batches of windows, longest first, each of at most ``batch`` × (the longest window) positions once padded,
    and no window in a batch shorter than half its first: a document's short last window no longer pads to a full
    one, and short windows go more than ``batch`` at a time. Scores are summed per document: the order is free."""
    order = sorted(windows, key=lambda w: -w.inputs.size)
    budget = batch * (order[0].inputs.size if order else 0)
    i = 0
    while i < len(order):
        j = i + 1  # order[i] is the batch's longest: it sets every row's padded length
        while (j < len(order) and (j - i + 1) * order[i].inputs.size <= budget
               and 2 * order[j].inputs.size >= order[i].inputs.size):
            j += 1
        yield order[i:j]
        i = j


def pad_batch(ws: list[Window], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(inputs [B, T], targets [B, T], mask [B, T] of real positions), right-padded with ``pad_id``."""
    T = max(w.inputs.size for w in ws)
    x = np.full((len(ws), T), pad_id, dtype=np.int64)
    y = np.full((len(ws), T), pad_id, dtype=np.int64)
    m = np.zeros((len(ws), T), dtype=bool)
    for i, w in enumerate(ws):
        x[i, :w.inputs.size] = w.inputs
        y[i, :w.targets.size] = w.targets
        m[i, :w.targets.size] = True
    return torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(m)


def token_nats(model: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-position cross-entropy in nats (fp32) [B, T] of ``model`` (a transformers causal LM) on inputs x."""
    logits = model(input_ids=x).logits  # [B, T, V]
    return F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="none").view(y.shape)


@torch.no_grad()
def score_documents(model: Any, windows: list[Window], n_docs: int, lengths: np.ndarray, *, batch: int = 4,
                    pad_id: int = 0, on_batch: Callable[[int], None] | None = None) -> dict[str, np.ndarray]:
    """Sum of nats, scored tokens and scored bytes per document: {"nats", "tokens", "bytes"} arrays [n_docs]."""
    nats = np.zeros(n_docs, dtype=np.float64)
    ntok = np.zeros(n_docs, dtype=np.int64)
    nbytes = np.zeros(n_docs, dtype=np.int64)
    dev = next(model.parameters()).device
    L = torch.from_numpy(lengths)
    for ws in _batches(windows, batch):
        x, y, m = pad_batch(ws, pad_id)
        ce = token_nats(model, x.to(dev), y.to(dev)).cpu().double()  # [B, T]
        by = L[y.clamp(0, L.numel() - 1)] * m  # [B, T] bytes of real targets
        scored = by > 0
        for i, w in enumerate(ws):
            nats[w.doc] += float(ce[i][scored[i]].sum())
            ntok[w.doc] += int(scored[i].sum())
            nbytes[w.doc] += int(by[i].sum())
        if on_batch is not None:
            on_batch(len(ws))
    return {"nats": nats, "tokens": ntok, "bytes": nbytes}


DOC_SHARE = 8  # a scoring set of N tokens takes at most N // 8 from one document: it spans at least 8 documents


def scoring_set(tokenizer: Any, texts: Sequence[str], max_tokens: int | None = None, *,
                doc_tokens: int | None = None) -> list[tuple[int, str]]:
    """The one rule every command scores held-out text by (``train --model``, ``attach``, ``transfer --model``,
    ``eval``): the documents in order, each cut at a token boundary to its first ``doc_tokens`` tokens (default
    ``max_tokens // 8`` when ``max_tokens`` is given, so that a set spans several documents; None: whole), until
    ``max_tokens`` tokens in all (None: every document). Returns (index of the document, its scored text)."""
    if max_tokens is not None and max_tokens < 1:
        raise PolymemError(f"max_tokens={max_tokens!r} must be >= 1 (or None: every document)")
    if doc_tokens is None and max_tokens is not None:
        doc_tokens = max(max_tokens // DOC_SHARE, 1)
    out: list[tuple[int, str]] = []
    n = 0
    for i, t in enumerate(texts):
        if max_tokens is None and doc_tokens is None:
            out.append((i, t))
            continue
        ids = tokenizer.encode(t)
        keep = min(len(ids), doc_tokens or len(ids), (max_tokens - n) if max_tokens is not None else len(ids))
        if keep <= 0 and max_tokens is not None and n >= max_tokens:
            break
        piece = t if keep == len(ids) else tokenizer.decode_bytes(ids[:keep]).decode("utf-8", errors="ignore")
        if piece:
            out.append((i, piece))
            n += keep
        if max_tokens is not None and n >= max_tokens:
            break
    if not out:
        raise PolymemError("no held-out text to score; use a corpus with more documents or a larger eval budget")
    return out


def bpb(nats: float, nbytes: int) -> float:
    return float(nats) / math.log(2) / max(int(nbytes), 1)


class Scorer:
    """One model and one set of documents, tokenized once; :meth:`score` runs the model over them (as it is
    now: with whatever is attached, enabled or not) and returns per-document and overall bits per byte. Which
    text (a sample of long documents) is :func:`scoring_set`'s to say, before this."""

    def __init__(self, lm: Any, texts: Sequence[str], *, window: int = 512, batch: int = 4,
                 names: Sequence[str] | None = None, lengths: np.ndarray | None = None) -> None:
        if not texts:
            raise PolymemError("no documents to score; pass a corpus with at least one non-empty document")
        self.lm, self.batch = lm, int(batch)
        cfg = getattr(getattr(lm, "model", None), "config", None)
        most = getattr(cfg, "max_position_embeddings", None)
        if isinstance(most, int) and window > most:
            raise PolymemError(f"--window {window} is longer than {getattr(lm, 'name', 'the model')}'s {most:,} positions "
                               f"(max_position_embeddings); a window past them is scored wrongly or not at all. Pass "
                               f"--window {min(most, 512)} or less")
        self.names = list(names) if names is not None else [str(i) for i in range(len(texts))]
        self.docs = [np.asarray(lm.tokenizer.encode(t), dtype=np.int64) for t in texts]
        self.lengths = token_byte_lengths(lm.tokenizer) if lengths is None else lengths
        self.windows = document_windows(self.docs, window, lm.bos_id)
        self.window = int(window)
        if self.num_bytes == 0:
            raise PolymemError(f"the {len(texts)} document(s) to score hold no bytes in their scored tokens (empty, or "
                               "only special tokens): bits per byte would be 0/0. Pass documents with text")
        self.pad_id = int(lm.eos_id if lm.eos_id is not None else (lm.bos_id or 0))

    @property
    def num_windows(self) -> int:
        return len(self.windows)

    @property
    def num_tokens(self) -> int:
        """Tokens scored (those with bytes)."""
        return int(sum(int((self.lengths[w.targets] > 0).sum()) for w in self.windows))

    @property
    def num_bytes(self) -> int:
        """Bytes of the tokens scored: the denominator of bits per byte."""
        return int(sum(int(self.lengths[w.targets].sum()) for w in self.windows))

    def score(self, on_batch: Callable[[int], None] | None = None) -> dict[str, Any]:
        s = score_documents(self.lm.model, self.windows, len(self.docs), self.lengths, batch=self.batch,
                            pad_id=self.pad_id, on_batch=on_batch)
        per_doc = [{"doc": n, "tokens": int(t), "bytes": int(b), "bpb": bpb(x, b) if b else None}
                   for n, t, b, x in zip(self.names, s["tokens"], s["bytes"], s["nats"])]
        return {"bpb": bpb(s["nats"].sum(), s["bytes"].sum()), "tokens": int(s["tokens"].sum()),
                "bytes": int(s["bytes"].sum()), "nats": float(s["nats"].sum()), "per_doc": per_doc}


def evaluate(lm: Any, texts: Sequence[str], *, attach: Callable[[], Any] | None = None,
             sites: Sequence[tuple[str, Callable[[], Any]]] = (), table_off: bool | None = None, window: int = 512,
             batch: int = 4, names: Sequence[str] | None = None,
             on_batch: Callable[[str, int], None] | None = None,
             on_start: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Bits per byte of ``lm`` on ``texts``: ``"alone"`` (nothing attached), scored once, and for each site in
    ``sites`` (a label and a function that attaches a table to ``lm.model`` and returns the handle) its
    ``"with_table"`` score and, when ``table_off``, ``"table_off"`` (the same handle switched off), under
    ``"sites"``; each handle is detached before the next attaches. ``attach`` is one unnamed site (``table_off``
    defaults to True for it); with exactly one site its scores are also at the top level.
    ``on_start(passes × windows)`` is called once, with the windows the whole call will score."""
    sc = Scorer(lm, texts, window=window, batch=batch, names=names)
    todo = list(sites) + ([("site", attach)] if attach is not None else [])
    off = bool(table_off) if table_off is not None else attach is not None
    if on_start is not None:
        on_start(sc.num_windows * (1 + len(todo) * (2 if off else 1)))
    cb = (lambda name: (lambda n: on_batch(name, n))) if on_batch is not None else (lambda name: None)
    out: dict[str, Any] = {"model": lm.name, "window": window, "bos": lm.bos_id, "documents": len(texts),
                           "windows": sc.num_windows, "tokens": sum(int(d.size) for d in sc.docs),
                           "precision": getattr(lm, "precision", "fp32")}
    out["alone"] = sc.score(cb("alone"))
    if not todo:
        return out
    out["sites"] = []
    for label, fn in todo:
        handle = fn()
        try:
            got: dict[str, Any] = {"site": label, "with_table": sc.score(cb(f"{label}: with table"))}
            if off:
                with handle.disabled():
                    got["table_off"] = sc.score(cb(f"{label}: table off"))
        finally:
            handle.detach()
        out["sites"].append(got)
    if len(todo) == 1:
        out.update({k: v for k, v in out["sites"][0].items() if k != "site"})
    return out
