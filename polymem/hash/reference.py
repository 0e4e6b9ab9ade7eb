"""Plain-Python reference implementations: slow, readable, and the definition the fast paths must match.

Everything here works on Python ints and bytes, straight from the definitions in ``docs/hash-spec.md``:
the n-gram hash is the hash of the *concatenated bytes* (no C/B caches), and rows follow the layout
formulas literally. Tests compare numba, numpy and torch against these, bit for bit.

Not for production use: ~1 µs per byte.
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence, Union

from polymem.hash.spec import MASK64, HashSpec, fastrange, finalize


TokenBytes = Union[Callable[[int], "bytes | None"], Sequence["bytes | None"]]  # id -> bytes (None: special)


def ngram_bytes(token_bytes: TokenBytes, ids: Iterable[int], max_n: int) -> list[list[bytes | None]]:
    """out[i][n-1] = bytes(ids[i-n+1]) ‖ … ‖ bytes(ids[i]), or None if the n-gram reaches before the start of
    ``ids`` or includes a token without bytes (special/control). The one definition of "the bytes of an n-gram";
    ``token_bytes`` is a function of the id or a table indexed by it."""
    get = token_bytes if callable(token_bytes) else token_bytes.__getitem__
    toks = [get(int(t)) for t in ids]
    out: list[list[bytes | None]] = []
    for i in range(len(toks)):
        row: list[bytes | None] = []
        for n in range(1, max_n + 1):
            parts = [t for t in toks[i - n + 1 : i + 1] if t is not None] if i - n + 1 >= 0 else []
            row.append(b"".join(parts) if len(parts) == n else None)  # n tokens, all with bytes
        out.append(row)
    return out


def ngram_hashes(spec: HashSpec, token_bytes: TokenBytes, ids: Sequence[int], max_n: int) -> list[list[int | None]]:
    """out[i][n-1] = Hash(the bytes of the n-gram ending at i) (:func:`ngram_bytes`), None where invalid."""
    return [[None if b is None else spec.hash_bytes(b) for b in row] for row in ngram_bytes(token_bytes, ids, max_n)]


def page_local_rows(h: int, *, heads: int, slots: int, pages: int) -> list[int]:
    """row_k = (page·K + k)·S + slot_k, page = fastrange(z0, P), slot_k = (16-bit field k%4 of z_{1+k//4})·S >> 16."""
    page = fastrange(finalize(h, 0), pages)
    rows = []
    for k in range(heads):
        w = finalize(h, 1 + k // 4)
        field = (w >> (16 * (k % 4))) & 0xFFFF
        slot = (field * slots) >> 16
        rows.append((page * heads + k) * slots + slot)
    return rows


def flat_rows(h: int, *, heads: int, slots: int, pages: int) -> list[int]:
    """One entry e = fastrange(z0, P·S) holding all K heads: row_k = e·K + k."""
    e = fastrange(finalize(h, 0), pages * slots)
    return [e * heads + k for k in range(heads)]


def independent_rows(h: int, *, heads: int, slots: int, pages: int) -> list[int]:
    """Engram-style: head k has its own sub-table of Q = P·S rows: row_k = k·Q + fastrange(z_{1+k}, Q)."""
    q = pages * slots
    return [k * q + fastrange(finalize(h, 1 + k), q) for k in range(heads)]


def xor_mix(ids: Sequence[int], multipliers: Sequence[int]) -> int:
    """Engram's token-id mix for the n-gram ending at ids[-1]: x_t·m0 ⊕ x_{t-1}·m1 ⊕ … (mod 2^64)."""
    acc = 0
    for j, m in enumerate(multipliers):
        acc ^= (int(ids[len(ids) - 1 - j]) * m) & MASK64
    return acc
