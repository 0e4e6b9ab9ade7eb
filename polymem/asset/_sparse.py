"""Sparse assets: shards that store only some chunks (docs/asset-format.md §12), as written by ``subset``.

A sparse asset's header has ``sparse: {"pages_kept": n, ...}``. A shard stores its present chunks back to back
in chunk order; the index entry of a present chunk is ``(j·chunk_bytes, chunk_bytes)`` with j its rank among the
shard's present chunks, an absent chunk's entry is ``(2^64−1, 2^64−1)`` — zarr's "missing chunk", read as the
fill value 0. A shard with no present chunk is not written at all (no file, no ``checksums.shards`` entry), which
zarr also reads as zeros. zarr-python and tensorstore read sparse assets unchanged.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np

from polymem.asset._format import Geometry, Header
from polymem.asset._reader import FastReader
from polymem.asset._shards import index_of_tail
from polymem.errors import FormatError, MissingError

_EMPTY = np.uint64(0xFFFFFFFFFFFFFFFF)


def sparse_index(geom: Geometry, present: np.ndarray) -> bytes:
    """Index + crc32c of a shard whose chunks ``present`` (bool [chunks_in_shard]) are stored."""
    cps, st = geom.chunks_per_shard, geom.stride
    idx = np.full((cps, 2), _EMPTY, dtype="<u8")
    pos = np.flatnonzero(present)
    idx[pos, 0] = np.arange(pos.shape[0], dtype=np.uint64) * np.uint64(st)
    idx[pos, 1] = st
    raw = idx.tobytes()
    return raw + int(google_crc32c.value(raw)).to_bytes(4, "little")


def write_sparse_shard(path: Path, geom: Geometry, present: np.ndarray, chunks: np.ndarray) -> str:
    """Write the present chunks (stored dtype, [n_present, ...]; their crc32c is appended for v2) and the sparse
    index; fsync; return sha256."""
    from polymem.asset._shards import chunk_crcs, shard_footer

    k, cb = int(present.sum()), geom.chunk_bytes
    raw: np.ndarray = np.ascontiguousarray(chunks).view(np.uint8).reshape(-1)
    if raw.nbytes != k * cb:
        raise ValueError(f"{path}: {raw.nbytes} data bytes for {k} chunks of {cb}")
    raw = raw.reshape(k, cb)
    out = np.empty((k, geom.stride), np.uint8)
    out[:, :cb] = raw
    if geom.crc:
        out[:, cb:] = chunk_crcs(raw).astype("<u4").view(np.uint8).reshape(k, 4)
    buf = out.data.cast("B")
    index = shard_footer(geom, buf) + sparse_index(geom, present)  # (the shard-id footer, then the index)
    h = hashlib.sha256()
    from polymem.asset import _fs

    with _fs.open_write(path) as f:
        _fs.write(f, buf)
        _fs.write(f, index)
        _fs.fsync(f)
    h.update(buf)
    h.update(index)
    return h.hexdigest()


def parse_sparse_index(geom: Geometry, s: int, tail: bytes, size: int, where: str) -> np.ndarray:
    """Check a sparse shard's index; return int64 [chunks_in_shard]: rank of each stored chunk, -1 = absent."""
    key = geom.shard_key(s)
    raw, crc = tail[:-4], int.from_bytes(tail[-4:], "little")
    if int(google_crc32c.value(bytes(raw))) != crc:
        raise FormatError(f"{where}: shard {key!r} has a corrupt index (crc32c mismatch); restore or re-create the asset")
    idx = np.frombuffer(raw, dtype="<u8").reshape(-1, 2)
    n = geom.chunks_in_shard(s)
    present = idx[:, 0] != _EMPTY
    if present[n:].any():
        raise FormatError(f"{where}: shard {key!r} indexes a chunk beyond the array's end; restore the asset")
    want = np.frombuffer(sparse_index(geom, present)[:-4], dtype="<u8").reshape(-1, 2)
    if not np.array_equal(idx, want):
        i = int(np.nonzero((idx != want).any(axis=1))[0][0])
        raise FormatError(
            f"{where}: shard {key!r} index entry {i} is (offset {idx[i, 0]}, nbytes {idx[i, 1]}), expected "
            f"({want[i, 0]}, {want[i, 1]}): stored chunks must be back to back in chunk order; re-create the subset")
    k = int(present.sum())
    if size != k * geom.stride + geom.tail_bytes:
        raise FormatError(
            f"{where}: shard {key!r} is {size} bytes, expected {k * geom.stride + geom.tail_bytes} "
            f"for {k} stored chunks (truncated or overwritten); restore the asset")
    rank = np.full(n, -1, dtype=np.int64)
    rank[np.flatnonzero(present[:n])] = np.arange(k)
    return rank


def validate_sparse(raw: Any, header: Header, where: str) -> list[np.ndarray | None]:
    """Every shard listed in checksums.shards exists with a valid sparse index; unlisted shards do not exist."""
    geom = header.geometry
    listed = header.checksums["shards"]
    ranks: list[np.ndarray | None] = []
    for s in range(geom.num_shards):
        key = geom.shard_key(s)
        if key not in listed:
            if raw.exists(key):
                raise FormatError(f"{where}: shard {key!r} exists but is not in checksums.shards of this sparse asset; remove it or re-create the subset")
            ranks.append(None)
            continue
        if not raw.exists(key):
            raise MissingError(f"{where}: shard {key!r} is missing; restore it or re-create the asset")
        size = raw.size(key)
        if size < geom.tail_bytes:
            raise FormatError(f"{where}: shard {key!r} is {size} bytes, shorter than its index; restore the asset")
        index = index_of_tail(geom, s, raw.tail(key, geom.tail_bytes), header.checksums.get("shard_ids"), where)
        ranks.append(parse_sparse_index(geom, s, index, size, where))
    return ranks


class SparseReader(FastReader):
    """Chunks of a local sparse asset through :class:`FastReader`'s verified ``pread`` (each stored chunk's crc32c
    checked): a stored chunk is read at its rank in the shard, absent chunks (and absent shards) read as zeros."""

    _mappable = False  # chunks lie at their rank, not at i * stride: no maps, no lean closure

    def __init__(self, root: Path, geom: Geometry, ranks: list[np.ndarray | None], where: str | None = None) -> None:
        super().__init__(root, geom, where)
        self._ranks = ranks

    def read_chunks_into(self, ids: np.ndarray, out: np.ndarray) -> np.ndarray:
        n = ids.shape[0]
        if out.shape != (n, self._cb) or out.dtype != np.uint8 or not out.flags.c_contiguous:
            raise ValueError(f"out must be uint8 [{n}, {self._cb}] C-contiguous, got {out.dtype} {out.shape}")
        out[...] = 0
        cps = self._cps
        for k, c in enumerate(ids.tolist()):
            s, i = divmod(int(c), cps)
            rank = self._ranks[s]
            if rank is None or rank[i] < 0:
                continue
            out[k] = np.frombuffer(self._pread(s, int(rank[i])), np.uint8, self._cb)
        return out

    def read_page(self, p: int) -> np.ndarray:
        g = self._geom
        c, j = divmod(p, g.pages_per_chunk)
        buf = np.empty((1, self._cb), np.uint8)
        self.read_chunks_into(np.array([c], dtype=np.int64), buf)
        if g.pages_per_chunk == 1 and not g.packed:
            page: np.ndarray = buf.view(self._dtype).reshape(self._page_shape)
            return page
        page = buf[:, j * g.page_bytes : (j + 1) * g.page_bytes].reshape(self._page_shape).copy()
        return page


__all__ = ["SparseReader", "parse_sparse_index", "sparse_index", "validate_sparse", "write_sparse_shard"]


def write_sparse_asset(dest: Path, src: Any, chunk_keep: np.ndarray, provenance: dict[str, Any], *,
                       overwrite: bool = False, row_counts: np.ndarray | None = None) -> None:
    """Write a sparse copy of ``src`` (a MemoryAsset) holding the chunks ``chunk_keep`` (bool [num_chunks]); atomic."""
    from polymem.asset import _commit, _fs, _zarr
    from polymem.asset._format import canonical_json, header_body, sha256_hex
    from polymem.asset._shards import file_sha256, read_shard_ids
    from polymem.errors import PolymemError

    if dest.exists() and not overwrite:
        raise PolymemError(f"{str(dest)!r} already exists; pass overwrite=True (CLI: --overwrite) or pick another path")
    from polymem.asset._format import geometry

    g_src = src.geometry
    g = geometry(src.layout, src.dtype, g_src.chunks_per_shard,  # subsets are written in the current version
                 fp8_scale=g_src.fp8_scale)
    with _commit.building(dest) as tmp:
        _zarr.create_array_metadata(tmp, g)
        shards: dict[str, str] = {}
        cps = g.chunks_per_shard
        for s in range(g.num_shards):
            n = g.chunks_in_shard(s)
            present = np.zeros(cps, dtype=bool)
            present[:n] = chunk_keep[s * cps : s * cps + n]
            if not present.any():
                continue
            ids = s * cps + np.flatnonzero(present)
            chunks = src._reader.read_chunks(ids.astype(np.int64))  # verified stored chunks of the source
            key = g.shard_key(s)
            (tmp / key).parent.mkdir(parents=True, exist_ok=True)
            shards[key] = write_sparse_shard(tmp / key, g, present, chunks)
        h = src._header
        extras: dict[str, Any] = {"sparse": {"pages_kept": int(min(g.pages, int(chunk_keep.sum()) * g.pages_per_chunk)),
                                             "chunks_kept": int(chunk_keep.sum())}}
        count_sums: dict[str, str] = {}
        if row_counts is not None:
            from polymem.asset._counts import write_counts

            extras["row_counts"], count_sums = write_counts(tmp, row_counts)
        body = header_body(h.spec, h.layout, h.orders, h.dtype, g, provenance, extras)
        checksums: dict[str, Any] = {"algorithm": "sha256", "attributes": sha256_hex(canonical_json(body)),
                                     "array_metadata": file_sha256(tmp / "pages" / "zarr.json"), "shards": shards}
        if g.shard_id:
            checksums["shard_ids"] = read_shard_ids(tmp, g, shards)
        if count_sums:
            checksums["row_counts"] = count_sums
        _commit.write_group_json(tmp, body, checksums)
        for d in {tmp, tmp / "pages", *((tmp / k).parent for k in shards)}:
            _fs.fsync_dir(d)
        _commit.install(tmp, dest, overwrite=overwrite, lock_timeout=None)
