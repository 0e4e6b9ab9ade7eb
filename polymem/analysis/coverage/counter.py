"""Coverage counters: feed (target ids, reference ids) per document, get a `Tally` of sums at the end.

Two implementations with one interface (`add`, then `finish_one`):

* `HashCounter` — the fast path. N-grams are compared by their 64-bit byte hashes
  (``TokenHashes.ngram_hashes``, joint space across orders) in per-document numba hash sets; the XOR baseline
  uses Engram's token-id mix. Memory: per-document scratch (O(largest document × max_n)), plus, for the
  occurrence-weighted metric, flat buffers of each document's distinct reference n-gram hashes and of the
  target n-grams that their own document's reference did not contain (17 bytes each); both are grouped by key
  bucket at the end (`HashCounter.occurrence_output`) and settled by the reduce of the occurrence pass. On the partitioned path a
  counter sees one partition, so this is bounded by the partition (:mod:`polymem.analysis.coverage.dist`).
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
from typing import Any

import numpy as np

from polymem.errors import PolymemError
from polymem.hash.token_hashes import TokenHashes
from polymem.analysis.coverage import _buckets
from polymem.analysis.coverage import _sets as _kernels
from polymem.hash.reference import ngram_bytes
from polymem.hash.xor import xor_multipliers



SHARE_BITS = 40  # per-document shares are summed as integers of 2^-40: exact, so in any order and grouping
_SHARE_ONE = float(1 << SHARE_BITS)
_FOLD_DOCS = 1 << 22  # int64 partial sums of at most 2^22 shares of at most 2^40 each cannot overflow
_SHARES = ("share", "share_by_ref", "xor_share")


@dataclass
class Tally:
    """Sums over documents, per target order n (index n-1) and reference order m (index m-1).

    Every sum is exact, so tallies add up to the same numbers in any order and grouping (one process or any
    partitioning of the corpus over Dask workers): counts are integers, and the per-document shares are summed
    as integers of 2^-40 (``*_fx``: Python ints; each document's share rounded once, to 1e-12)."""

    max_n: int
    docs: int = 0
    tokens_target: int = 0
    tokens_reference: int = 0
    uniq: np.ndarray = field(init=False)  # int64 [N]     Σ_d |U_n(d)|
    hits: np.ndarray = field(init=False)  # int64 [N, N]  Σ_d hits of order n first found at reference order m
    share_fx: np.ndarray = field(init=False)  # object [N] Σ_d round(2^40 hits_n(d) / |U_n(d)|), |U_n(d)| > 0
    share_by_ref_fx: np.ndarray = field(init=False)  # object [N, N]
    docs_with: np.ndarray = field(init=False)  # int64 [N] docs with |U_n(d)| > 0
    positions: np.ndarray = field(init=False)  # int64 [N] valid target n-gram positions
    pos_hits: np.ndarray = field(init=False)  # int64 [N] positions whose n-gram the corpus's reference has
    xor_uniq: np.ndarray = field(init=False)  # int64 [N]
    xor_hits: np.ndarray = field(init=False)  # int64 [N]
    xor_share_fx: np.ndarray = field(init=False)  # object [N]
    xor_docs_with: np.ndarray = field(init=False)  # int64 [N]
    _part: dict[str, np.ndarray] = field(init=False, repr=False)  # int64 share sums not yet folded into *_fx
    _unfolded: int = field(init=False, repr=False, default=0)

    def __post_init__(self) -> None:
        N = self.max_n
        for name in ("uniq", "docs_with", "positions", "pos_hits", "xor_uniq", "xor_hits", "xor_docs_with"):
            setattr(self, name, np.zeros(N, dtype=np.int64))
        self.hits = np.zeros((N, N), dtype=np.int64)
        shapes = {"share": (N,), "share_by_ref": (N, N), "xor_share": (N,)}
        for name, shape in shapes.items():
            setattr(self, name + "_fx", np.zeros(shape, dtype=np.int64).astype(object))
        self._part = {name: np.zeros(shape, dtype=np.int64) for name, shape in shapes.items()}
        self._unfolded = 0

    def add_doc(self, uniq: np.ndarray, hits: np.ndarray, xor_uniq: np.ndarray, xor_hits: np.ndarray) -> None:
        """One document's unique-set counts: uniq [N], hits [N, N], xor_uniq [N], xor_hits [N]."""
        self.docs += 1
        part = self._part
        _kernels.tally_doc(np.asarray(uniq, np.int64), np.asarray(hits, np.int64), np.asarray(xor_uniq, np.int64),
                           np.asarray(xor_hits, np.int64), self.uniq, self.hits, self.docs_with, part["share"],
                           part["share_by_ref"], self.xor_uniq, self.xor_hits, self.xor_docs_with,
                           part["xor_share"], _SHARE_ONE)
        self._unfolded += 1
        if self._unfolded >= _FOLD_DOCS:
            self._fold()

    def _fold(self) -> None:
        """Move the int64 partial share sums into the exact (Python int) ones."""
        for name in _SHARES:
            setattr(self, name + "_fx", getattr(self, name + "_fx") + self._part[name].astype(object))
            self._part[name][...] = 0
        self._unfolded = 0

    def _share(self, name: str) -> np.ndarray:
        self._fold()
        exact = getattr(self, name + "_fx")
        return np.array([float(v) for v in exact.ravel()], dtype=np.float64).reshape(exact.shape) / _SHARE_ONE

    @property
    def share(self) -> np.ndarray:
        """float64 [N]: Σ_d hits_n(d) / |U_n(d)| over documents with |U_n(d)| > 0 (from the exact sum)."""
        return self._share("share")

    @property
    def share_by_ref(self) -> np.ndarray:
        """float64 [N, N]: the same, split by the smallest reference order."""
        return self._share("share_by_ref")

    @property
    def xor_share(self) -> np.ndarray:
        """float64 [N]: Σ_d of the XOR baseline's per-document shares."""
        return self._share("xor_share")

    def __iadd__(self, other: "Tally") -> "Tally":
        for name in ("docs", "tokens_target", "tokens_reference"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("uniq", "hits", "docs_with", "positions", "pos_hits", "xor_uniq", "xor_hits",
                     "xor_docs_with"):
            getattr(self, name)[...] += getattr(other, name)
        self._fold()
        other._fold()
        for name in _SHARES:
            setattr(self, name + "_fx", getattr(self, name + "_fx") + getattr(other, name + "_fx"))
        return self


_COMPACT_KEYS = 1 << 23  # buffered reference keys (64 MiB) before they are deduplicated in place
_RESERVE = 1 << 23  # entries the occurrence buffers start with (address space: 64 MiB of keys)
BUCKET_BITS = 10  # key buckets of the occurrence pass (the top bits of a stored key; see _buckets.bucket_unique)


@dataclass
class OccurrenceOutput:
    """What a counter hands to the corpus-wide occurrence pass: each document's distinct reference keys and its
    target entries that its own reference did not hold, both grouped by key bucket (offsets int64
    [2^BUCKET_BITS + 1]); a key may repeat across documents (the reduce's table deduplicates)."""

    ref: np.ndarray  # uint64 stored reference keys (distinct per document)
    ref_off: np.ndarray
    pend_h: np.ndarray  # uint64 stored keys of target n-grams that their own document's reference did not hold
    pend_n: np.ndarray  # int8 their order - 1
    pend_c: np.ndarray  # int64 their number of positions
    pend_off: np.ndarray
    scratch: Any = field(default=None, repr=False)  # the pooled buffers these arrays are views of, if any

    def release(self) -> None:
        """Hand the pooled buffers these arrays view back for the next partition in this process (the arrays
        must not be used afterwards); nothing for an output that owns its arrays."""
        if self.scratch is not None:
            if len(_GROUP_SPARE) < SPARES[0]:
                _GROUP_SPARE.append(self.scratch)
            self.scratch = None


class HashCounter:
    """Fast coverage counter over 64-bit byte hashes (see the module docstring).

    For the occurrence-weighted metric each document's distinct reference keys and unresolved target entries
    are appended to flat buffers (no per-document copies or set inserts); :meth:`occurrence_output` groups them
    by key bucket for the reduce (:func:`_buckets.resolve_range`), which deduplicates the keys and looks the
    entries up, bucket by bucket in small tables. The buffers hold at most the counter's documents' n-grams (a partition's, on the partitioned
    path); beyond ``compact_keys`` buffered reference keys they are deduplicated in place."""

    def __init__(self, target: TokenHashes, reference: TokenHashes, max_n: int, *, occurrence: bool = True,
                 compact_keys: int = _COMPACT_KEYS) -> None:
        self.target, self.reference, self.max_n, self.occurrence = target, reference, max_n, occurrence
        self.tally = Tally(max_n)
        self._mults = xor_multipliers(max_n)
        self._mults_u64 = np.asarray(self._mults, dtype=np.uint64)
        self._tables = tuple(_kernels.ScanTables(tC=target.C, tP=target.P, tspecial=target.special, rC=reference.C,
                                                 rP=reference.P, rspecial=reference.special, mults=self._mults_u64))
        self._posbuf: Any = None
        self._scan: tuple[np.ndarray, ...] | None = None  # the scan's scratch as the kernel takes it
        self._seen: Any = None  # the fused kernel's stamps per target id, and the stamp of the last document
        self._xseen: Any = None
        self._stamp = 0
        self._cap_r = self._cap_t = 0
        self._surv = np.zeros(0, dtype=np.int64)
        self._racc = self._rh = self._rm = np.zeros(0, dtype=np.uint64)
        self._compact = int(compact_keys)
        self._ref, self._ph, self._pn, self._pc = _take_buffers() if occurrence else _NO_BUFFERS
        self._nref = self._npend = 0

    def _scratch(self, cap_r: int, cap_t: int, Tr: int, T: int) -> tuple[np.ndarray, ...]:
        """The scan's scratch (:class:`_sets.ScanScratch`, as a plain tuple) for a document of Tr reference and
        at most T tokens (reference set of cap_r entries, target sets of cap_t): grown when too small, else the
        tuple of the previous document."""
        if self._scan is not None and cap_r <= self._cap_r and cap_t <= self._cap_t and \
                Tr <= self._surv.shape[0] and T <= self._posbuf[0].shape[0]:
            return self._scan
        if self._seen is None:
            V = self.target.C.shape[0]
            self._seen, self._xseen = np.zeros(V, np.int64), np.zeros(V, np.int64)
        if cap_r > self._cap_r:
            self._cap_r = cap_r
            self._rt = np.zeros(cap_r, dtype=np.uint64)
        if Tr > self._surv.shape[0]:
            n = _pow2(Tr)
            self._surv = np.zeros(n, dtype=np.int64)
            self._racc, self._rh, self._rm = (np.zeros(n, dtype=np.uint64) for _ in range(3))
        if cap_t > self._cap_t:
            self._cap_t = cap_t
            self._tk, self._tv, self._tf = (np.zeros(cap_t, dtype=np.uint64) for _ in range(3))  # the target set
            self._vt = np.zeros((cap_t, 2), dtype=np.uint64)
            self._tlist = np.zeros(cap_t, dtype=np.int64)
        pos, run_t, run_r = self._pos(T)
        self._scan = tuple(_kernels.ScanScratch(
            rt=self._rt, tk=self._tk, tv=self._tv, tf=self._tf, tlist=self._tlist, vt=self._vt, pos=pos, run_t=run_t,
            run_r=run_r, surv=self._surv, racc=self._racc, rh=self._rh, rm=self._rm, seen=self._seen,
            xseen=self._xseen))
        return self._scan

    def _room(self, n_ref: int, n_pend: int) -> None:
        """Make the occurrence buffers hold n_ref more reference keys and n_pend more pending entries."""
        if self._nref + n_ref > self._ref.shape[0]:
            if self._nref >= self._compact:
                self._compact_ref()
            need = self._nref + n_ref
            if need > self._ref.shape[0]:
                # the first buffer is reserved big (np.empty: address space, its pages come as they are written),
                # so a partition rarely pays the copies of growing it
                new = np.empty(_pow2(max(need, 2 * self._ref.shape[0], min(self._compact, _RESERVE))),
                               dtype=np.uint64)
                new[:self._nref] = self._ref[:self._nref]
                self._ref = new
        need = self._npend + n_pend
        if need > self._ph.shape[0]:
            k = _pow2(max(need, 2 * self._ph.shape[0], _RESERVE // 2))
            for name, dt in (("_ph", np.uint64), ("_pn", np.int8), ("_pc", np.int64)):
                new = np.empty(k, dtype=dt)
                new[:self._npend] = getattr(self, name)[:self._npend]
                setattr(self, name, new)

    def _compact_ref(self) -> None:
        """Deduplicate the buffered reference keys in place (they stay a prefix of the buffer)."""
        keys, _ = _buckets.bucket_unique(self._ref, self._nref, BUCKET_BITS)
        self._ref[:keys.shape[0]] = keys
        self._nref = keys.shape[0]
        # still more than half full after deduplicating: let the buffer grow instead of compacting again soon
        self._compact = max(self._compact, 2 * self._nref)

    def _pos(self, T: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The fused kernel's per-position scratch: uint64 [>= T, 4] and two int64 [>= T]."""
        if self._posbuf is None or self._posbuf[0].shape[0] < T:
            n = _pow2(T)
            self._posbuf = (np.empty((n, 4), np.uint64), np.empty(n, np.int64), np.empty(n, np.int64))
        return self._posbuf

    def add(self, target_ids: Any, reference_ids: Any) -> None:
        """Count one document, given its ids under the target and the reference tokenizer: 1-D sequences of
        integers in range of each vocabulary (a tokenizer's own int64 arrays go straight to the kernel; anything
        else is checked, with a clear error for bad ids, and converted)."""
        if not _own_ids(target_ids, self.target):
            target_ids = _checked_ids(target_ids, self.target, "target")
        if not _own_ids(reference_ids, self.reference):
            reference_ids = _checked_ids(reference_ids, self.reference, "reference")
        self._add_ids(target_ids, reference_ids)

    def _add_ids(self, target_ids: np.ndarray, reference_ids: np.ndarray) -> None:
        """:meth:`add` for a tokenizer's own ids (int64 [T], in range): one fused kernel, :func:`_sets.doc_scan_ids`."""
        N, t = self.max_n, self.tally
        Tt, Tr = target_ids.shape[0], reference_ids.shape[0]
        t.tokens_target += Tt
        t.tokens_reference += Tr
        cr, ct = _pow2(3 * Tr * N // 2 + 1), _pow2(3 * Tt // 2 + 1)  # load ≤ 2/3; target: one order at a time
        scratch = self._scratch(cr, ct, Tr, max(Tt, Tr))
        self._stamp += 1
        uniq, xuniq, xhits = (np.zeros(N, dtype=np.int64) for _ in range(3))
        hits = np.zeros((N, N), dtype=np.int64)
        occ = self.occurrence
        if occ:  # the document's keys go straight into the counter's buffers (room for Tr·N and Tt·N)
            self._room(Tr * N, Tt * N)
            nr, npd = self._nref, self._npend
            ref_out, pend_h, pend_n, pend_c = self._ref[nr:], self._ph[npd:], self._pn[npd:], self._pc[npd:]
        else:
            ref_out, pend_h, pend_n, pend_c = _EMPTY_U64, _EMPTY_U64, _EMPTY_I8, _EMPTY_I64
        counts = _kernels.ScanCounts(uniq, hits, t.positions, t.pos_hits, xuniq, xhits)
        keys = _kernels.ScanKeys(ref_out, pend_h, pend_n, pend_c)
        # plain tuples: see _sets.doc_scan_ids
        n_ref, n_pend = _kernels.doc_scan_ids(target_ids, reference_ids, self._tables, scratch, self._stamp, occ,
                                              tuple(counts), tuple(keys))
        self._nref += n_ref
        self._npend += n_pend
        t.add_doc(uniq, hits, xuniq, xhits)

    def occurrence_bytes(self) -> int:
        """Bytes :meth:`occurrence_output` would hand back now (its arrays and their offsets)."""
        return 8 * self._nref + 17 * self._npend + 16 * ((1 << BUCKET_BITS) + 1)

    def occurrence_output(self, views: bool = False) -> OccurrenceOutput:
        """Group the buffered reference keys and pending target entries by bucket and hand them back; the
        buffers are emptied. What a corpus partition gives the bucketed occurrence pass
        (:mod:`polymem.analysis.coverage.dist`), whose reduce deduplicates the keys and looks the entries up.

        The grouping runs in scratch reused across partitions in this process. views: hand back views of that
        scratch (call ``release()`` on the output when done with it) instead of copies."""
        g = _take_group_scratch(self._nref, self._npend)
        ref_off, pend_off = _buckets.bucket_group_into(
            self._ref, self._nref, self._ph, self._pn, self._pc, self._npend, BUCKET_BITS, *g)
        w, wp = self._nref, self._npend
        grouped, gh, gn, gc = g
        out = OccurrenceOutput(grouped[:w], ref_off, gh[:wp], gn[:wp], gc[:wp], pend_off, scratch=g)
        if not views:
            out = OccurrenceOutput(out.ref.copy(), ref_off, out.pend_h.copy(), out.pend_n.copy(), out.pend_c.copy(),
                                   pend_off)
            if len(_GROUP_SPARE) < SPARES[0]:
                _GROUP_SPARE.append(g)
        if self._ref.shape[0]:  # the next counter in this process reuses the buffers (no regrowth, no page faults)
            if len(_SPARE) < SPARES[0]:
                _SPARE.append((self._ref, self._ph, self._pn, self._pc))
        self._ref, self._ph, self._pn, self._pc = _NO_BUFFERS
        self._nref = self._npend = 0
        return out

    def finish_one(self) -> Tally:
        """The tally of everything added, the occurrence-weighted hits settled against this counter's own
        reference keys (the whole corpus, when one counter saw it all)."""
        if self.occurrence:
            occ = self.occurrence_output(views=True)
            _buckets.resolve_range(occ.ref, occ.ref_off[None, :], occ.pend_h, occ.pend_n, occ.pend_c,
                                   occ.pend_off[None, :], BUCKET_BITS, self.tally.pos_hits)
            occ.release()
        return self.tally


def _pow2(n: int) -> int:
    return 1 << max(4, int(n - 1).bit_length())


def _checked_ids(ids: Any, cache: TokenHashes, side: str) -> np.ndarray:
    """A document's ids as the fused kernel takes them (contiguous int64 [T], in range), or a clear error."""
    arr = cache.check_ids(ids)
    if arr.ndim != 1:
        raise PolymemError(f"{side} ids of one document must be 1-D (a sequence of token ids), got shape "
                           f"{arr.shape}; pass one document's ids per add() call")
    return np.ascontiguousarray(arr)


def _own_ids(ids: Any, cache: TokenHashes) -> bool:
    """True for a tokenizer's own ids: a 1-D int64 array with every id in the vocabulary."""
    return (isinstance(ids, np.ndarray) and ids.dtype == np.int64 and ids.ndim == 1
            and _kernels.ids_in_range(ids, cache.C.shape[0]))


_EMPTY_U64 = np.empty(0, dtype=np.uint64)
_EMPTY_I8 = np.empty(0, dtype=np.int8)
_EMPTY_I64 = np.empty(0, dtype=np.int64)
_NO_BUFFERS: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] = (_EMPTY_U64, _EMPTY_U64, _EMPTY_I8, _EMPTY_I64)
# occurrence buffers finished counters left for the next ones in this process (a partition's each; at most
# SPARES[0]: 2, or as many as map tasks have run at once here, a worker's threads)
_SPARE: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
SPARES = [2]


def _take_buffers() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    try:
        return _SPARE.pop()
    except IndexError:  # none (or another thread took the last one)
        return _NO_BUFFERS


# scratch of the bucket grouping (grouped keys; grouped pending keys, orders, counts), reused the same way
_GROUP_SPARE: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []


def _take_group_scratch(n: int, n_pend: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    try:
        g = _GROUP_SPARE.pop()
    except IndexError:  # none (or another thread took the last one)
        g = (_EMPTY_U64, _EMPTY_U64, _EMPTY_I8, _EMPTY_I64)
    if g[0].shape[0] < n:
        g = (np.empty(_pow2(n), dtype=np.uint64), *g[1:])
    if g[1].shape[0] < n_pend:
        k = _pow2(n_pend)
        g = (g[0], np.empty(k, dtype=np.uint64), np.empty(k, dtype=np.int8), np.empty(k, dtype=np.int64))
    return g


def release_buffers() -> None:
    """Drop the occurrence buffers and grouping scratch kept for the next counter in this process (the end of a
    run)."""
    _SPARE.clear()
    _GROUP_SPARE.clear()


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
