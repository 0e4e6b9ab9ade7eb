"""The lane: a CPU consumer's forward on a local dense asset in two compiled calls (:meth:`LaneMixin.lane_begin`,
then :meth:`LaneMixin.lane_rows` or :meth:`LaneMixin.lane_finish`): look the rows' chunks up, reserve slots for
the missing ones and read them straight into the slab (in the caller's thread, or by the I/O thread), then decode
the rows out of the slab. Per-forward Python is what costs inside a model's forward (cold CPU caches: 5-20 µs a
call). :class:`LaneMixin` is the part of :class:`polymem.serve.service.PageService` that does it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import numpy as np

from polymem.errors import FormatError
from polymem.serve._load import kernels
from polymem.serve._state import S_DECODED, S_HITS, S_MISSES, S_READ_HERE, S_SHARD
from polymem.serve.pending import IORead

if TYPE_CHECKING:
    import queue
    import threading

    from polymem.asset._format import Geometry
    from polymem.serve.pending import ChunkRead
    from polymem.serve.reader import ChunkReader
    from polymem.serve.service import PageService

NOWAIT_BACKOFF = 8  # forwards that skip the non-blocking attempt after one that found less than half
DECODED = "decoded"  # lane_begin: every chunk in the cache and the rows decoded
_NO_ROWS = np.empty((0, 1), dtype=np.float32)  # lane_begin without rows to decode
_NO_PAIRS = np.zeros((256, 2), dtype=np.float32)
_NO_HALF = np.zeros(1, dtype=np.float32)


class LaneMixin:
    """The lane's methods of :class:`polymem.serve.service.PageService` (its state: the service's)."""

    lane: bool
    io_thread: bool
    _nowait_skip: int
    _lane_buf: tuple[np.ndarray, ...] | None
    if TYPE_CHECKING:  # set by PageService and its cache (polymem.serve.cache.ChunkCache)
        geom: Geometry
        reader: ChunkReader
        _lock: threading.Lock
        _inflight: dict[int, tuple[ChunkRead, int]]
        _stats: dict[str, Any]
        _gen: int
        _tick: int
        _nslots: int
        _rpc: int
        _row_bytes: int
        _code: int
        _kst: np.ndarray
        _state: np.ndarray
        _keys: np.ndarray
        _vals: np.ndarray
        _free: np.ndarray
        _chunk_at: np.ndarray
        _stamp: np.ndarray
        _slab: np.ndarray

        def _try_nowait(self) -> bool: ...
        def _io_queue(self) -> queue.SimpleQueue[Any]: ...
        def _make_room(self, k: int, keep: np.ndarray | None = None) -> None: ...

    def lane_begin(self, rows: np.ndarray, *, background: bool, out: np.ndarray | None = None,
                   pairs: np.ndarray | None = None, half: np.ndarray | None = None) -> str | bool | IORead | None:
        """Step 1 of a forward on the lane (local dense assets with the compiled reader; ``rows`` int64, any
        shape, -1 = invalid): one compiled call looks the rows' distinct chunks up in the cache and reserves
        slots for the missing ones, which are read straight into them — background=False: here, blocking;
        background=True: here what the OS page cache holds (RWF_NOWAIT), the rest by the I/O thread.
        Returns DECODED (every chunk is in the cache now and, ``out`` given, the rows are decoded into it as
        :meth:`lane_rows` does), True (every chunk is in the cache now), the :class:`IORead` of the
        reads left or failures to re-read (:meth:`lane_finish` settles and decodes), or None: this forward takes
        the general path
        (:meth:`fetch_into`; e.g. reads of other consumers in flight, a shard not open yet, no room)."""
        kern = kernels(io=True)
        if kern is None or not (self.lane and self.io_thread) or self._nslots == 0:
            return None
        M = rows.size
        buf = self._lane_buf
        if buf is None or buf[0].shape[0] < M:
            size = max(M, 64)
            buf = self._lane_buf = (*(np.empty(size, dtype=np.int64) for _ in range(5)), np.zeros(size, dtype=bool))
        mch, mslot, mfd, moff, mhit, ok = buf
        if out is None:
            out, pairs, half = _NO_ROWS, _NO_PAIRS, _NO_HALF
        g = self.geom
        with self._lock:
            if self._inflight:
                return None
            if not background:
                mode = 0
            elif not self.reader.nowait:
                mode = 2
            elif not self.reader._probed:  # the general path tries RWF_NOWAIT on this file system first
                return None
            else:
                mode = 1 if self._try_nowait() else 2
            self._tick += 1
            args = (rows, self._rpc, g.chunks_per_shard, g.stride, self.reader._fdtab, self._keys, self._vals,
                    self._chunk_at, self._stamp, self._tick, self._free, self._state, self._slab, mode, g.crc,
                    mch, mslot, mfd, moff, ok, mhit, self._kst, self._row_bytes, self._code, pairs, half, out,
                    out.view(np.uint32))
            n = kern.lane_begin(*args)
            opened = 0
            while n == -2 and opened < 64:  # open the shards it needs (a FormatError names a missing one)
                try:
                    self.reader._fd(int(self._state[S_SHARD]))  # (the reader's own lock)
                except FormatError:
                    self._stats["errors"] += 1
                    raise
                opened += 1
                n = kern.lane_begin(*args)
            if n == -1:  # make room, keeping this forward's hits
                self._make_room(int(self._state[S_MISSES]), keep=mhit[: self._state[S_HITS]])
                n = kern.lane_begin(*args)
            if n < 0:
                return None
            if mode == 1 and 2 * self._state[S_READ_HERE] < self._state[S_MISSES]:
                self._nowait_skip = NOWAIT_BACKOFF  # most came from storage: see fetch_into
            if n == 0:
                return DECODED if self._state[S_DECODED] else True
            rd = IORead(cast("PageService", self), mch[:n].copy(), mslot[:n].copy())
            for i, c in enumerate(rd.chunks.tolist()):
                self._inflight[c] = (rd, i)
            if mode == 0:
                rd.queued = False
                rd.io.release()
            else:
                self._io_queue().put((mfd[:n].copy(), moff[:n].copy(), rd.buf, rd.slots, rd.ok, rd.io))
            return rd

    def _lane_settle(self, rd: IORead) -> None:
        """A lane read done: chunks not read whole and intact are read again (blocking: the precise error),
        then all join the index (on an error their slots are given back and the error propagates)."""
        bad = np.flatnonzero(~rd.ok)
        assert rd.slots is not None  # a lane read: its chunks' reserved slots
        try:
            if bad.size:
                self.reader.read_into(rd.chunks[bad], rd.buf, rd.slots[bad])
        except BaseException:
            with self._lock:
                self._stats["errors"] += 1
                for c in rd.chunks.tolist():
                    self._inflight.pop(c, None)
                if rd.gen == self._gen:
                    kernels().lane_release(rd.slots, self._chunk_at, self._free, self._state)
            raise
        with self._lock:
            n = rd.chunks.size if rd.queued else bad.size  # (in-thread reads were counted when made)
            if n:
                st = self._stats
                st["reads"] += n
                st["read_calls"] += 1
                st["bytes_read"] += n * self.geom.chunk_bytes
            for c in rd.chunks.tolist():
                self._inflight.pop(c, None)
            if rd.gen == self._gen:
                kernels().lane_settle(rd.chunks, rd.slots, self._keys, self._vals, self._chunk_at, self._free,
                                     self._state)

    def lane_finish(self, rd: IORead, rows: np.ndarray, out: np.ndarray, pairs: np.ndarray, half: np.ndarray) -> bool:
        """Step 2 after reads were left (``rd`` from :meth:`lane_begin`): wait for them, then settle them and
        decode ``rows`` as :meth:`lane_rows` does — one compiled call when the I/O thread read them all whole
        and intact, else :meth:`IORead.settle` (re-reads; errors raise) and :meth:`lane_rows`."""
        with rd._lock:
            if rd._res is None and rd._exc is None and rd.queued:
                rd._wait_io()
                if rd.ok.all():
                    with self._lock:
                        if rd.gen == self._gen:
                            for c in rd.chunks.tolist():
                                self._inflight.pop(c, None)
                            rd._res = rd.slots
                            return bool(kernels().settle_rows(
                                rd.chunks, rd.slots, self._keys, self._vals, self._chunk_at, self._free, self._state,
                                self._kst, rows, self._rpc, self._slab, self._row_bytes, self._code, pairs, half, out,
                                out.view(np.uint32)) == 0)
        rd.settle()
        return self.lane_rows(rows, out, pairs, half)

    def lane_rows(self, rows: np.ndarray, out: np.ndarray, pairs: np.ndarray, half: np.ndarray) -> bool:
        """Step 2: decode ``rows`` (as given to :meth:`lane_begin`) out of the cache into ``out`` (float32
        [rows.size, head_dim]; zeros for invalid rows) in one compiled call. False if a chunk is not in the
        cache (evicted by another consumer since, or no room): the caller takes the general path."""
        with self._lock:
            return bool(kernels().rows_from_cache(rows, self._rpc, self._keys, self._vals, self._slab, self._row_bytes,
                                                 self._code, pairs, half, out, out.view(np.uint32)) == 0)


__all__ = ["DECODED", "LaneMixin", "NOWAIT_BACKOFF"]
