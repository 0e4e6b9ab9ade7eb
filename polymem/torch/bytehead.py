"""A byte decoder over a table's rows: what the rows say about the bytes that follow their n-gram.

The rows of a table are keyed by bytes (the hash of an n-gram's bytes), so any tokenizer reaches the same rows;
what they hold is read by a projection learnt with them, in one model's hidden space. A byte head makes the rows
say something in a code every tokenizer shares: for the n-gram ending at position t (order n), its gathered row
e_{t,n} (K heads × r, fp32) goes through one linear map per order, (K·r) → J × 256 logits, trained to predict
the J bytes that follow the n-gram's end in the text (the next token's bytes and beyond)::

    logits_{t,n} = W_n e_{t,n} + b_n        # [J, 256]   per order n, W_n [J·256, K·r]
    p_{t,n,j}    = softmax(logits_{t,n,j})  # the j-th byte after the n-gram's end

A row the table never wrote is all zeros and reads the decoder's prior ``softmax(b_n)``: the background every
row's score is measured against (:meth:`ByteHead.log_ratio`), so an unwritten row scores every byte 0.

Targets: the bytes of the tokens that follow, up to J, stopping at a token without bytes (a special token, e.g.
the EOS between two documents); bytes past it are not predicted (-1).

The decoder is saved beside a site as ``bytes.safetensors`` and named in its ``site.json`` (``"byte_head"``: J,
the orders, the row width and the file's sha256), both written whole (:mod:`polymem._io`).

:class:`DonorBytes` is the auxiliary loss that trains a decoder with a table (``polymem train --model
--byte-head J``). Not here: the recipient's arms that read it (:mod:`polymem.recipes.nextbytes`).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from polymem.errors import FormatError, PolymemError

MAX_BYTES = 16  # J: the most bytes after an n-gram a decoder predicts
BYTES_FILE = "bytes.safetensors"
STOP = -2  # a token without bytes, in a stream's byte string: nothing after it is predicted


def check_bytes(j: int, option: str = "--byte-head") -> int:
    """J checked: 1..MAX_BYTES (one line naming ``option`` otherwise)."""
    if isinstance(j, bool) or not isinstance(j, (int, np.integer)) or not 1 <= int(j) <= MAX_BYTES:
        raise PolymemError(f"{option} {j!r}: the bytes a row's decoder predicts must be 1..{MAX_BYTES}; "
                           f"pass e.g. {option} 8")
    return int(j)


def token_byte_matrix(token_bytes: Sequence[bytes | None], j: int, rows: int | None = None) -> np.ndarray:
    """int16 [rows, J]: the first J bytes of each token id, -1 past its end; a token without bytes (special)
    and ids past the tokenizer's vocabulary (``rows`` > its size: a padded embedding) are all -1.

    >>> token_byte_matrix([b"ab", None, b"xyz"], 2).tolist()
    [[97, 98], [-1, -1], [120, 121]]"""
    V = len(token_bytes) if rows is None else int(rows)
    out = np.full((V, j), -1, dtype=np.int16)
    for i, b in enumerate(token_bytes[:V]):
        if b:
            k = min(len(b), j)
            out[i, :k] = np.frombuffer(b[:k], dtype=np.uint8)
    return out


def next_byte_targets(stream: np.ndarray, token_bytes: Sequence[bytes | None], j: int) -> np.ndarray:
    """int16 [S, J]: for each position s of the token stream, the J bytes that start at token s's first byte
    (its bytes, then the next tokens'), -1 from a token without bytes on and past the stream's end.

    >>> tb = [b"ab", b"c", None, b"de"]
    >>> next_byte_targets(np.array([0, 1, 2, 3]), tb, 3).tolist()
    [[97, 98, 99], [99, -1, -1], [-1, -1, -1], [100, 101, -1]]"""
    stream = np.asarray(stream, dtype=np.int64)
    each: dict[int, np.ndarray] = {}  # per vocabulary id in the stream
    for t in np.unique(stream):
        b = token_bytes[int(t)]
        each[int(t)] = np.frombuffer(b, dtype=np.uint8).astype(np.int16) if b else np.array([STOP], dtype=np.int16)
    parts = [each[int(t)] for t in stream]
    lens = np.array([p.size for p in parts], dtype=np.int64)
    flat = np.concatenate(parts + [np.array([STOP], dtype=np.int16)]) if parts else np.array([STOP], np.int16)
    off = np.concatenate([[0], np.cumsum(lens)[:-1]]) if lens.size else np.zeros(0, np.int64)  # [S]
    idx = np.minimum(off[:, None] + np.arange(j)[None, :], flat.size - 1)  # [S, J]
    vals = flat[idx]
    stop = np.logical_or.accumulate(vals == STOP, axis=1)  # a stop, and everything after it
    return np.where(stop, -1, vals).astype(np.int16)


class ByteHead(nn.Module):
    """One linear decoder per order: rows e [..., N, K, r] -> byte logits [..., N, J, 256]."""

    def __init__(self, orders: int, heads: int, head_dim: int, j: int, *, seed: int = 0) -> None:
        super().__init__()
        self.orders, self.heads, self.head_dim, self.j = int(orders), int(heads), int(head_dim), check_bytes(j)
        D = self.heads * self.head_dim
        g = torch.Generator().manual_seed(int(seed))
        # a random start: with a zero table and a zero decoder neither would ever get a gradient
        self.weight = nn.Parameter(torch.randn(self.orders, self.j * 256, D, generator=g) / D ** 0.5)  # [N, J·256, D]
        self.bias = nn.Parameter(torch.zeros(self.orders, self.j * 256))  # [N, J·256]

    def forward(self, e: torch.Tensor) -> torch.Tensor:
        """e fp32 [..., N, K, r] -> logits [..., N, J, 256]."""
        *lead, N, K, r = e.shape
        x = e.reshape(-1, N, K * r).float()  # [M, N, D]
        z = torch.einsum("mnd,nod->mno", x, self.weight) + self.bias  # [M, N, J·256]
        return z.view(*lead, N, self.j, 256)

    def log_ratio(self, e: torch.Tensor) -> torch.Tensor:
        """log p - log q [..., N, J, 256]: each byte's log-probability against the decoder's prior q (what it
        says of a zero row), so a row the table never wrote scores every byte 0."""
        lp = F.log_softmax(self.forward(e), dim=-1)
        prior = F.log_softmax(self.bias.view(self.orders, self.j, 256), dim=-1)  # [N, J, 256]
        return lp - prior

    def describe(self) -> dict[str, Any]:
        return {"bytes": self.j, "orders": self.orders, "heads": self.heads, "head_dim": self.head_dim}


def byte_loss(logits: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean cross-entropy, accuracy) of ``logits`` [B, T, N, J, 256] on ``targets`` long [B, T, J] (-1: none),
    counted where ``valid`` [B, T, N] (the n-gram has a row)."""
    B, T, N, J, _ = logits.shape
    y = targets.unsqueeze(2).expand(B, T, N, J)
    y = torch.where(valid.unsqueeze(-1), y, torch.full_like(y, -1))  # [B, T, N, J]
    m = y >= 0
    if not bool(m.any()):
        z = logits.sum() * 0.0
        return z, z.detach()
    ce = F.cross_entropy(logits.reshape(-1, 256), y.reshape(-1).clamp_min(0), reduction="none").view(y.shape)
    acc = (logits.argmax(-1) == y).float()
    return ce[m].mean(), acc[m].mean().detach()


class DonorBytes:
    """The auxiliary byte loss of a table training on ``stream`` (a token stream read in windows whose starts
    are given): ``aux(nats, starts)`` for :func:`polymem.recipes.frozen.train_site`, ``params`` for its
    optimizer, ``record()`` for the provenance. The loss, times ``weight``, trains the decoder and the rows."""

    def __init__(self, handle: Any, stream: np.ndarray, token_bytes: Sequence[bytes | None], j: int, *,
                 weight: float = 1.0, bos: int | None, seed: int = 0) -> None:
        check_bytes(j)
        if not weight > 0:
            raise PolymemError(f"--byte-weight {weight!r} must be > 0; pass e.g. 1.0")
        lay = handle.table.layout
        self.handle, self.weight, self.off = handle, float(weight), 0 if bos is not None else 1
        self.head = ByteHead(handle.max_n, lay.heads, lay.head_dim, j, seed=seed)
        dev = handle.table.weight.device
        self.head.to(dev)
        self.targets = torch.from_numpy(next_byte_targets(stream, token_bytes, j).astype(np.int64))  # [S, J]
        self.losses: list[float] = []
        self.accs: list[float] = []

    @property
    def params(self) -> list[nn.Parameter]:
        return list(self.head.parameters())

    def aux(self, nats: torch.Tensor, starts: np.ndarray) -> torch.Tensor:
        rows = self.handle._rows  # [B, T, N, K] of the forward just run
        e = self.handle.table.gather(rows)  # [B, T, N, K, r], with the table's gradient
        B, T = rows.shape[:2]
        idx = torch.from_numpy(np.asarray(starts)[:, None] + np.arange(T)[None, :] + self.off)  # [B, T]
        y = self.targets[idx].to(rows.device)  # [B, T, J]: the bytes after position t's n-gram
        loss, acc = byte_loss(self.head(e), y, rows[..., 0] >= 0)
        self.losses.append(float(loss.detach()))
        self.accs.append(float(acc))
        return self.weight * loss

    def record(self) -> dict[str, Any]:
        k = max(1, min(10, len(self.losses)))
        return {**self.head.describe(), "weight": self.weight,
                "byte_loss_first": self.losses[0] if self.losses else None,
                "byte_loss_last10": float(np.mean(self.losses[-k:])) if self.losses else None,
                "byte_acc_last10": float(np.mean(self.accs[-k:])) if self.accs else None}


def save_byte_head(head: ByteHead, site_dir: str | os.PathLike[str], *, record: dict[str, Any] | None = None) -> Path:
    """Write ``bytes.safetensors`` beside a saved site and name it in its ``site.json`` (each file whole)."""
    from safetensors.torch import save_file

    from polymem._io import atomic_path, atomic_write_json, read_json

    d = Path(site_dir)
    header = read_json(d / "site.json", what="site header", fix="save the site before its byte decoder")
    with atomic_path(d / BYTES_FILE, fsync=True) as tmp:
        save_file({"weight": head.weight.detach().cpu().contiguous(), "bias": head.bias.detach().cpu().contiguous()},
                  str(tmp))
    sha = hashlib.sha256((d / BYTES_FILE).read_bytes()).hexdigest()
    header["byte_head"] = {**head.describe(), "file": BYTES_FILE, "sha256": sha, **(record or {})}
    atomic_write_json(d / "site.json", header, indent=1, sort_keys=True, fsync=True)
    return d / BYTES_FILE


def load_byte_head(site_dir: str | os.PathLike[str], *, option: str = "the next_bytes arm") -> ByteHead:
    """The decoder a site folder names (:func:`save_byte_head`); a site without one, or a file that is not what
    site.json says, is refused in one line."""
    from polymem._io import read_json

    d = Path(site_dir)
    if not (d / "site.json").is_file():
        raise PolymemError(f"{option} reads the donor's byte decoder, and {str(d)!r} holds no site; pass the donor's "
                           "site folder, trained with --byte-head J")
    header = read_json(d / "site.json", what="site header", fix="pass the folder `polymem train --model` wrote")
    bh = header.get("byte_head") if isinstance(header, dict) else None
    if not isinstance(bh, dict):
        raise PolymemError(f"{option} reads the donor's byte decoder, and the site {str(d)!r} has none; train the "
                           "donor with --byte-head J (`polymem train --model ... --byte-head 8`, or "
                           "--donor-byte-head 8 in a content-split run)")
    return read_decoder(d / str(bh.get("file", BYTES_FILE)), bh, where=str(d / "site.json"),
                        fix="train the donor again with --byte-head J")


def read_decoder(f: Path, rec: dict[str, Any], *, where: str, fix: str) -> ByteHead:
    """The decoder file ``f`` that ``rec`` (a site.json entry: orders, heads, head_dim, bytes, sha256) names,
    frozen; a file that is not that one (sha256, keys, shapes) is one FormatError naming it and ``where``."""
    from safetensors.torch import load_file

    from polymem._io import load_regular_safetensors

    try:
        got = load_regular_safetensors(f, what="byte decoder", load=load_file, fix=fix)
        if hashlib.sha256(f.read_bytes()).hexdigest() != rec.get("sha256"):
            raise ValueError("sha256 differs from site.json's")
        head = ByteHead(int(rec["orders"]), int(rec["heads"]), int(rec["head_dim"]), int(rec["bytes"]))
        head.load_state_dict({"weight": got["weight"], "bias": got["bias"]})
    except PolymemError:
        raise
    except Exception as e:  # noqa: BLE001 - safetensors, a missing key or a wrong shape all mean the same
        raise FormatError(f"{str(f)!r} is not the byte decoder {where!r} names ({type(e).__name__}: "
                          f"{str(e).splitlines()[0][:120] if str(e) else ''}); {fix}") from None
    head.requires_grad_(False)
    return head


POLISH_STEPS = 1000  # steps a donor's decoder trains on alone after the table (rows frozen; polish_decoder)
FIT_BATCH = 512  # positions per step of fit_decoder
POLISH_LR = 1e-3


def rows_and_targets(stream: np.ndarray, tokenizer: Any, cache: Any, layout: Any, N: int, J: int,
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows [S, N, K] of the n-grams ending at each position of the token ``stream``, the J bytes after each
    [S, J]; -1 where none)."""
    from polymem.torch.hash import TorchTokenHashes

    rows = TorchTokenHashes.from_cache(cache).ngram_rows(torch.from_numpy(stream)[None], layout, N)[0]
    y = torch.from_numpy(next_byte_targets(stream, tokenizer.all_token_bytes(), J).astype(np.int64))
    return rows, torch.cat([y[1:], torch.full((1, J), -1)])  # the bytes after the n-gram ending at s


def _loss_on(head: ByteHead, table: torch.Tensor, rows: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    e = table.index_select(0, rows.reshape(-1).clamp_min(0)) * (rows.reshape(-1, 1) >= 0)
    return byte_loss(head(e.view(1, *rows.shape, -1)), y[None], (rows[..., 0] >= 0)[None])[0]


LOSS_POSITIONS = 32768  # positions (evenly spaced) a polish record's byte loss is measured on
LOSS_CHUNK = 2048  # positions decoded at once for it (a [chunk, N, J, 256] block of logits)


@torch.no_grad()
def _mean_loss(head: ByteHead, table: torch.Tensor, rows: torch.Tensor, y: torch.Tensor) -> float:
    """The byte loss over at most :data:`LOSS_POSITIONS` evenly spaced positions, decoded in chunks (a whole
    corpus at once would not fit), each chunk's mean weighted by its targets."""
    at = torch.from_numpy(np.unique(np.linspace(0, rows.shape[0] - 1, min(rows.shape[0], LOSS_POSITIONS)).astype(np.int64)))
    total, count = 0.0, 0
    for a in range(0, at.numel(), LOSS_CHUNK):
        i = at[a:a + LOSS_CHUNK]
        r, t = rows[i], y[i]
        n = int(((r[..., 0] >= 0).unsqueeze(-1) & (t.unsqueeze(1) >= 0)).sum())  # [q, N, J]: what byte_loss counts
        if n:
            total += float(_loss_on(head, table, r, t)) * n
            count += n
    return total / count if count else float("nan")


def fit_decoder(head: ByteHead, table: torch.Tensor, rows: torch.Tensor, y: torch.Tensor, *, steps: int,
                batch: int = FIT_BATCH, lr: float, seed: int) -> dict[str, Any]:
    """Train ``head`` (in place, then frozen) to predict the bytes ``y`` [S, J] after the rows ``rows`` [S, N, K]
    of the frozen ``table``: AdamW on random batches of positions. Returns its losses and time."""
    import time

    t0 = time.perf_counter()
    head.requires_grad_(True)
    opt = torch.optim.AdamW(head.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    g = np.random.default_rng(int(seed))
    losses = []
    for _ in range(steps):
        i = torch.from_numpy(g.integers(0, rows.shape[0], size=batch))
        loss = _loss_on(head, table, rows[i], y[i])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    head.requires_grad_(False)
    return {"steps": steps, "batch": batch, "lr": lr, "loss_first": losses[0] if losses else None,
            "loss_last10": float(np.mean(losses[-10:])) if losses else None, "seconds": time.perf_counter() - t0}


def polish_decoder(head: ByteHead, table: torch.Tensor, spec: Any, layout: Any, tokenizer: Any,
                   stream: np.ndarray, *, check: np.ndarray | None = None,
                   steps: int | None = None) -> tuple[ByteHead, dict[str, Any]]:
    """The donor's decoder trained on alone over the donor's own token ``stream`` (its ``tokenizer``; the table
    frozen, no model forward: rows -> bytes), ``steps`` (default :data:`POLISH_STEPS`) steps of :data:`FIT_BATCH`
    positions, from the jointly
    trained decoder ``head`` (a copy; ``head`` is kept). In the donor's run the decoder sees a few positions per
    step of the model; the rows hold more than it learnt to read by then. ``check``: another stream whose byte
    loss is reported before and after (a diagnostic; it does not train). Returns the polished copy and its
    record (losses, the byte loss on ``stream`` and ``check`` before and after)."""
    import copy

    from polymem.hash.token_hashes import TokenHashes

    cache = TokenHashes.build(tokenizer, spec)
    own = rows_and_targets(np.asarray(stream, dtype=np.int64), tokenizer, cache, layout, head.orders, head.j)
    other = (rows_and_targets(np.asarray(check, dtype=np.int64), tokenizer, cache, layout, head.orders, head.j)
             if check is not None and len(check) else None)
    new = copy.deepcopy(head)

    def losses(h: ByteHead) -> dict[str, float]:
        return {"own": _mean_loss(h, table, *own), **({"check": _mean_loss(h, table, *other)} if other is not None else {})}

    before = losses(head)
    rec = fit_decoder(new, table, *own, steps=POLISH_STEPS if steps is None else int(steps), lr=POLISH_LR, seed=3000)
    return new, {**rec, "byte_loss_before": before, "byte_loss_after": losses(new), "positions": int(own[0].shape[0])}
