"""numba kernels of the corpus-wide occurrence pass: bucketed sets of 64-bit n-gram keys (stored as
:mod:`._sets` stores them: 0 as ``ZERO_KEY``). Used by :class:`~polymem.analysis.coverage.counter.HashCounter`
(one partition) and by :mod:`polymem.analysis.coverage.dist` (the reduce over partitions).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from polymem.analysis.coverage._sets import _key, _log2, _pow2
from polymem.hash._numba import _U0, _U1, _fmix64


# ------------------------------------------------------------------- bucketed key sets (the occurrence pass)
# The corpus-wide occurrence metric needs set membership over a partition's (and then the corpus's) distinct
# reference keys. Keys are grouped by **bucket** (the top ``bits`` bits of the stored key, a counting sort), and
# each bucket is deduplicated / looked up in its own small open-addressing table (slot = fmix64(key)), which
# stays cache-sized: one sequential pass to group, then probes that hit L1/L2 instead of missing all over one
# table of hundreds of MiB.


@njit(cache=True, nogil=True)
def _bucket_counts(keys, n, bits):  # pragma: no cover - compiled
    """Offsets int64 [2^bits + 1] of the stored keys _key(keys[:n]) grouped by their top ``bits`` bits."""
    shift = np.uint64(64 - bits)
    off = np.zeros((1 << bits) + 1, dtype=np.int64)
    for i in range(n):
        off[np.int64(_key(keys[i]) >> shift) + 1] += 1
    for b in range(1 << bits):
        off[b + 1] += off[b]
    return off


@njit(cache=True, nogil=True)
def _table_for(off):  # pragma: no cover - compiled
    """A zeroed scratch table big enough for the largest bucket at load <= 1/2."""
    big = 0
    for b in range(off.shape[0] - 1):
        big = max(big, off[b + 1] - off[b])
    return np.zeros(_pow2(2 * big + 1), dtype=np.uint64)


@njit(cache=True, inline="always")
def _insert(table, s, mask, k):  # pragma: no cover - compiled
    """Insert stored key k, probing linearly from slot s; True if it was new."""
    while True:
        t = table[s]
        if t == _U0:
            table[s] = k
            return True
        if t == k:
            return False
        s = (s + _U1) & mask


@njit(cache=True, inline="always")
def _member(table, s, mask, k):  # pragma: no cover - compiled
    """True if stored key k is in the table, probing linearly from slot s."""
    while True:
        t = table[s]
        if t == _U0:
            return False
        if t == k:
            return True
        s = (s + _U1) & mask


@njit(cache=True, nogil=True)
def _group_keys(keys, n, bits):  # pragma: no cover - compiled
    """Counting sort of the stored keys of keys[:n] by bucket (top ``bits`` bits): (grouped keys, offsets)."""
    grouped = np.empty(n, dtype=np.uint64)
    return grouped, _group_keys_into(keys, n, bits, grouped)


@njit(cache=True, nogil=True)
def _group_keys_into(keys, n, bits, grouped):  # pragma: no cover - compiled
    """:func:`_group_keys` into ``grouped`` (uint64 [>= n], reused scratch); returns the offsets."""
    shift = np.uint64(64 - bits)
    off = _bucket_counts(keys, n, bits)
    fill = off[:-1].copy()
    for i in range(n):
        k = _key(keys[i])
        b = np.int64(k >> shift)
        grouped[fill[b]] = k
        fill[b] += 1
    return off


@njit(cache=True, nogil=True)
def bucket_unique(keys, n, bits):  # pragma: no cover - compiled
    """The distinct stored keys of keys[:n] (raw hashes; 0 is stored as ZERO_KEY) grouped by bucket:
    (keys uint64 [d], offsets int64 [2^bits + 1]); bucket b = keys[offsets[b]:offsets[b+1]]."""
    nb = 1 << bits
    grouped, off = _group_keys(keys, n, bits)
    table = _table_for(off)
    out_off = np.zeros(nb + 1, dtype=np.int64)
    w = 0
    for b in range(nb):
        lo, hi = off[b], off[b + 1]
        if hi > lo:
            cap = _pow2(2 * (hi - lo) + 1)
            mask = np.uint64(cap - 1)
            table[:cap] = 0
            for j in range(lo, hi):
                k = grouped[j]
                if _insert(table, _fmix64(k) & mask, mask, k):
                    grouped[w] = k  # w <= j: compaction in place
                    w += 1
        out_off[b + 1] = w
    return grouped[:w].copy(), out_off


@njit(cache=True, nogil=True)
def _group_into(ph, pn, pc, n, bits, gh, gn, gc):  # pragma: no cover - compiled
    """Counting sort of (stored key, order, count) entries by bucket into gh, gn, gc (scratch, >= n each);
    returns the offsets."""
    shift = np.uint64(64 - bits)
    off = _bucket_counts(ph, n, bits)
    fill = off[:-1].copy()
    for i in range(n):
        k = _key(ph[i])
        b = np.int64(k >> shift)
        j = fill[b]
        gh[j], gn[j], gc[j] = k, pn[i], pc[i]
        fill[b] = j + 1
    return off


@njit(cache=True, nogil=True)
def bucket_group_into(keys, n, ph, pn, pc, n_pend, bits, grouped, gh, gn, gc):  # pragma: no cover - compiled
    """The map side of the occurrence pass: the stored keys of keys[:n] and the pending target entries (stored
    keys ph, order-1 pn, counts pc; first n_pend) grouped by bucket (counting sorts) into scratch reused across
    partitions (grouped uint64 [>= n]; gh, gn, gc [>= n_pend]). Nothing is deduplicated or looked up here: the
    reduce's per-bucket table does both, once (a map-side table removed only ~20 % of the keys of a 4 MB
    partition and cost as much as the grouping). Returns (offsets of the keys, offsets of the entries), int64
    [2^bits + 1] each."""
    off = _group_keys_into(keys, n, bits, grouped)
    poff = _group_into(ph, pn, pc, n_pend, bits, gh, gn, gc)
    return off, poff


@njit(cache=True, nogil=True)
def resolve_range(ref, ref_off, ph, pn, pc, pend_off, bits, hits):  # pragma: no cover - compiled
    """The reduce of the occurrence pass over B buckets and P partitions: ref / ph, pn, pc are the partitions'
    slices concatenated, ref_off / pend_off int64 [P, B + 1] their absolute offsets per bucket (buckets of the
    top ``bits`` bits). For each bucket, the union of every partition's reference keys goes into a small table,
    then every partition's pending entries of that bucket are looked up: hits[pn] += pc for those found."""
    P = ref_off.shape[0]
    B = ref_off.shape[1] - 1
    big = 0
    for b in range(B):
        tot = 0
        for p in range(P):
            tot += ref_off[p, b + 1] - ref_off[p, b]
        big = max(big, tot)
    table = np.zeros(_pow2(2 * big + 1), dtype=np.uint64)
    lshift = np.uint64(bits)
    for b in range(B):
        tot = 0
        for p in range(P):
            tot += ref_off[p, b + 1] - ref_off[p, b]
        if tot == 0:
            continue
        cap = _pow2(2 * tot + 1)  # load <= 1/2, less where documents share keys (2/3 was measured slower)
        mask = np.uint64(cap - 1)
        rshift = np.uint64(64 - _log2(cap))
        table[:cap] = 0
        for p in range(P):
            for j in range(ref_off[p, b], ref_off[p, b + 1]):
                k = ref[j]
                _insert(table, (k << lshift) >> rshift, mask, k)  # slot: the bits below the bucket's
        for p in range(P):
            for j in range(pend_off[p, b], pend_off[p, b + 1]):
                k = ph[j]
                if _member(table, (k << lshift) >> rshift, mask, k):
                    hits[pn[j]] += pc[j]
    return 0
