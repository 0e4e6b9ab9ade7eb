"""The page service's cache: one preallocated slab of chunk-sized slots (committed by the OS only when touched),
chunk -> slot in a compiled open-addressing index (:mod:`._kernels`), least recently used by a per-slot stamp.

:class:`ChunkCache` is the part of :class:`polymem.serve.service.PageService` that keeps it; every method runs
under the service's lock. The bookkeeping lives in int64 arrays the compiled lane updates too (slots named in
:mod:`._state`).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from polymem.serve._load import kernels
from polymem.serve._state import READING, S_CACHED, S_NFREE, S_PEAK, S_TOP, STATE_SIZE

if TYPE_CHECKING:
    from polymem.asset._format import Geometry


class ChunkCache:
    """Slab, index and LRU of one service (``geom``, ``_lock`` and ``_stats`` are the service's)."""

    geom: Geometry
    _lock: threading.Lock
    _stats: dict[str, Any]
    _gen = 0
    _state: np.ndarray

    # ---- the cache: a slab of slots, chunk -> slot (a compiled open-addressing index), LRU by stamp
    def _setup_cache(self, capacity: int) -> None:  # under the lock (or in __init__)
        cb = self.geom.chunk_bytes
        if self._gen:  # the peak of the cache being dropped stays in the counters
            self._stats["cache_peak_bytes"] = max(self._stats["cache_peak_bytes"], int(self._state[S_PEAK]) * cb)
        self.capacity = capacity
        self._nslots = n = capacity // cb
        self._slab = np.empty((n, cb), dtype=np.uint8)  # the OS commits pages only when written
        cap = 8
        while cap < 2 * n:
            cap *= 2
        self._keys = np.full(cap, -1, dtype=np.int64)  # the index: chunk ids (-1 = empty) ...
        self._vals = np.zeros(cap, dtype=np.int64)  # ... and their slots
        self._chunk_at = np.full(n, -1, dtype=np.int64)  # chunk in each slot; -1 free, READING: a read lands there
        self._stamp = np.zeros(n, dtype=np.int64)
        self._free = np.empty(n, dtype=np.int64)  # a stack of free slots below top
        self._state = np.zeros(STATE_SIZE, dtype=np.int64)  # top (slots [0, top) used), free count, cached count, peak; the lane's
        self._tick = 0
        self._gen += 1  # reads that land in an older slab leave the new one alone

    def cached(self, chunk: int) -> bool:
        """Whether ``chunk`` is in the cache now."""
        with self._lock:
            return self._slot_of(int(chunk)) >= 0

    def _slot_of(self, chunk: int) -> int:  # under the lock
        return int(kernels().idx_find(self._keys, self._vals, chunk))

    def _cache_bytes(self) -> int:
        return int(self._state[S_CACHED]) * self.geom.chunk_bytes

    def _make_room(self, k: int, keep: np.ndarray | None = None) -> None:  # under the lock
        """At least min(k, what can be freed) slots free or never used: evict the least recently used chunks
        (slots a read is landing in, and slots in ``keep``, are never chosen)."""
        st_ = self._state
        avail = int(st_[S_NFREE]) + self._nslots - int(st_[S_TOP])
        need = k - avail
        if need <= 0:
            return
        used = int(st_[S_TOP])
        at = self._chunk_at[:used]
        st = self._stamp[:used].copy()
        never = np.iinfo(np.int64).max
        st[self._free[: st_[S_NFREE]]] = never
        st[at == READING] = never
        if keep is not None:
            st[keep] = never
        # evict a little more than needed when the cache is large, so the O(slots) search runs seldom
        take = min(used, max(need, self._nslots // 64))
        victims = np.argpartition(st, take - 1)[:take] if take < used else np.argsort(st)[:take]
        victims = victims[st[victims] != never]
        gone = at[victims]
        kernels().idx_del_many(self._keys, self._vals, gone)
        at[victims] = -1
        self._stats["evictions"] += int(victims.size)
        st_[S_CACHED] -= victims.size
        nf = int(st_[S_NFREE])
        self._free[nf: nf + victims.size] = victims
        st_[S_NFREE] = nf + victims.size

    def _take_slots(self, k: int) -> np.ndarray:  # under the lock
        """Up to k slots to fill (fewer only when every other slot has a read landing in it)."""
        self._make_room(k)
        st_ = self._state
        nf = int(st_[S_NFREE])
        a = min(k, nf)
        got: np.ndarray = self._free[nf - a: nf][::-1].copy()
        st_[S_NFREE] = nf - a
        fresh = min(k - a, self._nslots - int(st_[S_TOP]))
        if fresh:
            top = int(st_[S_TOP])
            got = np.concatenate([got, np.arange(top, top + fresh, dtype=np.int64)])
            st_[S_TOP] = top + fresh
        return got

    def _insert(self, chunks: np.ndarray, src: np.ndarray, rows: np.ndarray) -> None:  # under the lock
        """Cache chunks[i] = src[rows[i]] (those not cached yet; at most the cache's slots)."""
        if self._nslots == 0 or chunks.size == 0:
            return
        chunks = np.ascontiguousarray(chunks, dtype=np.int64)
        have = kernels().idx_get_many(self._keys, self._vals, chunks, np.empty(chunks.size, dtype=np.int64))
        keep = np.flatnonzero(have < 0)
        if keep.size > self._nslots:
            keep = keep[-self._nslots:]
        if not keep.size:
            return
        slots = self._take_slots(int(keep.size))
        keep = keep[: slots.size]
        self._slab[slots] = src[rows[keep]]
        ids = chunks[keep]
        kernels().idx_put_many(self._keys, self._vals, ids, slots)
        self._chunk_at[slots] = ids
        self._stamp[slots] = self._tick
        st_ = self._state
        st_[S_CACHED] += ids.size
        if st_[S_CACHED] > st_[S_PEAK]:
            st_[S_PEAK] = st_[S_CACHED]


__all__ = ["ChunkCache"]
