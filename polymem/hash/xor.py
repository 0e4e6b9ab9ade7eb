"""Engram's XOR token-id hash — a **tokenizer-bound** baseline, offered for comparisons only.

For the n-gram ending at position t, Engram mixes token ids with per-position odd multipliers,
``mix = x_t·m_0 ⊕ x_{t-1}·m_1 ⊕ … ⊕ x_{t-n+1}·m_{n-1}`` (mod 2^64), and head k of order n reads row
``mix mod p_{n,k}`` of its own sub-table, with a distinct prime ``p_{n,k}`` per (order, head) (Engram).
Because it hashes ids, not bytes, the same text under another tokenizer addresses unrelated rows; and
byte-equivalent n-grams of different lengths never meet (disjoint spaces per order).

Not implemented: Engram's "tokenizer compression" id remapping (it changes which ids collide, not the cost).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from polymem.errors import PolymemError
from polymem.hash.spec import splitmix64


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    for p in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37):
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37):  # deterministic for n < 3.3e24
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


@dataclass(frozen=True, kw_only=True)
class XorHashSpec:
    """Engram-style XOR hashing: ``orders`` (e.g. 2, 3), ``heads`` per order, sub-tables of ≤ ``head_rows`` rows."""

    head_rows: int  # rows per (order, head) sub-table before rounding down to a distinct prime
    orders: tuple[int, ...] = (2, 3)
    heads: int = 8
    seed: int = 0
    tokenizer_bound: bool = field(default=True, init=False)
    primes: tuple[int, ...] = field(init=False, repr=False)
    multipliers: tuple[int, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.head_rows < 64 or not self.orders or min(self.orders) < 1 or self.heads < 1:
            raise PolymemError(
                f"XorHashSpec(head_rows={self.head_rows}, orders={self.orders}, heads={self.heads}) is invalid: "
                "head_rows ≥ 64, orders ≥ 1, heads ≥ 1"
            )
        primes: list[int] = []
        cand = self.head_rows
        while len(primes) < len(self.orders) * self.heads:  # distinct primes, descending from head_rows
            if _is_prime(cand):
                primes.append(cand)
            cand -= 1
        object.__setattr__(self, "primes", tuple(primes))
        object.__setattr__(self, "multipliers", xor_multipliers(max(self.orders), seed=self.seed))

    @property
    def num_rows(self) -> int:
        return sum(self.primes)

    def rows(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """ids int [T] -> (rows int64 [T, len(orders), heads], valid bool [T, len(orders)]).

        Rows index one concatenated table (each sub-table at its own offset). Positions whose n-gram
        reaches before the start are invalid (their rows are still computed from zero padding, as Engram does).
        """
        T = np.asarray(ids).shape[0]
        primes = np.array(self.primes, dtype=np.uint64).reshape(len(self.orders), self.heads)
        offsets = np.concatenate([[0], np.cumsum(self.primes)[:-1]]).astype(np.int64).reshape(primes.shape)
        out = np.empty((T, len(self.orders), self.heads), dtype=np.int64)
        valid = np.zeros((T, len(self.orders)), dtype=bool)
        mixes = xor_mixes(ids, self.multipliers, max(self.orders))  # [T, max order]
        for oi, n in enumerate(self.orders):
            out[:, oi, :] = (mixes[:, n - 1, None] % primes[oi][None, :]).astype(np.int64) + offsets[oi]
            valid[n - 1 :, oi] = True
        return out, valid


def xor_multipliers(count: int, *, seed: int = 0) -> tuple[int, ...]:
    """Engram's per-position odd multipliers m_0..m_{count-1}: successive splitmix64 outputs of ``seed``, | 1."""
    state, mults = seed, []
    for _ in range(count):
        state, v = splitmix64(state)
        mults.append(v | 1)  # odd, as Engram draws them
    return tuple(mults)


def xor_mixes(ids: np.ndarray, multipliers: Sequence[int], max_n: int) -> np.ndarray:
    """The XOR mix of every suffix n-gram, n = 1..max_n: ids int [T] -> uint64 [T, max_n],

        out[i, n-1] = ids[i]·m_0 ⊕ ids[i-1]·m_1 ⊕ … ⊕ ids[i-n+1]·m_{n-1}   (mod 2^64)

    with ids before the start read as 0 (Engram's padding); the n-gram is real only for i ≥ n-1.
    The one implementation of the mix (the slow definition for tests: :func:`polymem.hash.reference.xor_mix`).
    """
    if len(multipliers) < max_n:
        raise PolymemError(f"{len(multipliers)} multipliers cannot mix orders up to {max_n}; pass at least {max_n}")
    x = np.asarray(ids, dtype=np.int64).astype(np.uint64)
    T = x.shape[0]
    out = np.empty((max_n, T), dtype=np.uint64)  # planar: each order is one contiguous pass
    with np.errstate(over="ignore"):
        np.multiply(x, np.uint64(multipliers[0]), out=out[0])
        for n in range(1, max_n):  # extend leftwards: the id n positions back; before the start it is 0
            out[n] = out[n - 1]
            if n < T:
                out[n, n:] ^= x[: T - n] * np.uint64(multipliers[n])
    hashes: np.ndarray = out.T  # [T, max_n] (a view)
    return hashes
