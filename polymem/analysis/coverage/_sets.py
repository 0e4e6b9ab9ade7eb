"""numba kernels for coverage: the per-document scan (:func:`doc_scan_ids`: open-addressing sets over 64-bit
n-gram keys) and the per-document tally. The bucketed key sets of the corpus-wide occurrence pass are in
:mod:`._buckets`, the byte-fidelity comparisons in :mod:`._fidelity`.

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

from typing import NamedTuple

import numpy as np
from numba import njit

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


class ScanTables(NamedTuple):
    """What :func:`doc_scan_ids` reads of the tokenizers: their token hashes (C, P, special per token id: the
    target's for its n-grams and for the reference's ids read as target ids, the reference's for its n-grams)
    and the XOR multipliers, uint64 [N] (N = max_n, the orders counted)."""

    tC: np.ndarray
    tP: np.ndarray
    tspecial: np.ndarray
    rC: np.ndarray
    rP: np.ndarray
    rspecial: np.ndarray
    mults: np.ndarray


class ScanScratch(NamedTuple):
    """:func:`doc_scan_ids`' scratch, reused across documents (Tt, Tr: the document's target and reference
    tokens)."""

    rt: np.ndarray  # uint64 [>= pow2(1.5*Tr*N)]: the reference set (its first pow2(1.5*Tr*N) entries), entries
    #                 (key & ~31) | (smallest order - 1)
    tk: np.ndarray  # uint64 [>= pow2(1.5*Tt)]: one target order's set: keys...
    tv: np.ndarray  # ... count << 16 | XOR hit...
    tf: np.ndarray  # ... the XOR key of the first id n-gram with these bytes
    tlist: np.ndarray  # int64 [same]: slots of the distinct target entries, in insertion order
    vt: np.ndarray  # uint64 [same, 2]: XOR keys of further id n-grams with the same bytes (rare), hit flag
    pos: np.ndarray  # uint64 [>= max(Tt, Tr), 4]: per position, the current order's byte hash and XOR
    #                  accumulator, and the token's C and P (what a position's update reads is one cache line)
    run_t: np.ndarray  # int64 [>= Tt]: non-special tokens ending at each position
    run_r: np.ndarray  # int64 [>= Tr]
    surv: np.ndarray  # int64 [>= Tr]: the XOR lookups of the reference: the positions still alive (a list),
    racc: np.ndarray  # uint64 [>= Tr] ... their XOR key,
    rh: np.ndarray  # ... their target byte hash,
    rm: np.ndarray  # ... its base power
    seen: np.ndarray  # int64 [target vocabulary]: stamps (the document's stamp is above every stamp in them)
    xseen: np.ndarray


class ScanCounts(NamedTuple):
    """:func:`doc_scan_ids`' counts, added to (+=): int64 [N], [N, N], [N], [N], [N], [N]."""

    uniq: np.ndarray  # distinct target n-grams per order
    hits: np.ndarray  # ... found in the reference, by (target order, smallest reference order)
    positions: np.ndarray  # valid target n-gram positions
    pos_hits: np.ndarray  # ... whose n-gram the document's own reference has
    xuniq: np.ndarray  # the XOR baseline: distinct target id n-grams
    xhits: np.ndarray  # ... found among the reference's


class ScanKeys(NamedTuple):
    """Where :func:`doc_scan_ids` writes the document's keys for the corpus-wide occurrence pass (``record``)."""

    ref_out: np.ndarray  # uint64 [>= Tr*N]: distinct reference keys
    pend_h: np.ndarray  # uint64 [>= Tt*N]: target keys not found in the document's reference...
    pend_n: np.ndarray  # int8: ... their order - 1
    pend_c: np.ndarray  # int64: ... their number of positions


# The groups go to the kernel as plain tuples (``tuple(group)``): numba types a named tuple argument in Python on
# every call (~35 µs more per document), a plain one in C. The scratch tuple is built once per size of the
# scratch, not per document: the scan sizes its tables itself.
@njit(cache=True, nogil=True)
def doc_scan_ids(
    tids, rids,  # the document's ids: target int64 [Tt], reference int64 [Tr] (in range of their vocabularies)
    tables,  # ScanTables, as a plain tuple
    scratch,  # ScanScratch, as a plain tuple
    stamp,  # this document's stamp in scratch.seen / xseen
    record,  # True: emit distinct reference keys and the not-found target (key, order, count) for the corpus pass
    counts,  # ScanCounts (out, +=), as a plain tuple
    keys,  # ScanKeys (out buffers), as a plain tuple
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
    tC, tP, tspecial, rC, rP, rspecial, mults = tables
    rt, tk, tv, tf, tlist, vt, pos, run_t, run_r, surv, racc, rh, rm, seen, xseen = scratch
    uniq, hits, positions, pos_hits, xuniq, xhits = counts
    ref_out, pend_h, pend_n, pend_c = keys
    N = mults.shape[0]
    Tr = rids.shape[0]
    Tt = tids.shape[0]
    # ---- the reference set, order by order
    rt = rt[:_pow2(3 * Tr * N // 2 + 1)]  # load <= 2/3
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
