"""Vectorised n-gram hashing over token ids (numpy path; the numba kernel lives in :mod:`polymem.hash._numba`).

Given per-token caches C(t) = Hash(bytes(t)) and P(t) = base^L(t), the suffix n-gram ending at position i
extends leftwards (DESIGN §2)::

    H_1(i) = C(x_i)                       M_1(i) = P(x_i)
    H_n(i) = C(x_{i-n+1})·M_{n-1}(i) + H_{n-1}(i)
    M_n(i) = P(x_{i-n+1})·M_{n-1}(i)

An n-gram is valid iff i-n+1 ≥ 0 and none of its tokens is special (no bytes); invalid hashes are 0.
"""

from __future__ import annotations

import numpy as np


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
