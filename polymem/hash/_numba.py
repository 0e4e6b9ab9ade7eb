"""numba kernels for the hot paths: token table build, n-gram hashing, and fused hashing + layout rows.

They implement exactly the definitions in :mod:`polymem.hash.spec` / :mod:`polymem.hash.reference` (checked bit for
bit by the tests). All arithmetic is uint64 wrap-around; every constant is a ``np.uint64`` so numba never
promotes to float (mixing uint64 with int64 in numba gives float64).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from numba import njit

from polymem.hash.spec import FMIX_M1, FMIX_M2, GOLDEN, KIND_FLAT, KIND_PAGE_LOCAL

_U0 = np.uint64(0)
_U1 = np.uint64(1)
_S16 = np.uint64(16)
_S33 = np.uint64(33)
_M16 = np.uint64(0xFFFF)
_F1 = np.uint64(FMIX_M1)
_F2 = np.uint64(FMIX_M2)
_GOLDEN = np.uint64(GOLDEN)  # numba needs the constant as a module-level np.uint64

# The annotations are for readers and mypy only: numba types each call from its arguments.
U64s = npt.NDArray[np.uint64]
I64s = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]


@njit(cache=True, inline="always")
def _fmix64(k: np.uint64) -> np.uint64:  # pragma: no cover - compiled
    k ^= k >> _S33
    k *= _F1
    k ^= k >> _S33
    k *= _F2
    k ^= k >> _S33
    return k


_S32 = np.uint64(32)
_M32 = np.uint64(0xFFFFFFFF)


@njit(cache=True, inline="always")
def _fastrange(z: np.uint64, m: int | np.int64) -> np.int64:  # pragma: no cover - compiled
    """⌊z·m / 2^64⌋ for m < 2^32, from 32-bit halves (exact)."""
    mu = np.uint64(m)
    c = ((z & _M32) * mu) >> _S32
    r: np.int64 = np.int64(((z >> _S32) * mu + c) >> _S32)
    return r


@njit(cache=True, inline="always")
def _finalize(h: np.uint64, stream: int) -> np.uint64:  # pragma: no cover - compiled
    return _fmix64(h + np.uint64(stream + 1) * _GOLDEN)


@njit(cache=True, nogil=True)
def token_hashes(  # pragma: no cover - compiled
    buf: npt.NDArray[np.uint8], offsets: I64s, table: U64s, base: np.uint64,
) -> U64s:
    """C[t] = Horner hash of buf[offsets[t]:offsets[t+1]] with byte table ``table``."""
    V = offsets.shape[0] - 1
    out = np.empty(V, dtype=np.uint64)
    for t in range(V):
        acc = _U0
        for j in range(offsets[t], offsets[t + 1]):
            acc = (acc + table[buf[j]]) * base
        out[t] = acc
    return out


# Row kernels write a planar [K, M] array: one simple loop per head over all n-grams, which LLVM vectorises
# (AVX-512 has native 64-bit multiplies); the per-n-gram [M, K] order did not vectorise and ran ~6× slower.
# Callers get a [M, K] view of it (a transpose, no copy).
@njit(cache=True, nogil=True)
def rows_planar(  # pragma: no cover - compiled
    h: U64s, valid: Bools, kind: int, heads: int, slots: int, pages: int,
) -> I64s:
    """h uint64 [M], valid bool [M] -> rows int64 [heads, M] (-1 where invalid)."""
    M = h.shape[0]
    out = np.empty((heads, M), dtype=np.int64)
    base = np.empty(M, dtype=np.int64)  # page·K·S (page-local), entry e (flat); -1 if invalid
    if kind == KIND_PAGE_LOCAL:
        KS = heads * slots
        for i in range(M):
            base[i] = _fastrange(_finalize(h[i], 0), pages) * KS if valid[i] else -1
        w = np.empty(M, dtype=np.uint64)
        su = np.uint64(slots)
        for g in range((heads + 3) // 4):
            off = np.uint64(g + 2) * _GOLDEN  # stream 1+g
            for i in range(M):
                w[i] = _fmix64(h[i] + off)
            for f in range(4):
                k = 4 * g + f
                if k >= heads:
                    break
                sh = np.uint64(16 * f)
                ks = k * slots
                row = out[k]
                for i in range(M):
                    r = base[i] + ks + np.int64((((w[i] >> sh) & _M16) * su) >> _S16)
                    row[i] = r if base[i] >= 0 else -1
    elif kind == KIND_FLAT:
        for i in range(M):
            base[i] = _fastrange(_finalize(h[i], 0), pages * slots) * heads if valid[i] else -1
        for k in range(heads):
            row = out[k]
            for i in range(M):
                row[i] = base[i] + k if base[i] >= 0 else -1
    else:
        q = np.int64(pages) * slots
        for k in range(heads):
            row = out[k]
            off = np.uint64(k + 2) * _GOLDEN  # stream 1+k
            for i in range(M):
                r = k * q + _fastrange(_fmix64(h[i] + off), q)
                row[i] = r if valid[i] else -1
    return out


@njit(cache=True, nogil=True)
def ngram_hashes(  # pragma: no cover - compiled
    ids: I64s, C: U64s, P: U64s, special: Bools, max_n: int,
) -> tuple[U64s, Bools]:
    """ids int64 [B, T] -> (hashes uint64 [B, T, max_n], valid bool [B, T, max_n]).

    For position i the suffix n-gram grows leftwards: H_n = C(x_{i-n+1})·M_{n-1} + H_{n-1}, where M_{n-1}
    is base^(bytes of x_{i-n+2..i}) = the product of P(x) = base^L(x) over those tokens.
    """
    B, T = ids.shape
    out_h = np.zeros((B, T, max_n), dtype=np.uint64)
    out_v = np.zeros((B, T, max_n), dtype=np.bool_)
    for b in range(B):
        for i in range(T):
            h = _U0
            m = _U1
            for n in range(max_n):
                j = i - n
                if j < 0:
                    break
                t = ids[b, j]
                if special[t]:
                    break
                h = C[t] * m + h
                m = m * P[t]
                out_h[b, i, n] = h
                out_v[b, i, n] = True
    return out_h, out_v


def ngram_rows(
    ids: I64s, C: U64s, P: U64s, special: Bools, max_n: int, kind: int, heads: int, slots: int, pages: int,
) -> I64s:
    """Hashing + layout: ids int64 [B, T] -> rows int64 [B, T, max_n, heads] (-1 where invalid).

    A view of a planar [heads, B, T, max_n] array (see :func:`rows_planar`).
    """
    h, v = ngram_hashes(ids, C, P, special, max_n)
    B, T = ids.shape
    planar = rows_planar(h.reshape(-1), v.reshape(-1), kind, heads, slots, pages)
    rows: I64s = planar.reshape((heads, B, T, max_n)).transpose(1, 2, 3, 0)
    return rows
