"""numba kernels for coverage: per-document open-addressing sets over 64-bit n-gram keys,
a partitioned set for the corpus-wide reference n-grams, and the byte-fidelity comparison.

Tables are power-of-two arrays of uint64 keys with linear probing; key 0 means "empty", so a real key of 0
is stored as ``ZERO_KEY`` (a byte hash is 0 with probability 2^-64; the substitution is applied the same way
to every key, so it can only ever merge two n-grams that the 64-bit hash already collides). Slots: the
per-document byte-hash tables start at the key's top bits (a polynomial byte hash mixes upwards: its top bits
are uniform, its low bits are not); the XOR tables and the bucketed sets at ``fmix64(key) & mask`` (XOR mixes
of small token ids have structured bits; a bucket's keys share their top bits). All arithmetic is uint64 with
np.uint64 constants (mixing uint64 and int64 in numba gives float64). The kernels release the GIL
(``nogil``): a Dask worker's threads count documents side by side.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from polymem.hash._numba import _GOLDEN, _U0, _U1, _fmix64  # one fmix64 for the whole package

ZERO_KEY = _GOLDEN  # any fixed non-zero key would do; a byte hash equals it with probability 2^-64


_LOW = np.uint64(0x1F)  # the low 5 bits of a reference-table entry hold the smallest reference order - 1
_HIGH = ~np.uint64(0x1F)


@njit(cache=True, inline="always")
def _key(h):  # pragma: no cover - compiled
    """A key as stored: 0 means "empty", so a real 0 becomes ZERO_KEY."""
    return h if h != _U0 else ZERO_KEY


@njit(cache=True, inline="always")
def _probe(tt, h, mask):  # pragma: no cover - compiled
    """Linear probing in a keyed table (keys in column 0): the slot holding ``h``, or the empty slot where it
    would go."""
    s = _fmix64(h) & mask
    while tt[s, 0] != _U0 and tt[s, 0] != h:
        s = (s + _U1) & mask
    return s


@njit(cache=True, inline="always")
def _probe_one(rt, hi, mask, shift):  # pragma: no cover - compiled
    """Linear probing in the reference table, comparing the top 59 bits: the slot whose entry has the high bits
    ``hi``, or the empty slot where it would go. The first slot is the key's top bits (``shift`` = 64 - log2 of
    the table size): the top bits of a polynomial byte hash are already well mixed (its low bits are not), so
    no fmix64 is needed here. One branch per slot: ``a and b`` compiles to two branches, and the first one
    (empty slot or not) goes either way at random (found or not), mispredicting; ``a | b`` is almost always true
    at the first slot, so its branch is predicted (in-process A/B, kerneldocs: -2-7 % in each of 5 rounds)."""
    s = hi >> shift
    e = rt[s]
    while not ((e == _U0) | ((e & _HIGH) == hi)):
        s = (s + _U1) & mask
        e = rt[s]
    return s


@njit(cache=True, inline="always")
def _log2(n):  # pragma: no cover - compiled
    """log2 of a power of two."""
    k = 0
    while (1 << k) < n:
        k += 1
    return k


@njit(cache=True, inline="always")
def _variant_hit(vt, x, tmask, xhits, n):  # pragma: no cover - compiled
    """A reference id n-gram (XOR key x) against the further target id n-grams whose bytes an entry already has
    (``vt``): True if found; its first hit counted in xhits[n]."""
    v = _probe(vt, _key(x), tmask)
    if vt[v, 0] == _U0:
        return False
    if vt[v, 1] == _U0:
        vt[v, 1] = _U1
        xhits[n] += 1
    return True


@njit(cache=True, inline="always")
def _gather(ids, C, P, special, run, pos):  # pragma: no cover - compiled
    """Per position of a document: the run of non-special tokens ending there, and the token's C and P in pos
    columns 2 and 3 (see :func:`doc_scan_ids`)."""
    r = 0
    for i in range(ids.shape[0]):
        t = ids[i]
        r = 0 if special[t] else r + 1
        run[i] = r
        pos[i, 2] = C[t]
        pos[i, 3] = P[t]


@njit(cache=True, inline="always")
def _extend(pos, i, m, carry):  # pragma: no cover - compiled
    """The byte hash of the n-gram of order m+1 ending at i, from the one of order m ending at i-1 (``carry``,
    read before it is overwritten): h = h'·P[t] + C[t]; stored in pos[i, 0]. Returns (hash, the next carry)."""
    if m == 0:
        h = pos[i, 2]
    else:
        h = carry * pos[i, 3] + pos[i, 2]
        carry = pos[i, 0]
    pos[i, 0] = h
    return h, carry


@njit(cache=True, nogil=True)
def doc_scan_ids(
    tids, rids,  # the document's ids: target int64 [Tt], reference int64 [Tr] (in range of their vocabularies)
    tC, tP, tspecial,  # the target's token hashes (its n-grams; and the reference's ids read as target ids)
    rC, rP, rspecial,  # the reference's token hashes
    mults,  # uint64 [N]: the XOR multipliers; N = max_n, the orders counted
    rt,  # scratch uint64 [pow2 >= 1.5*Tr*N]: the reference set, entries (key & ~31) | (smallest order - 1)
    tk, tv, tf,  # scratch uint64 [>= pow2(1.5*Tt)]: one target order's set: keys; count << 16 | XOR hit; the
    #              XOR key of the first id n-gram with these bytes
    tlist,  # scratch int64 [same]: slots of the distinct target entries, in insertion order
    vt,  # scratch uint64 [same, 2]: XOR keys of further id n-grams with the same bytes (rare), hit flag
    pos,  # scratch uint64 [>= max(Tt, Tr), 4]: per position, the current order's byte hash and XOR accumulator,
    #       and the token's C and P (one row per position: what a position's update reads is one cache line)
    run_t, run_r,  # scratch int64 [>= Tt], [>= Tr]: non-special tokens ending at each position
    surv, racc, rh, rm,  # scratch int64 / uint64 [>= Tr]: the XOR lookups of the reference: the positions
    #                      still alive (a list), their target byte hash, its base power, their XOR key
    seen, xseen, stamp,  # scratch int64 [target vocabulary], and this document's stamp (> every stamp in them)
    record,  # True: emit distinct reference keys and the not-found target (key, order, count) for the corpus pass
    uniq, hits, positions, pos_hits, xuniq, xhits,  # out (+=): int64 [N], [N, N], [N], [N], [N], [N]
    ref_out, pend_h, pend_n, pend_c,  # out buffers: uint64 [>= Tr*N]; uint64/int8/int64 [>= Tt*N]
):  # pragma: no cover - compiled
    """One document: unique-set hits per (target order n, smallest matching reference order m), positions,
    the XOR baseline's unique-set counts (Engram's token-id mix, :func:`polymem.hash.xor.xor_mixes`, with the
    order folded in: key = mix + n·GOLDEN) and, with ``record``, the document's keys for the corpus-wide
    occurrence pass.

    The n-gram hashes, their validity and the XOR keys are not materialised as [T, N] arrays but built one
    order at a time in place (the n-gram of order n+1 ending at i is the one of order n ending at i-1 extended
    by token i: h = h' * P[t] + C[t]; valid while the run of non-special tokens ending at i is longer than n),
    while each order's set is filled. The reference's orders go in ascending order, so a key's first insertion
    is its smallest order. The reference table compares the top 59 bits of a key (its low 5 bits carry the
    smallest order), so one probe is one 8-byte read; a false match needs two of the document's n-grams to
    agree on 59 random bits. The target's set is split into arrays (keys; counts and flags; XOR keys) so that a
    probe reads only keys, and an order's distinct n-grams are looked up in the reference set after its
    positions are counted (one look-up per distinct n-gram, its count known: no per-position hit flag, fewer
    branches in the position loop).

    XOR baseline, in the same target tables: an id n-gram determines its bytes, so the distinct target id
    n-grams of order n are the distinct byte n-grams (the table's entries) plus the further id n-grams that
    spell bytes an entry already has (``vt``; rare: another segmentation of the same bytes). A reference id
    n-gram can equal a target one only if its ids, read as target ids, spell bytes the target table has: its
    target byte hash is built up one order at a time (``rh``, ``rm``) with its XOR key (``racc``), and looked
    up. Its order 1 is "the same id": the target's ids are stamped in ``seen`` and a reference id (read as a
    target id) is looked up there, its first hit stamped in ``xseen``; the reference positions that matched are
    kept in a list (``surv``) and only they are extended at the next order (a reference n-gram whose
    (n-1)-suffix matched no target (n-1)-gram cannot match: with two unrelated id spaces almost nothing
    survives order 1). Equal XOR keys are taken as equal ids (64-bit keys of a document's n-grams), as for the
    table rows of the XOR baseline.

    Returns (number of distinct reference keys written to ref_out, number of pending entries written)."""
    N = mults.shape[0]
    Tr = rids.shape[0]
    Tt = tids.shape[0]
    # ---- the reference set, order by order
    rt[:] = 0
    rmask = np.uint64(rt.shape[0] - 1)
    rshift = np.uint64(64 - _log2(rt.shape[0]))
    n_ref = 0
    _gather(rids, rC, rP, rspecial, run_r, pos)
    for m in range(N):
        carry = _U0
        if m > 0 and m <= Tr:
            carry = pos[m - 1, 0]
        for i in range(m, Tr):
            h, carry = _extend(pos, i, m, carry)
            if run_r[i] <= m:
                continue
            hi = _key(h & _HIGH)
            s = _probe_one(rt, hi, rmask, rshift)
            if rt[s] == _U0:
                rt[s] = hi | np.uint64(m)
                if record:
                    ref_out[n_ref] = h
                    n_ref += 1
    # ---- the target, one order at a time
    n_pend = 0
    V = tC.shape[0]
    cap_t = _pow2(3 * Tt // 2 + 1)
    tmask = np.uint64(cap_t - 1)
    tshift = np.uint64(64 - _log2(cap_t))
    _gather(tids, tC, tP, tspecial, run_t, pos)
    pos[:Tt, 1] = _U0
    n_var = 1  # clear vt before the first order
    n_surv = 0
    for n in range(N):
        tk[:cap_t] = 0
        if n_var:
            vt[:cap_t, 0] = 0
            n_var = 0
        n_list = 0
        npos = 0
        nposhit = 0
        gold = np.uint64(n + 1) * _GOLDEN
        mn = mults[n]
        carry = _U0
        if n > 0 and n <= Tt:
            carry = pos[n - 1, 0]
        for i in range(n, Tt):
            h, carry = _extend(pos, i, n, carry)
            xa = pos[i, 1] ^ (np.uint64(tids[i - n]) * mn)
            pos[i, 1] = xa
            if run_t[i] <= n:
                continue
            if n == 0:
                seen[tids[i]] = stamp
            x = xa + gold
            h = _key(h)
            npos += 1
            s = h >> tshift
            e = tk[s]
            while not ((e == _U0) | (e == h)):  # one branch (see _probe_one), taken only on a collision
                s = (s + _U1) & tmask
                e = tk[s]
            if e == _U0:  # a new unique target n-gram (looked up in the reference set below)
                tk[s] = h
                tv[s] = _U1 << np.uint64(16)
                tf[s] = x
                tlist[n_list] = s
                n_list += 1
            else:
                tv[s] += _U1 << np.uint64(16)
                if tf[s] != x:  # the same bytes from other ids: a distinct id n-gram (if new)
                    x = _key(x)
                    v = _probe(vt, x, tmask)
                    if vt[v, 0] == _U0:
                        vt[v, 0] = x
                        vt[v, 1] = _U0
                        n_var += 1
        # the distinct target n-grams among the reference's n-grams of every order: a hit is attributed to
        # the smallest reference order; its positions are occurrence hits; the rest go to the corpus pass
        for j in range(n_list):
            s = tlist[j]
            h = tk[s]
            e = rt[_probe_one(rt, _key(h & _HIGH), rmask, rshift)]
            c = np.int64(tv[s] >> np.uint64(16))
            if e != _U0:
                hits[n, np.int64(e & _LOW)] += 1
                nposhit += c
            elif record:
                pend_h[n_pend] = h
                pend_n[n_pend] = n
                pend_c[n_pend] = c
                n_pend += 1
        uniq[n] += n_list
        positions[n] += npos
        pos_hits[n] += nposhit
        xuniq[n] += n_list + n_var
        # the reference's id n-grams of order n whose (n-1)-suffix matched
        if n == 0:
            n_surv = 0
            for j in range(Tr):
                t = rids[j]
                if run_r[j] == 0 or t >= V or seen[t] != stamp:
                    continue
                if xseen[t] != stamp:
                    xseen[t] = stamp
                    xhits[0] += 1
                rh[j] = tC[t]
                rm[j] = tP[t]
                racc[j] = np.uint64(t) * mults[0]
                surv[n_surv] = j
                n_surv += 1
        w = 0
        for k in range(n_surv if n > 0 else 0):
            j = surv[k]
            if j < n:
                continue
            t = rids[j - n]
            if run_r[j] <= n or t >= V or tspecial[t]:
                continue
            h = tC[t] * rm[j] + rh[j]
            mm = rm[j] * tP[t]
            acc = racc[j] ^ (np.uint64(t) * mults[n])
            rh[j] = h
            rm[j] = mm
            racc[j] = acc
            x = acc + gold
            h = _key(h)
            s = h >> tshift
            while tk[s] != _U0 and tk[s] != h:
                s = (s + _U1) & tmask
            found = False
            if tk[s] != _U0:
                if tf[s] == x:
                    found = True
                    if not tv[s] & _U1:
                        tv[s] |= _U1
                        xhits[n] += 1
                elif n_var:
                    found = _variant_hit(vt, x, tmask, xhits, n)
            if found:
                surv[w] = j
                w += 1
        if n > 0:
            n_surv = w
    return n_ref, n_pend


@njit(cache=True, inline="always")
def _pow2(n):  # pragma: no cover - compiled
    p = 16
    while p < n:
        p *= 2
    return p


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


@njit(cache=True, nogil=True)
def ids_in_range(ids, vocab):  # pragma: no cover - compiled
    """True if every id of the 1-D int64 ``ids`` is in [0, vocab)."""
    for i in range(ids.shape[0]):
        if ids[i] < 0 or ids[i] >= vocab:
            return False
    return True


@njit(cache=True, nogil=True)
def tally_doc(uniq, hits, xuniq, xhits, t_uniq, t_hits, t_docs_with, p_share, p_share_by_ref, t_xuniq, t_xhits,
              t_xdocs_with, p_xshare, one):  # pragma: no cover - compiled
    """One document's counts into a Tally (:meth:`polymem.analysis.coverage.counter.Tally.add_doc`): the integer
    sums, and each share (hits / |U_n(d)|, in float64) as rint(share * one) into the int64 partial sums."""
    N = uniq.shape[0]
    for n in range(N):
        t_uniq[n] += uniq[n]
        tot = 0
        for m in range(N):
            t_hits[n, m] += hits[n, m]
            tot += hits[n, m]
        if uniq[n] > 0:
            t_docs_with[n] += 1
            d = np.float64(uniq[n])
            p_share[n] += np.int64(np.rint(tot / d * one))
            for m in range(N):
                p_share_by_ref[n, m] += np.int64(np.rint(hits[n, m] / d * one))
        t_xuniq[n] += xuniq[n]
        t_xhits[n] += xhits[n]
        if xuniq[n] > 0:
            t_xdocs_with[n] += 1
            p_xshare[n] += np.int64(np.rint(xhits[n] / np.float64(xuniq[n]) * one))
    return 0


@njit(cache=True, nogil=True)
def compare_token_bytes(ids, buf, offsets, text):  # pragma: no cover - compiled
    """Compare the concatenated token bytes of ``ids`` (token t = buf[offsets[t]:offsets[t+1]]) with ``text``.

    Returns (status, offset): status 0 exact, 1 equal to b" " + text (a dummy prefix), 2 mismatch at
    byte ``offset`` of the token stream (compared against the text, or against b" " + text when the stream
    is one byte longer than the text; the offset is the length of the shorter one when one is a prefix of the
    other).

    The lengths are summed first: when they agree (the usual case) every token's bytes lie inside the text, and
    each token is compared in one tight loop without bounds checks; otherwise :func:`_compare_unequal`."""
    L = text.shape[0]
    n = ids.shape[0]
    total = 0
    for k in range(n):
        t = ids[k]
        total += offsets[t + 1] - offsets[t]
    shift = 1 if total == L + 1 else 0
    if total != L + shift:
        return _compare_unequal(ids, buf, offsets, text)
    k = 0
    q = 0  # bytes of the text compared so far
    if shift:  # the stream's first byte must be the dummy prefix's space
        while k < n:
            t = ids[k]
            a, b = offsets[t], offsets[t + 1]
            k += 1
            if b > a:
                if buf[a] != 32:
                    return 2, 0
                for j in range(a + 1, b):
                    if buf[j] != text[q]:
                        return 2, q + 1
                    q += 1
                break
    for kk in range(k, n):
        t = ids[kk]
        a, b = offsets[t], offsets[t + 1]
        d = q - a
        for j in range(a, b):
            if buf[j] != text[j + d]:
                return 2, j + d + shift
        q += b - a
    return shift, 0


@njit(cache=True, nogil=True)
def _compare_unequal(ids, buf, offsets, text):  # pragma: no cover - compiled
    """:func:`compare_token_bytes` when the stream is neither as long as the text nor one byte longer: always a
    mismatch, at the first differing byte or at the end of the shorter one."""
    L = text.shape[0]
    pos = 0
    for t in ids:
        for j in range(offsets[t], offsets[t + 1]):
            if pos >= L or buf[j] != text[pos]:
                return 2, pos
            pos += 1
    return 2, pos


PAD = 8  # bytes of zeros after the text and after the token buffer for :func:`compare_token_words`


@intrinsic
def _load8(typingctx, arr, idx):  # pragma: no cover - compiled
    """The 8 bytes arr[idx:idx+8] of a uint8 array as one native-endian uint64 (an unaligned load; the caller
    guarantees idx + 8 <= len(arr))."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.uint8 and isinstance(idx, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        i = context.cast(builder, args[1], sig.args[1], types.intp)
        ptr = builder.bitcast(builder.gep(ary.data, [i]), ir.IntType(64).as_pointer())
        return builder.load(ptr, align=1)

    return types.uint64(arr, idx), codegen


@njit(cache=True, nogil=True)
def compare_token_words(ids, buf, offsets, text, L, shift):  # pragma: no cover - compiled
    """:func:`compare_token_bytes` of ``text[:L]`` (the same result), 8 bytes at a time. ``buf`` and ``text``
    each end with at least :data:`PAD` bytes beyond their data (any values), so a token's bytes and the text
    under them are compared as masked 8-byte words, one per token of up to 8 bytes, with no inner byte loop
    (whose exit, a different trip count per token, mispredicts about once a token). ``shift`` is a guess of the
    status (1 for a tokenizer with a dummy prefix, else 0): the stream is compared against the text shifted by
    it, and only a complete match, with the stream ending where the text does, is answered here (it proves
    the stream's length is L + shift, so the status is shift); anything else goes to
    :func:`compare_token_bytes`. Little-endian machines only (the mask keeps the low bytes); the caller checks."""
    n = ids.shape[0]
    ones = ~_U0
    q = -shift  # the text byte under the token's first byte
    for k in range(n):
        t = ids[k]
        a, b = offsets[t], offsets[t + 1]
        c = a
        if q < 0:  # the dummy prefix: the stream's first byte (q = -1) must be a space
            if b == a:
                continue
            if buf[a] != 32:
                return compare_token_bytes(ids, buf, offsets, text[:L])
            c = a + 1
        if q + (b - a) > L:
            return compare_token_bytes(ids, buf, offsets, text[:L])
        while c < b:
            w = _load8(buf, c) ^ _load8(text, q + (c - a))
            m = b - c
            if m < 8:
                w &= ~(ones << np.uint64(8 * m))
            if w != _U0:
                return compare_token_bytes(ids, buf, offsets, text[:L])  # a mismatch: the byte loop finds where
            c += 8
        q += b - a
    if q != L:
        return compare_token_bytes(ids, buf, offsets, text[:L])
    return shift, 0


@njit(cache=True, inline="always")
def _stream_status(ids, C, P, h_text, h_space_text, p_len, p_len1):  # pragma: no cover - compiled
    """0 if the token stream's bytes hash and measure as the text, 1 as b" " + text, else -1 (see
    :func:`stream_fidelity`)."""
    h = _U0
    pp = _U1
    for k in range(ids.shape[0]):
        t = ids[k]
        h = h * P[t] + C[t]
        pp *= P[t]
    if pp == p_len and h == h_text:
        return 0
    if pp == p_len1 and h == h_space_text:
        return 1
    return -1


@njit(cache=True, nogil=True)
def stream_fidelity(ti, tC, tP, ri, rC, rP, text, table, base):  # pragma: no cover - compiled
    """Byte fidelity of both tokenizers' ids for one document, by hash: (status of ti, status of ri), each 0
    when the token stream is the text, 1 when it is b" " + text, -1 otherwise (then :func:`compare_token_bytes`
    says where they differ). A stream's hash and length come from the token hashes the counting has just used
    (Hash(A‖B) = Hash(A)·base^|B| + Hash(B): the fold h·P[t] + C[t], and the product of P[t] = base^len(t),
    equal to base^L iff the lengths are equal: base's multiplicative order is >= 2^56), the text's from its
    bytes with the spec's byte ``table`` (uint64 [256]); the hashes must be of a spec without a normalizer.
    Compared with the bytes themselves this reads no token bytes (a random read per token of a vocabulary-sized
    buffer the tokenizers have just evicted from the cache); a stream answered 0 or 1 differs from the text only
    if two different byte strings of the same length collide in 64 bits."""
    L = text.shape[0]
    h = _U0
    for i in range(L):
        h = (h + table[text[i]]) * base
    p_len = _U1  # base^L by squaring
    b = base
    e = L
    while e > 0:
        if e & 1:
            p_len *= b
        b *= b
        e >>= 1
    p_len1 = p_len * base
    h_space = (table[32] * base) * p_len + h  # Hash(b" " + text) = Hash(b" ")·base^L + Hash(text)
    return (_stream_status(ti, tC, tP, h, h_space, p_len, p_len1),
            _stream_status(ri, rC, rP, h, h_space, p_len, p_len1))
