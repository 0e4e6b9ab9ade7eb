"""Rows of a forward from an asset's page service, decoded in torch on the consumer's device.

:class:`PagedRows` turns the rows of a forward (int64 ``[...]``, -1 = invalid) into fp32 ``[..., r]``:

1. plan (host): the distinct stored chunks the rows live in (a page read once per batch however many
   n-grams hit it), and where each row sits in them;
2. fetch: :class:`polymem.serve.service.PageService` copies the cached chunks into a reused host buffer (the
   stage) and reads the others into it — in the calling thread what the OS page cache holds, on the reader
   threads what has to come from storage;
3. finish: only the rows the forward needs are taken out of the chunks (host, one numpy gather), moved to the
   device (CUDA: a pinned host staging buffer and a non-blocking copy on a side stream) and decoded there,
   vectorised — float16/bfloat16 rows are widened, NF4 codes are looked up and scaled (the same float32
   products as :func:`polymem.asset.nf4.dequantize`, so results are bit-identical to the in-memory table
   made from the same asset). FP8 rows (fp8-e4m3-e8m0, fp8-e4m3) are decoded on the host by numpy, as
   ``MemoryAsset.read_rows`` decodes them, and the float32 rows moved to the device.

With prefetch, :meth:`PagedRows.start` (called from the model's forward pre-hook, before block 0) runs steps
1-2, so reads from storage overlap the blocks before the first site; :meth:`PagedRows.gather` (called by each
site) waits only for reads not finished yet, then decodes, and every later site of that forward reuses the
result. Without prefetch the reads happen inside the first site's gather, in the calling thread.
On the CPU with a local asset, steps 1-3 run as the service's *lane* instead: one compiled call in
:meth:`PagedRows.start` (lookup, slots reserved, reads straight into the cache, and the rows decoded when
nothing is left to read) and, when reads were left, one in :meth:`PagedRows.gather` (settled, decoded out of the
cache) — same values, far fewer calls inside the forward.
Not here: the cache and reads (:mod:`polymem.serve`), the site maths (:mod:`.site`).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from polymem.asset._codec import decode_rows
from polymem.asset._shards import bad_scale
from polymem.asset.nf4 import NF4_LEVELS, ScaleError, check_scales
from polymem.serve._load import kernels
from polymem.serve.lane import DECODED

_PAIRS = np.ascontiguousarray(np.stack([NF4_LEVELS[np.arange(256) & 0x0F], NF4_LEVELS[np.arange(256) >> 4]],
                                        axis=-1).astype(np.float32))  # byte -> (low-nibble level, high-nibble level)
_HALF: np.ndarray | None = None
USE_HOST_KERNELS = True  # False: the numpy/torch path (what runs where numba is missing; tests run both)


def _half_table() -> np.ndarray:
    """float16 bits -> float32 value, all 65,536 (exact: every float16 is a float32)."""
    global _HALF
    if _HALF is None:
        _HALF = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    return _HALF


def _host_kernels() -> Any:
    """The page service's numba kernels (:func:`polymem.serve._load.kernels`), or None where numba is missing or
    the kernels are switched off."""
    return kernels() if USE_HOST_KERNELS else None


_TORCH_FLOAT = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_FP8 = ("fp8-e4m3-e8m0", "fp8-e4m3")  # decoded by numpy on the host; the compiled lane does not take them


@dataclass
class _Plan:
    shape: tuple[int, ...]  # rows.shape
    device: torch.device
    chunks: np.ndarray  # int64 [n] distinct chunk ids, sorted
    slot: np.ndarray  # int64 [m] index into chunks of each valid row
    inner: np.ndarray  # int64 [m] row index inside its chunk (its pages' rows are consecutive)
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
    """Gathers rows of one frozen asset through its :class:`~polymem.serve.service.PageService`."""

    def __init__(self, asset: Any, service: Any) -> None:
        g = asset.geometry
        self.service = service
        self.geom, self.where = g, str(asset.path)
        self.dtype = g.dtype
        self.KS, self.r, self.ppc = g.rows_per_page, g.head_dim, g.pages_per_chunk
        self.chunk_bytes, self.page_bytes = g.chunk_bytes, g.page_bytes
        self.row_bytes = g.page_bytes // g.rows_per_page
        self.rpc = g.rows_per_page * g.pages_per_chunk  # rows per chunk
        self._rows_view: np.ndarray | None = None
        self._levels: dict[torch.device, torch.Tensor] = {}
        self._stagers: dict[torch.device, _CudaStager] = {}
        self._ticket: tuple[torch.Tensor, Any] | None = None  # (rows of the forward, pending reads or result)
        self._buf: np.ndarray | None = None  # the stage, reused forward after forward

    # ---- planning (host)
    def plan(self, rows: torch.Tensor) -> _Plan:
        flat = rows.detach().reshape(-1)
        host = (flat if flat.device.type == "cpu" else flat.cpu()).numpy()
        kern = _host_kernels()
        if kern is not None:
            chunks, slot, inner, valid, all_valid = kern.plan_rows(host, self.rpc)
            return _Plan(tuple(rows.shape), rows.device, chunks, slot, inner, None if all_valid else valid)
        valid = host >= 0
        all_valid = bool(valid.all())
        vr = host if all_valid else host[valid]
        chunk, inner = np.divmod(vr, self.rpc)  # rows of a chunk are consecutive: its pages, K·S rows each
        srt = np.sort(chunk)  # np.unique(return_inverse=True), without its overhead on small arrays
        first = np.empty(srt.shape[0], dtype=bool)
        first[:1] = True
        np.not_equal(srt[1:], srt[:-1], out=first[1:])
        chunks = srt[first]
        slot = np.searchsorted(chunks, chunk)
        return _Plan(tuple(rows.shape), rows.device, chunks, slot, inner, None if all_valid else valid)

    # ---- decoding
    def _stage(self, n: int) -> np.ndarray:
        """The reused host buffer the chunks of one forward are copied / read into: uint8 [n, chunk_bytes]."""
        buf = self._buf
        if buf is None or buf.shape[0] < n:
            buf = self._buf = np.empty((max(n, 2 * (0 if buf is None else buf.shape[0]), 16), self.chunk_bytes),
                                       dtype=np.uint8)
            # every stored row of every chunk in the buffer: [chunks, rows per chunk, row bytes] (a view)
            self._rows_view = np.lib.stride_tricks.as_strided(
                buf, (buf.shape[0], self.rpc, self.row_bytes), (self.chunk_bytes, self.row_bytes, 1), writeable=False)
        return buf[:n]

    def _row_bytes(self, plan: _Plan) -> np.ndarray:
        """The stored bytes of the plan's valid rows, uint8 [m, row_bytes] (a copy: the stage is reused)."""
        view = self._rows_view
        assert view is not None  # made with the stage (_stage), which every forward fills first
        rows: np.ndarray = view[plan.slot, plan.inner]
        return rows

    def _decode(self, b: torch.Tensor) -> torch.Tensor:
        """Stored rows uint8 [m, row_bytes] (on the device) -> fp32 [m, r]: float16/bfloat16 widened, NF4 codes
        looked up (byte -> level pair) and scaled by the row's float16 scale — the float32 products of
        :func:`polymem.asset.nf4.dequantize`, so bit-identical to the in-memory table."""
        r = self.r
        if self.dtype != "nf4":
            return b.view(_TORCH_FLOAT[self.dtype]).float()
        lut = self._levels.get(b.device)
        if lut is None:  # byte -> (level of its low nibble, level of its high nibble): one lookup per byte
            pairs = np.stack([NF4_LEVELS[np.arange(256) & 0x0F], NF4_LEVELS[np.arange(256) >> 4]], axis=-1)
            lut = self._levels[b.device] = torch.from_numpy(pairs.astype(np.float32)).to(b.device)  # [256, 2]
        codes = b[:, : r // 2].reshape(-1).to(torch.int64)
        levels = lut.index_select(0, codes).view(-1, r)  # [m, r]: code 2i low nibble, 2i+1 high
        scale = b[:, r // 2:].contiguous().view(torch.float16).float()  # [m, 1]
        return levels * scale

    def finish(self, plan: _Plan, stage: np.ndarray) -> tuple[torch.Tensor, Any]:
        """Decode the rows of ``plan`` from its chunks in ``stage`` on the device -> (fp32 [..., r], event|None).
        Only the rows the forward needs are taken out of the chunks (on the host) and decoded."""
        n, r = stage.shape[0], self.r
        dev = plan.device
        if n == 0:
            return torch.zeros(*plan.shape, r, device=dev), None
        M = math.prod(plan.shape)
        if self.geom.dtype in _FP8:  # decoded (and checked) on the host by numpy, the float32 rows moved over
            dec = torch.from_numpy(self._fp8_rows(plan)).to(dev)
            valid = None if plan.valid is None else torch.from_numpy(plan.valid).to(dev)
            return self._scatter(dec, valid, M, dev).view(*plan.shape, r), None
        if dev.type == "cuda":
            rb = self._row_bytes(plan)
            self._check_scales(plan, rb)
            stager = self._stagers.get(dev)
            if stager is None:
                stager = self._stagers[dev] = _CudaStager(dev)
            extra = [plan.valid.astype(np.uint8)] if plan.valid is not None else []
            tensors, event = stager.upload([rb.reshape(-1)], extra)
            with torch.cuda.stream(stager.stream):
                dec = self._decode(tensors[0].view(-1, self.row_bytes))
                out = self._scatter(dec, tensors[1].bool() if plan.valid is not None else None, M, dev)
                event = torch.cuda.Event()
                event.record(stager.stream)
            return out.view(*plan.shape, r), event
        kern = _host_kernels() if self.dtype == "nf4" else None
        if kern is not None:  # CPU: one compiled loop over the needed rows, the same float32 products
            dec_np = np.empty((plan.slot.shape[0], r), dtype=np.float32)
            bad = kern.nf4_rows(stage, plan.slot, plan.inner, self.row_bytes, _PAIRS, _half_table(), dec_np)
            if bad >= 0:
                self._check_scales(plan, self._row_bytes(plan))
            dec = torch.from_numpy(dec_np)
        elif self.dtype == "nf4":  # host work on the host: codes widened and scales split by numpy
            rb = self._row_bytes(plan)
            self._check_scales(plan, rb)
            lut = self._levels.get(dev)
            if lut is None:
                self._decode(torch.zeros(1, self.row_bytes, dtype=torch.uint8))
                lut = self._levels[dev]
            h = r // 2
            levels = lut.index_select(0, torch.from_numpy(rb[:, :h].astype(np.int64).reshape(-1))).view(-1, r)
            dec = levels * torch.from_numpy(rb[:, h:].copy().view(np.float16)).float()
        else:
            dec = self._decode(torch.from_numpy(self._row_bytes(plan)))
        out = self._scatter(dec, None if plan.valid is None else torch.from_numpy(plan.valid), M, dev)
        return out.view(*plan.shape, r), None

    def _fp8_rows(self, plan: _Plan) -> np.ndarray:
        """FP8 rows of the plan, float32 [m, r] (``polymem.asset._codec.decode_rows``: the values of
        ``MemoryAsset.read_rows``); a row decoding to NaN or ±inf raises FormatError naming shard, page and row."""
        try:
            return decode_rows(self._row_bytes(plan), self.geom)
        except ScaleError as e:
            row = int(plan.chunks[plan.slot[e.row]]) * self.rpc + int(plan.inner[e.row])
            raise bad_scale(self.geom, row, e.value, self.where) from None

    def _check_scales(self, plan: _Plan, rb: np.ndarray) -> None:
        """NF4: raise FormatError naming shard, page and row unless every scale of the plan's stored rows ``rb``
        (uint8 [m, row_bytes], on the host) is a finite number >= 0."""
        if self.dtype != "nf4":
            return
        try:
            check_scales(rb, self.r)
        except ScaleError as e:
            row = int(plan.chunks[plan.slot[e.row]]) * self.rpc + int(plan.inner[e.row])
            raise bad_scale(self.geom, row, e.value, self.where) from None

    def _scatter(self, dec: torch.Tensor, valid: torch.Tensor | None, M: int, dev: torch.device) -> torch.Tensor:
        if valid is None:
            return dec
        out = torch.zeros(M, self.r, device=dev)
        out[valid] = dec
        return out

    # ---- the lane (CPU, compiled): the whole forward in two calls of the service
    def _lane_ok(self, rows: torch.Tensor) -> bool:
        return rows.is_cpu and rows.dtype == torch.int64 and self.service.lane and USE_HOST_KERNELS

    def _lane_out(self, rows: torch.Tensor, host: np.ndarray, rd: Any, out: np.ndarray) -> torch.Tensor | None:
        """Settle the lane's reads (errors raise), then decode the rows (``host``: their numpy view) out of the
        cache into ``out``; None: the general path."""
        if rd is True:
            done = self.service.lane_rows(host, out, _PAIRS, _half_table())
        else:
            done = self.service.lane_finish(rd, host, out, _PAIRS, _half_table())
        if not done:
            return None
        return torch.from_numpy(out).view(*rows.shape, self.r)

    # ---- the two paths
    def start(self, rows: torch.Tensor) -> None:
        """Prefetch: plan now, copy cached chunks and read what the OS page cache holds, and start background
        reads of the rest (returns without waiting for storage)."""
        if self._lane_ok(rows):
            host = rows.reshape(-1).numpy()  # (1-D: one compiled variant of the lane, whatever the shape)
            out = np.empty((host.size, self.r), dtype=np.float32)
            try:
                rd = self.service.lane_begin(host, background=True, out=out, pairs=_PAIRS, half=_half_table())
            except BaseException as e:  # surfaces in the forward's first site
                rd = e
            if rd is DECODED:  # every chunk was at hand: the rows are ready for the sites
                self._ticket = (rows, torch.from_numpy(out).view(*rows.shape, self.r))
                return
            if rd is not None:
                self._ticket = (rows, ("lane", host, rd, out))
                return
        plan = self.plan(rows)
        stage = self._stage(plan.chunks.shape[0])
        try:
            pending = self.service.fetch_into(plan.chunks, stage, background=True)
        except BaseException as e:  # surfaces in the forward's first site, like a background read's error
            pending = e
        self._ticket = (rows, (plan, stage, pending))

    def gather(self, rows: torch.Tensor) -> torch.Tensor:
        """fp32 [..., r] rows of the forward in progress: the prefetched chunks when ``rows`` is the tensor
        :meth:`start` saw (waiting only for reads not finished yet), read now otherwise. Decoded once per
        forward; every later site of the forward reuses the result. Read errors of this forward raise here."""
        t = self._ticket
        out = None
        if t is not None and t[0] is rows:
            if isinstance(t[1], torch.Tensor):
                return t[1]
            if t[1][0] == "lane":
                try:
                    if isinstance(t[1][2], BaseException):
                        raise t[1][2]
                    out = self._lane_out(rows, t[1][1], t[1][2], t[1][3])
                except BaseException:
                    self._ticket = None
                    raise
                event = None  # (out None: a chunk left the cache since; the general path reads it again)
            else:
                plan, stage, pending = t[1]
                try:
                    if isinstance(pending, BaseException):
                        raise pending
                    if pending is not None:
                        pending.wait()
                    out, event = self.finish(plan, stage)
                except BaseException:
                    self._ticket = None
                    raise
        elif self._lane_ok(rows):
            host = rows.reshape(-1).numpy()  # (1-D: one compiled variant of the lane, whatever the shape)
            dec = np.empty((host.size, self.r), dtype=np.float32)
            rd = self.service.lane_begin(host, background=False, out=dec, pairs=_PAIRS, half=_half_table())
            event = None
            if rd is DECODED:
                out = torch.from_numpy(dec).view(*rows.shape, self.r)
            elif rd is not None:
                try:
                    out = self._lane_out(rows, host, rd, dec)
                except BaseException:
                    self._ticket = None
                    raise
        if out is None:
            plan = self.plan(rows)
            stage = self._stage(plan.chunks.shape[0])
            self.service.fetch_into(plan.chunks, stage, background=False)
            out, event = self.finish(plan, stage)
        if event is not None:
            torch.cuda.current_stream(out.device).wait_event(event)
            out.record_stream(torch.cuda.current_stream(out.device))
        self._ticket = (rows, out)
        return out

    def forget(self) -> None:
        self._ticket = None


__all__ = ["PagedRows"]
