"""Row statistics: the optional ``counts`` array of an asset group (docs/asset-format.md §11).

``counts`` is a zarr v3 array ``uint32 [num_rows]`` (how many optimizer updates each row received while the
table was trained; merged and subset tables carry combined counts), chunked by ``chunk_rows`` rows with a
little-endian ``bytes`` codec only (no compression, no sharding), every chunk written (the last one padded with
zeros to a full chunk, as zarr stores edge chunks). Its metadata and chunk files are covered by
``checksums.row_counts`` (file key → sha256), which ``verify`` checks like the table's shards.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from polymem.asset._format import COUNTS_ARRAY, COUNTS_CHUNK_ROWS, MAX_JSON_BYTES, check_counts_field
from polymem.errors import FormatError, MissingError, PolymemError


def counts_field(num_rows: int, counts: np.ndarray) -> dict[str, Any]:
    c = min(COUNTS_CHUNK_ROWS, num_rows)
    return {"array": COUNTS_ARRAY, "data_type": "uint32", "shape": [num_rows], "chunk_rows": c,
            "total": int(counts.sum(dtype=np.int64)), "rows_nonzero": int(np.count_nonzero(counts))}


def check_counts_checksums(f: Mapping[str, Any], got: Any, where: str) -> None:
    """``checksums.row_counts`` must list exactly counts/zarr.json and every chunk file. Its length is compared
    first, so a header asking for billions of chunks is refused before one key is made."""
    n = -(-f["shape"][0] // f["chunk_rows"])
    if not isinstance(got, Mapping) or len(got) != n + 1:
        size = len(got) if isinstance(got, Mapping) else 0
        raise FormatError(f"{where}: field 'checksums.row_counts' lists {size:,} files; the counts array "
                          f"({f['shape'][0]:,} rows in chunks of {f['chunk_rows']:,}) has {n + 1:,}; the asset was edited")
    want = {f"{COUNTS_ARRAY}/zarr.json", *chunk_keys(f)}
    if set(got) != want:
        raise FormatError(f"{where}: field 'checksums.row_counts' must list exactly {sorted(want)[:4]}…; the asset was edited")


def check_counts(counts: Any, num_rows: int) -> np.ndarray:
    c = np.asarray(counts)
    if c.shape != (num_rows,):
        raise PolymemError(f"row counts have shape {c.shape}; the table has {num_rows} rows, so pass [{num_rows}]")
    if c.size and (not np.issubdtype(c.dtype, np.integer) and not np.issubdtype(c.dtype, np.floating)):
        raise PolymemError(f"row counts must be integers, got dtype {c.dtype}")
    if c.size and (c.min() < 0 or c.max() > np.iinfo(np.uint32).max):
        raise PolymemError(f"row counts must be in [0, 2^32); got {c.min()}..{c.max()}")
    return np.ascontiguousarray(c, dtype=np.uint32)


def chunk_keys(f: Mapping[str, Any]) -> list[str]:
    n = math.ceil(f["shape"][0] / f["chunk_rows"])
    return [f"{COUNTS_ARRAY}/c/{i}" for i in range(n)]


def write_counts(root: Path, counts: np.ndarray) -> tuple[dict[str, Any], dict[str, str]]:
    """Write ``root/counts`` (metadata via zarr-python, chunks directly). Returns (header field, checksums)."""
    import zarr
    from zarr.codecs import BytesCodec

    from polymem.asset._shards import file_sha256  # numba: loaded on first write

    R = int(counts.shape[0])
    f = counts_field(R, counts)
    c = f["chunk_rows"]
    group = zarr.open_group(str(root), mode="a", zarr_format=3)
    group.create_array(COUNTS_ARRAY, shape=(R,), dtype="uint32", chunks=(c,), compressors=None, filters=None,
                       serializer=BytesCodec(endian="little"), fill_value=0, overwrite=True)
    sums = {f"{COUNTS_ARRAY}/zarr.json": file_sha256(root / COUNTS_ARRAY / "zarr.json")}
    (root / COUNTS_ARRAY / "c").mkdir(parents=True, exist_ok=True)
    for i, key in enumerate(chunk_keys(f)):
        part = np.zeros(c, dtype="<u4")
        seg = counts[i * c : (i + 1) * c]
        part[: seg.shape[0]] = seg
        with open(root / key, "wb") as fh:
            fh.write(part.tobytes())
            fh.flush()
            import os

            os.fsync(fh.fileno())
        sums[key] = file_sha256(root / key)
    return f, sums


def check_counts_files(raw: Any, f: Mapping[str, Any], where: str) -> None:
    """Every file of the counts array exists with a size it may have (stat, nothing read): each chunk exactly
    4·chunk_rows bytes, the metadata at most 16 MiB. A chunk replaced by a huge (sparse) file is never read."""
    for key in [f"{COUNTS_ARRAY}/zarr.json", *chunk_keys(f)]:
        if not raw.exists(key):
            raise MissingError(f"{where}: row counts file {key!r} is missing; restore the asset")
        size, meta = raw.size(key), key.endswith("zarr.json")
        want = MAX_JSON_BYTES if meta else 4 * f["chunk_rows"]
        if size > want or (not meta and size != want):
            raise FormatError(f"{where}: row counts file {key!r} is {size:,} bytes, expected {'at most ' * meta}"
                              f"{want:,}; restore the asset")


def read_counts(raw: Any, f: Mapping[str, Any], where: str) -> np.ndarray:
    """The counts array (uint32 [num_rows]) through ``raw`` (local or fsspec). Every chunk file's size is checked
    (stat) before anything is allocated or read: a chunk replaced by a huge (sparse) file is never read."""
    R, c = f["shape"][0], f["chunk_rows"]
    check_counts_files(raw, f, where)
    out = np.empty(R, dtype=np.uint32)
    for i, key in enumerate(chunk_keys(f)):
        data = raw.cat(key)
        if len(data) != 4 * c:  # changed since the stat
            raise FormatError(f"{where}: row counts chunk {key!r} is {len(data)} bytes, expected {4 * c}; restore the asset")
        seg = np.frombuffer(data, dtype="<u4")
        n = min(c, R - i * c)
        out[i * c : i * c + n] = seg[:n]
    return out


__all__ = ["COUNTS_ARRAY", "check_counts", "check_counts_checksums", "check_counts_field", "check_counts_files",
           "chunk_keys", "read_counts", "write_counts"]
