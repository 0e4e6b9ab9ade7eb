"""Element encodings of pages: float32 pages [n, K·S, r] <-> stored chunks (docs/asset-format.md §3-5).

float32 / float16 are stored as is; bfloat16 as uint16 (upper half of the float32 bits, round to nearest
even); nf4 as rows of codes + float16 scale packed into 4 KiB blocks of whole pages. No files here.
"""

from __future__ import annotations

import numpy as np

from polymem.asset import nf4
from polymem.asset._format import Geometry
from polymem.errors import PolymemError


def bf16_encode(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits as uint16, round to nearest even (finite input)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    bias = ((u >> np.uint32(16)) & np.uint32(1)) + np.uint32(0x7FFF)
    return ((u + bias) >> np.uint32(16)).astype(np.uint16)


def bf16_decode(b: np.ndarray) -> np.ndarray:
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


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
    q = nf4.quantize(pages)  # [n, K·S, row_bytes]
    return q.reshape(pages.shape[0], geom.page_bytes)


def pages_to_chunks(stored: np.ndarray, geom: Geometry) -> np.ndarray:
    """Stored pages (page 0 of the result's first chunk = stored[0]) -> chunks [ceil(n/ppc), ...]."""
    if geom.dtype != "nf4":
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
    rows = pages.reshape(-1, geom.rows_per_page, geom.page_bytes // geom.rows_per_page)
    return nf4.dequantize(rows, geom.head_dim)
