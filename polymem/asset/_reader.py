"""The asset's readers: :class:`AssetReader`, what every reader of the ``pages`` array provides, and the local
one, :class:`FastReader`, which reads verified chunks straight from the shard files.

The other readers: :class:`polymem.asset._sparse.SparseReader` (local sparse subsets), ``ZarrReader`` and
``TensorstoreReader`` (:mod:`._zarr`: fsspec URLs, tensorstore); ``MemoryAsset`` picks one in ``_make_reader``,
typed as :class:`AssetReader`, so mypy checks each of them against it.

Chunks come by ``pread`` (and, after ``MAP_AFTER`` reads, from a read-only memory map guarded against SIGBUS,
:mod:`._sigbus`); every chunk's crc32c is checked on every read (format v2). Batches go through the numba kernels
of :mod:`._shards` (``preadv`` and the crc32c library called directly, :mod:`._ckern`). Not here: the shard
files' layout and their writers (:mod:`._shards`), metadata (``_format``), zarr-python (``_zarr``).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np

from polymem.asset._format import Geometry
from polymem.asset._shards import CRC_RESIDUE, _crc_buffer, _crc_bytes, _kernels, corrupt_chunk, crc32c, pages_of_chunk
from polymem.errors import FormatError, MissingError


class AssetReader(Protocol):
    """What :class:`polymem.asset.core.MemoryAsset` reads its stored chunks through."""

    def read_chunks(self, ids: np.ndarray) -> np.ndarray:
        """int64 chunk ids [n] (in range) -> verified stored-dtype chunks [n, *chunk_shape[1:]]."""
        ...

    def invalidate(self, shards: "list[int] | None" = None) -> None:
        """Forget open files (all, or those of ``shards``) after shard files were replaced."""
        ...

    def close(self) -> None:
        ...


class _ShardFile:
    """A read-only descriptor, closed when the last holder lets go: a reader thread that took it from the
    table keeps it open through its pread even if invalidate() drops it meanwhile (no closed or reused fd)."""

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __del__(self) -> None:
        try:
            os.close(self.fd)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


# chunk reads by pread before a reader memory-maps its shards (the SIGBUS guard compiles once per process, ~0.5 s)
MAP_AFTER = int(os.environ.get("POLYMEM_MAP_AFTER", "64"))


class FastReader:
    """Verified chunks straight from local shard files, crc32c checked on every read (format v2).

    Each shard is read through a SIGBUS-guarded read-only memory map (``_sigbus``; after ``MAP_AFTER`` reads, so
    a process reading a handful of pages never pays for compiling the guard) or, where maps are not used (format
    v1, sparse assets, a platform without the guard, ``POSIX_FADV_RANDOM``-advised ``pread`` otherwise). Either
    way every read copies the chunk and its stored crc32c out of the file's pages and checks the copy — the bytes
    returned are the bytes checked, read from the OS page cache on every call (no verified-once cache). A failed
    check on a map is retried with ``pread`` for the precise error (truncated / corrupt, naming shard and page);
    a map that took a SIGBUS (the file shrank under it) is dropped.
    """

    _mappable = True  # SparseReader: its shards are not laid out at i * stride

    def __init__(self, root: Path, geom: Geometry, where: str | None = None) -> None:
        self._root = root
        self._geom = geom
        self._where = where or str(root)
        self._files: list[_ShardFile | None] = [None] * geom.num_shards
        self._dtype = np.dtype(geom.data_type).newbyteorder("<")
        self._chunk_shape = geom.chunk_shape[1:]
        self._page_shape = (1,) + geom.chunk_shape[1:] if not geom.packed else (1, geom.page_bytes)
        self._count = geom.chunk_bytes // self._dtype.itemsize
        self._cps, self._stride, self._cb, self._crc = geom.chunks_per_shard, geom.stride, geom.chunk_bytes, geom.crc
        # memory maps: only where every read is checked (v2); None = not mapped (yet), False = never for this shard
        self._maps: list[Any] = [None] * geom.num_shards
        self._lock = threading.Lock()
        self._reads = 0
        self._map_ok = geom.crc and self._mappable and os.environ.get("POLYMEM_NO_MMAP", "") in ("", "0")

    def _open(self, s: int) -> "_ShardFile":
        f = self._files[s]
        if f is None:
            key = self._geom.shard_key(s)
            try:
                f = _ShardFile(os.open(self._root / key, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)))
            except FileNotFoundError:
                raise MissingError(f"{self._where}: shard {key!r} is missing (removed while the asset was open); "
                                   "reopen or restore the asset", self._root / key) from None
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(f.fd, 0, 0, os.POSIX_FADV_RANDOM)
            with self._lock:  # another thread may have opened it meanwhile: keep one
                f = self._files[s] = self._files[s] or f
        return f

    def _map(self, s: int) -> Any:
        """The guarded map of shard s, made now if maps are in use and the shard is whole; else None."""
        m = self._maps[s]
        if m is not None or not self._map_ok:
            return m or None
        self._reads += 1
        if self._reads < MAP_AFTER:
            return None
        from polymem.asset import _sigbus

        g = _sigbus.guard()
        if g is None:
            self._map_ok = False
            return None
        size = self._geom.shard_size(s)
        try:
            f = self._open(s)  # held while mapping: not closed under us
            if os.fstat(f.fd).st_size < size:  # already short: leave it to pread's precise error
                return None
            m = _sigbus.GuardedMap(g, f.fd, size)
        except OSError:  # out of map slots / address space: this shard stays on pread
            self._maps[s] = False
            return None
        with self._lock:  # another thread may have mapped it meanwhile: keep one (ours is unmapped when dropped)
            cur = self._maps[s]
            if cur:
                return cur
            self._maps[s] = m
        return m

    def _unmap(self, s: int) -> None:
        self._maps[s] = None  # readers holding the map keep it mapped until they let go

    def _check(self, s: int, i: int, b: bytes) -> None:
        """Raise the FormatError for chunk i of shard s whose stored bytes ``b`` failed."""
        if len(b) != self._stride:
            key = self._geom.shard_key(s)
            c = s * self._cps + i
            raise FormatError(
                f"{self._where}: shard {key!r} is truncated: {pages_of_chunk(self._geom, c)} lies beyond its end "
                f"(read {len(b)} of {self._stride} bytes; the file changed under this reader); reopen or restore "
                "the asset"
            )
        if self._crc and crc32c(b) != CRC_RESIDUE:
            raise corrupt_chunk(self._geom, s, i, self._where)

    def _pread(self, s: int, i: int) -> bytes:
        f = self._files[s] or self._open(s)  # held across the call: an invalidate() meanwhile cannot close it
        b = os.pread(f.fd, self._stride, i * self._stride)
        if len(b) != self._stride or (self._crc and _crc_bytes(b) != CRC_RESIDUE):
            self._check(s, i, b)
        return b

    def _stored(self, s: int, i: int) -> bytes:
        """Verified stored bytes (chunk ‖ crc32c) of chunk i of shard s: from its map, else by pread."""
        m = self._maps[s] or self._map(s)
        if m:
            a = i * self._stride
            b: bytes = m.mv[a : a + self._stride].tobytes()
            if _crc_bytes(b) == CRC_RESIDUE:
                return b
            if m.faults():  # the file shrank under the map (those pages now read as zeros): drop it
                self._unmap(s)
        return self._pread(s, i)  # the precise error, or good bytes if they changed back

    def read_page(self, p: int) -> np.ndarray:
        """One page as stored, [1, K*S, r] (float dtypes) or uint8 [1, page_bytes] (nf4); verified. Lean on purpose."""
        g = self._geom
        if g.pages_per_chunk == 1 and not g.packed:
            s, i = divmod(p, self._cps)
            page: np.ndarray = np.ndarray(self._page_shape, self._dtype, bytearray(self._stored(s, i)))
            return page
        c, j = divmod(p, g.pages_per_chunk)
        s, i = divmod(c, self._cps)
        b = self._stored(s, i)
        page = np.frombuffer(b, np.uint8, g.page_bytes, j * g.page_bytes).reshape(self._page_shape).copy()
        return page

    def lean_reader(self) -> Callable[[int], np.ndarray]:
        """``read_page`` specialised for this geometry: a closure over locals (the single-page hot path)."""
        g = self._geom
        if g.pages_per_chunk != 1 or g.packed or not self._mappable:
            return self.read_page
        maps, st, cps, stored = self._maps, self._stride, self._cps, self._stored
        crc, res, shape, dt = _crc_bytes, CRC_RESIDUE, self._page_shape, self._dtype
        nd: Callable[[tuple[int, ...], np.dtype[Any], bytearray], np.ndarray] = np.ndarray
        if not self._map_ok:  # pread only (format v1, POLYMEM_NO_MMAP, ...): one pread, check, one copy
            files, opener, check, pread, want_crc = self._files, self._open, self._check, os.pread, self._crc

            def read_pread(p: int) -> np.ndarray:
                s, i = divmod(p, cps)
                f = files[s] or opener(s)
                b = pread(f.fd, st, i * st)
                if len(b) != st or (want_crc and crc(b) != res):
                    check(s, i, b)
                return nd(shape, dt, bytearray(b))

            return read_pread
        if _crc_buffer is not None:  # one copy (map -> the result's own buffer), then check that copy
            crcb = _crc_buffer

            def read_mapped_buffer(p: int) -> np.ndarray:
                s, i = divmod(p, cps)
                m = maps[s]
                if m:
                    a = i * st
                    b = bytearray(m.mv[a : a + st])
                    if crcb(b) == res:
                        return nd(shape, dt, b)
                return nd(shape, dt, bytearray(stored(s, i)))

            return read_mapped_buffer

        def read_mapped(p: int) -> np.ndarray:
            s, i = divmod(p, cps)
            m = maps[s]
            if m:
                a = i * st
                b = m.mv[a : a + st].tobytes()
                if crc(b) == res:
                    return nd(shape, dt, bytearray(b))
            return nd(shape, dt, bytearray(stored(s, i)))

        return read_mapped

    def _prepare(self, shards: "list[int]", n: int) -> tuple[list[Any], np.ndarray, np.ndarray]:
        """Map (once past MAP_AFTER reads) or open the shards a batch of n chunk reads touches. Returns (the maps,
        which the caller holds until its kernel returns — they stay mapped while it copies from them —, and per
        shard in ``shards`` order its descriptor and map address, 0 = read by pread)."""
        keep = []
        self._reads += n
        fds = np.empty(len(shards), np.int64)
        bases = np.zeros(len(shards), np.int64)
        for j, s in enumerate(shards):
            m = self._maps[s] or self._map(s)
            f = self._files[s] or self._open(s)
            fds[j] = f.fd
            if m:
                bases[j] = m.addr
            keep.append((m, f))
        return keep, fds, bases

    def read_chunks_into(self, ids: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Verified raw bytes of chunks ``ids`` (int64 [n], in range) into ``out`` (uint8 [n, chunk_bytes],
        C-contiguous, writable); returns ``out``. The primitive a page service builds on."""
        n = ids.shape[0]
        if out.shape != (n, self._cb) or out.dtype != np.uint8 or not out.flags.c_contiguous:
            raise ValueError(f"out must be uint8 [{n}, {self._cb}] C-contiguous, got {out.dtype} {out.shape}")
        if n == 0:
            return out
        cps = self._cps
        shard = ids // cps
        kern = _kernels() if n > 2 else None
        if kern is None:
            for k, (s, i) in enumerate(zip(shard.tolist(), (ids - shard * cps).tolist())):
                out[k] = np.frombuffer(self._stored(s, i), np.uint8, self._cb)
            return out
        shards, local = np.unique(shard, return_inverse=True)
        keep, fds, bases = self._prepare(shards.tolist(), n)
        offs = (ids - shard * cps) * self._stride
        crcs = np.empty(n, np.uint32)
        bad = kern[0](fds, bases, local.astype(np.int64, copy=False), offs, out, crcs, self._crc)
        del keep
        if bad >= 0:  # re-read the failing chunk in Python for the precise error (or a transient short read)
            for k in range(bad, n):  # it read fine the second time: finish in Python
                s, i = int(shard[k]), int(ids[k] - shard[k] * cps)
                out[k] = np.frombuffer(self._stored(s, i), np.uint8, self._cb)
        return out

    def read_chunks(self, ids: np.ndarray) -> np.ndarray:
        """int64 chunk ids [n] (in range) -> verified stored-dtype chunks [n, *chunk_shape[1:]] (a new array)."""
        out = np.empty((ids.shape[0], self._cb), np.uint8)
        self.read_chunks_into(ids, out)
        chunks: np.ndarray = out.view(self._dtype).reshape((ids.shape[0],) + self._chunk_shape)
        return chunks

    def read_rows(self, rows: np.ndarray) -> np.ndarray:
        """int64 table rows [n] (in range) -> stored rows: [n, r] (float dtypes) or uint8 [n, r/2+2] (nf4).

        Every row comes out of a verified copy of its chunk (one kernel pass, no sort: runs of rows in one chunk
        share one copy and check); without the kernels, each distinct page is read and verified once.
        """
        g = self._geom
        n = rows.shape[0]
        kern = _kernels() if n > 2 and self._mappable else None
        if kern is None:
            return self._read_rows_by_page(rows)
        KS, ppc, cps = g.rows_per_page, g.pages_per_chunk, self._cps
        touched = np.flatnonzero(np.bincount(rows // (KS * ppc * cps), minlength=g.num_shards))  # no sort
        loc = np.empty(g.num_shards, np.int64)
        loc[touched] = np.arange(touched.shape[0])
        keep, fds, bases = self._prepare(touched.tolist(), n)
        out = np.empty((n, g.page_bytes // KS), np.uint8)
        bad = kern[2](fds, bases, loc, rows, out, KS, ppc, g.page_bytes, cps, self._stride, self._crc)
        del keep
        if bad >= 0:  # the precise error (raised here), or it read fine this time: redo page by page
            s, i = divmod(int(rows[bad]) // KS // ppc, cps)
            self._stored(s, i)
            return self._read_rows_by_page(rows)
        return out if g.packed else out.view(self._dtype)

    def _read_rows_by_page(self, rows: np.ndarray) -> np.ndarray:
        g = self._geom
        KS, ppc = g.rows_per_page, g.pages_per_chunk
        page = rows // KS
        chunks, inv = np.unique(page // ppc, return_inverse=True)
        buf = np.empty((chunks.shape[0], self._cb), np.uint8)
        self.read_chunks_into(chunks, buf)
        if not g.packed:
            stored: np.ndarray = buf.view(self._dtype).reshape(chunks.shape[0], KS, g.head_dim)[inv, rows % KS]
            return stored
        rb = g.page_bytes // KS
        off = (page % ppc) * g.page_bytes + (rows % KS) * rb
        stored = buf[inv[:, None], off[:, None] + np.arange(rb)]
        return stored

    def invalidate(self, shards: "list[int] | None" = None) -> None:
        """Close descriptors and drop maps (after shard files were replaced), so the next read opens the new files."""
        for s in range(self._geom.num_shards) if shards is None else shards:
            self._unmap(s)
            self._files[s] = None  # closed once no read in flight holds it (at once, when none does)

    def close(self) -> None:
        self.invalidate()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


__all__ = ["AssetReader", "FastReader", "MAP_AFTER"]
