"""Stored chunks of one asset, read for the page service: :class:`ChunkReader`.

Local assets: ``preadv`` straight into the caller's buffer (no mmap: resident memory stays what the cache holds,
and the GIL is released while the disk works), through the compiled ``read_rows`` kernel where it runs (libc
``preadv2`` and google-crc32c called from numba, :mod:`polymem.asset._ckern`), else a Python loop doing the same;
``RWF_NOWAIT`` reads take only what the OS page cache holds. URLs: parallel range requests through fsspec. Every
chunk is checked (its length, and its crc32c from format v2) before it is used; a missing or short shard, a
missing object or a failed check raises :class:`FormatError` naming the asset, the shard and the chunk.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from polymem.errors import FormatError, MissingError
from polymem.serve._load import kernels

if TYPE_CHECKING:
    from polymem.asset.core import MemoryAsset

_NOWAIT = getattr(os, "RWF_NOWAIT", 0)
_NOWAIT_BY_DEVICE: dict[Any, bool] = {}  # st_dev -> does the file system honour RWF_NOWAIT (probed once)


class ChunkReader:
    """Stored chunks of one asset: ``preadv`` on local shard files, fsspec range requests for URLs."""

    def __init__(self, asset: MemoryAsset) -> None:
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
            i = int(self._ranks[s][i])
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
        kern = kernels(io=True)
        if kern is not None:
            kern.read_rows(fds, offs, out, rows.astype(np.int64, copy=False), self.geom.crc, flags, ok)
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

    def _read_py(self, fds: np.ndarray, offs: np.ndarray, out: np.ndarray, rows: np.ndarray, flags: int,
                 ok: np.ndarray) -> None:
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

    def _probe(self, chunks: np.ndarray, fds: np.ndarray, offs: np.ndarray, out: np.ndarray, rows: np.ndarray,
               ok: np.ndarray) -> None:
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
        kern = kernels(io=True)
        if kern is not None:
            kern.read_rows(fds[:1], offs[:1], out, rows[j].astype(np.int64), self.geom.crc, _NOWAIT, again)
        else:
            self._read_py(fds[:1], offs[:1], out, rows[:1], _NOWAIT, again)
        self.nowait = _NOWAIT_BY_DEVICE[dev] = bool(again[0])
        ok[0] = True

    def _fds_of(self, shard: np.ndarray) -> np.ndarray:
        tab = self._fdtab
        fds: np.ndarray = tab[shard]
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
                    assert self.local is not None  # shard files are opened for local assets only
                    try:
                        fd = os.open(self.local / key, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
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


def _close_fds(tab: np.ndarray) -> None:
    for fd in tab[tab >= 0].tolist():
        try:
            os.close(fd)
        except OSError:
            pass
    tab[:] = -1


__all__ = ["ChunkReader"]


def resident_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes of the file ``path`` held in the OS page cache now (``mincore`` over a read-only mapping): pages
    every process reading the file with ``pread`` shares. 0 for an empty file; -1 where mincore is unavailable."""
    import ctypes
    import mmap

    size = os.path.getsize(path)
    if size == 0:
        return 0
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        c_mmap, c_mincore, c_munmap = libc.mmap, libc.mincore, libc.munmap
    except (OSError, AttributeError):
        return -1
    c_mmap.restype = ctypes.c_void_p
    c_mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    c_mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    c_munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    vec = np.zeros((size + mmap.PAGESIZE - 1) // mmap.PAGESIZE, dtype=np.uint8)
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = c_mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            return -1
        try:
            if c_mincore(addr, size, vec.ctypes.data) != 0:
                return -1
        finally:
            c_munmap(addr, size)
    finally:
        os.close(fd)
    return int(np.count_nonzero(vec & 1)) * mmap.PAGESIZE
