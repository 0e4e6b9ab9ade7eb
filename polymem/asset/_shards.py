"""Shard files of the ``pages`` array, written and read directly (docs/asset-format.md §4).

A shard is ``chunks ‖ index ‖ crc32c``: the present chunks back to back — from format v2 each stored chunk is
``chunk bytes ‖ crc32c(chunk bytes)`` (zarr's ``crc32c`` codec inside the sharding codec) — then
``chunks_per_shard`` little-endian uint64 pairs (offset, nbytes) — ``(2^64-1, 2^64-1)`` for chunks past the
array's end — then the crc32c of the index. Apart from the 32-byte shard-id footer between the chunks and
the index (docs/asset-format.md §13; no index entry points into it), this is byte for byte what zarr-python's
``sharding_indexed`` codec writes with a ``[bytes, crc32c]`` chain and ``write_empty_chunks=True``
(tests/test_asset_zarr.py proves it), but ~an order of magnitude faster.

:class:`FastReader` reads chunks with ``pread`` (never a memory map: a shard truncated or rewritten under a
reader gives a FormatError, not SIGBUS) and checks every chunk's crc32c on every read. Batches go through a
small numba kernel that calls ``preadv`` and the crc32c library directly (cached on disk: :mod:`._ckern`). Not here: metadata (``_format``),
zarr-python (``_zarr``), the commit protocol (``core``).
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np

from numba import njit

from polymem.asset import _ckern as _c, _fs
from polymem.asset._format import CRC_BYTES, FOOTER_BYTES, SHARD_ID_TAG, Geometry
from polymem.errors import FormatError, MissingError

_EMPTY = np.uint64(0xFFFFFFFFFFFFFFFF)
CRC_RESIDUE = 0x48674BC7  # crc32c(x ‖ crc32c(x) as little-endian uint32) for every x
try:  # the C implementation (hardware crc32 instructions): takes bytes only
    from google_crc32c._crc32c import value as _crc_bytes
except ImportError:  # pragma: no cover - pure-python fallback of google_crc32c
    _crc_bytes = google_crc32c.value


try:  # optional (extra "fast"): takes any buffer, AVX-512 VPCLMULQDQ / SSE4.2 chosen at run time; ~2.5x faster
    from crc32c_rs import crc32c as _crc_buffer  # on 4 KiB than google-crc32c here

    if _crc_buffer(b"123456789") != 0xE3069283 or _crc_buffer(bytearray(b"123456789")) != 0xE3069283:
        raise ImportError("crc32c_rs gives a wrong check value")  # pragma: no cover
except ImportError:  # google-crc32c's C code takes bytes only: copy first
    _crc_buffer = None


def crc32c(data: Any) -> int:
    return int(_crc_bytes(data if isinstance(data, bytes) else bytes(data)))


def chunk_crcs(chunks: np.ndarray) -> np.ndarray:
    """uint8 chunks [n, chunk_bytes] -> their crc32c, uint32 [n]."""
    kern = _kernels()
    out = np.empty(chunks.shape[0], np.uint32)
    c = np.ascontiguousarray(chunks)
    if kern is not None and c.shape[0] > 4:
        kern[1](c, out)
    else:
        for i in range(c.shape[0]):
            out[i] = crc32c(c[i].tobytes())
    return out


# ------------------------------------------------------------------------------------------ numba kernels
_KERNELS: Any = None


def _kernels() -> Any:
    """(read_chunks, crc rows, read_rows kernels) — cached numba code calling libc and google-crc32c's C code
    (:mod:`._ckern`) — or None where numba/libcrc32c lack."""
    global _KERNELS
    if _KERNELS is not None:
        return _KERNELS or None
    try:
        if not _c.link():
            raise RuntimeError("no C crc32c")
        out = np.empty(1, np.uint32)
        _crc_rows(np.zeros((1, 8), np.uint8), out)  # compile or load now, so that a missing symbol shows here
        if out[0] != np.uint32(_crc_bytes(bytes(8))):  # pragma: no cover - a wrongly linked crc
            raise RuntimeError("crc32c_value gives a wrong value")
        _KERNELS = (_read_chunks, _crc_rows, _read_rows)
    except Exception:  # noqa: BLE001 - any missing piece: the pure-Python loop does the same work
        _KERNELS = ()
    return _KERNELS or None


@njit(cache=True, nogil=True)
def _read_chunks(fds, bases, shard, off, out, crcs, crc):  # pragma: no cover - compiled
    """Copy chunk i (shard[i], byte offset off[i]) into out[i] (+ its crc into crcs[i]) and check the copy:
    from the shard's map where bases[shard] != 0 (v2 only), else by preadv. Returns -1 if all are good,
    else the first failing i."""
    cb = out.shape[1]
    iov = np.empty(4, np.uint64)
    base, cbase = out.ctypes.data, crcs.ctypes.data
    for i in range(out.shape[0]):
        src = bases[shard[i]]
        if src != 0:
            _c.memcpy(base + i * cb, src + off[i], cb)
            _c.memcpy(cbase + 4 * i, src + off[i] + cb, 4)
        else:
            iov[0] = base + i * cb
            iov[1] = cb
            iov[2] = cbase + 4 * i
            iov[3] = 4
            want = cb + 4 if crc else cb
            if _c.preadv(np.int32(fds[shard[i]]), iov.ctypes.data, np.int32(2 if crc else 1), off[i]) != want:
                return i
        if crc and _c.crc32c_value(base + i * cb, cb) != crcs[i]:
            return i
    return -1


@njit(cache=True, nogil=True)
def _read_rows(fds, bases, loc, rows, out, KS, ppc, page_bytes, cps, stride, crc):  # pragma: no cover
    """Stored rows: out[k] = row rows[k] (rb = out.shape[1] bytes), each read out of a verified copy of its
    chunk (chunk ‖ crc32c copied from the map or pread into a scratch buffer, crc residue checked; a run of
    rows in one chunk — the K heads of an n-gram — copies and checks it once). -1, or the first failing k."""
    rb = out.shape[1]
    scratch = np.empty(stride, np.uint8)
    sp, obase = scratch.ctypes.data, out.ctypes.data
    last = -1
    for k in range(rows.shape[0]):
        r = rows[k]
        page = r // KS
        c = page // ppc
        if c != last:
            sh = c // cps
            off = (c - sh * cps) * stride
            src = bases[loc[sh]]
            if src != 0:
                _c.memcpy(sp, src + off, stride)
            elif _c.pread(np.int32(fds[loc[sh]]), sp, stride, off) != stride:
                return k
            if crc and _c.crc32c_value(sp, stride) != CRC_RESIDUE:
                return k
            last = c
        _c.memcpy(obase + k * rb, sp + (page - c * ppc) * page_bytes + (r - page * KS) * rb, rb)
    return -1


@njit(cache=True, nogil=True)
def _crc_rows(chunks, out):  # pragma: no cover - compiled
    cb = chunks.shape[1]
    base = chunks.ctypes.data
    for i in range(chunks.shape[0]):
        out[i] = _c.crc32c_value(base + i * cb, cb)


# ------------------------------------------------------------------------------------------ index, writes
def shard_index(geom: Geometry, s: int) -> bytes:
    """Index bytes + crc32c of shard ``s`` (offset = i·stride for present chunks)."""
    n, cps, st = geom.chunks_in_shard(s), geom.chunks_per_shard, geom.stride
    idx = np.full((cps, 2), _EMPTY, dtype="<u8")
    idx[:n, 0] = np.arange(n, dtype=np.uint64) * np.uint64(st)
    idx[:n, 1] = st
    raw = idx.tobytes()
    return raw + crc32c(raw).to_bytes(4, "little")


def index_of_tail(geom: Geometry, s: int, tail: bytes, ids: Any, where: str) -> bytes:
    """The index bytes of ``tail`` (the last ``geom.tail_bytes`` of shard s), after checking that its footer holds
    the shard id ``ids`` (checksums.shard_ids) names for it. One read at open binds the shard to the header."""
    if not geom.shard_id:
        return tail
    check_shard_id(geom, s, tail[:FOOTER_BYTES], ids[geom.shard_key(s)], where)
    return tail[FOOTER_BYTES:]


def check_shard_index(geom: Geometry, s: int, tail: bytes, where: str) -> None:
    """Raise FormatError unless ``tail`` (the last 16·cps+4 bytes of shard s) is exactly the expected index."""
    key = geom.shard_key(s)
    raw, crc = tail[:-4], int.from_bytes(tail[-4:], "little")
    if crc32c(raw) != crc:
        raise FormatError(f"{where}: shard {key!r} has a corrupt index (crc32c mismatch); restore or re-create the asset")
    if tail != shard_index(geom, s):
        got = np.frombuffer(raw, dtype="<u8").reshape(-1, 2)
        want = np.frombuffer(shard_index(geom, s)[:-4], dtype="<u8").reshape(-1, 2)
        i = int(np.nonzero((got != want).any(axis=1))[0][0])
        raise FormatError(
            f"{where}: shard {key!r} index entry {i} is (offset {got[i, 0]}, nbytes {got[i, 1]}), expected "
            f"({want[i, 0]}, {want[i, 1]}): the shard was not written with the one-chunk-per-page "
            "geometry polymem reads; re-create it with `polymem quantize` or MemoryAsset.from_array"
        )


def shard_bytes(geom: Geometry, s: int, data: np.ndarray | None) -> bytes | memoryview:
    """The stored chunk region of shard ``s`` (without the index): data = present chunks (any dtype) or None
    (zeros)."""
    n, cb = geom.chunks_in_shard(s), geom.chunk_bytes
    if data is None:
        chunks = np.zeros((n, cb), np.uint8)
    else:
        chunks = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        if chunks.nbytes != n * cb:
            raise ValueError(f"shard {s}: got {chunks.nbytes} data bytes, expected {n * cb}")
        chunks = chunks.reshape(n, cb)
    if not geom.crc:
        return memoryview(chunks).cast("B")
    out = np.empty((n, geom.stride), np.uint8)
    out[:, :cb] = chunks
    if data is None:
        out[:, cb:] = np.frombuffer(crc32c(bytes(cb)).to_bytes(4, "little"), np.uint8)
    else:
        out[:, cb:] = chunk_crcs(chunks).astype("<u4").view(np.uint8).reshape(n, CRC_BYTES)
    return memoryview(out).cast("B")


def write_shard(path: Path, geom: Geometry, s: int, data: np.ndarray | None) -> str:
    """Write shard ``s`` (``data`` = the present chunks, any dtype, C-contiguous; None = all zeros) and fsync.

    Returns the sha256 of the file. Every write goes through :mod:`polymem.asset._fs` (fault injection).
    """
    body = shard_bytes(geom, s, data)
    tail = shard_footer(geom, body) + shard_index(geom, s)
    h = hashlib.sha256(body)
    h.update(tail)
    with _fs.open_write(path) as f:
        _fs.write(f, body)
        _fs.write(f, tail)
        _fs.fsync(f)
    return h.hexdigest()


def shard_footer(geom: Geometry, body: Any) -> bytes:
    """The shard-id footer (docs/asset-format.md §13) of a shard whose stored chunks are ``body``; b"" without ids."""
    if not geom.shard_id:
        return b""
    return SHARD_ID_TAG + hashlib.sha256(body).digest()[:16]


def read_shard_ids(root: Path, geom: Geometry, keys: Any, suffix: str = "") -> dict[str, str]:
    """The shard id (hex) in the footer of each shard file ``root/key+suffix`` just written (one small read each)."""
    out = {}
    for key in keys:
        with open(root / (key + suffix), "rb") as f:
            f.seek(-geom.tail_bytes, os.SEEK_END)
            out[key] = f.read(FOOTER_BYTES)[len(SHARD_ID_TAG):].hex()
    return out


def check_shard_id(geom: Geometry, s: int, footer: bytes, want: str, where: str) -> None:
    """Raise FormatError unless ``footer`` (the bytes before shard s's index) names shard id ``want``."""
    key = geom.shard_key(s)
    if footer[: len(SHARD_ID_TAG)] != SHARD_ID_TAG:
        raise FormatError(f"{where}: shard {key!r} has no shard-id footer although the header gives it one (a shard "
                          "written by another tool, or overwritten); restore the asset")
    got = footer[len(SHARD_ID_TAG):].hex()
    if got != want:
        raise FormatError(
            f"{where}: shard {key!r} is from another write of the asset (shard id {got[:12]}…, the header names "
            f"{want[:12]}…): restored from an older backup or copied from another asset, its pages are not the ones "
            "zarr.json describes; restore this shard together with its zarr.json (or the whole asset)"
        )


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def read_shard_checked(path: Path, geom: Geometry, s: int, sha256: str, where: str) -> np.ndarray:
    """The present chunks of shard ``s`` as uint8 [n, chunk_bytes] (a copy), after checking the whole file
    against its recorded sha256 and every chunk against its crc32c. Writers rebuild shards from this."""
    key = geom.shard_key(s)
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise MissingError(f"{where}: shard {key!r} is missing; restore the asset (`polymem verify --repair` "
                           "cleans up interrupted writes)", path) from None
    if len(data) != geom.shard_size(s):
        raise FormatError(f"{where}: shard {key!r} is {len(data)} bytes, expected {geom.shard_size(s)} (truncated or "
                          "overwritten); restore the asset")
    n = geom.chunks_in_shard(s)
    st = np.frombuffer(data, np.uint8, count=n * geom.stride).reshape(n, geom.stride)
    if geom.crc:
        crcs = chunk_crcs(st[:, : geom.chunk_bytes])
        bad = np.flatnonzero(crcs != st[:, geom.chunk_bytes :].copy().view("<u4").reshape(-1))
        if bad.size:
            raise corrupt_chunk(geom, s, int(bad[0]), where)
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        raise FormatError(
            f"{where}: shard {key!r} checksum mismatch (stored {sha256[:12]}…, computed {got[:12]}…): its bytes "
            "changed, so polymem will not build on it; restore the asset (or rewrite every page of this shard "
            "from a good copy)"
        )
    return st[:, : geom.chunk_bytes].copy()


def pages_of_chunk(geom: Geometry, c: int) -> str:
    a = c * geom.pages_per_chunk
    b = min(geom.pages, a + geom.pages_per_chunk) - 1
    return f"page {a}" if a == b else f"pages {a}..{b} (block {c})"


def corrupt_chunk(geom: Geometry, s: int, i: int, where: str) -> FormatError:
    c = s * geom.chunks_per_shard + i
    return FormatError(
        f"{where}: shard {geom.shard_key(s)!r} {pages_of_chunk(geom, c)} fails its crc32c check: the stored bytes "
        f"changed; run `polymem verify {where}` and restore the asset"
    )


def bad_scale(geom: Geometry, row: int, value: float, where: str) -> FormatError:
    """The error for table row ``row`` of an nf4 asset whose stored scale ``value`` is not finite and >= 0, or
    of an fp8 asset whose row decodes to ``value`` (NaN or ±inf)."""
    page = row // geom.rows_per_page
    s, _ = geom.shard_of_page(page)
    if geom.dtype != "nf4":
        return FormatError(
            f"{where}: shard {geom.shard_key(s)!r} page {page} (row {row}) decodes to {value!r} ({geom.dtype}: a NaN "
            "code or a scale no writer makes), so the bytes are bad although their checksums match; restore the asset")
    return FormatError(
        f"{where}: shard {geom.shard_key(s)!r} page {page} (row {row}) has nf4 scale {value!r}: a scale is the row's "
        f"absolute maximum, a finite number >= 0, so the bytes are bad although their checksums match (written by a "
        "faulty tool, or edited); restore the asset"
    )


# ------------------------------------------------------------------------------------------ reads
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
            b = m.mv[a : a + self._stride].tobytes()
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
            return np.ndarray(self._page_shape, self._dtype, bytearray(self._stored(s, i)))
        c, j = divmod(p, g.pages_per_chunk)
        s, i = divmod(c, self._cps)
        b = self._stored(s, i)
        return np.frombuffer(b, np.uint8, g.page_bytes, j * g.page_bytes).reshape(self._page_shape).copy()

    def lean_reader(self) -> Any:
        """``read_page`` specialised for this geometry: a closure over locals (the single-page hot path)."""
        g = self._geom
        if g.pages_per_chunk != 1 or g.packed or not self._mappable:
            return self.read_page
        maps, st, cps, stored = self._maps, self._stride, self._cps, self._stored
        crc, res, nd, shape, dt = _crc_bytes, CRC_RESIDUE, np.ndarray, self._page_shape, self._dtype
        if not self._map_ok:  # pread only (format v1, POLYMEM_NO_MMAP, ...): one pread, check, one copy
            files, opener, check, pread, want_crc = self._files, self._open, self._check, os.pread, self._crc

            def read_page(p: int) -> np.ndarray:
                s, i = divmod(p, cps)
                f = files[s] or opener(s)
                b = pread(f.fd, st, i * st)
                if len(b) != st or (want_crc and crc(b) != res):
                    check(s, i, b)
                return nd(shape, dt, bytearray(b))

            return read_page
        if _crc_buffer is not None:  # one copy (map -> the result's own buffer), then check that copy
            crcb = _crc_buffer

            def read_page(p: int) -> np.ndarray:
                s, i = divmod(p, cps)
                m = maps[s]
                if m:
                    a = i * st
                    b = bytearray(m.mv[a : a + st])
                    if crcb(b) == res:
                        return nd(shape, dt, b)
                return nd(shape, dt, bytearray(stored(s, i)))

            return read_page

        def read_page(p: int) -> np.ndarray:
            s, i = divmod(p, cps)
            m = maps[s]
            if m:
                a = i * st
                b = m.mv[a : a + st].tobytes()
                if crc(b) == res:
                    return nd(shape, dt, bytearray(b))
            return nd(shape, dt, bytearray(stored(s, i)))

        return read_page

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
        return out.view(self._dtype).reshape((ids.shape[0],) + self._chunk_shape)

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
            return buf.view(self._dtype).reshape(chunks.shape[0], KS, g.head_dim)[inv, rows % KS]
        rb = g.page_bytes // KS
        off = (page % ppc) * g.page_bytes + (rows % KS) * rb
        return buf[inv[:, None], off[:, None] + np.arange(rb)]

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
