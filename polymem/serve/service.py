"""The page service: a bounded RAM cache of an asset's stored chunks, filled by reads that overlap compute.

A *chunk* is the unit an asset stores and reads (docs/asset-format.md §4): one page for float assets, one
4 KiB block of whole pages for NF4. :class:`PageService` reads chunks straight from the shard files —
``preadv`` on local assets (no mmap: resident memory stays what the cache holds, and the GIL is released
while the disk works), parallel range requests through fsspec for URLs (``s3://…``, ``memory://…``).

A consumer asks for the distinct chunks of one forward at once (:meth:`PageService.fetch_into`) and gets
them copied into its own buffer (one row per chunk). Each chunk is either in the cache (a hit: copied under
the lock), already being read for another consumer (joined: read once), or read now (a miss). With
``background=True`` (prefetch) the misses of a local asset are first read in the calling thread with
``RWF_NOWAIT``, which returns at once for chunks in the OS page cache and refuses the others (~5 µs per
chunk: cheaper than handing them to a thread); only chunks that really have to come from storage are handed
on, all of the forward's reads together, and :meth:`Pending.wait` (at the first site) waits only for those.
They go to the service's one I/O thread (local assets: one compiled ``preadv2`` loop per forward with the
GIL released; the thread holds the GIL only to take a job and to signal it done, and the consumer that
waits does the bookkeeping) or, for URLs and without numba, to a pool of ``workers`` reader threads. A
refused ``RWF_NOWAIT`` read has already cost the caller the kernel's work of starting that read, so after a
forward whose chunks were mostly not in the OS cache the next ``NOWAIT_BACKOFF`` forwards hand every miss
to the I/O thread directly. The cache is one preallocated slab of ``cache_mb`` (slots of one chunk,
LRU by a per-slot stamp, committed by the OS only when touched; chunk -> slot in a compiled open-addressing
index), shared by every consumer of one asset (:func:`service_for`).

The lane (:meth:`PageService.lane_begin` / :meth:`PageService.lane_rows`): a CPU consumer of a local dense
asset does a forward in two compiled calls instead — look the rows' chunks up, reserve slots for the missing
ones and read them straight into the slab (in the caller's thread, or by the I/O thread), then decode the rows
out of the slab. Per-forward Python is what costs inside a model's forward (cold CPU caches: 5-20 µs a call).

    svc = service_for(asset, cache_mb=256)
    out = np.empty((2, svc.geom.chunk_bytes), np.uint8)
    pending = svc.fetch_into(np.array([3, 17]), out, background=True)  # returns at once
    if pending is not None:
        pending.wait()                                                # reads done, rows copied into out
    svc.stats()     # hits, misses, joined, reads, nowait_reads, bytes_read, wait_s, cache_bytes, ...

Every chunk read is checked before it is used or cached (its length, and its crc32c from format v2); a
missing or short shard, a missing object or a failed check raises :class:`FormatError` naming the asset,
the shard and the chunk — for prefetched reads in :meth:`Pending.wait`, i.e. in the forward that needed
the chunk. The service assumes the asset does not change while it is served (a frozen table).
Here: :class:`PageService` (lifecycle, reads, stats) and :func:`service_for`. Its parts: :mod:`.reader` (stored
chunks), :mod:`.cache` (slab, index, LRU), :mod:`.lane` (the compiled lane), :mod:`.pending` (reads in flight),
:mod:`._kernels` (numba; loaded by :mod:`._load`; the slots of their state named in :mod:`._state`).
Not here: decoding into torch tensors (:mod:`polymem.torch.pages`), the asset format (:mod:`polymem.asset`).
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from polymem.errors import FormatError, PolymemError
from polymem.serve._load import kernels
from polymem.serve._state import DTYPE_CODES, K_LANE, KST_SIZE, KST_STATS, S_CACHED, S_PEAK
from polymem.serve.cache import ChunkCache
from polymem.serve.lane import DECODED, NOWAIT_BACKOFF, LaneMixin
from polymem.serve.pending import ChunkRead, IORead, Pending, _io_loop, _stop_io
from polymem.serve.reader import ChunkReader

if TYPE_CHECKING:
    from polymem.asset.core import MemoryAsset

THREAD_PREFIX = "polymem-pages"
READS_PER_TASK = 8  # background reads of one forward are split into tasks of at least this many chunks


class PageService(ChunkCache, LaneMixin):
    """Chunk cache + reader pool of one asset. ``fetch_into`` copies chunks into a consumer's buffer."""

    def __init__(self, asset: MemoryAsset, *, cache_mb: float = 256.0, workers: int = 4) -> None:
        _check_args(cache_mb, workers)
        self.asset = asset
        self.geom = asset.geometry
        self.reader = ChunkReader(asset)
        self.workers = workers
        self._inflight: dict[int, tuple[ChunkRead, int]] = {}
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        # local dense assets with the compiled reader: one I/O thread takes the chunks that must come from
        # storage (else, and for URLs, the pool of ``workers`` threads)
        self.io_thread = self.reader.direct and kernels(io=True) is not None
        self._io: tuple[queue.SimpleQueue[Any], threading.Thread] | None = None
        self._io_fin: weakref.finalize[..., PageService] | None = None
        self._nowait_skip = 0  # forwards left that skip the non-blocking attempt (it found little lately)
        self._users = 0
        self._finalizer: weakref.finalize[..., PageService] | None = None
        self._stats = dict(hits=0, misses=0, joined=0, reads=0, nowait_reads=0, read_calls=0, bytes_read=0,
                           evictions=0, wait_s=0.0, cache_peak_bytes=0, errors=0)
        self._kst = np.zeros(KST_SIZE, dtype=np.int64)
        self._gen = 0
        # the lane: a consumer's whole forward in two compiled calls (lane_begin, lane_rows) on a local dense
        # asset with the compiled reader; False = every forward takes the general path (fetch_into)
        self.lane = self.io_thread
        g = self.geom
        self._rpc = g.rows_per_page * g.pages_per_chunk
        self._row_bytes = g.page_bytes // g.rows_per_page
        self._code = DTYPE_CODES.get(str(g.dtype), -1)
        self.lane = self.lane and self._code >= 0
        self._lane_buf: tuple[np.ndarray, ...] | None = None
        self._setup_cache(int(cache_mb * (1 << 20)))

    # ---- lifecycle
    def acquire(self) -> None:
        """Count one more consumer of the service (:func:`service_for` calls it; :meth:`release` undoes it)."""
        with self._lock:
            self._users += 1

    def release(self) -> None:
        """One consumer is done; the last one stops the workers and empties the cache."""
        with self._lock:
            self._users = max(0, self._users - 1)
            last = self._users == 0
        if last:
            self.close()

    def close(self) -> None:
        """Stop the worker threads (waits for reads in flight), close the shard files and drop the cache."""
        with self._lock:
            pool, self._pool = self._pool, None
            fin, self._finalizer = self._finalizer, None
            io, self._io = self._io, None
            iofin, self._io_fin = self._io_fin, None
            self._setup_cache(self.capacity)
        if fin is not None:
            fin.detach()
        if iofin is not None:
            iofin.detach()
        if io is not None:
            _stop_io(*io)
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=False)
        self.reader.close()

    def idle(self) -> bool:
        """Whether no consumer holds the service (it may then be resized or closed)."""
        with self._lock:
            return self._users == 0

    def restart(self, cache_mb: float) -> None:
        """A service no table uses any more starts over: the new size, counters at zero."""
        with self._lock:
            self._setup_cache(int(cache_mb * (1 << 20)))
            for k in self._stats:
                self._stats[k] = 0.0 if k == "wait_s" else 0
            self._kst[:] = 0

    def resize(self, cache_mb: float) -> None:
        """Grow the cache to ``cache_mb`` (never shrinks; cached chunks are kept)."""
        with self._lock:
            cap = int(cache_mb * (1 << 20))
            if cap <= self.capacity:
                return
            old_slab, old_keys, old_vals = self._slab, self._keys, self._vals
            self._setup_cache(cap)
            held = old_keys >= 0
            if held.any():
                self._insert(old_keys[held], old_slab, old_vals[held])

    # ---- reads
    def _finish_read(self, chunks: np.ndarray, buf: np.ndarray, ok: np.ndarray) -> np.ndarray:
        """After the I/O thread: chunks it could not read whole and intact are read again (the precise error),
        then all are counted and cached."""
        def reread() -> np.ndarray:
            if not ok.all():
                bad = np.flatnonzero(~ok)
                self.reader.read_into(chunks[bad], buf, bad)
            return buf

        return self._settle(chunks, reread)

    def _settle(self, chunks: np.ndarray, read: Callable[[], np.ndarray]) -> np.ndarray:
        """``read()`` -> the chunks' bytes; counted and cached, or on failure counted as an error and no longer
        in flight (the error propagates)."""
        try:
            buf = read()
        except BaseException:
            with self._lock:
                self._stats["errors"] += 1
                for c in chunks.tolist():
                    self._inflight.pop(c, None)
            raise
        with self._lock:
            self._count_read(chunks, buf)
        return buf

    def _count_read(self, chunks: np.ndarray, buf: np.ndarray) -> None:  # under the lock
        n = chunks.shape[0]
        st = self._stats
        st["reads"] += n
        st["read_calls"] += 1
        st["bytes_read"] += n * self.geom.chunk_bytes
        inflight = self._inflight
        for c in chunks.tolist():
            inflight.pop(c, None)
        self._insert(chunks, buf, np.arange(n))

    def _io_queue(self) -> "queue.SimpleQueue[Any]":  # under the lock
        if self._io is None or not self._io[1].is_alive():  # (a forked child inherits no threads: start one)
            if self._io_fin is not None:
                self._io_fin.detach()
            q: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
            t = threading.Thread(target=_io_loop, args=(q, kernels(io=True).read_rows, self.geom.crc), name=THREAD_PREFIX + "-io",
                                 daemon=True)
            t.start()
            self._io = (q, t)
            self._io_fin = weakref.finalize(self, _stop_io, q, t)  # stops when the service is collected
        return self._io[0]

    def _io_submit(self, chunks: np.ndarray) -> IORead:  # under the lock
        fds, offs = self.reader.locate(chunks)  # FormatError (a shard gone) before anything is queued
        rd = IORead(self, chunks)
        self._io_queue().put((fds, offs, rd.buf, np.arange(chunks.shape[0]), rd.ok, rd.io))
        return rd

    def _read_task(self, chunks: np.ndarray) -> np.ndarray:
        """A pool task: read chunks (blocking, checked) into a new buffer, cache them; uint8 [n, chunk_bytes]."""
        def read() -> np.ndarray:
            if not self.reader.direct:
                return np.stack(self.reader.read(chunks))
            n = chunks.shape[0]
            buf = np.empty((n, self.geom.chunk_bytes), dtype=np.uint8)
            self.reader.read_into(chunks, buf, np.arange(n))
            return buf

        return self._settle(chunks, read)

    def fetch_into(self, chunks: np.ndarray, out: np.ndarray, *, background: bool) -> Pending | None:
        """Distinct chunk ids (int64 [n]) -> their bytes in ``out[:n]`` (uint8 [>=n, chunk_bytes], C-contiguous).

        background=False reads the missing chunks in the calling thread (blocking) and returns None.
        background=True reads in the calling thread only what the OS page cache holds (non-blocking) and
        hands the rest to the worker pool; returns a :class:`Pending` to wait on, or None when nothing is left."""
        n = chunks.shape[0]
        cb = self.geom.chunk_bytes
        with self._lock:  # lookup, copies out of the cache and registration of reads: one critical section
            self._tick += 1
            inflight = self._inflight
            chunks = np.ascontiguousarray(chunks, dtype=np.int64)
            slot = kernels().idx_get_many(self._keys, self._vals, chunks, np.empty(n, dtype=np.int64)).tolist()
            hit_rows: list[int] = []
            hit_slots: list[int] = []
            joins: list[tuple[int, ChunkRead, int]] = []
            miss: list[int] = []
            for j, c in enumerate(chunks.tolist()):
                s = slot[j]
                if s >= 0:
                    hit_rows.append(j)
                    hit_slots.append(s)
                    continue
                f = inflight.get(c)
                if f is not None:
                    joins.append((j, f[0], f[1]))
                    continue
                miss.append(j)
            if hit_rows:
                hs = np.asarray(hit_slots, dtype=np.int64)
                out[hit_rows] = self._slab[hs]
                self._stamp[hs] = self._tick
            st = self._stats
            st["hits"] += len(hit_rows)
            st["joined"] += len(joins)
            st["misses"] += len(miss)
            if not miss and not joins:
                return None
            mrows = np.asarray(miss, dtype=np.int64)
            mids = chunks[mrows]
            if background and miss and self.reader.nowait and self._try_nowait():
                ok = self.reader.read_into(mids, out, mrows, nowait=True)  # what the OS page cache holds
                got = int(ok.sum())
                if self.io_thread and 2 * got < len(miss):
                    # a miss costs the caller the kernel's work to start its read (RWF_NOWAIT starts it before
                    # refusing): when most chunks come from storage, skip the attempt for a while and let the
                    # I/O thread start and wait for them all
                    self._nowait_skip = NOWAIT_BACKOFF
                if got:
                    st["reads"] += got
                    st["nowait_reads"] += got
                    st["read_calls"] += 1
                    st["bytes_read"] += got * cb
                    self._insert(mids[ok], out, mrows[ok])
                    mrows, mids = mrows[~ok], mids[~ok]
            pending = Pending(self, out) if (joins or (background and mids.size)) else None
            if pending is not None:
                for j, joined, i in joins:
                    pending.parts.append((joined, np.array([j]), np.array([i])))
            if background and not mids.size:
                return pending
            if background:
                assert pending is not None  # made above: chunks are left to read in the background
                if self.io_thread:
                    rd: ChunkRead
                    try:
                        rd = self._io_submit(mids)
                        for i, c in enumerate(mids.tolist()):
                            inflight[c] = (rd, i)
                    except FormatError as e:  # raised by the consumer's wait, in the forward that needs it
                        failed: Future[np.ndarray] = Future()
                        failed.set_exception(e)
                        rd = failed
                        st["errors"] += 1
                    pending.parts.append((rd, mrows, np.arange(mids.size)))
                    return pending
                pool = self._pool or self._start_pool()
                m = mids.size
                groups = max(1, min(self.workers, -(-m // READS_PER_TASK)))
                bounds = [m * g // groups for g in range(groups + 1)]
                for g in range(groups):
                    part = mids[bounds[g]: bounds[g + 1]]
                    fut = pool.submit(self._read_task, part)
                    for i, c in enumerate(part.tolist()):
                        inflight[c] = (fut, i)
                    pending.parts.append((fut, mrows[bounds[g]: bounds[g + 1]], np.arange(part.size)))
                return pending
        if mids.size:  # the synchronous path: the caller reads, and waits for the whole read
            t0 = time.perf_counter()
            try:
                if self.reader.direct:
                    self.reader.read_into(mids, out, mrows)
                else:
                    out[mrows] = np.stack(self.reader.read(mids))
            except BaseException:
                with self._lock:
                    self._stats["errors"] += 1
                raise
            with self._lock:
                st = self._stats
                st["reads"] += mids.size
                st["read_calls"] += 1
                st["bytes_read"] += mids.size * cb
                st["wait_s"] += time.perf_counter() - t0
                self._insert(mids, out, mrows)
        if pending is not None:
            pending.wait()
        return None

    def _try_nowait(self) -> bool:  # under the lock
        if self._nowait_skip:
            self._nowait_skip -= 1
            return False
        return True

    def _start_pool(self) -> ThreadPoolExecutor:  # under the lock
        """The pool of ``workers`` reader threads, started by the first background read that needs it."""
        self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix=THREAD_PREFIX)
        # workers stop when the service is garbage-collected, even without close()
        self._finalizer = weakref.finalize(self, _shutdown, self._pool, self.reader)
        return self._pool

    def note_wait(self, seconds: float) -> None:
        """Add time a consumer spent waiting for this service's reads to ``wait_s``."""
        with self._lock:
            self._stats["wait_s"] += seconds

    def stats(self) -> dict[str, Any]:
        """Counters since the service started: hits / misses / joined (chunks found in the cache, read, or
        shared with a read in flight), reads and bytes_read (chunks and bytes read from storage; nowait_reads
        of them read in the consumer's thread from the OS page cache), read_calls, evictions, errors, wait_s
        (seconds consumers waited for reads), cache_bytes / cache_peak_bytes / capacity_bytes, chunk_bytes,
        workers, io_thread (whether background reads go to the I/O thread rather than the pool), lane_forwards
        (forwards served on the compiled lane, :meth:`lane_begin`)."""
        with self._lock:
            out = dict(self._stats)
            k = self._kst.tolist()
            for name, i in KST_STATS:
                out[name] += k[i]
            out["lane_forwards"] = k[K_LANE]
            out["cache_peak_bytes"] = max(out["cache_peak_bytes"], int(self._state[S_PEAK]) * self.geom.chunk_bytes)
            out.update(cache_bytes=self._cache_bytes(), cache_chunks=int(self._state[S_CACHED]), capacity_bytes=self.capacity,
                       chunk_bytes=self.geom.chunk_bytes, workers=self.workers, io_thread=self.io_thread,
                       source="pread" if self.reader.local is not None else "fsspec")
        return out


MAX_CACHE_MB = 1 << 30  # 1 PiB of cached pages: far above any table; a larger number is a typo (1e30, inf)


def check_cache_mb(cache_mb: Any, name: str = "cache_mb") -> None:
    """A page cache size in MiB: a finite number in [0, MAX_CACHE_MB] (one PolymemError naming ``name``)."""
    if not isinstance(cache_mb, (int, float)) or isinstance(cache_mb, bool) or not 0 <= cache_mb <= MAX_CACHE_MB:
        raise PolymemError(f"{name}={cache_mb!r} must be a number in [0, {MAX_CACHE_MB:,}] (MiB of RAM for cached "
                           "pages; a cache as large as the table already holds all of it), e.g. 256")


def _check_args(cache_mb: Any, workers: Any) -> None:
    check_cache_mb(cache_mb)
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise PolymemError(f"read_workers={workers!r} must be a positive integer (reader threads), e.g. 4")


def _shutdown(pool: ThreadPoolExecutor, reader: ChunkReader) -> None:
    pool.shutdown(wait=False, cancel_futures=True)
    reader.close()


# services live as long as a table holds them (the registry only finds them); a service holds its asset, so
# the id of a registered asset cannot be reused while its service is alive
_SERVICES: "weakref.WeakValueDictionary[int, PageService]" = weakref.WeakValueDictionary()
_SERVICES_LOCK = threading.Lock()


def service_for(asset: MemoryAsset, *, cache_mb: float = 256.0, workers: int = 4) -> PageService:
    """The page service of ``asset`` (one per opened asset, shared by every table reading it while any
    holds it). A later call asking for a larger cache grows it."""
    _check_args(cache_mb, workers)
    with _SERVICES_LOCK:
        svc = _SERVICES.get(id(asset))
        if svc is None or svc.asset is not asset:
            svc = PageService(asset, cache_mb=cache_mb, workers=workers)
            _SERVICES[id(asset)] = svc
        elif svc.idle():
            svc.restart(cache_mb)
        else:
            svc.resize(cache_mb)
    return svc


__all__ = ["DECODED", "ChunkReader", "IORead", "NOWAIT_BACKOFF", "PageService", "Pending", "THREAD_PREFIX", "service_for"]
