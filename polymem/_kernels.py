"""numba kernels for the hot paths: token table build, n-gram hashing, and fused hashing + layout rows.

They implement exactly the definitions in :mod:`polymem.hashing` / :mod:`polymem.reference` (checked bit for
bit by the tests). All arithmetic is uint64 wrap-around; every constant is a ``np.uint64`` so numba never
promotes to float (mixing uint64 with int64 in numba gives float64).
"""

from __future__ import annotations

import numpy as np
from numba import njit

_U0 = np.uint64(0)
_U1 = np.uint64(1)
_S16 = np.uint64(16)
_S33 = np.uint64(33)
_M16 = np.uint64(0xFFFF)
_F1 = np.uint64(0xFF51AFD7ED558CCD)
_F2 = np.uint64(0xC4CEB9FE1A85EC53)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)

KIND_PAGE_LOCAL = 0
KIND_FLAT = 1
KIND_INDEPENDENT = 2


@njit(cache=True, inline="always")
def _fmix64(k):  # pragma: no cover - compiled
    k ^= k >> _S33
    k *= _F1
    k ^= k >> _S33
    k *= _F2
    k ^= k >> _S33
    return k


_S32 = np.uint64(32)
_M32 = np.uint64(0xFFFFFFFF)


@njit(cache=True, inline="always")
def _fastrange(z, m):  # pragma: no cover - compiled
    """⌊z·m / 2^64⌋ for m < 2^32, from 32-bit halves (exact)."""
    mu = np.uint64(m)
    c = ((z & _M32) * mu) >> _S32
    return np.int64(((z >> _S32) * mu + c) >> _S32)


@njit(cache=True, inline="always")
def _finalize(h, stream):  # pragma: no cover - compiled
    return _fmix64(h + np.uint64(stream + 1) * _GOLDEN)


@njit(cache=True)
def token_hashes(buf, offsets, table, base):  # pragma: no cover - compiled
    """C[t] = Horner hash of buf[offsets[t]:offsets[t+1]] with byte table ``table``."""
    V = offsets.shape[0] - 1
    out = np.empty(V, dtype=np.uint64)
    for t in range(V):
        acc = _U0
        for j in range(offsets[t], offsets[t + 1]):
            acc = (acc + table[buf[j]]) * base
        out[t] = acc
    return out


@njit(cache=True, inline="always")
def _page_local(h, heads, slots, pages, out, o):  # pragma: no cover - compiled
    page = _fastrange(_finalize(h, 0), pages)
    rb = page * heads * slots
    su = np.uint64(slots)
    for g in range((heads + 3) // 4):
        w = _finalize(h, 1 + g)
        for f in range(4):
            k = g * 4 + f
            if k < heads:
                out[o + k] = rb + k * slots + np.int64((((w >> np.uint64(16 * f)) & _M16) * su) >> _S16)


@njit(cache=True, inline="always")
def _flat(h, heads, slots, pages, out, o):  # pragma: no cover - compiled
    e = _fastrange(_finalize(h, 0), pages * slots)
    for k in range(heads):
        out[o + k] = e * heads + k


@njit(cache=True, inline="always")
def _independent(h, heads, slots, pages, out, o):  # pragma: no cover - compiled
    q = np.int64(pages) * slots
    for k in range(heads):
        out[o + k] = k * q + _fastrange(_finalize(h, 1 + k), q)


@njit(cache=True, inline="always")
def _rows_of(h, kind, heads, slots, pages, out, o):  # pragma: no cover - compiled
    if kind == KIND_PAGE_LOCAL:
        _page_local(h, heads, slots, pages, out, o)
    elif kind == KIND_FLAT:
        _flat(h, heads, slots, pages, out, o)
    else:
        _independent(h, heads, slots, pages, out, o)


@njit(cache=True)
def rows_from_hashes(h, valid, kind, heads, slots, pages):  # pragma: no cover - compiled
    """h: uint64 [M], valid: bool [M] -> int64 [M*heads] (-1 where invalid)."""
    M = h.shape[0]
    out = np.empty(M * heads, dtype=np.int64)
    for i in range(M):
        if valid[i]:
            _rows_of(h[i], kind, heads, slots, pages, out, i * heads)
        else:
            for k in range(heads):
                out[i * heads + k] = -1
    return out


@njit(cache=True)
def ngram_hashes(ids, C, P, special, max_n):  # pragma: no cover - compiled
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


def _make_ngram_rows(row_fn):
    @njit(cache=True)
    def kernel(ids, C, P, special, max_n, heads, slots, pages):  # pragma: no cover - compiled
        B, T = ids.shape
        out = np.empty(B * T * max_n * heads, dtype=np.int64)
        for b in range(B):
            for i in range(T):
                h = _U0
                m = _U1
                base_o = ((b * T + i) * max_n) * heads
                n_ok = 0
                for n in range(max_n):
                    j = i - n
                    if j < 0:
                        break
                    t = ids[b, j]
                    if special[t]:
                        break
                    h = C[t] * m + h
                    m = m * P[t]
                    row_fn(h, heads, slots, pages, out, base_o + n * heads)
                    n_ok += 1
                for x in range(base_o + n_ok * heads, base_o + max_n * heads):
                    out[x] = -1
        return out.reshape((B, T, max_n, heads))

    return kernel


_NGRAM_ROWS = {}


def ngram_rows(ids, C, P, special, max_n, kind, heads, slots, pages):
    """Fused hashing + layout: ids int64 [B, T] -> rows int64 [B, T, max_n, heads] (-1 where invalid).

    One kernel per layout kind (compiled on first use), so the inner loop has no kind branch.
    """
    if kind not in _NGRAM_ROWS:
        _NGRAM_ROWS[kind] = _make_ngram_rows({KIND_PAGE_LOCAL: _page_local, KIND_FLAT: _flat, KIND_INDEPENDENT: _independent}[kind])
    return _NGRAM_ROWS[kind](ids, C, P, special, max_n, heads, slots, pages)
