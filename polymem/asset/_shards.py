"""Shard files of the ``pages`` array, written and read directly (docs/asset-format.md §4).

A shard is ``chunks ‖ index ‖ crc32c``: the present chunks back to back — from format v2 each stored chunk is
``chunk bytes ‖ crc32c(chunk bytes)`` (zarr's ``crc32c`` codec inside the sharding codec) — then
``chunks_per_shard`` little-endian uint64 pairs (offset, nbytes) — ``(2^64-1, 2^64-1)`` for chunks past the
array's end — then the crc32c of the index. Apart from the 32-byte shard-id footer between the chunks and
the index (docs/asset-format.md §13; no index entry points into it), this is byte for byte what zarr-python's
``sharding_indexed`` codec writes with a ``[bytes, crc32c]`` chain and ``write_empty_chunks=True``
(tests/asset/test_asset_zarr.py proves it), but ~an order of magnitude faster.

:class:`polymem.asset._reader.FastReader` reads chunks (``pread``, or SIGBUS-guarded maps: a shard truncated or
rewritten under a reader gives a FormatError, not a signal) and checks every chunk's crc32c on every read; its
batches go through the numba kernels here, which call ``preadv`` and the crc32c library directly (cached on
disk: :mod:`._ckern`). Not here: metadata (``_format``), zarr-python (``_zarr``), the commit protocol
(``_commit``, ``_write``).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Callable

import google_crc32c
import numpy as np
import numpy.typing as npt

from numba import njit

from polymem.asset import _ckern as _c, _fs
from polymem.asset._format import CRC_BYTES, FOOTER_BYTES, SHARD_ID_TAG, Geometry
from polymem.errors import FormatError, MissingError

_EMPTY = np.uint64(0xFFFFFFFFFFFFFFFF)
# The kernels' annotations are for readers and mypy only: numba types each call from its arguments.
I64s = npt.NDArray[np.int64]
U8s = npt.NDArray[np.uint8]
U32s = npt.NDArray[np.uint32]
CRC_RESIDUE = 0x48674BC7  # crc32c(x ‖ crc32c(x) as little-endian uint32) for every x
try:  # the C implementation (hardware crc32 instructions): takes bytes only
    from google_crc32c._crc32c import value as _crc_c
except ImportError:  # pragma: no cover - pure-python fallback of google_crc32c
    _crc_c = google_crc32c.value
_crc_bytes: Callable[[bytes], int] = _crc_c


def _buffer_crc() -> Callable[[bytes | bytearray], int] | None:
    """crc32c_rs's crc32c (optional, extra "fast"): takes any buffer, AVX-512 VPCLMULQDQ / SSE4.2 chosen at run
    time; ~2.5x faster on 4 KiB than google-crc32c here. None without it: google-crc32c's C code takes bytes
    only, so callers copy first."""
    try:
        from crc32c_rs import crc32c
    except ImportError:
        return None
    if crc32c(b"123456789") != 0xE3069283 or crc32c(bytearray(b"123456789")) != 0xE3069283:
        return None  # pragma: no cover - a wrong check value
    return crc32c


_crc_buffer = _buffer_crc()


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
def _read_chunks(fds: I64s, bases: I64s, shard: I64s, off: I64s, out: U8s, crcs: U32s, crc: bool) -> int:  # pragma: no cover
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
def _read_rows(fds: I64s, bases: I64s, loc: I64s, rows: I64s, out: U8s, KS: int, ppc: int, page_bytes: int, cps: int,
               stride: int, crc: bool) -> int:  # pragma: no cover - compiled
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
def _crc_rows(chunks: U8s, out: U32s) -> None:  # pragma: no cover - compiled
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
        chunks: np.ndarray = np.zeros((n, cb), np.uint8)
    else:
        chunks = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        if chunks.nbytes != n * cb:
            raise ValueError(f"shard {s}: got {chunks.nbytes} data bytes, expected {n * cb}")
        chunks = chunks.reshape(n, cb)
    if not geom.crc:
        return chunks.data.cast("B")
    out = np.empty((n, geom.stride), np.uint8)
    out[:, :cb] = chunks
    if data is None:
        out[:, cb:] = np.frombuffer(crc32c(bytes(cb)).to_bytes(4, "little"), np.uint8)
    else:
        out[:, cb:] = chunk_crcs(chunks).astype("<u4").view(np.uint8).reshape(n, CRC_BYTES)
    return out.data.cast("B")


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
    chunks: np.ndarray = st[:, : geom.chunk_bytes].copy()
    return chunks


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
