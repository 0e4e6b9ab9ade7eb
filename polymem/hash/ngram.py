"""Vectorised n-gram hashing and layout rows in numpy: the readable fallback of the numba kernels in
:mod:`polymem.hash._numba` (``TokenHashes.ngram_hashes(backend="numpy")``, ``Layout.rows(backend="numpy")``).

Given per-token caches C(t) = Hash(bytes(t)) and P(t) = base^L(t), the suffix n-gram ending at position i
extends leftwards::

    H_1(i) = C(x_i)                       M_1(i) = P(x_i)
    H_n(i) = C(x_{i-n+1})·M_{n-1}(i) + H_{n-1}(i)
    M_n(i) = P(x_{i-n+1})·M_{n-1}(i)

An n-gram is valid iff i-n+1 ≥ 0 and none of its tokens is special (no bytes); invalid hashes are 0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from polymem.hash.spec import FMIX_M1, FMIX_M2, GOLDEN

if TYPE_CHECKING:
    from polymem.hash.layout import Layout


def ngram_hashes_numpy(
    C: np.ndarray, P: np.ndarray, special: np.ndarray, ids: np.ndarray, max_n: int
) -> tuple[np.ndarray, np.ndarray]:
    """ids int [..., T] -> (hashes uint64 [..., T, max_n], valid bool [..., T, max_n])."""
    ids = np.asarray(ids, dtype=np.int64)
    c = C[ids]
    p = P[ids]
    ok = ~special[ids]
    T = ids.shape[-1]
    H = np.zeros(ids.shape + (max_n,), dtype=np.uint64)
    V = np.zeros(ids.shape + (max_n,), dtype=bool)
    h = c.copy()
    m = p.copy()
    v = ok.copy()
    H[..., 0] = np.where(v, h, 0)
    V[..., 0] = v
    with np.errstate(over="ignore"):
        for n in range(2, max_n + 1):
            s = n - 1  # the new leftmost token sits s positions back
            if s >= T:
                break
            h[..., s:] = c[..., :-s] * m[..., s:] + h[..., s:]
            m[..., s:] = p[..., :-s] * m[..., s:]
            v[..., s:] &= ok[..., :-s]
            v[..., :s] = False
            H[..., n - 1] = np.where(v, h, 0)
            V[..., n - 1] = v
    return H, V


# ------------------------------------------------------------------ finaliser and layouts (docs/hash-spec.md)
def fmix64(k: np.ndarray) -> np.ndarray:
    """:func:`polymem.hash.spec.fmix64` on uint64 arrays."""
    with np.errstate(over="ignore"):
        k = k ^ (k >> np.uint64(33))
        k = k * np.uint64(FMIX_M1)
        k = k ^ (k >> np.uint64(33))
        k = k * np.uint64(FMIX_M2)
        out: np.ndarray = k ^ (k >> np.uint64(33))
    return out


def finalize(h: np.ndarray, stream: int) -> np.ndarray:
    """:func:`polymem.hash.spec.finalize` on uint64 arrays."""
    with np.errstate(over="ignore"):
        h = h + np.uint64(stream + 1) * np.uint64(GOLDEN)
    return fmix64(h)


def fastrange(z: np.ndarray, m: int) -> np.ndarray:
    """⌊z·m / 2^64⌋ for m < 2^32 (exact, from 32-bit halves) -> int64."""
    mu = np.uint64(m)
    with np.errstate(over="ignore"):
        c = ((z & np.uint64(0xFFFFFFFF)) * mu) >> np.uint64(32)
        out: np.ndarray = (((z >> np.uint64(32)) * mu + c) >> np.uint64(32)).astype(np.int64)
    return out


def rows_numpy(layout: "Layout", hashes: np.ndarray) -> np.ndarray:
    """uint64 hashes [...] -> int64 rows [..., K], every hash treated as valid; same bits as :meth:`Layout.rows`."""
    h = np.asarray(hashes, dtype=np.uint64)
    K, S, P = layout.heads, layout.slots, layout.pages
    k = np.arange(K, dtype=np.int64)
    if layout.kind == "page-local":
        page = fastrange(finalize(h, 0), P)  # [...]
        ws = np.stack([finalize(h, 1 + g) for g in range((K + 3) // 4)], axis=-1)  # [..., G]
        w = ws[..., k // 4]  # [..., K]
        field = (w >> (np.uint64(16) * (k % 4).astype(np.uint64))) & np.uint64(0xFFFF)
        slot = ((field * np.uint64(S)) >> np.uint64(16)).astype(np.int64)
        rows: np.ndarray = (page[..., None] * K + k) * S + slot
    elif layout.kind == "flat":
        e = fastrange(finalize(h, 0), P * S)
        rows = e[..., None] * K + k
    else:
        q = P * S
        u = np.stack([fastrange(finalize(h, 1 + j), q) for j in range(K)], axis=-1)  # [..., K]
        rows = k * q + u
    return rows
