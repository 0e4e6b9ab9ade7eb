"""Rows of a forward from an asset's page service, decoded in torch on the consumer's device.

:class:`PagedRows` turns the rows of a forward (int64 ``[...]``, -1 = invalid) into fp32 ``[..., r]``:

1. plan (host): the distinct stored chunks the rows live in (a page read once per batch however many
   n-grams hit it), and where each row sits in them;
2. fetch: :class:`polymem.asset.pages.PageService` hands out cached chunks and starts reads for the others;
3. finish: the chunks are stacked into one uint8 buffer, moved to the device (CUDA: a pinned host staging
   buffer and a non-blocking copy on a side stream) and decoded there, vectorised — float16/bfloat16 rows
   are widened, NF4 codes are looked up and scaled (the same float32 products as :func:`polymem.asset.nf4.dequantize`,
   so results are bit-identical to the in-memory table made from the same asset).

With prefetch, :meth:`PagedRows.start` (called from the model's forward pre-hook, before block 0) runs steps
1-2, so the reads overlap the blocks before the first site; :meth:`PagedRows.gather` (called by each site)
waits only for reads not finished yet, then decodes (cheap, vectorised), and every later site of that forward
reuses the result. Without prefetch the reads happen inside the first site's gather, in the calling thread.
Not here: the cache and reads (:mod:`polymem.asset.pages`), the site maths (:mod:`.site`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from polymem.asset.nf4 import NF4_LEVELS

_TORCH_FLOAT = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class _Plan:
    shape: tuple[int, ...]  # rows.shape
    device: torch.device
    chunks: np.ndarray  # int64 [n] distinct chunk ids, sorted
    slot: np.ndarray  # int64 [m] index into chunks of each valid row
    inner: np.ndarray  # int64 [m] row index inside its chunk
    valid: np.ndarray | None  # bool [M] (None = all valid)


class _CudaStager:
    """Pinned host staging buffers (two, used in turn) and a side stream for host-to-device copies."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device=device)
        self._bufs: list[torch.Tensor | None] = [None, None]
        self._events: list[Any] = [None, None]
        self._turn = 0
        self._lock = threading.Lock()

    def upload(self, arrs: list[np.ndarray], extra: list[np.ndarray]) -> tuple[list[torch.Tensor], Any]:
        """Copy the chunks (stacked) and int64 index arrays to the device on the side stream.
        Returns the device tensors and the event the consumer waits on."""
        with self._lock:
            k = self._turn
            self._turn ^= 1
            if self._events[k] is not None:
                self._events[k].synchronize()  # the previous copy out of this buffer has finished
            nb = sum(a.nbytes for a in arrs) + sum(e.nbytes for e in extra)
            buf = self._bufs[k]
            if buf is None or buf.numel() < nb:
                buf = torch.empty(max(nb, 2 * (0 if buf is None else buf.numel()), 1 << 16), dtype=torch.uint8,
                                  pin_memory=True)
                self._bufs[k] = buf
            host = buf.numpy()
            pos = 0
            for a in arrs:
                host[pos: pos + a.nbytes] = a
                pos += a.nbytes
            spans = [(0, pos)]
            for e in extra:
                host[pos: pos + e.nbytes] = e.view(np.uint8)
                spans.append((pos, pos + e.nbytes))
                pos += e.nbytes
            with torch.cuda.stream(self.stream):
                out = [buf[a:b].to(self.device, non_blocking=True) for a, b in spans]
                ev = torch.cuda.Event()
                ev.record(self.stream)
            self._events[k] = ev
            return out, ev


class PagedRows:
    """Gathers rows of one frozen asset through its :class:`~polymem.asset.pages.PageService`."""

    def __init__(self, asset: Any, service: Any) -> None:
        g = asset.geometry
        self.service = service
        self.dtype = g.dtype
        self.KS, self.r, self.ppc = g.rows_per_page, g.head_dim, g.pages_per_chunk
        self.chunk_bytes, self.page_bytes = g.chunk_bytes, g.page_bytes
        self.row_bytes = g.page_bytes // g.rows_per_page
        self._levels: dict[torch.device, torch.Tensor] = {}
        self._stagers: dict[torch.device, _CudaStager] = {}
        self._ticket: tuple[torch.Tensor, Any] | None = None  # (rows of the forward, future or result)

    # ---- planning (host)
    def plan(self, rows: torch.Tensor) -> _Plan:
        flat = rows.detach().reshape(-1)
        host = (flat if flat.device.type == "cpu" else flat.cpu()).numpy()
        valid = host >= 0
        all_valid = bool(valid.all())
        vr = host if all_valid else host[valid]
        page = vr // self.KS
        if self.ppc == 1:
            chunk, inner = page, vr % self.KS
        else:
            chunk = page // self.ppc
            inner = (page % self.ppc) * self.KS + vr % self.KS
        chunks, slot = np.unique(chunk, return_inverse=True)
        return _Plan(tuple(rows.shape), rows.device, chunks.astype(np.int64), slot.reshape(-1).astype(np.int64),
                     inner.astype(np.int64), None if all_valid else valid)

    # ---- decoding (device)
    def _decode(self, buf: torch.Tensor, n: int, idx: torch.Tensor, inner: torch.Tensor) -> torch.Tensor:
        """buf uint8 [n*chunk_bytes] on the device; idx/inner int64 [m] -> fp32 [m, r]."""
        r = self.r
        if self.dtype != "nf4":
            table = buf.view(_TORCH_FLOAT[self.dtype]).view(n * self.KS, r)
            return table.index_select(0, idx * self.KS + inner).float()
        rb = self.row_bytes
        rowsv = buf.as_strided((n, self.ppc * self.KS, rb), (self.chunk_bytes, rb, 1))
        b = rowsv[idx, inner]  # uint8 [m, rb]: r/2 code bytes, then a float16 scale
        lut = self._levels.get(buf.device)
        if lut is None:  # byte -> (level of its low nibble, level of its high nibble): one lookup per byte
            pairs = np.stack([NF4_LEVELS[np.arange(256) & 0x0F], NF4_LEVELS[np.arange(256) >> 4]], axis=-1)
            lut = self._levels[buf.device] = torch.from_numpy(pairs.astype(np.float32)).to(buf.device)  # [256, 2]
        levels = lut[b[:, : r // 2].to(torch.int32)].view(-1, r)  # [m, r]: code 2i low nibble, 2i+1 high
        scale = b[:, r // 2:].contiguous().view(torch.float16).float()  # [m, 1]
        return levels * scale

    def finish(self, plan: _Plan, entries: list[Any]) -> tuple[torch.Tensor, Any]:
        """Wait for the chunks of ``plan``, move them to the device and decode -> (fp32 [..., r], event|None)."""
        svc = self.service
        arrs = [svc.resolve(e) for e in entries]
        n, r = len(arrs), self.r
        M = int(np.prod(plan.shape)) if plan.shape else 1
        dev = plan.device
        event = None
        if n == 0:
            return torch.zeros(*plan.shape, r, device=dev), None
        if dev.type == "cuda":
            stager = self._stagers.get(dev)
            if stager is None:
                stager = self._stagers[dev] = _CudaStager(dev)
            extra = [plan.slot, plan.inner] + ([plan.valid.astype(np.uint8)] if plan.valid is not None else [])
            tensors, event = stager.upload(arrs, extra)
            with torch.cuda.stream(stager.stream):
                buf = tensors[0]
                idx, inner = tensors[1].view(torch.int64), tensors[2].view(torch.int64)
                dec = self._decode(buf, n, idx, inner)
                out = self._scatter(dec, tensors[3].bool() if plan.valid is not None else None, M, dev)
                event = torch.cuda.Event()
                event.record(stager.stream)
        else:
            buf = torch.from_numpy(np.concatenate(arrs) if n > 1 else arrs[0].copy())
            dec = self._decode(buf, n, torch.from_numpy(plan.slot), torch.from_numpy(plan.inner))
            out = self._scatter(dec, None if plan.valid is None else torch.from_numpy(plan.valid), M, dev)
        return out.view(*plan.shape, r), event

    def _scatter(self, dec: torch.Tensor, valid: torch.Tensor | None, M: int, dev: torch.device) -> torch.Tensor:
        if valid is None:
            return dec
        out = torch.zeros(M, self.r, device=dev)
        out[valid] = dec
        return out

    # ---- the two paths
    def start(self, rows: torch.Tensor) -> None:
        """Prefetch: plan now and start reading the missing chunks on the worker pool (returns at once)."""
        plan = self.plan(rows)
        self._ticket = (rows, (plan, self.service.fetch(plan.chunks, background=True)))

    def gather(self, rows: torch.Tensor) -> torch.Tensor:
        """fp32 [..., r] rows of the forward in progress: the prefetched chunks when ``rows`` is the tensor
        :meth:`start` saw (waiting only for reads not finished yet), read now otherwise. Decoded once per
        forward; every later site of the forward reuses the result. Read errors of this forward raise here."""
        t = self._ticket
        if t is not None and t[0] is rows:
            if isinstance(t[1], torch.Tensor):
                return t[1]
            plan, entries = t[1]
            pending = [e for e in entries if not isinstance(e, np.ndarray) and not e[0].done()]
            t0 = time.perf_counter() if pending else 0.0
            try:
                out, event = self.finish(plan, entries)
            except BaseException:
                self._ticket = None
                raise
            if pending:
                self.service.note_wait(time.perf_counter() - t0)
        else:
            plan = self.plan(rows)
            out, event = self.finish(plan, self.service.fetch(plan.chunks, background=False))
        if event is not None:
            torch.cuda.current_stream(out.device).wait_event(event)
            out.record_stream(torch.cuda.current_stream(out.device))
        self._ticket = (rows, out)
        return out

    def forget(self) -> None:
        self._ticket = None


__all__ = ["PagedRows"]
