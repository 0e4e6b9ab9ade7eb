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
Not here: decoding into torch tensors (:mod:`polymem.torch.pages`), the asset format (:mod:`.core`).
"""

from __future__ import annotations

import os
import queue
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from polymem.errors import FormatError, MissingError, PolymemError

THREAD_PREFIX = "polymem-pages"
READS_PER_TASK = 8  # background reads of one forward are split into tasks of at least this many chunks
NOWAIT_BACKOFF = 8  # forwards that skip the non-blocking attempt after one that found less than half
_NOWAIT = getattr(os, "RWF_NOWAIT", 0)
_NOWAIT_BY_DEVICE: dict[Any, bool] = {}  # st_dev -> does the file system honour RWF_NOWAIT (probed once)
READING = -2  # PageService._chunk_at of a slot a read is landing in (not in the index yet, never evicted);
# the same value as _pagekern.READING (that module loads numba, so it is not imported here; a test checks)
DECODED = "decoded"  # PageService.lane_begin: every chunk in the cache and the rows decoded
_NO_ROWS = np.empty((0, 1), dtype=np.float32)  # lane_begin without rows to decode
_NO_PAIRS = np.zeros((256, 2), dtype=np.float32)
_NO_HALF = np.zeros(1, dtype=np.float32)
_TOP, _NFREE, _CACHED, _PEAK = range(4)  # PageService._state
# PageService._kst: counters the compiled lane updates (folded into stats())
_K_HITS, _K_MISSES, _K_READS, _K_NOWAIT, _K_CALLS, _K_BYTES, _K_LANE = range(7)


def _index() -> Any:
    from polymem.asset import _pagekern

    return _pagekern


# ------------------------------------------------------------------------------------------ read kernel
_KERNEL: Any = None


def _kernel() -> Any:
    """(``read_rows``, ``lane_begin``) of :mod:`._pagekern` — libc ``preadv2`` and google-crc32c's C
    ``crc32c_value`` called from numba (:mod:`._ckern`), compiled once and cached on disk — or None where one
    lacks."""
    global _KERNEL
    if _KERNEL is not None:
        return _KERNEL or None
    try:
        from polymem.asset import _ckern, _pagekern as K

        if not _ckern.link():
            raise RuntimeError("no C crc32c")

        K.warm_up()  # compile or load every kernel now: a missing symbol shows here, no compile mid-forward
        _KERNEL = (K.read_rows, K.lane_begin)
    except Exception:  # noqa: BLE001 - any missing piece: the Python loop does the same work
        _KERNEL = ()
    return _KERNEL or None


class ChunkReader:
    """Stored chunks of one asset: ``preadv`` on local shard files, fsspec range requests for URLs."""

    def __init__(self, asset: Any) -> None:
        self.asset = asset
        self.geom = asset.geometry
        raw = asset._raw
        self.where = str(asset.path)
        self.local = raw.local
        self._raw = raw
        self._fdtab = np.full(self.geom.num_shards, -1, dtype=np.int64)
        weakref.finalize(self, _close_fds, self._fdtab)  # a reader dropped without close() closes its files too
        self._lock = threading.Lock()
        self._check = getattr(asset, "check_chunk_bytes", None)
        # a sparse subset (docs/asset-format.md §12): rank of each stored chunk in its shard, -1 = absent (zeros)
        self._ranks = asset.sparse_ranks() if getattr(asset, "sparse", False) else None
        # the fast path: a local dense asset, read by chunk offset straight into the caller's buffer
        self.direct = self.local is not None and self._ranks is None
        self.nowait = self.direct and bool(_NOWAIT)  # may be switched off by the first probe (see read_nowait)
        self._probed = False
        self._crcbuf = bytearray(4)

    def _extent(self, c: int) -> tuple[int, int]:
        cps = self.geom.chunks_per_shard
        s, i = divmod(int(c), cps)
        if self._ranks is not None:
            i = int(self._ranks[s][i])  # type: ignore[index]
        return s, i * self.geom.stride  # stride = chunk bytes + its crc32c (format v2)

    def _absent(self, c: int) -> bool:
        if self._ranks is None:
            return False
        s, i = divmod(int(c), self.geom.chunks_per_shard)
        rank = self._ranks[s]
        return rank is None or int(rank[i]) < 0

    # ---- the fast path (local, dense): straight into rows of the caller's buffer
    def read_into(self, chunks: np.ndarray, out: np.ndarray, rows: np.ndarray, *, nowait: bool = False) -> np.ndarray:
        """Read chunks (int64 [n]) into ``out[rows]`` (out: uint8 [N, chunk_bytes], C-contiguous), each checked.

        nowait=False: every chunk is read (blocking) or FormatError names the one that could not be.
        nowait=True: only chunks the OS can hand over without waiting for storage (RWF_NOWAIT); a chunk that
        would block, or fails in any way, is left for a blocking read, which reports the precise error.
        Returns bool [n]: which chunks are now in ``out``."""
        n = chunks.shape[0]
        ok = np.zeros(n, dtype=bool)
        if n == 0:
            return ok
        try:
            fds, offs = self.locate(chunks)
        except FormatError:
            if nowait:
                return ok
            raise
        flags = _NOWAIT if nowait else 0
        kern = _kernel()
        if kern is not None:
            kern[0](fds, offs, out, rows.astype(np.int64, copy=False), self.geom.crc, flags, ok)
        else:
            self._read_py(fds, offs, out, rows, flags, ok)
        if nowait and not self._probed:
            self._probe(chunks, fds, offs, out, rows, ok)
        if not nowait and not ok.all():
            for j in np.flatnonzero(~ok).tolist():  # again in Python: the precise error, or a transient failure
                out[rows[j]] = self._read_stored([int(chunks[j])])[0]
                ok[j] = True
        return ok

    def locate(self, chunks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(file descriptor, byte offset) of each chunk (int64 [n]) of a local dense asset."""
        cps = self.geom.chunks_per_shard
        shard = chunks // cps
        return self._fds_of(shard), (chunks - shard * cps) * self.geom.stride

    def _read_py(self, fds, offs, out, rows, flags, ok) -> None:
        cb, crc = self.geom.chunk_bytes, self.geom.crc
        want = cb + 4 if crc else cb
        from polymem.asset._shards import crc32c

        cbuf = self._crcbuf
        for i, (fd, off, r) in enumerate(zip(fds.tolist(), offs.tolist(), rows.tolist())):
            dst = memoryview(out[r])
            try:
                got = os.preadv(fd, [dst, cbuf] if crc else [dst], off, flags)
            except OSError:  # EAGAIN (would block), EOPNOTSUPP, EIO: left to the blocking read
                continue
            ok[i] = got == want and (not crc or crc32c(dst) == int.from_bytes(cbuf, "little"))

    def _probe(self, chunks, fds, offs, out, rows, ok) -> None:
        """The first non-blocking read: if the file system refuses RWF_NOWAIT even for a chunk just read
        (in the OS page cache for sure), stop trying it. Known answers are kept per device."""
        self._probed = True
        try:
            dev = os.fstat(int(fds[0])).st_dev
        except OSError:
            dev = None
        if ok.any():
            _NOWAIT_BY_DEVICE[dev] = True
            return
        known = _NOWAIT_BY_DEVICE.get(dev)
        if known is not None:
            self.nowait = known
            return
        j = np.arange(1)
        self.read_into(chunks[:1], out, rows[:1])  # blocking; the chunk is in the page cache now
        again = np.zeros(1, dtype=bool)
        kern = _kernel()
        if kern is not None:
            kern[0](fds[:1], offs[:1], out, rows[j].astype(np.int64), self.geom.crc, _NOWAIT, again)
        else:
            self._read_py(fds[:1], offs[:1], out, rows[:1], _NOWAIT, again)
        self.nowait = _NOWAIT_BY_DEVICE[dev] = bool(again[0])
        ok[0] = True

    def _fds_of(self, shard: np.ndarray) -> np.ndarray:
        tab = self._fdtab
        fds = tab[shard]
        if (fds < 0).any():
            for s in np.unique(shard[fds < 0]).tolist():
                self._fd(s)
            fds = tab[shard]
        return fds

    # ---- the general path: one uint8 array per chunk
    def read(self, chunks: "list[int] | np.ndarray") -> list[np.ndarray]:
        """Chunk ids -> one uint8 array [chunk_bytes] each (checked); absent chunks of a sparse asset are zeros."""
        if self._ranks is None:
            return self._read_stored(chunks)
        chunks = [int(c) for c in chunks]
        here = [c for c in chunks if not self._absent(c)]
        got = dict(zip(here, self._read_stored(here))) if here else {}
        zero = np.zeros(self.geom.chunk_bytes, dtype=np.uint8)
        return [got.get(c, zero) for c in chunks]

    def _fd(self, s: int) -> int:
        fd = int(self._fdtab[s])
        if fd < 0:
            with self._lock:
                fd = int(self._fdtab[s])
                if fd < 0:
                    key = self.geom.shard_key(s)
                    try:
                        fd = os.open(self.local / key, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))  # type: ignore[operator]
                    except FileNotFoundError:
                        raise MissingError(
                            f"{self.where}: shard {key!r} is missing (it was there when the asset was opened); "
                            "restore the asset (or `polymem pull` it again)"
                        ) from None
                    except OSError as e:
                        raise FormatError(f"{self.where}: cannot open shard {key!r}: {e.strerror}; check the file") from None
                    if hasattr(os, "posix_fadvise"):  # single-chunk reads: no readahead of the neighbours
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
                    self._fdtab[s] = fd
        return fd

    def _short(self, c: int, got: int) -> FormatError:
        s, off = self._extent(c)
        return FormatError(
            f"{self.where}: shard {self.geom.shard_key(s)!r} ended after {got} of the {self.geom.stride} bytes "
            f"of chunk {int(c)} (offset {off}): the shard is truncated or was replaced; restore the asset"
        )

    def _read_stored(self, chunks: "list[int] | np.ndarray") -> list[np.ndarray]:
        """Chunk ids -> one uint8 array [chunk_bytes] each (checked: length and, format v2, crc32c)."""
        cb = self.geom.stride  # read the stored chunk with its crc32c; the check strips it
        out: list[np.ndarray] = []
        if self.local is not None:
            for c in chunks:
                s, off = self._extent(c)
                try:
                    b = os.pread(self._fd(s), cb, off)
                except OSError as e:
                    raise FormatError(
                        f"{self.where}: reading chunk {int(c)} of shard {self.geom.shard_key(s)!r} failed: "
                        f"{e.strerror}; check the disk or restore the asset"
                    ) from None
                if len(b) != cb:
                    raise self._short(c, len(b))
                out.append(np.frombuffer(b, dtype=np.uint8))
        else:
            paths, starts, ends = [], [], []
            for c in chunks:
                s, off = self._extent(c)
                paths.append(self._raw._p(self.geom.shard_key(s)))
                starts.append(off)
                ends.append(off + cb)
            fs = self._raw._fs
            got = fs.cat_ranges(paths, starts, ends, on_error="return")
            for c, p, b in zip(chunks, paths, got):
                if isinstance(b, BaseException):
                    if isinstance(b, FileNotFoundError):
                        raise MissingError(
                            f"{self.where}: object {p!r} (chunk {int(c)}) is missing; restore the asset or pull it again"
                        ) from None
                    raise FormatError(f"{self.where}: reading chunk {int(c)} from {p!r} failed: {b}") from None
                if len(b) != cb:
                    raise self._short(c, len(b))
                out.append(np.frombuffer(bytes(b), dtype=np.uint8))
        if self._check is not None:
            self._check(np.asarray(chunks, dtype=np.int64), out)
        if cb != self.geom.chunk_bytes:
            out = [a[: self.geom.chunk_bytes] for a in out]
        return out

    def close(self) -> None:
        with self._lock:
            fds = self._fdtab[self._fdtab >= 0].tolist()
            self._fdtab[:] = -1
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass


class Pending:
    """The chunks of one :meth:`PageService.fetch_into` still being read by the pool (or by another consumer).
    :meth:`wait` blocks until they are done and copies them into the consumer's buffer (read errors raise)."""

    __slots__ = ("service", "out", "parts")

    def __init__(self, service: "PageService", out: np.ndarray) -> None:
        self.service, self.out = service, out
        self.parts: list[tuple[Future, np.ndarray, np.ndarray]] = []  # (future, rows of out, rows of its result)

    def done(self) -> bool:
        return all(f.done() for f, _, _ in self.parts)

    def wait(self) -> None:
        t0 = time.perf_counter()
        waited = not self.done()
        out = self.out
        for fut, rows, src in self.parts:
            out[rows] = fut.result()[src]
        if waited:
            self.service.note_wait(time.perf_counter() - t0)


class IORead:
    """Chunks handed to the service's I/O thread: done / result like the Future of a pool read (so reads are
    joined alike). The thread only reads (one compiled call, GIL released); the first consumer that waits
    re-reads any chunk that failed (the precise error), counts and caches them."""

    __slots__ = ("service", "chunks", "buf", "slots", "gen", "queued", "ok", "io", "_res", "_exc", "_lock")

    def __init__(self, service: "PageService", chunks: np.ndarray, slots: np.ndarray | None = None) -> None:
        self.service, self.chunks = service, chunks
        # lane reads (slots given) land straight in their reserved slots of the cache slab
        self.slots = slots
        self.buf = np.empty((chunks.shape[0], service.geom.chunk_bytes), dtype=np.uint8) if slots is None \
            else service._slab
        self.gen = service._gen
        self.queued = True  # False: a lane read made (blocking) in the consumer's thread; only failures are left
        self.ok = np.zeros(chunks.shape[0], dtype=bool)
        self.io = threading.Lock()  # held until the I/O thread has read the chunks
        self.io.acquire()
        self._res: np.ndarray | None = None
        self._exc: BaseException | None = None
        self._lock = threading.Lock()

    def done(self) -> bool:
        return not self.io.locked()

    def result(self) -> np.ndarray:
        self.settle()
        if self.slots is not None:  # a lane read: a copy of its chunks (for a consumer that joined it)
            return self.buf[self.slots]
        return self._res  # type: ignore[return-value]

    def _wait_io(self) -> None:  # under self._lock
        if self.io.locked():
            t0 = time.perf_counter()
            self.io.acquire()
            self.service.note_wait(time.perf_counter() - t0)
        else:
            self.io.acquire()
        self.io.release()

    def settle(self) -> None:
        """Wait for the I/O thread, then (once) re-read failures, count and cache; read errors raise."""
        with self._lock:
            if self._res is None and self._exc is None:
                self._wait_io()
                try:
                    if self.slots is not None:
                        self.service._lane_settle(self)
                        self._res = self.slots
                    else:
                        self._res = self.service._finish_read(self.chunks, self.buf, self.ok)
                except BaseException as e:
                    self._exc = e
            if self._exc is not None:
                raise self._exc


def _io_loop(q: "queue.SimpleQueue[Any]", read_rows: Any, crc: bool) -> None:
    """The I/O thread of a service: blocking reads of whole jobs, each one compiled call with the GIL released
    (the thread holds the GIL only to take a job and to signal it done, so the model's thread barely notices)."""
    while True:
        job = q.get()
        if job is None:
            return
        fds, offs, buf, rows, ok, done = job
        job = None  # hold nothing between jobs: the service must stay collectable
        try:
            read_rows(fds, offs, buf, rows, crc, 0, ok)
        except BaseException:  # noqa: BLE001 - ok stays False: the consumer re-reads for the precise error
            pass
        finally:
            done.release()
            fds = offs = buf = rows = ok = done = None


def _close_fds(tab: np.ndarray) -> None:
    for fd in tab[tab >= 0].tolist():
        try:
            os.close(fd)
        except OSError:
            pass
    tab[:] = -1


def _stop_io(q: "queue.SimpleQueue[Any]", t: threading.Thread) -> None:
    q.put(None)
    if t is not threading.current_thread():
        t.join()


class PageService:
    """Chunk cache + reader pool of one asset. ``fetch_into`` copies chunks into a consumer's buffer."""

    def __init__(self, asset: Any, *, cache_mb: float = 256.0, workers: int = 4) -> None:
        _check_args(cache_mb, workers)
        self.asset = asset
        self.geom = asset.geometry
        self.reader = ChunkReader(asset)
        self.workers = workers
        self._inflight: dict[int, tuple[Future, int]] = {}
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        # local dense assets with the compiled reader: one I/O thread takes the chunks that must come from
        # storage (else, and for URLs, the pool of ``workers`` threads)
        self.io_thread = self.reader.direct and _kernel() is not None
        self._io: tuple[Any, threading.Thread] | None = None
        self._io_fin: weakref.finalize | None = None
        self._nowait_skip = 0  # forwards left that skip the non-blocking attempt (it found little lately)
        self._users = 0
        self._finalizer: weakref.finalize | None = None
        self._stats = dict(hits=0, misses=0, joined=0, reads=0, nowait_reads=0, read_calls=0, bytes_read=0,
                           evictions=0, wait_s=0.0, cache_peak_bytes=0, errors=0)
        self._kst = np.zeros(7, dtype=np.int64)
        self._gen = 0
        # the lane: a consumer's whole forward in two compiled calls (lane_begin, lane_rows) on a local dense
        # asset with the compiled reader; False = every forward takes the general path (fetch_into)
        self.lane = self.io_thread
        g = self.geom
        self._rpc = g.rows_per_page * g.pages_per_chunk
        self._row_bytes = g.page_bytes // g.rows_per_page
        self._code = _index().DTYPE_CODES.get(str(g.dtype), -1)
        self.lane = self.lane and self._code >= 0
        self._lane_buf: tuple[np.ndarray, ...] | None = None
        self._setup_cache(int(cache_mb * (1 << 20)))

    # ---- the cache: a slab of slots, chunk -> slot (a compiled open-addressing index), LRU by stamp
    def _setup_cache(self, capacity: int) -> None:  # under the lock (or in __init__)
        cb = self.geom.chunk_bytes
        if self._gen:  # the peak of the cache being dropped stays in the counters
            self._stats["cache_peak_bytes"] = max(self._stats["cache_peak_bytes"], int(self._state[_PEAK]) * cb)
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
        self._state = np.zeros(16, dtype=np.int64)  # top (slots [0, top) used), free count, cached count, peak; the lane's
        self._tick = 0
        self._gen += 1  # reads that land in an older slab leave the new one alone

    def cached(self, chunk: int) -> bool:
        """Whether ``chunk`` is in the cache now."""
        with self._lock:
            return self._slot_of(int(chunk)) >= 0

    def _slot_of(self, chunk: int) -> int:  # under the lock
        return int(_index().idx_find(self._keys, self._vals, chunk))

    def _cache_bytes(self) -> int:
        return int(self._state[_CACHED]) * self.geom.chunk_bytes

    def _make_room(self, k: int, keep: np.ndarray | None = None) -> None:  # under the lock
        """At least min(k, what can be freed) slots free or never used: evict the least recently used chunks
        (slots a read is landing in, and slots in ``keep``, are never chosen)."""
        st_ = self._state
        avail = int(st_[_NFREE]) + self._nslots - int(st_[_TOP])
        need = k - avail
        if need <= 0:
            return
        used = int(st_[_TOP])
        at = self._chunk_at[:used]
        st = self._stamp[:used].copy()
        never = np.iinfo(np.int64).max
        st[self._free[: st_[_NFREE]]] = never
        st[at == READING] = never
        if keep is not None:
            st[keep] = never
        # evict a little more than needed when the cache is large, so the O(slots) search runs seldom
        take = min(used, max(need, self._nslots // 64))
        victims = np.argpartition(st, take - 1)[:take] if take < used else np.argsort(st)[:take]
        victims = victims[st[victims] != never]
        gone = at[victims]
        _index().idx_del_many(self._keys, self._vals, gone)
        at[victims] = -1
        self._stats["evictions"] += int(victims.size)
        st_[_CACHED] -= victims.size
        nf = int(st_[_NFREE])
        self._free[nf: nf + victims.size] = victims
        st_[_NFREE] = nf + victims.size

    def _take_slots(self, k: int) -> np.ndarray:  # under the lock
        """Up to k slots to fill (fewer only when every other slot has a read landing in it)."""
        self._make_room(k)
        st_ = self._state
        nf = int(st_[_NFREE])
        a = min(k, nf)
        got = self._free[nf - a: nf][::-1].copy()
        st_[_NFREE] = nf - a
        fresh = min(k - a, self._nslots - int(st_[_TOP]))
        if fresh:
            top = int(st_[_TOP])
            got = np.concatenate([got, np.arange(top, top + fresh, dtype=np.int64)])
            st_[_TOP] = top + fresh
        return got

    def _insert(self, chunks: np.ndarray, src: np.ndarray, rows: np.ndarray) -> None:  # under the lock
        """Cache chunks[i] = src[rows[i]] (those not cached yet; at most the cache's slots)."""
        if self._nslots == 0 or chunks.size == 0:
            return
        chunks = np.ascontiguousarray(chunks, dtype=np.int64)
        have = _index().idx_get_many(self._keys, self._vals, chunks, np.empty(chunks.size, dtype=np.int64))
        keep = np.flatnonzero(have < 0)
        if keep.size > self._nslots:
            keep = keep[-self._nslots:]
        if not keep.size:
            return
        slots = self._take_slots(int(keep.size))
        keep = keep[: slots.size]
        self._slab[slots] = src[rows[keep]]
        ids = chunks[keep]
        _index().idx_put_many(self._keys, self._vals, ids, slots)
        self._chunk_at[slots] = ids
        self._stamp[slots] = self._tick
        st_ = self._state
        st_[_CACHED] += ids.size
        if st_[_CACHED] > st_[_PEAK]:
            st_[_PEAK] = st_[_CACHED]

    # ---- lifecycle
    def acquire(self) -> None:
        with self._lock:
            self._users += 1

    def release(self) -> None:
        """One consumer is done; the last one stops the workers and empties the cache."""
        with self._lock:
            self._users = max(0, self._users - 1)
            last = self._users == 0
        if last:
            self.close()

    def pool(self) -> ThreadPoolExecutor:
        p = self._pool
        if p is None:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix=THREAD_PREFIX)
                    # workers stop when the service is garbage-collected, even without close()
                    self._finalizer = weakref.finalize(self, _shutdown, self._pool, self.reader)
                p = self._pool
        return p

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

    def _settle(self, chunks: np.ndarray, read: Any) -> np.ndarray:
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
            t = threading.Thread(target=_io_loop, args=(q, _kernel()[0], self.geom.crc), name=THREAD_PREFIX + "-io",
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
            slot = _index().idx_get_many(self._keys, self._vals, chunks, np.empty(n, dtype=np.int64)).tolist()
            hit_rows: list[int] = []
            hit_slots: list[int] = []
            joins: list[tuple[int, Future, int]] = []
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
                for j, f, i in joins:
                    pending.parts.append((f, np.array([j]), np.array([i])))
            if background and not mids.size:
                return pending
            if background and self.io_thread:
                try:
                    rd = self._io_submit(mids)
                    for i, c in enumerate(mids.tolist()):
                        inflight[c] = (rd, i)
                except FormatError as e:  # raised by the consumer's wait, in the forward that needs it
                    rd = Future()  # type: ignore[assignment]
                    rd.set_exception(e)  # type: ignore[attr-defined]
                    st["errors"] += 1
                pending.parts.append((rd, mrows, np.arange(mids.size)))  # type: ignore[union-attr]
                return pending
            if background:
                pool = self._pool or self._start_pool()
                m = mids.size
                groups = max(1, min(self.workers, -(-m // READS_PER_TASK)))
                bounds = [m * g // groups for g in range(groups + 1)]
                for g in range(groups):
                    part = mids[bounds[g]: bounds[g + 1]]
                    fut = pool.submit(self._read_task, part)
                    for i, c in enumerate(part.tolist()):
                        inflight[c] = (fut, i)
                    pending.parts.append((fut, mrows[bounds[g]: bounds[g + 1]], np.arange(part.size)))  # type: ignore[union-attr]
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

    # ---- the lane: a CPU consumer's forward in two compiled calls
    def lane_begin(self, rows: np.ndarray, *, background: bool, out: np.ndarray | None = None,
                   pairs: np.ndarray | None = None, half: np.ndarray | None = None) -> Any:
        """Step 1 of a forward on the lane (local dense assets with the compiled reader; ``rows`` int64, any
        shape, -1 = invalid): one compiled call looks the rows' distinct chunks up in the cache and reserves
        slots for the missing ones, which are read straight into them — background=False: here, blocking;
        background=True: here what the OS page cache holds (RWF_NOWAIT), the rest by the I/O thread.
        Returns DECODED (every chunk is in the cache now and, ``out`` given, the rows are decoded into it as
        :meth:`lane_rows` does), True (every chunk is in the cache now), the :class:`IORead` of the
        reads left or failures to re-read (:meth:`lane_finish` settles and decodes), or None: this forward takes
        the general path
        (:meth:`fetch_into`; e.g. reads of other consumers in flight, a shard not open yet, no room)."""
        kern = _kernel()
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
            n = kern[1](*args)
            opened = 0
            while n == -2 and opened < 64:  # open the shards it needs (a FormatError names a missing one)
                try:
                    self.reader._fd(int(self._state[6]))  # (the reader's own lock)
                except FormatError:
                    self._stats["errors"] += 1
                    raise
                opened += 1
                n = kern[1](*args)
            if n == -1:  # make room, keeping this forward's hits
                self._make_room(int(self._state[4]), keep=mhit[: self._state[7]])
                n = kern[1](*args)
            if n < 0:
                return None
            if mode == 1 and 2 * self._state[5] < self._state[4]:
                self._nowait_skip = NOWAIT_BACKOFF  # most came from storage: see fetch_into
            if n == 0:
                return DECODED if self._state[8] else True
            rd = IORead(self, mch[:n].copy(), mslot[:n].copy())
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
        try:
            if bad.size:
                self.reader.read_into(rd.chunks[bad], rd.buf, rd.slots[bad])
        except BaseException:
            with self._lock:
                self._stats["errors"] += 1
                for c in rd.chunks.tolist():
                    self._inflight.pop(c, None)
                if rd.gen == self._gen:
                    _index().lane_release(rd.slots, self._chunk_at, self._free, self._state)
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
                _index().lane_settle(rd.chunks, rd.slots, self._keys, self._vals, self._chunk_at, self._free,
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
                            return _index().settle_rows(
                                rd.chunks, rd.slots, self._keys, self._vals, self._chunk_at, self._free, self._state,
                                self._kst, rows, self._rpc, self._slab, self._row_bytes, self._code, pairs, half, out,
                                out.view(np.uint32)) == 0
        rd.settle()
        return self.lane_rows(rows, out, pairs, half)

    def lane_rows(self, rows: np.ndarray, out: np.ndarray, pairs: np.ndarray, half: np.ndarray) -> bool:
        """Step 2: decode ``rows`` (as given to :meth:`lane_begin`) out of the cache into ``out`` (float32
        [rows.size, head_dim]; zeros for invalid rows) in one compiled call. False if a chunk is not in the
        cache (evicted by another consumer since, or no room): the caller takes the general path."""
        with self._lock:
            return _index().rows_from_cache(rows, self._rpc, self._keys, self._vals, self._slab, self._row_bytes,
                                            self._code, pairs, half, out, out.view(np.uint32)) == 0

    def _try_nowait(self) -> bool:  # under the lock
        if self._nowait_skip:
            self._nowait_skip -= 1
            return False
        return True

    def _start_pool(self) -> ThreadPoolExecutor:  # under the lock
        self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix=THREAD_PREFIX)
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
            for name, i in (("hits", _K_HITS), ("misses", _K_MISSES), ("reads", _K_READS), ("nowait_reads", _K_NOWAIT),
                            ("read_calls", _K_CALLS), ("bytes_read", _K_BYTES)):
                out[name] += k[i]
            out["lane_forwards"] = k[_K_LANE]
            out["cache_peak_bytes"] = max(out["cache_peak_bytes"], int(self._state[_PEAK]) * self.geom.chunk_bytes)
            out.update(cache_bytes=self._cache_bytes(), cache_chunks=int(self._state[_CACHED]), capacity_bytes=self.capacity,
                       chunk_bytes=self.geom.chunk_bytes, workers=self.workers, io_thread=self.io_thread,
                       source="pread" if self.reader.local is not None else "fsspec")
        return out


def _check_args(cache_mb: Any, workers: Any) -> None:
    if not isinstance(cache_mb, (int, float)) or isinstance(cache_mb, bool) or not cache_mb >= 0:
        raise PolymemError(f"cache_mb={cache_mb!r} must be a number >= 0 (MiB of RAM for cached pages), e.g. 256")
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise PolymemError(f"read_workers={workers!r} must be a positive integer (reader threads), e.g. 4")


def _shutdown(pool: ThreadPoolExecutor, reader: ChunkReader) -> None:
    pool.shutdown(wait=False, cancel_futures=True)
    reader.close()


# services live as long as a table holds them (the registry only finds them); a service holds its asset, so
# the id of a registered asset cannot be reused while its service is alive
_SERVICES: "weakref.WeakValueDictionary[int, PageService]" = weakref.WeakValueDictionary()
_SERVICES_LOCK = threading.Lock()


def service_for(asset: Any, *, cache_mb: float = 256.0, workers: int = 4) -> PageService:
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


__all__ = ["ChunkReader", "IORead", "PageService", "Pending", "THREAD_PREFIX", "service_for"]
