"""Shard files of the ``pages`` array, written and read directly (docs/asset-format.md §4).

A shard is ``data ‖ index ‖ crc32c``: present chunks back to back, then ``chunks_per_shard`` little-endian
uint64 pairs (offset, nbytes) — ``(2^64-1, 2^64-1)`` for chunks past the array's end — then the crc32c of the
index. This is byte for byte what zarr-python's ``sharding_indexed`` codec writes with a ``bytes``-only chain
and ``write_empty_chunks=True`` (tests/test_asset_zarr.py proves it), but ~an order of magnitude faster.

:class:`FastReader` memory-maps shard files with ``MADV_RANDOM`` after the geometry was checked once.
Not here: metadata (``_format``), zarr-python (``_zarr``).
"""

from __future__ import annotations

import hashlib
import mmap
import os
from pathlib import Path

import google_crc32c
import numpy as np

from polymem.asset._format import Geometry
from polymem.errors import FormatError

_EMPTY = np.uint64(0xFFFFFFFFFFFFFFFF)
_ZEROS = bytes(1 << 20)


def shard_index(geom: Geometry, s: int) -> bytes:
    """Index bytes + crc32c of shard ``s`` (offset = i·chunk_bytes for present chunks)."""
    n, cps, cb = geom.chunks_in_shard(s), geom.chunks_per_shard, geom.chunk_bytes
    idx = np.full((cps, 2), _EMPTY, dtype="<u8")
    idx[:n, 0] = np.arange(n, dtype=np.uint64) * np.uint64(cb)
    idx[:n, 1] = cb
    raw = idx.tobytes()
    return raw + int(google_crc32c.value(raw)).to_bytes(4, "little")


def check_shard_index(geom: Geometry, s: int, tail: bytes, where: str) -> None:
    """Raise FormatError unless ``tail`` (the last 16·cps+4 bytes of shard s) is exactly the expected index."""
    key = geom.shard_key(s)
    raw, crc = tail[:-4], int.from_bytes(tail[-4:], "little")
    if int(google_crc32c.value(raw)) != crc:
        raise FormatError(f"{where}: shard {key!r} has a corrupt index (crc32c mismatch); restore or re-create the asset")
    if tail != shard_index(geom, s):
        got = np.frombuffer(raw, dtype="<u8").reshape(-1, 2)
        want = np.frombuffer(shard_index(geom, s)[:-4], dtype="<u8").reshape(-1, 2)
        i = int(np.nonzero((got != want).any(axis=1))[0][0])
        raise FormatError(
            f"{where}: shard {key!r} index entry {i} is (offset {got[i, 0]}, nbytes {got[i, 1]}), expected "
            f"({want[i, 0]}, {want[i, 1]}): the shard was not written with the bytes-only, one-chunk-per-page "
            "geometry polymem reads; re-create it with `polymem quantize` or MemoryAsset.from_array"
        )


def write_shard(path: Path, geom: Geometry, s: int, data: np.ndarray | None, *, hash_zeros: bool = True) -> str:
    """Write shard ``s`` (``data`` = the present chunks, any dtype, C-contiguous; None = all zeros) and fsync.

    Returns the sha256 of the file ("" for zeros with ``hash_zeros=False``). Zeros are written as a sparse hole.
    """
    index = shard_index(geom, s)
    nbytes = geom.chunks_in_shard(s) * geom.chunk_bytes
    h = hashlib.sha256()
    with open(path, "wb") as f:
        if data is None:
            f.truncate(nbytes)
            f.seek(nbytes)
            left = nbytes if hash_zeros else 0
            while left:
                step = min(left, len(_ZEROS))
                h.update(_ZEROS[:step] if step < len(_ZEROS) else _ZEROS)
                left -= step
        else:
            buf = memoryview(np.ascontiguousarray(data)).cast("B")
            if buf.nbytes != nbytes:
                raise ValueError(f"shard {s}: got {buf.nbytes} data bytes, expected {nbytes}")
            f.write(buf)
            h.update(buf)
        f.write(index)
        h.update(index)
        f.flush()
        os.fsync(f.fileno())
    return h.hexdigest() if data is not None or hash_zeros else ""


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _groups(keys: np.ndarray) -> "list[tuple[int, np.ndarray]]":
    """[(key, positions of that key)] for an int array (one group when all keys are equal)."""
    if keys.shape[0] == 0:
        return []
    k0 = int(keys[0])
    if keys.shape[0] == 1 or (keys == k0).all():
        return [(k0, np.arange(keys.shape[0]))]
    order = np.argsort(keys, kind="stable")
    bounds = np.flatnonzero(np.diff(keys[order])) + 1
    return [(int(keys[grp[0]]), grp) for grp in np.split(order, bounds)]


class FastReader:
    """Chunks straight from local shard files: one mmap per shard (opened lazily, ``MADV_RANDOM``)."""

    def __init__(self, root: Path, geom: Geometry) -> None:
        self._root = root
        self._geom = geom
        self._views: list[np.ndarray | None] = [None] * geom.num_shards
        self._maps: list[mmap.mmap | None] = [None] * geom.num_shards
        self._dtype = np.dtype(geom.data_type).newbyteorder("<")
        self._chunk_shape = geom.chunk_shape[1:]

    def _view(self, s: int) -> np.ndarray:
        v = self._views[s]
        if v is None:
            g = self._geom
            with open(self._root / g.shard_key(s), "rb") as f:
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            if hasattr(mmap, "MADV_RANDOM"):
                mm.madvise(mmap.MADV_RANDOM)
            n = g.chunks_in_shard(s)
            v = np.frombuffer(mm, dtype=self._dtype, count=n * g.chunk_bytes // self._dtype.itemsize)
            v = v.reshape((n,) + self._chunk_shape)
            self._maps[s], self._views[s] = mm, v
        return v

    def read_page(self, p: int) -> np.ndarray:
        """One page as stored, [1, K*S, r] (float dtypes) or uint8 [1, page_bytes] (nf4); a copy. Lean on purpose."""
        g = self._geom
        c, j = divmod(p, g.pages_per_chunk)
        s, i = divmod(c, g.chunks_per_shard)
        v = self._views[s]
        if v is None:
            v = self._view(s)
        if g.pages_per_chunk == 1 and g.dtype != "nf4":
            return v[i : i + 1].copy()
        return v[i : i + 1, j * g.page_bytes : (j + 1) * g.page_bytes].copy()

    def read_chunks(self, ids: np.ndarray) -> np.ndarray:
        """int64 chunk ids [n] (in range) -> stored-dtype chunks [n, *chunk_shape[1:]] (a copy)."""
        cps = self._geom.chunks_per_shard
        if ids.shape[0] == 1:  # lean path for single-page reads
            c = int(ids[0])
            return self._view(c // cps)[c % cps : c % cps + 1].copy()
        if self._geom.num_shards == 1:
            return self._view(0)[ids]
        out = np.empty((ids.shape[0],) + self._chunk_shape, dtype=self._dtype)
        for s, sel in _groups(ids // cps):
            out[sel] = self._view(s)[ids[sel] - s * cps]
        return out

    def read_rows(self, rows: np.ndarray) -> np.ndarray:
        """int64 table rows [n] (in range) -> stored rows: [n, r] (float dtypes) or uint8 [n, r/2+2] (nf4).

        Gathers the rows straight out of the mapped shards, without copying whole pages.
        """
        g = self._geom
        KS, cps, ppc = g.rows_per_page, g.chunks_per_shard, g.pages_per_chunk
        if g.dtype != "nf4":
            out = np.empty((rows.shape[0], g.head_dim), dtype=self._dtype)
            rows_per_shard = cps * KS
            for s, sel in _groups(rows // rows_per_shard):
                v = self._view(s)
                out[sel] = v.reshape(-1, g.head_dim)[rows[sel] - s * rows_per_shard]
            return out
        rb = g.page_bytes // KS
        out = np.empty((rows.shape[0], rb), dtype=np.uint8)
        page = rows // KS
        chunk = page // ppc
        for s, sel in _groups(chunk // cps):
            flat = self._view(s).reshape(-1)
            off = (chunk[sel] - s * cps) * g.chunk_bytes + (page[sel] % ppc) * g.page_bytes + (rows[sel] % KS) * rb
            out[sel] = flat[off[:, None] + np.arange(rb)]
        return out

    def invalidate(self, shards: "list[int] | None" = None) -> None:
        """Forget mappings (after shard files were replaced), so the next read maps the new files."""
        for s in range(self._geom.num_shards) if shards is None else shards:
            self._views[s] = None
            self._maps[s] = None  # the mmap closes when the last view of it is gone

    def close(self) -> None:
        self.invalidate()
