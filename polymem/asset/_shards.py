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

    def read_chunks(self, ids: np.ndarray) -> np.ndarray:
        """int64 chunk ids [n] (in range) -> stored-dtype chunks [n, *chunk_shape[1:]] (a copy)."""
        cps = self._geom.chunks_per_shard
        if ids.shape[0] == 1:  # lean path for single-page reads
            c = int(ids[0])
            return self._view(c // cps)[c % cps : c % cps + 1].copy()
        if self._geom.num_shards == 1:
            return self._view(0)[ids]
        out = np.empty((ids.shape[0],) + self._chunk_shape, dtype=self._dtype)
        if not ids.shape[0]:
            return out
        shard = ids // cps
        order = np.argsort(shard, kind="stable")
        bounds = np.flatnonzero(np.diff(shard[order])) + 1
        for grp in np.split(order, bounds):
            s = int(shard[grp[0]])
            out[grp] = self._view(s)[ids[grp] - s * cps]
        return out

    def invalidate(self, shards: "list[int] | None" = None) -> None:
        """Forget mappings (after shard files were replaced), so the next read maps the new files."""
        for s in range(self._geom.num_shards) if shards is None else shards:
            self._views[s] = None
            self._maps[s] = None  # the mmap closes when the last view of it is gone

    def close(self) -> None:
        self.invalidate()
