"""Compiled host loops of the page service's consumer (:mod:`polymem.torch.pages`): planning a forward's rows
and decoding NF4 rows on the CPU. One call each instead of a dozen small numpy/torch calls, which cost tens of
µs apiece inside a model's forward (cold caches). Results equal the vectorised numpy/torch paths bit for bit
(tests/test_serving.py runs both)."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def plan_rows(rows, rpc):  # pragma: no cover - compiled
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


@njit(cache=True, nogil=True)
def nf4_rows(stage, slot, inner, row_bytes, pairs, half, out):  # pragma: no cover - compiled
    """NF4 rows out of the stage (uint8 [n, chunk_bytes]): row i = chunk slot[i], row inner[i]; each row is r/2
    code bytes (low nibble = even column) then a float16 scale. out[i] = levels * scale in float32, the
    products of :func:`polymem.asset.nf4.dequantize`. pairs: float32 [256, 2] byte -> levels; half: float32
    [65536] float16 bits -> value."""
    h = out.shape[1] // 2
    for i in range(slot.shape[0]):
        s = slot[i]
        base = inner[i] * row_bytes
        scale = half[np.int64(stage[s, base + h]) | (np.int64(stage[s, base + h + 1]) << 8)]
        for j in range(h):
            b = stage[s, base + j]
            out[i, 2 * j] = pairs[b, 0] * scale
            out[i, 2 * j + 1] = pairs[b, 1] * scale
