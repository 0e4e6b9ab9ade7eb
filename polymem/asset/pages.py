"""The page service: a bounded RAM cache of an asset's stored chunks, filled by background reads.

A *chunk* is the unit an asset stores and reads (docs/asset-format.md §4): one page for float assets, one
4 KiB block of whole pages for NF4. :class:`PageService` reads chunks straight from the shard files —
``os.pread`` on local assets (no mmap: resident memory stays what the cache holds, and the GIL is released
while the disk works), parallel range requests through fsspec for URLs (``s3://…``, ``memory://…``) — on a
pool of worker threads. Each chunk a request needs is either in the cache (a hit), already being read for an
earlier request (joined, read once), or read now (a miss). The cache is an LRU bounded in bytes
(``cache_mb``); every consumer of one asset shares it (:func:`service_for`).

    svc = service_for(asset, cache_mb=256)
    entries = svc.fetch(np.array([3, 17]), background=True)   # returns at once
    chunks = [svc.resolve(e) for e in entries]                 # uint8 [chunk_bytes] each; waits if needed
    svc.stats()     # hits, misses, joined, reads, bytes_read, wait_s, cache_bytes, cache_peak_bytes, ...

Every chunk read is checked before it is used or cached (its length, and ``asset.check_chunk_bytes``); a
missing or short shard, a missing object or a failed check raises :class:`FormatError` naming the asset,
the shard and the chunk. The service assumes the asset does not change while it is served (a frozen table).
Not here: decoding into torch tensors (:mod:`polymem.torch.pages`), the asset format (:mod:`.core`).
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from polymem.errors import FormatError, PolymemError

THREAD_PREFIX = "polymem-pages"


class ChunkReader:
    """Stored chunks of one asset as uint8 arrays: ``os.pread`` (local) or fsspec range requests (URLs)."""

    def __init__(self, asset: Any) -> None:
        self.asset = asset
        self.geom = asset.geometry
        raw = asset._raw
        self.where = str(asset.path)
        self.local = raw.local
        self._raw = raw
        self._fds: dict[int, int] = {}
        self._lock = threading.Lock()
        self._check = getattr(asset, "check_chunk_bytes", None)
        # a sparse subset (docs/asset-format.md §12): rank of each stored chunk in its shard, -1 = absent (zeros)
        self._ranks = asset.sparse_ranks() if getattr(asset, "sparse", False) else None

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
        fd = self._fds.get(s)
        if fd is None:
            with self._lock:
                fd = self._fds.get(s)
                if fd is None:
                    key = self.geom.shard_key(s)
                    try:
                        fd = os.open(self.local / key, os.O_RDONLY)  # type: ignore[operator]
                    except FileNotFoundError:
                        raise FormatError(
                            f"{self.where}: shard {key!r} is missing (it was there when the asset was opened); "
                            "restore the asset (or `polymem pull` it again)"
                        ) from None
                    except OSError as e:
                        raise FormatError(f"{self.where}: cannot open shard {key!r}: {e.strerror}; check the file") from None
                    self._fds[s] = fd
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
                        raise FormatError(
                            f"{self.where}: object {p!r} (chunk {int(c)}) is missing; restore the asset or pull it again"
                        ) from None
                    raise FormatError(f"{self.where}: reading chunk {int(c)} from {p!r} failed: {b}") from None
                if len(b) != cb:
                    raise self._short(c, len(b))
                out.append(np.frombuffer(bytes(b), dtype=np.uint8))
        if self._check is not None:
            self._check(np.asarray(chunks, dtype=np.int64), out)
        if cb != self.geom.chunk_bytes:  # a copy, so the cache holds (and counts) exactly chunk_bytes per chunk
            out = [a[: self.geom.chunk_bytes].copy() for a in out]
        return out

    def close(self) -> None:
        with self._lock:
            fds, self._fds = self._fds, {}
        for fd in fds.values():
            try:
                os.close(fd)
            except OSError:
                pass


class PageService:
    """Chunk cache + reader pool of one asset. ``fetch`` hands out chunks or futures; ``resolve`` waits."""

    def __init__(self, asset: Any, *, cache_mb: float = 256.0, workers: int = 4) -> None:
        _check_args(cache_mb, workers)
        self.asset = asset
        self.geom = asset.geometry
        self.reader = ChunkReader(asset)
        self.capacity = int(cache_mb * (1 << 20))
        self.workers = workers
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()
        self._cache_bytes = 0
        self._inflight: dict[int, tuple[Future, int]] = {}
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._users = 0
        self._finalizer: weakref.finalize | None = None
        self._stats = dict(hits=0, misses=0, joined=0, reads=0, read_calls=0, bytes_read=0, evictions=0,
                           wait_s=0.0, cache_peak_bytes=0, errors=0)

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
            self._cache.clear()
            self._cache_bytes = 0
        if fin is not None:
            fin.detach()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=False)
        self.reader.close()

    def idle(self) -> bool:
        with self._lock:
            return self._users == 0

    def restart(self, cache_mb: float) -> None:
        """A service no table uses any more starts over: the new size, counters at zero."""
        with self._lock:
            self.capacity = int(cache_mb * (1 << 20))
            for k in self._stats:
                self._stats[k] = 0.0 if k == "wait_s" else 0

    def resize(self, cache_mb: float) -> None:
        with self._lock:
            self.capacity = max(self.capacity, int(cache_mb * (1 << 20)))

    # ---- reads
    def _insert(self, c: int, a: np.ndarray) -> None:  # under the lock
        nb = a.nbytes
        if nb > self.capacity or c in self._cache:
            return
        while self._cache_bytes + nb > self.capacity and self._cache:
            _, old = self._cache.popitem(last=False)
            self._cache_bytes -= old.nbytes
            self._stats["evictions"] += 1
        self._cache[c] = a
        self._cache_bytes += nb
        if self._cache_bytes > self._stats["cache_peak_bytes"]:
            self._stats["cache_peak_bytes"] = self._cache_bytes

    def _read(self, chunks: list[int]) -> list[np.ndarray]:
        try:
            arrs = self.reader.read(chunks)
        except BaseException:
            with self._lock:
                self._stats["errors"] += 1
                for c in chunks:
                    self._inflight.pop(c, None)
            raise
        with self._lock:
            self._stats["reads"] += len(chunks)
            self._stats["read_calls"] += 1
            self._stats["bytes_read"] += sum(a.nbytes for a in arrs)
            for c, a in zip(chunks, arrs):
                self._inflight.pop(c, None)
                self._insert(c, a)
        return arrs

    def fetch(self, chunks: np.ndarray, *, background: bool) -> list[Any]:
        """Distinct chunk ids -> one entry each: the chunk (uint8 array) or a (future, index) of a read.

        background=True submits the missing chunks to the worker pool and returns at once; False reads them
        in the calling thread (the synchronous path)."""
        entries: list[Any] = [None] * len(chunks)
        missing: list[int] = []
        where: list[int] = []
        hits = joined = 0
        pool = self.pool() if background else None
        with self._lock:  # one critical section: a chunk is looked up and, if missing, registered as in flight
            cache, inflight = self._cache, self._inflight
            for j, c in enumerate(chunks.tolist()):
                a = cache.get(c)
                if a is not None:
                    cache.move_to_end(c)
                    entries[j] = a
                    hits += 1
                    continue
                f = inflight.get(c)
                if f is not None:
                    entries[j] = f
                    joined += 1
                    continue
                missing.append(c)
                where.append(j)
            self._stats["hits"] += hits
            self._stats["joined"] += joined
            self._stats["misses"] += len(missing)
            if missing and pool is not None:
                n = len(missing)
                groups = min(self.workers, n)
                bounds = [n * g // groups for g in range(groups + 1)]
                for g in range(groups):
                    part = missing[bounds[g]: bounds[g + 1]]
                    fut = pool.submit(self._read, part)
                    for i, c in enumerate(part):
                        inflight[c] = (fut, i)
                        entries[where[bounds[g] + i]] = (fut, i)
        if not missing or pool is not None:
            return entries
        # the synchronous path: the caller reads, and waits for the whole read
        t0 = time.perf_counter()
        arrs = self._read(missing)
        self.note_wait(time.perf_counter() - t0)
        for j, a in zip(where, arrs):
            entries[j] = a
        return entries

    def resolve(self, entry: Any) -> np.ndarray:
        """An entry of :meth:`fetch` -> the chunk, waiting for its read if needed (read errors raise here)."""
        if isinstance(entry, np.ndarray):
            return entry
        fut, i = entry
        return fut.result()[i]

    def note_wait(self, seconds: float) -> None:
        """Add time a consumer spent waiting for this service (reads and decoding) to ``wait_s``."""
        with self._lock:
            self._stats["wait_s"] += seconds

    def stats(self) -> dict[str, Any]:
        """Counters since the service started: hits / misses / joined (chunks found in the cache, read, or
        shared with a read in flight), reads and bytes_read (chunks and bytes read from storage), read_calls,
        evictions, errors, wait_s (seconds consumers waited for reads), cache_bytes / cache_peak_bytes /
        capacity_bytes, chunk_bytes, workers."""
        with self._lock:
            out = dict(self._stats)
            out.update(cache_bytes=self._cache_bytes, cache_chunks=len(self._cache), capacity_bytes=self.capacity,
                       chunk_bytes=self.geom.chunk_bytes, workers=self.workers,
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


__all__ = ["ChunkReader", "PageService", "THREAD_PREFIX", "service_for"]
