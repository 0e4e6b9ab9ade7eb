"""Element encodings of pages: float32 pages [n, K·S, r] <-> stored chunks (docs/asset-format.md §3-5).

float32 / float16 are stored as is; bfloat16 as uint16 (upper half of the float32 bits, round to nearest
even); the packed dtypes as rows of bytes packed into 4 KiB blocks of whole pages: nf4 (codes + float16 scale),
fp8-e4m3-e8m0 (r E4M3 bytes, then one E8M0 scale byte per 32 values: DeepSeek's 264-byte rows for r = 256),
fp8-e4m3 (r E4M3 bytes; the global scale is ``storage.fp8_scale`` in the header). No files here.
"""

from __future__ import annotations

import numpy as np

from polymem.asset import nf4
from polymem.asset._format import Geometry
from polymem.asset import fp8
from polymem.errors import PolymemError


class Fp8ValueError(nf4.ScaleError):
    """A stored fp8 row that decodes to NaN or ±inf (a NaN code, or a scale no writer makes); ``row`` is the
    flat index among the decoded rows, as for nf4 scales."""

    def __init__(self, row: int, value: float) -> None:
        PolymemError.__init__(self, f"fp8 row {row} decodes to {value!r}; an asset stores finite values only, so "
                                    "the stored bytes are corrupt; restore the asset")
        self.row, self.value = row, value


def bf16_encode(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits as uint16, round to nearest even (finite input)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    bias = ((u >> np.uint32(16)) & np.uint32(1)) + np.uint32(0x7FFF)
    out: np.ndarray = ((u + bias) >> np.uint32(16)).astype(np.uint16)
    return out


def bf16_decode(b: np.ndarray) -> np.ndarray:
    out: np.ndarray = (np.asarray(b, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)
    return out


def page_view(chunks: np.ndarray, geom: Geometry) -> np.ndarray:
    """uint8 chunks [n, chunk_bytes] -> a writable view [n, pages_per_chunk, page_bytes] (padding excluded)."""
    n = chunks.shape[0]
    s0 = chunks.strides[0]
    return np.lib.stride_tricks.as_strided(
        chunks, shape=(n, geom.pages_per_chunk, geom.page_bytes), strides=(s0, geom.page_bytes, 1), writeable=True
    )


def check_pages(data: np.ndarray, geom: Geometry, n: int | None = None) -> np.ndarray:
    """Validate float pages [n, K·S, r]: shape and finiteness. Returns float32, C-contiguous."""
    arr = np.ascontiguousarray(data, dtype=np.float32)
    want = (arr.shape[0] if n is None else n, geom.rows_per_page, geom.head_dim)
    if arr.shape != want:
        raise PolymemError(f"pages have shape {arr.shape}, expected {want} ([n, K*S, r])")
    if not np.isfinite(arr).all():
        bad = int(np.argwhere(~np.isfinite(arr))[0][0])
        raise PolymemError(f"page data holds NaN or inf (first in input page {bad}); assets store finite values only")
    return arr


def encode_pages(pages: np.ndarray, geom: Geometry) -> np.ndarray:
    """float32 [n, K·S, r] -> stored per page: [n, K·S, r] (float32/float16/uint16) or uint8 [n, page_bytes]."""
    d = geom.dtype
    if d == "float32":
        return pages
    if d == "float16":
        if pages.size and float(np.abs(pages).max()) > 65504.0:
            raise PolymemError("values exceed float16's range (65504); store this table as float32 or bfloat16")
        return pages.astype("<f2")
    if d == "bfloat16":
        return bf16_encode(pages)
    return encode_rows(pages, geom).reshape(pages.shape[0], geom.page_bytes)


def encode_rows(x: np.ndarray, geom: Geometry) -> np.ndarray:
    """float32 rows [..., r] (finite) -> stored rows of a packed dtype, uint8 [..., row_bytes]."""
    if geom.dtype == "nf4":
        return nf4.quantize(x)
    flat = x.reshape(-1, geom.head_dim)
    if geom.dtype == "fp8-e4m3-e8m0":
        w, sc = fp8.encode_rows(flat)  # [m, r], [m, r/32]
        out: np.ndarray = np.concatenate([w, sc], axis=1).reshape(x.shape[:-1] + (geom.row_bytes,))
        return out
    scale = np.float32(geom.fp8_scale)
    if flat.size and float(np.abs(flat).max()) > fp8.E4M3_MAX * float(scale):
        raise PolymemError(f"values exceed fp8-e4m3's range ±448 × scale {float(scale)!r}; quantize the table to "
                           "fp8-e4m3 again (`polymem quantize --to fp8-e4m3` picks the scale) or store it as bfloat16")
    return fp8.encode_e4m3(x.astype(np.float64) / float(scale))


def decode_rows(b: np.ndarray, geom: Geometry) -> np.ndarray:
    """Stored rows of a packed dtype uint8 [..., row_bytes] -> float32 [..., r]. A row that decodes to a value
    no writer stores (an nf4 scale that is not finite ≥ 0, an fp8 NaN or ±inf) raises ScaleError."""
    r = geom.head_dim
    if geom.dtype == "nf4":
        return nf4.dequantize(b, r)
    flat = np.asarray(b, dtype=np.uint8).reshape(-1, geom.row_bytes)
    if geom.dtype == "fp8-e4m3-e8m0":
        out = fp8.decode_rows(flat[:, :r], flat[:, r:])
    else:
        out = fp8.decode_e4m3(flat) * np.float32(geom.fp8_scale)
    bad = ~np.isfinite(out)
    if bad.any():
        i = int(np.argwhere(bad)[0][0])
        raise Fp8ValueError(i, float(out[i][bad[i]][0]))
    return out.reshape(b.shape[:-1] + (r,))


def pages_to_chunks(stored: np.ndarray, geom: Geometry) -> np.ndarray:
    """Stored pages (page 0 of the result's first chunk = stored[0]) -> chunks [ceil(n/ppc), ...]."""
    if not geom.packed:
        return stored
    ppc = geom.pages_per_chunk
    n = stored.shape[0]
    chunks = np.zeros((-(-n // ppc), geom.chunk_bytes), dtype=np.uint8)
    pv = page_view(chunks, geom)  # [B, ppc, page_bytes]
    for j in range(ppc):
        sel = stored[j::ppc]
        pv[: sel.shape[0], j] = sel
    return chunks


def decode_chunks(chunks: np.ndarray, geom: Geometry) -> np.ndarray:
    """Stored chunks -> float32 pages [n_chunks * pages_per_chunk, K·S, r]."""
    d = geom.dtype
    if d == "float32":
        return np.ascontiguousarray(chunks, dtype=np.float32)
    if d == "float16":
        return chunks.astype(np.float32)
    if d == "bfloat16":
        return bf16_decode(chunks)
    pages = page_view(np.ascontiguousarray(chunks), geom)  # [n, ppc, page_bytes]
    return decode_rows(pages.reshape(-1, geom.rows_per_page, geom.row_bytes), geom)
