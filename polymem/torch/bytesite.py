"""Next bytes in a site: the donor's byte decoder over its frozen table, added to a recipient model's next-token
logits, and its record in the recipient's site folder.

:class:`ByteBias` hooks a model's forward: at each position t the rows of the n-grams ending at t (the donor's
table, frozen) are decoded by the donor's byte decoder (:class:`polymem.torch.bytehead.ByteHead`, frozen) into
log p_{n,j}(b) − log q_{n,j}(b) per order n, byte position j and byte b (q: the decoder's prior, what it says of a
row the table never wrote), and every vocabulary token v with bytes b_1..b_L gets::

    s_v(t) = Σ_n w_n Σ_{j ≤ min(L, J)} [log p_{t,n,j}(b_j) − log q_{n,j}(b_j)]     (special tokens: 0)

added to its logit. Only the N order weights w_n train, from 0 (the model alone). :class:`SiteBytes` is the same
reader bound to an attached site (:class:`polymem.torch.attach.AttachHandle`): it reads the rows the handle hashed
for the forward (with its decoding history, so incremental generation reads the same n-grams as a full pass),
from the handle's table (in memory or paged), and is off while the handle is disabled.

A site folder records it in ``site.json`` under ``"next_bytes"`` (the decoder's J, orders and row width, the file
``bytes.safetensors`` beside it and its sha256, the learned weights), each file written whole
(:mod:`polymem._io`); :func:`read_next_bytes` checks every field and the file's sha256 before installing it.

Not here: training the decoder with the donor's table (:mod:`polymem.torch.bytehead`), the content study's arms
(:mod:`polymem.recipes.nextbytes`), training the weights with a site (:func:`polymem.recipes.pretrained.
train_recipient_site`).
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from polymem.errors import FormatError, PolymemError
from polymem.torch.bytehead import BYTES_FILE, MAX_BYTES, ByteHead, read_decoder, token_byte_matrix

MIX_CAP = 0.9  # mix=True: the orders' mixture weights together at most this
HITS = ("any", "all")  # which rows a reader reads: written in any of their K heads, or in all (an n-gram the donor never read rarely collides in every head)
CHUNK = 256  # positions per block of the vocabulary scores when scoring (a [CHUNK, V] float block)
RECORD = "next_bytes"  # the key of site.json that names the reader


class ByteBias:
    """Hooks on a recipient model that add the byte scores of the donor's rows to its next-token logits."""

    def __init__(self, lm: Any, head: ByteHead, table: torch.Tensor | None, layout: Any, cache: Any, max_n: int,
                 cut_ids: np.ndarray | None = None, confidence: bool = False, mix: bool = False,
                 hits: str = "any") -> None:
        from polymem.torch.hash import TorchTokenHashes

        if hits not in HITS:
            raise PolymemError(f"hits={hits!r} is unknown; accepted: {', '.join(HITS)} (all: read a row only where "
                               "every head's row was written), e.g. --next-bytes-hits all")
        # "all": an n-gram whose K head rows are not all written (a hash collision in some head, or an n-gram the
        # donor never read) scores 0, as an unwritten row does
        self.hits = hits

        self.lm, self.head, self.table, self.layout, self.N = lm, head, table, layout, int(max_n)
        self.tc = TorchTokenHashes.from_cache(cache) if cache is not None else None
        self.w = nn.Parameter(torch.zeros(self.N))  # [N]: 0 = the model alone
        # confidence: each order's weight is w_n + u_n·c_{t,n}, c the decoder's mean top-byte probability of the row
        self.u = nn.Parameter(torch.zeros(self.N)) if confidence else None
        self.mix = mix  # interpolate probabilities instead (:meth:`mixed`); w_n is then order n's mixture weight
        out = lm.model.get_output_embeddings()
        V = int(getattr(out, "out_features", 0) or lm.model.config.vocab_size)
        bm = torch.from_numpy(token_byte_matrix(lm.tokenizer.all_token_bytes(), head.j, rows=V).astype(np.int64))
        self.full = torch.where(bm < 0, torch.full_like(bm, 256), bm)  # [V, J]; 256: a column of zeros (no score)
        self.cut = self.full[torch.from_numpy(cut_ids)] if cut_ids is not None else None
        self.ids: torch.Tensor | None = None
        self.hooks: list[Any] = []

    def install(self) -> "ByteBias":
        def pre(module: Any, args: Any, kwargs: Any) -> None:
            self.ids = kwargs.get("input_ids", args[0] if args else None)

        def post(module: Any, args: Any, output: Any) -> Any:
            output.logits = self.add(output.logits)
            return output

        self.hooks = [self.lm.model.register_forward_pre_hook(pre, with_kwargs=True),
                      self.lm.model.register_forward_hook(post)]
        return self

    def remove(self) -> None:
        for h in self.hooks:
            h.remove()
        self.hooks = []

    def log_ratio(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(log p − log q [B, T, N, J, 256] of the rows of the n-grams ending at each position, rows [B, T, N, K])."""
        assert self.tc is not None and self.table is not None  # a ByteBias built with its own table and hashes
        rows = self.tc.ngram_rows(ids.cpu(), self.layout, self.N)  # [B, T, N, K]
        e = self.table.index_select(0, rows.reshape(-1).clamp_min(0)) * (rows.reshape(-1, 1) >= 0)
        with torch.no_grad():
            return self._read(e.view(*rows.shape, -1)), rows

    def _read(self, e: torch.Tensor) -> torch.Tensor:
        """The decoder's log-ratios [B, T, N, J, 256] of the gathered rows ``e`` [B, T, N, K, r] (0 where the
        reader's ``hits`` rule does not read the n-gram)."""
        lr = self.head.log_ratio(e)
        if self.hits == "all":
            lr = lr * (e.abs().amax(-1) > 0).all(-1)[..., None, None].to(lr.dtype)
        return lr

    def scores(self, d: torch.Tensor, bm: torch.Tensor) -> torch.Tensor:
        """d [P, J, 256] per-byte scores -> [P, V] each token's sum over its first J bytes."""
        d = torch.cat([d, d.new_zeros(*d.shape[:-1], 1)], dim=-1)  # [P, J, 257]
        s = d[:, 0, :].index_select(1, bm[:, 0])
        for j in range(1, bm.shape[1]):
            if s.requires_grad:
                s = s + d[:, j, :].index_select(1, bm[:, j])
            else:
                s.add_(d[:, j, :].index_select(1, bm[:, j]))  # in place: a [P, V] block less per byte
        return s  # [P, V]

    def add(self, logits: torch.Tensor) -> torch.Tensor:
        if self.ids is None:
            raise PolymemError("the byte bias ran without the model's input_ids; call the model with input_ids")
        V = logits.shape[-1]
        bm = self.full if V == self.full.shape[0] else self.cut
        if bm is None or bm.shape[0] != V:
            raise PolymemError(f"the model returned {V} logits; the byte bias knows {self.full.shape[0]} ids")
        lr, _ = self.log_ratio(self.ids)
        lr = lr[:, lr.shape[1] - logits.shape[1]:]  # the positions the model computed logits for (logits_to_keep)
        B, T = lr.shape[:2]
        if bm.device != lr.device:  # moved once, then kept where the rows are read
            self.full = self.full.to(lr.device)
            self.cut = self.cut.to(lr.device) if self.cut is not None else None
            bm = bm.to(lr.device)
        if self.mix:
            return self.mixed(logits, lr, bm)
        g = self.w.to(lr.device).view(1, 1, self.N)  # [1, 1, N]: each order's weight at each position
        if self.u is not None:
            prior = torch.log_softmax(self.head.bias.view(self.N, self.head.j, 256), dim=-1)
            c = (lr + prior).exp().amax(-1).mean(-1)  # [B, T, N]: the decoder's confidence in the row
            g = g + self.u.to(lr.device).view(1, 1, self.N) * c
        d = (lr * g.unsqueeze(-1).unsqueeze(-1)).sum(2).reshape(B * T, self.head.j, 256)  # [B·T, J, 256]
        if torch.is_grad_enabled() and self.w.requires_grad:
            return logits.float() + self.scores(d, bm).view(B, T, V).to(logits.device)
        flat = logits.view(B * T, V)
        for a in range(0, B * T, CHUNK):  # in place, a block of positions at a time (V may be 262k)
            flat[a:a + CHUNK] += self.scores(d[a:a + CHUNK], bm).to(flat.device, flat.dtype)
        return logits

    def mixed(self, logits: torch.Tensor, lr: torch.Tensor, bm: torch.Tensor) -> torch.Tensor:
        """Log-probabilities of the mixture (1 − Σ_n λ_n) p + Σ_n λ_n p_n, p the model's next-token distribution
        and p_n ∝ p · exp(s_n) the model's reweighted by order n's byte scores alone (an unwritten row: p_n = p),
        as log p + log1p(Σ_n λ_n (p_n / p − 1)). λ_n = w_n clamped to [0, MIX_CAP / N] in the forward, the
        gradient passing as if unclamped; at λ = 0 this is log p, the model alone. A wrong memory costs at most
        log(1 − Σλ) nats, as in kNN-LM's interpolation.

        Only the (position, order) pairs whose row the table wrote (any of its K heads) are scored over the
        vocabulary: an unwritten row scores every byte 0 (p_n = p, its term is 0); without gradients an order
        whose λ_n is 0 is skipped too, and the vocabulary-sized blocks are updated in place."""
        B, T, N = lr.shape[:3]
        V, P = logits.shape[-1], B * T
        w = self.w.to(lr.device)
        lam = w + (w.clamp(0.0, MIX_CAP / N) - w).detach()  # [N]
        x = logits.float().reshape(P, V).to(lr.device)
        d = lr.reshape(P, N, self.head.j, 256)
        grad = torch.is_grad_enabled() and self.w.requires_grad
        written = d.abs().flatten(2).amax(-1) > 0  # [P, N]
        live = [n for n in range(N) if grad or float(lam[n]) != 0.0]
        step = P if grad else CHUNK
        out = []
        for a in range(0, P, step):
            lp = torch.log_softmax(x[a:a + step], dim=-1)  # [p, V]
            acc = torch.zeros_like(lp)
            for n in live:
                at = written[a:a + step, n].nonzero().squeeze(1)  # the positions whose order-n row was written
                if at.numel() == 0:
                    continue
                every = at.numel() == lp.shape[0]
                lpn = lp if every else lp.index_select(0, at)
                s = self.scores(d[a:a + step, n] if every else d[a:a + step, n].index_select(0, at), bm)  # [q, V]
                lse = torch.logsumexp(lpn + s, dim=-1, keepdim=True)
                if grad:  # p_n / p − 1, differentiable in the model's logits and in λ
                    s = torch.exp(s - lse) - 1.0
                    acc = acc + lam[n] * s if every else acc.index_add(0, at, lam[n] * s)
                    continue
                s = s.sub_(lse).exp_().sub_(1.0)  # the same in place, without gradients
                if every:
                    acc.add_(s, alpha=float(lam[n]))
                else:
                    acc.index_add_(0, at, s, alpha=float(lam[n]))
            out.append(lp + torch.log1p(acc) if grad else acc.log1p_().add_(lp))
        return torch.cat(out).view(B, T, V).to(logits.device)


class SiteBytes(ByteBias):
    """A :class:`ByteBias` bound to an attached site: the handle's rows and table, off while the handle is
    disabled, removed by ``handle.detach()`` and saved by ``handle.save()``. ``seconds``: time spent in its
    forward so far (what the cost line reports)."""

    def __init__(self, handle: Any, model: Any, tokenizer: Any, head: ByteHead, *,
                 cut_ids: np.ndarray | None = None, mix: bool = False, hits: str = "any") -> None:
        if handle.byte_reader is not None:
            raise PolymemError("the site already has a byte reader (handle.byte_reader); remove it first "
                               "(handle.byte_reader.remove())")
        lay = handle.table.layout
        if head.orders != handle.max_n or head.heads != lay.heads or head.head_dim != lay.head_dim:
            raise PolymemError(f"the byte decoder reads orders 1..{head.orders} of {head.heads} × {head.head_dim} rows; "
                               f"the site reads orders 1..{handle.max_n} of {lay.heads} × {lay.head_dim}: use the "
                               "decoder trained with this table (its site folder's bytes.safetensors)")
        from polymem.tokenizers import load_tokenizer

        super().__init__(SimpleNamespace(model=model, tokenizer=load_tokenizer(tokenizer)), head, None, lay, None,
                         handle.max_n, cut_ids, mix=mix, hits=hits)
        self.handle, self.seconds = handle, 0.0
        handle.byte_reader = self

    def remove(self) -> None:
        """Unhook the reader; the handle no longer has it (nor saves it)."""
        super().remove()
        if self.handle.byte_reader is self:
            self.handle.byte_reader = None

    def log_ratio(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.handle._rows  # [B, T, N, K]: hashed by the handle for this forward, with its history
        if rows is None:
            raise PolymemError("the byte reader ran without the site's rows; call the attached model with input_ids")
        e = self.handle.table.gather(rows)  # [B, T, N, K, r], 0 where no row
        if next(self.head.parameters()).device != e.device:
            self.head.to(e.device)
        with torch.no_grad():
            return self._read(e.detach()), rows

    def add(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.handle.enabled:
            return logits
        sync = torch.cuda.synchronize if logits.is_cuda else (lambda: None)
        sync()
        t0 = time.perf_counter()
        out = super().add(logits)
        sync()
        self.seconds += time.perf_counter() - t0
        return out

    def record(self) -> dict[str, Any]:
        """What site.json says of the reader (the file's sha256 is added by :meth:`save`)."""
        return {**self.head.describe(), "file": BYTES_FILE, "weights": [float(x) for x in self.w.detach().cpu()],
                "mix": bool(self.mix), "hits": self.hits}

    def save(self, site_dir: str | os.PathLike[str]) -> dict[str, Any]:
        """Write the decoder into ``site_dir`` (whole) and return the record site.json names it with."""
        from safetensors.torch import save

        from polymem._io import atomic_write_bytes

        data = save({"weight": self.head.weight.detach().cpu().contiguous(),
                     "bias": self.head.bias.detach().cpu().contiguous()})
        atomic_write_bytes(Path(site_dir) / BYTES_FILE, data, fsync=True)
        return {**self.record(), "sha256": hashlib.sha256(data).hexdigest()}


def read_next_bytes(handle: Any, model: Any, tokenizer: Any, site_dir: str | os.PathLike[str],
                    rec: Any) -> SiteBytes:
    """Install the reader a site folder records (``rec``: site.json's ``"next_bytes"``) on ``handle``'s model:
    every field and the decoder file's sha256 checked, one FormatError naming what is wrong otherwise."""
    d = Path(site_dir)
    where, fix = str(d / "site.json"), "run `polymem attach` again (or remove the site's next_bytes entry)"

    def num(x: Any) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and np.isfinite(x)

    def whole(x: Any, lo: int, hi: int) -> bool:
        return isinstance(x, int) and not isinstance(x, bool) and lo <= x <= hi

    ok = (isinstance(rec, dict) and whole(rec.get("bytes"), 1, MAX_BYTES) and whole(rec.get("orders"), 1, 64)
          and whole(rec.get("heads"), 1, 1 << 16) and whole(rec.get("head_dim"), 1, 1 << 16)
          and rec.get("file") == BYTES_FILE and isinstance(rec.get("sha256"), str)
          and isinstance(rec.get("weights"), list) and len(rec["weights"]) == rec["orders"]
          and all(num(x) for x in rec["weights"]) and isinstance(rec.get("mix", False), bool)
          and rec.get("hits", "any") in HITS)
    if not ok:
        raise FormatError(f"{where}: its {RECORD!r} entry is not a byte reader's record (bytes 1..{MAX_BYTES}, orders, "
                          f"heads, head_dim, file {BYTES_FILE!r}, sha256, one weight per order, mix true or false, "
                          f"hits {' or '.join(HITS)}); {fix}")
    head = read_decoder(d / BYTES_FILE, rec, where=where, fix=fix)
    reader = SiteBytes(handle, model, tokenizer, head, mix=rec.get("mix", False), hits=rec.get("hits", "any"))
    with torch.no_grad():
        reader.w.copy_(torch.tensor(rec["weights"], dtype=torch.float32))
    reader.w.requires_grad_(False)
    reader.install()
    return reader
