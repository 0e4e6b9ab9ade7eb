"""Coverage counters: feed (target ids, reference ids) per document, get a `Tally` of sums at the end.

Two implementations with one interface (`add`, `partial`, `finish`):

* `HashCounter` — the fast path. N-grams are compared by their 64-bit byte hashes
  (``TokenHashes.ngram_hashes``, joint space across orders) in per-document numba hash sets; the XOR baseline
  uses Engram's token-id mix. Memory: per-document scratch (O(largest document × max_n)), plus the
  corpus-wide set of distinct reference n-gram hashes (`KeySet`, 11–46 bytes each) and the target n-grams
  that their own document's reference did not contain (17 bytes each, resolved against the corpus-wide set
  when they pile up and at the end). Both are bounded by distinct n-grams, not by corpus size.
* `ExactCounter` — the readable reference. N-grams are byte strings (and id tuples for XOR) in Python sets.
  Slow; used by ``--exact-bytes`` and by the tests to check the hash path.

Definitions (docs/coverage.md): for target order n and document d, U_n(d) is the set of distinct valid target
n-grams, R(d) the set of the reference's n-grams of every order 1..max_n. A target n-gram is a hit if it is in
R(d); it is attributed to the smallest reference order it occurs at. Positions: every valid target n-gram
occurrence; a position is an occurrence hit if its n-gram is anywhere in the corpus's reference n-grams.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from polymem.hash.token_hashes import TokenHashes
from polymem.analysis.coverage import _sets as _kernels
from polymem.hash.reference import ngram_bytes
from polymem.hash.xor import xor_multipliers

_FLUSH_KEYS = 1 << 23  # buffered reference keys / pending entries before a compaction (64 MiB of uint64)


@dataclass
class Tally:
    """Sums over documents, per target order n (index n-1) and reference order m (index m-1)."""

    max_n: int
    docs: int = 0
    tokens_target: int = 0
    tokens_reference: int = 0
    uniq: np.ndarray = field(init=False)  # int64 [N]     Σ_d |U_n(d)|
    hits: np.ndarray = field(init=False)  # int64 [N, N]  Σ_d hits of order n first found at reference order m
    share: np.ndarray = field(init=False)  # float64 [N]  Σ_d hits_n(d) / |U_n(d)| over docs with |U_n(d)| > 0
    share_by_ref: np.ndarray = field(init=False)  # float64 [N, N]
    docs_with: np.ndarray = field(init=False)  # int64 [N] docs with |U_n(d)| > 0
    positions: np.ndarray = field(init=False)  # int64 [N] valid target n-gram positions
    pos_hits: np.ndarray = field(init=False)  # int64 [N] positions whose n-gram the corpus's reference has
    xor_uniq: np.ndarray = field(init=False)  # int64 [N]
    xor_hits: np.ndarray = field(init=False)  # int64 [N]
    xor_share: np.ndarray = field(init=False)  # float64 [N]
    xor_docs_with: np.ndarray = field(init=False)  # int64 [N]

    def __post_init__(self) -> None:
        N = self.max_n
        for name in ("uniq", "docs_with", "positions", "pos_hits", "xor_uniq", "xor_hits", "xor_docs_with"):
            setattr(self, name, np.zeros(N, dtype=np.int64))
        self.hits = np.zeros((N, N), dtype=np.int64)
        self.share = np.zeros(N, dtype=np.float64)
        self.xor_share = np.zeros(N, dtype=np.float64)
        self.share_by_ref = np.zeros((N, N), dtype=np.float64)

    def add_doc(self, uniq: np.ndarray, hits: np.ndarray, xor_uniq: np.ndarray, xor_hits: np.ndarray) -> None:
        """One document's unique-set counts: uniq [N], hits [N, N], xor_uniq [N], xor_hits [N]."""
        self.docs += 1
        has = uniq > 0
        denom = np.where(has, uniq, 1).astype(np.float64)
        self.uniq += uniq
        self.hits += hits
        self.docs_with += has
        self.share += np.where(has, hits.sum(axis=1) / denom, 0.0)
        self.share_by_ref += np.where(has[:, None], hits / denom[:, None], 0.0)
        xhas = xor_uniq > 0
        self.xor_uniq += xor_uniq
        self.xor_hits += xor_hits
        self.xor_docs_with += xhas
        self.xor_share += np.where(xhas, xor_hits / np.where(xhas, xor_uniq, 1), 0.0)

    def __iadd__(self, other: "Tally") -> "Tally":
        for name in ("docs", "tokens_target", "tokens_reference"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("uniq", "hits", "share", "share_by_ref", "docs_with", "positions", "pos_hits", "xor_uniq",
                     "xor_hits", "xor_share", "xor_docs_with"):
            getattr(self, name)[...] += getattr(other, name)
        return self


def xor_keys(ids: np.ndarray, valid: np.ndarray, mults: tuple[int, ...]) -> np.ndarray:
    """Engram's XOR mix of the n-gram ending at i with its order folded in (Engram's tables are disjoint per
    order): X[i, n-1] = mix(i, n) + n·GOLDEN (mod 2^64), so equal keys mean the same mix at the same order.
    mix is :func:`polymem.hash.xor.xor_mixes`; the numba kernel fuses it (:func:`_sets.xor_keys`).

    ids int [T], valid bool [T, N] (the byte path's validity: before the start or with a special token ->
    invalid) -> uint64 [T, N]; invalid entries are 0.
    """
    return _kernels.xor_keys(np.ascontiguousarray(ids, dtype=np.int64), np.ascontiguousarray(valid),
                             np.asarray(mults, dtype=np.uint64))


def _pow2(n: int) -> int:
    return 1 << max(4, int(n - 1).bit_length())


class KeySet:
    """A growable set of uint64 keys for the corpus-wide reference n-grams: 2^8 cache-sized sub-tables, filled
    and probed one sub-table at a time (:func:`polymem.analysis.coverage._sets.pset_insert`). ~11–46 bytes per key
    (load kept between 0.17 and 0.7)."""

    _BITS = 8
    _CHUNK = 1 << 21
    _LOAD = 0.7

    def __init__(self, slots_per_table: int = 1 << 13) -> None:
        self.tab = np.zeros((1 << self._BITS, slots_per_table), dtype=np.uint64)
        self.count = 0

    def add(self, keys: np.ndarray) -> None:
        for lo in range(0, keys.shape[0], self._CHUNK):
            chunk = keys[lo:lo + self._CHUNK]
            while self.count + chunk.shape[0] > self._LOAD * self.tab.size:
                self._grow()
            self.count += int(_kernels.pset_insert(self.tab, chunk, 64 - self._BITS))

    def _grow(self) -> None:
        new = np.zeros((self.tab.shape[0], 4 * self.tab.shape[1]), dtype=np.uint64)  # x4: fewer rehashes
        _kernels.pset_rehash(self.tab, new)
        self.tab = new

    def contains(self, keys: np.ndarray) -> np.ndarray:
        if keys.shape[0] == 0:
            return np.zeros(0, dtype=bool)
        return _kernels.pset_contains(self.tab, keys, 64 - self._BITS)

    def keys(self) -> np.ndarray:
        return self.tab[self.tab != 0]


@dataclass
class HashPartial:
    """What one HashCounter hands back (picklable): its tally, reference keys and unresolved target entries."""

    tally: Tally
    ref: np.ndarray  # uint64 distinct reference keys (the worker's KeySet contents)
    pend_h: np.ndarray  # uint64
    pend_n: np.ndarray  # int8 (order - 1)
    pend_c: np.ndarray  # int64
    keyset: KeySet | None = None  # set in-process (workers=1) to skip rebuilding it


class HashCounter:
    """Fast coverage counter over 64-bit byte hashes (see the module docstring)."""

    def __init__(self, target: TokenHashes, reference: TokenHashes, max_n: int, *, occurrence: bool = True) -> None:
        self.target, self.reference, self.max_n, self.occurrence = target, reference, max_n, occurrence
        self.tally = Tally(max_n)
        self._mults = xor_multipliers(max_n)
        self._cap_r = self._cap_t = 0
        self._alive = np.zeros(0, dtype=np.bool_)
        self._ref_out, self._pend_h, self._pend_n, self._pend_c = _EMPTY_U64, _EMPTY_U64, _EMPTY_I8, _EMPTY_I64
        self._refset = KeySet()
        self._ref_chunks: list[np.ndarray] = []
        self._ref_buffered = 0
        self._pend: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._pend_buffered = 0

    def _scratch(self, cap_r: int, cap_t: int) -> None:
        if cap_r > self._cap_r:
            self._cap_r = cap_r
            self._rt = np.zeros(cap_r, dtype=np.uint64)
        if cap_r > self._alive.shape[0]:
            self._alive = np.zeros(cap_r, dtype=np.bool_)
        if cap_t > self._cap_t:
            self._cap_t = cap_t
            self._tt = np.zeros((cap_t, 2), dtype=np.uint64)
            self._tlist = np.zeros(cap_t, dtype=np.int64)

    def add(self, target_ids: np.ndarray, reference_ids: np.ndarray) -> None:
        """Count one document, given its ids under the target and the reference tokenizer."""
        N, t = self.max_n, self.tally
        tH, tV = self.target.ngram_hashes(target_ids, N)  # [Tt, N]
        rH, rV = self.reference.ngram_hashes(reference_ids, N)  # [Tr, N]
        Tt, Tr = tH.shape[0], rH.shape[0]
        t.tokens_target += Tt
        t.tokens_reference += Tr
        cr, ct = _pow2(3 * Tr * N // 2 + 1), _pow2(3 * Tt // 2 + 1)  # load ≤ 2/3; target: one order at a time
        self._scratch(cr, ct)
        rt, tt, tlist = self._rt[:cr], self._tt[:ct], self._tlist[:ct]
        uniq = np.zeros(N, dtype=np.int64)
        hits = np.zeros((N, N), dtype=np.int64)
        occ = self.occurrence
        if occ:  # output buffers, reused across documents (fresh large arrays would page-fault every time)
            if self._ref_out.shape[0] < Tr * N:
                self._ref_out = np.empty(_pow2(Tr * N), dtype=np.uint64)
            if self._pend_h.shape[0] < Tt * N:
                k = _pow2(Tt * N)
                self._pend_h, self._pend_n, self._pend_c = (np.empty(k, np.uint64), np.empty(k, np.int8),
                                                            np.empty(k, np.int64))
        ref_out, pend_h, pend_n, pend_c = self._ref_out, self._pend_h, self._pend_n, self._pend_c
        n_ref, n_pend = _kernels.doc_scan(
            tH, tV, rH, rV, rt, tt, tlist, occ,
            uniq, hits, t.positions, t.pos_hits, ref_out, pend_h, pend_n, pend_c,
        )
        # the XOR baseline: Engram's token-id mix, same multipliers for both tokenizers, order folded into the key
        tX = xor_keys(target_ids, tV, self._mults)
        rX = xor_keys(reference_ids, rV, self._mults)
        xuniq = np.zeros(N, dtype=np.int64)
        xhits = np.zeros(N, dtype=np.int64)
        _kernels.xor_scan(tX, tV, rX, rV, tt, tlist, self._alive[:Tr], xuniq, xhits)
        t.add_doc(uniq, hits, xuniq, xhits)
        if occ:
            if n_ref:
                self._ref_chunks.append(ref_out[:n_ref].copy())
                self._ref_buffered += n_ref
            if n_pend:
                self._pend.append((pend_h[:n_pend].copy(), pend_n[:n_pend].copy(), pend_c[:n_pend].copy()))
                self._pend_buffered += n_pend
            if self._ref_buffered >= KeySet._CHUNK:
                self._flush_ref()
            if self._pend_buffered >= _FLUSH_KEYS:
                self._flush_ref()
                self._resolve_pending()

    def _flush_ref(self) -> None:
        if self._ref_chunks:
            self._refset.add(np.concatenate(self._ref_chunks))
            self._ref_chunks, self._ref_buffered = [], 0

    def _pending(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if not self._pend:
            return _EMPTY_U64, _EMPTY_I8, _EMPTY_I64
        h, n, c = (np.concatenate(x) for x in zip(*self._pend))
        return h, n, c

    def _resolve_pending(self) -> None:
        """Count pending entries already in the reference set (it only grows); keep the rest for later."""
        h, n, c = self._pending()
        found = self._refset.contains(h)
        self.tally.pos_hits += np.bincount(n[found], weights=c[found], minlength=self.max_n).astype(np.int64)
        keep = ~found
        self._pend = [(h[keep], n[keep], c[keep])]
        self._pend_buffered = int(keep.sum())

    def partial(self, *, in_process: bool = False, keys: bool = True) -> HashPartial:
        """This counter's share. ``in_process`` hands over the reference set itself instead of its keys;
        ``keys=False`` first resolves the pending entries against this counter's own set and sends no keys
        (the worker pool then resolves the rest with :meth:`lookup` in the other workers)."""
        self._flush_ref()
        if not keys:
            self._resolve_pending()
        h, n, c = self._pending()
        if in_process:
            return HashPartial(tally=self.tally, ref=_EMPTY_U64, pend_h=h, pend_n=n, pend_c=c, keyset=self._refset)
        return HashPartial(tally=self.tally, ref=self._refset.keys() if keys else _EMPTY_U64, pend_h=h, pend_n=n,
                           pend_c=c)

    def partition_output(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(distinct reference keys, unresolved target keys, their orders - 1, their counts) after resolving the
        pending entries against this counter's own reference set: what a corpus partition hands to the
        bucketed occurrence pass (:mod:`polymem.analysis.coverage.dist`)."""
        self._flush_ref()
        self._resolve_pending()
        h, n, c = self._pending()
        return self._refset.keys(), h, n, c

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """bool [len(keys)]: which keys this counter's reference set holds (after flushing it)."""
        self._flush_ref()
        return self._refset.contains(keys)

    @staticmethod
    def settle(partial: HashPartial, found: np.ndarray) -> None:
        """Count the pending entries marked ``found`` and drop all pending entries (they are settled)."""
        N = partial.tally.max_n
        partial.tally.pos_hits += np.bincount(partial.pend_n[found], weights=partial.pend_c[found],
                                              minlength=N).astype(np.int64)
        partial.pend_h, partial.pend_n, partial.pend_c = _EMPTY_U64, _EMPTY_I8, _EMPTY_I64

    @staticmethod
    def finish(partials: list[HashPartial]) -> Tally:
        """Merge partials (one per worker): sum the tallies, then resolve every pending target n-gram against
        the union of all reference sets."""
        N = partials[0].tally.max_n
        total = Tally(N)
        for p in partials:
            total += p.tally
        if len(partials) == 1 and partials[0].keyset is not None:
            refset = partials[0].keyset
        else:
            refset = KeySet()
            for p in partials:
                if p.keyset is not None:
                    refset.add(p.keyset.keys())
                refset.add(p.ref)
        for p in partials:
            found = refset.contains(p.pend_h)
            total.pos_hits += np.bincount(p.pend_n[found], weights=p.pend_c[found], minlength=N).astype(np.int64)
        return total

    def finish_one(self) -> Tally:
        return HashCounter.finish([self.partial(in_process=True)])


_EMPTY_U64 = np.empty(0, dtype=np.uint64)
_EMPTY_I8 = np.empty(0, dtype=np.int8)
_EMPTY_I64 = np.empty(0, dtype=np.int64)


# ------------------------------------------------------------------------------------------------ exact path
class ExactCounter:
    """The readable reference: n-grams as byte strings (and id tuples for XOR) in Python sets and Counters.

    Same definitions and outputs as HashCounter, with no hashing at all, so it also checks the hash path.
    """

    def __init__(self, target_bytes: list[bytes | None], reference_bytes: list[bytes | None], max_n: int,
                 *, occurrence: bool = True) -> None:
        self.tb, self.rb, self.max_n, self.occurrence = target_bytes, reference_bytes, max_n, occurrence
        self.tally = Tally(max_n)
        self.ref_all: set[bytes] = set()
        self.tgt_all: list[Counter[bytes]] = [Counter() for _ in range(max_n)]

    def _ngrams(self, ids: np.ndarray, table: list[bytes | None]) -> list[list[tuple[bytes, tuple[int, ...]]]]:
        """[n-1] -> list of (bytes, ids) of every valid n-gram, in position order."""
        ids_l = ids.tolist()
        out: list[list[tuple[bytes, tuple[int, ...]]]] = [[] for _ in range(self.max_n)]
        for i, row in enumerate(ngram_bytes(table, ids_l, self.max_n)):
            for n, b in enumerate(row, start=1):
                if b is None:
                    break  # reaches before the start, or holds a special token: invalid (and so are longer ones)
                out[n - 1].append((b, tuple(ids_l[i - n + 1 : i + 1])))
        return out

    def add(self, target_ids: np.ndarray, reference_ids: np.ndarray) -> None:
        N, t = self.max_n, self.tally
        tg = self._ngrams(np.asarray(target_ids), self.tb)
        rg = self._ngrams(np.asarray(reference_ids), self.rb)
        t.tokens_target += len(target_ids)
        t.tokens_reference += len(reference_ids)
        ref_min: dict[bytes, int] = {}  # byte string -> smallest reference order (1-based)
        for m in range(N, 0, -1):
            for b, _ in rg[m - 1]:
                ref_min[b] = m
        ref_ids = [{ids for _, ids in rg[m]} for m in range(N)]
        uniq = np.zeros(N, dtype=np.int64)
        hits = np.zeros((N, N), dtype=np.int64)
        xuniq = np.zeros(N, dtype=np.int64)
        xhits = np.zeros(N, dtype=np.int64)
        for n in range(N):
            uset = {b for b, _ in tg[n]}
            uniq[n] = len(uset)
            for b in uset:
                if b in ref_min:
                    hits[n, ref_min[b] - 1] += 1
            xset = {ids for _, ids in tg[n]}
            xuniq[n] = len(xset)
            xhits[n] = len(xset & ref_ids[n])
            t.positions[n] += len(tg[n])
            if self.occurrence:
                self.tgt_all[n].update(b for b, _ in tg[n])
        if self.occurrence:
            self.ref_all.update(ref_min)
        t.add_doc(uniq, hits, xuniq, xhits)

    def partial(self, *, in_process: bool = False, keys: bool = True) -> "ExactCounter":
        return self

    @staticmethod
    def finish(partials: list["ExactCounter"]) -> Tally:
        N = partials[0].max_n
        total = Tally(N)
        ref: set[bytes] = set()
        for p in partials:
            total += p.tally
            ref |= p.ref_all
        for p in partials:
            for n in range(N):
                total.pos_hits[n] += sum(c for b, c in p.tgt_all[n].items() if b in ref)
        return total

    def finish_one(self) -> Tally:
        return ExactCounter.finish([self])
