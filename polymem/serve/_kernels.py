"""The page service's numba kernels: its chunk index (chunk -> slot), the consumer's lane (a forward's lookups,
reads and row decoding in one compiled call each), and the host loops of :mod:`polymem.torch.pages` (planning a
forward's rows, decoding NF4 rows on the CPU). One call each instead of a dozen small numpy/torch calls, which
cost tens of µs apiece inside a model's forward (cold caches). Results equal the vectorised numpy/torch paths
bit for bit (tests/serve/test_page_service.py runs both). The slots of the state arrays they update are named in
:mod:`._state`; load this module through :func:`._state.kernels`."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from numba import njit

from polymem.asset._ckern import RWF_NOWAIT, crc32c_value, preadv2
from polymem.serve._state import (CODE_BFLOAT16, CODE_FLOAT16, CODE_NF4, K_BYTES, K_CALLS, K_HITS, K_LANE,
                                  K_MISSES, K_NOWAIT, K_READS, KST_SIZE, READING, S_CACHED, S_DECODED, S_HITS,
                                  S_MISSES, S_NFREE, S_PEAK, S_READ_HERE, S_SHARD, S_TOP, STATE_SIZE)

# The annotations are for readers and mypy only: numba types each call from its arguments.
I64s = npt.NDArray[np.int64]
U8s = npt.NDArray[np.uint8]
U32s = npt.NDArray[np.uint32]
F32s = npt.NDArray[np.float32]
Bools = npt.NDArray[np.bool_]
Int = int | np.integer[Any]


@njit(cache=True, nogil=True)
def plan_rows(rows: I64s, rpc: int) -> tuple[I64s, I64s, I64s, Bools, bool]:  # pragma: no cover - compiled
    """rows int64 [M] (-1 = invalid), rows per chunk -> (distinct chunks sorted int64 [n], slot int64 [m] (index
    into chunks of each valid row), inner int64 [m] (row inside its chunk), valid bool [M], all valid)."""
    M = rows.shape[0]
    valid = np.empty(M, np.bool_)
    m = 0
    for i in range(M):
        valid[i] = rows[i] >= 0
        m += valid[i]
    ch = np.empty(m, np.int64)
    inner = np.empty(m, np.int64)
    j = 0
    for i in range(M):
        r = rows[i]
        if r >= 0:
            c = r // rpc
            ch[j] = c
            inner[j] = r - c * rpc
            j += 1
    order = np.argsort(ch)
    slot = np.empty(m, np.int64)
    chunks = np.empty(m, np.int64)
    n = 0
    for k in range(m):
        c = ch[order[k]]
        if n == 0 or chunks[n - 1] != c:
            chunks[n] = c
            n += 1
        slot[order[k]] = n - 1
    return chunks[:n].copy(), slot, inner, valid, m == M


@njit(cache=True, nogil=True, inline="always")
def _nf4_row(src: U8s, base: int, pairs: F32s, half: F32s, out: F32s, i: int) -> bool:  # pragma: no cover - compiled
    """out[i] = the NF4 row at src[base:]: r/2 code bytes (low nibble = even column), then a float16 scale.
    False (out[i] untouched) when the scale is not a finite number >= 0 (NaN fails both comparisons)."""
    h = out.shape[1] // 2
    scale = half[np.int64(src[base + h]) | (np.int64(src[base + h + 1]) << 8)]
    if not (scale >= 0 and scale <= 65504):
        return False
    for j in range(h):
        b = src[base + j]
        out[i, 2 * j] = pairs[b, 0] * scale
        out[i, 2 * j + 1] = pairs[b, 1] * scale
    return True


@njit(cache=True, nogil=True)
def nf4_rows(stage: U8s, slot: I64s, inner: I64s, row_bytes: int, pairs: F32s, half: F32s, out: F32s) -> int:  # pragma: no cover - compiled
    """NF4 rows out of the stage (uint8 [n, chunk_bytes]): row i = chunk slot[i], row inner[i]; each row is r/2
    code bytes (low nibble = even column) then a float16 scale. out[i] = levels * scale in float32, the
    products of :func:`polymem.asset.nf4.dequantize`. pairs: float32 [256, 2] byte -> levels; half: float32
    [65536] float16 bits -> value. Returns -1, or the first i whose scale is bad (not finite, or < 0)."""
    for i in range(slot.shape[0]):
        if not _nf4_row(stage[slot[i]], inner[i] * row_bytes, pairs, half, out, i):
            return i
    return -1


# ------------------------------------------------------------------ the page service's chunk index (chunk -> slot)
# Open addressing over int64 keys (-1 = empty), linear probing, deletion by backward shift (no tombstones), at
# most half full: the service's cache lookups, inserts and evictions, callable from other compiled loops (the
# consumer's lane, :mod:`polymem.serve.service`) and from Python (one call per batch of chunks).
_MIX = np.uint64(0x9E3779B97F4A7C15)


@njit(cache=True, nogil=True, inline="always")
def _home(c: Int, mask: Int) -> np.int64:  # pragma: no cover - compiled
    h: np.int64 = np.int64((np.uint64(c) * _MIX) >> np.uint64(40)) & mask
    return h


@njit(cache=True, nogil=True)
def idx_find(keys: I64s, vals: I64s, c: Int) -> int:  # pragma: no cover - compiled
    """The slot of chunk ``c``, or -1."""
    mask = keys.shape[0] - 1
    i = _home(c, mask)
    while True:
        k = keys[i]
        if k == c:
            v: int = vals[i]
            return v
        if k == -1:
            return -1
        i = (i + 1) & mask


@njit(cache=True, nogil=True)
def idx_put(keys: I64s, vals: I64s, c: Int, v: Int) -> None:  # pragma: no cover - compiled
    """Map chunk ``c`` to slot ``v`` (replaces its slot if present)."""
    mask = keys.shape[0] - 1
    i = _home(c, mask)
    while keys[i] != -1 and keys[i] != c:
        i = (i + 1) & mask
    keys[i] = c
    vals[i] = v


@njit(cache=True, nogil=True)
def idx_del(keys: I64s, vals: I64s, c: Int) -> None:  # pragma: no cover - compiled
    """Forget chunk ``c`` (no-op if absent); later keys of its probe run shift back into the gap."""
    mask = keys.shape[0] - 1
    i = _home(c, mask)
    while keys[i] != c:
        if keys[i] == -1:
            return
        i = (i + 1) & mask
    j = i
    while True:
        j = (j + 1) & mask
        k = keys[j]
        if k == -1:
            break
        h = _home(k, mask)
        # k may move into the gap at i unless its home lies cyclically in (i, j]
        if (i < j and (h <= i or h > j)) or (i > j and h <= i and h > j):
            keys[i] = k
            vals[i] = vals[j]
            i = j
    keys[i] = -1


@njit(cache=True, nogil=True)
def idx_get_many(keys: I64s, vals: I64s, chunks: I64s, out: I64s) -> I64s:  # pragma: no cover - compiled
    for j in range(chunks.shape[0]):
        out[j] = idx_find(keys, vals, chunks[j])
    return out


@njit(cache=True, nogil=True)
def idx_put_many(keys: I64s, vals: I64s, chunks: I64s, slots: I64s) -> None:  # pragma: no cover - compiled
    for j in range(chunks.shape[0]):
        idx_put(keys, vals, chunks[j], slots[j])


@njit(cache=True, nogil=True)
def idx_del_many(keys: I64s, vals: I64s, chunks: I64s) -> None:  # pragma: no cover - compiled
    for j in range(chunks.shape[0]):
        idx_del(keys, vals, chunks[j])


# ------------------------------------------------------------------ decoding rows straight out of the cache

@njit(cache=True, nogil=True)
def rows_from_cache(rows: I64s, rpc: int, keys: I64s, vals: I64s, slab: U8s, row_bytes: int, code: int, pairs: F32s,
                    half: F32s, out: F32s, outw: U32s) -> int:  # pragma: no cover - compiled
    """fp32 rows of a forward decoded from the cache slab: out[i] = row rows.flat[i] (zeros where < 0), its
    chunk found through the index. code: ``_state.DTYPE_CODES``. The same float32 values as the vectorised decoders
    (float16/bfloat16 widened exactly; NF4 levels × the row's float16 scale, as :func:`nf4_rows`). outw: ``out``
    viewed as uint32 (bit copies).
    Returns -1 if a row's chunk is not in the cache (nothing else is wrong), -3 at a bad NF4 scale (the caller's
    general path decodes again and names it), else 0."""
    r = out.shape[1]
    i = 0
    last_c = -1
    s = -1
    for row in rows.flat:
        if row < 0:
            for j in range(r):
                out[i, j] = 0.0
            i += 1
            continue
        c = row // rpc
        if c != last_c:
            s = idx_find(keys, vals, c)
            if s < 0:
                return -1
            last_c = c
        base = (row - c * rpc) * row_bytes
        src = slab[s]
        if code == CODE_NF4:
            if not _nf4_row(src, base, pairs, half, out, i):
                return -3
        elif code == CODE_FLOAT16:
            for j in range(r):
                out[i, j] = half[np.int64(src[base + 2 * j]) | (np.int64(src[base + 2 * j + 1]) << 8)]
        elif code == CODE_BFLOAT16:
            for j in range(r):
                outw[i, j] = (np.uint32(src[base + 2 * j]) << np.uint32(16)) | (np.uint32(src[base + 2 * j + 1]) << np.uint32(24))
        else:
            for j in range(r):
                o = base + 4 * j
                outw[i, j] = (np.uint32(src[o]) | (np.uint32(src[o + 1]) << np.uint32(8)) | (np.uint32(src[o + 2]) << np.uint32(16))
                        | (np.uint32(src[o + 3]) << np.uint32(24)))
        i += 1
    return 0


# ------------------------------------------------------------------ slots of the consumer's lane

@njit(cache=True, nogil=True)
def lane_settle(chunks: I64s, slots: I64s, keys: I64s, vals: I64s, chunk_at: I64s, free: I64s, state: I64s) -> None:  # pragma: no cover - compiled
    """Chunks read into their reserved slots join the index; a chunk someone else cached meanwhile gives its
    slot back. state: the service's (named in ._state)."""
    for j in range(chunks.shape[0]):
        c = chunks[j]
        s = slots[j]
        if idx_find(keys, vals, c) >= 0:
            chunk_at[s] = -1
            free[state[S_NFREE]] = s
            state[S_NFREE] += 1
        else:
            idx_put(keys, vals, c, s)
            chunk_at[s] = c
            state[S_CACHED] += 1
    if state[S_CACHED] > state[S_PEAK]:
        state[S_PEAK] = state[S_CACHED]


@njit(cache=True, nogil=True)
def settle_rows(chunks: I64s, slots: I64s, keys: I64s, vals: I64s, chunk_at: I64s, free: I64s, state: I64s, kst: I64s,
                rows: I64s, rpc: int, slab: U8s, row_bytes: int, code: int, pairs: F32s, half: F32s, out: F32s,
                outw: U32s) -> int:  # pragma: no cover - compiled
    """:func:`lane_settle` of a read the I/O thread made whole (counted: kst reads / read calls / bytes), then
    :func:`rows_from_cache` — the consumer's whole step 2 in one call."""
    lane_settle(chunks, slots, keys, vals, chunk_at, free, state)
    n = chunks.shape[0]
    kst[K_READS] += n
    kst[K_CALLS] += 1
    kst[K_BYTES] += n * slab.shape[1]
    return rows_from_cache(rows, rpc, keys, vals, slab, row_bytes, code, pairs, half, out, outw)


@njit(cache=True, nogil=True)
def lane_release(slots: I64s, chunk_at: I64s, free: I64s, state: I64s) -> None:  # pragma: no cover - compiled
    """Reserved slots whose read failed are free again."""
    for j in range(slots.shape[0]):
        s = slots[j]
        if chunk_at[s] == READING:
            chunk_at[s] = -1
            free[state[S_NFREE]] = s
            state[S_NFREE] += 1


# ------------------------------------------------------------------ reads (libc preadv2, google-crc32c: ._ckern)
@njit(cache=True, nogil=True)
def read_rows(fds: I64s, off: I64s, out: U8s, rows: I64s, crc: bool, flags: int, ok: Bools) -> int:  # pragma: no cover - compiled
    """Read chunk i (file fds[i], byte offset off[i]) into out[rows[i]] and check its crc32c;
    ok[i] = it read whole and intact. Returns how many did."""
    cb = out.shape[1]
    iov = np.empty(4, np.uint64)
    stored = np.empty(1, np.uint32)
    base = out.ctypes.data
    want = cb + 4 if crc else cb
    good = 0
    for i in range(fds.shape[0]):
        dst = base + rows[i] * cb
        iov[0] = dst
        iov[1] = cb
        iov[2] = stored.ctypes.data
        iov[3] = 4
        got = preadv2(np.int32(fds[i]), iov.ctypes.data, np.int32(2 if crc else 1), off[i], np.int32(flags))
        ok[i] = got == want and (not crc or crc32c_value(dst, cb) == stored[0])
        good += ok[i]
    return good


@njit(cache=True, nogil=True)
def lane_begin(rows: I64s, rpc: int, cps: int, stride: int, fdtab: I64s, keys: I64s, vals: I64s, chunk_at: I64s,
               stamp: I64s, tick: int, free: I64s, state: I64s, slab: U8s, mode: int, crc: bool, mch: I64s,
               mslot: I64s, mfd: I64s, moff: I64s, ok: Bools, mhit: I64s, kst: I64s, row_bytes: int, code: int,
               pairs: F32s, half: F32s, out: F32s, outw: U32s) -> int:  # pragma: no cover
    """The consumer's lane, step 1 (:meth:`polymem.serve.service.PageService.lane_begin`): the distinct chunks of ``rows``
    (any shape, -1 = invalid) looked up in the cache (hits stamped), slots reserved for the missing
    ones (in mch / mslot, with their file and offset in mfd / moff) and, mode 0, read here
    (blocking) or, mode 1, read here if the OS page cache holds them (RWF_NOWAIT); mode 2 reads none.
    Chunks read whole and intact join the index; the others are moved to the front of the m* arrays.
    Returns how many are left, or -1 (not enough slots: state[S_MISSES] = distinct misses, the hits' slots in
    mhit[:state[S_HITS]], nothing changed) or -2 (shard state[S_SHARD] is not open yet, nothing changed).
    state[S_MISSES] / state[S_READ_HERE]: distinct misses / read here. When none are left and ``out`` has a row
    per row, the rows are decoded into it too (:func:`rows_from_cache`; state[S_DECODED] = 1)."""
    nh = 0
    n = 0
    last = -1
    cap = 16
    while cap < 2 * rows.size:
        cap *= 2
    seen = np.full(cap, -1, np.int64)  # the misses so far (a forward's distinct chunks are read once)
    mask = cap - 1
    for row in rows.flat:
        if row < 0:
            continue
        c = row // rpc
        if c == last:
            continue
        last = c
        s = idx_find(keys, vals, c)
        if s >= 0:
            mhit[nh] = s
            nh += 1
            continue
        i = _home(c, mask)
        while seen[i] != -1 and seen[i] != c:
            i = (i + 1) & mask
        if seen[i] == -1:
            seen[i] = c
            mch[n] = c
            n += 1
    state[S_MISSES] = n
    state[S_READ_HERE] = 0
    state[S_HITS] = nh
    state[S_DECODED] = 0
    if n > state[S_NFREE] + chunk_at.shape[0] - state[S_TOP]:
        return -1
    for k in range(n):
        if fdtab[mch[k] // cps] < 0:
            state[S_SHARD] = mch[k] // cps
            return -2
    h = 0
    for k in range(nh):
        s = mhit[k]
        if stamp[s] != tick:
            stamp[s] = tick
            h += 1
    kst[K_HITS] += h
    kst[K_MISSES] += n
    kst[K_LANE] += 1
    for k in range(n):
        if state[S_NFREE] > 0:
            state[S_NFREE] -= 1
            s = free[state[S_NFREE]]
        else:
            s = state[S_TOP]
            state[S_TOP] += 1
        chunk_at[s] = READING
        stamp[s] = tick
        mslot[k] = s
        sh = mch[k] // cps
        mfd[k] = fdtab[sh]
        moff[k] = (mch[k] - sh * cps) * stride
    if mode == 2 and n:
        return n
    good = read_rows(mfd[:n], moff[:n], slab, mslot[:n], crc, RWF_NOWAIT if mode == 1 else 0, ok[:n]) if n else 0
    state[S_READ_HERE] = good
    if good:
        kst[K_READS] += good
        kst[K_CALLS] += 1
        kst[K_BYTES] += good * slab.shape[1]
        if mode == 1:
            kst[K_NOWAIT] += good
    left = 0
    for k in range(n):
        if ok[k]:
            idx_put(keys, vals, mch[k], mslot[k])
            chunk_at[mslot[k]] = mch[k]
            state[S_CACHED] += 1
        else:
            mch[left] = mch[k]
            mslot[left] = mslot[k]
            mfd[left] = mfd[k]
            moff[left] = moff[k]
            left += 1
    if state[S_CACHED] > state[S_PEAK]:
        state[S_PEAK] = state[S_CACHED]
    if left == 0 and out.shape[0] == rows.size:
        state[S_DECODED] = rows_from_cache(rows, rpc, keys, vals, slab, row_bytes, code, pairs, half, out, outw) == 0
    return left


def warm_up() -> None:
    """Compile (the first time after an install or an edit; later: load from numba's cache) every kernel of the
    page service with the argument types the service passes, so that none compiles in the middle of a forward
    (a compile takes ~0.5-2 s). Nothing is read: every row is invalid."""
    i64 = np.int64
    e = np.empty(1, i64)
    keys, vals = np.full(8, -1, i64), np.zeros(8, i64)
    chunk_at, stamp, free, state, kst = np.full(1, -1, i64), np.zeros(1, i64), np.zeros(1, i64), np.zeros(STATE_SIZE, i64), np.zeros(KST_SIZE, i64)
    slab = np.zeros((1, 8), np.uint8)
    rows = np.full(1, -1, i64)
    out = np.empty((1, 2), np.float32)
    pairs, half = np.zeros((256, 2), np.float32), np.zeros(1, np.float32)
    ok = np.zeros(1, np.bool_)
    read_rows(np.full(1, -1, i64), np.zeros(1, i64), slab, np.zeros(1, i64), True, 0, ok)
    lane_begin(rows, 1, 1, 1, np.full(1, -1, i64), keys, vals, chunk_at, stamp, 1, free, state, slab, 0, True,
               e.copy(), e.copy(), e.copy(), e.copy(), ok, e.copy(), kst, 1, 0, pairs, half, out, out.view(np.uint32))
    empty = np.empty(0, i64)
    settle_rows(empty, empty, keys, vals, chunk_at, free, state, kst, rows, 1, slab, 1, 0, pairs, half, out,
                out.view(np.uint32))
    rows_from_cache(rows, 1, keys, vals, slab, 1, 0, pairs, half, out, out.view(np.uint32))
    lane_settle(empty, empty, keys, vals, chunk_at, free, state)
    lane_release(empty, chunk_at, free, state)
    idx_get_many(keys, vals, empty, empty)
    idx_put_many(keys, vals, empty, empty)
    idx_del_many(keys, vals, empty)
