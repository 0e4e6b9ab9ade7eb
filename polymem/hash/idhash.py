"""Tokenizer-bound token-id hashing (Engram's XOR hash) as a storable spec: :class:`IdHashSpec`.

A table trained with this hash is addressed by *token ids*, so it is bound to one tokenizer (named, with its
fingerprint, in the spec and in the asset header). For the n-gram of order n ending at position t::

    mix  = x_t·m_0 ⊕ x_{t-1}·m_1 ⊕ … ⊕ x_{t-n+1}·m_{n-1}          (mod 2^64; ids before the start = pad_id)
    u    = mix mod p_{n,k}                                        (a distinct prime per (order, head))
    row  = k·(len(orders)·stride) + i·stride + u                  (i = index of n in ``orders``)

The storage layout is ``Layout(kind="independent-heads", heads=K, slots=1, pages=len(orders)·stride)``: head
k owns its own region (Engram's independent heads) holding one sub-table per order; ``stride`` ≥ every prime.
Positions whose n-gram reaches before the start, or holds a special id (document separator), are invalid.

Two origins share this spec (docs/asset-format.md §10):

* ``polymem-xor`` — :class:`polymem.hash.xor.XorHashSpec` (splitmix64 multipliers, primes descending from
  ``head_rows``); what ``polymem train --hash xor`` writes.
* ``engram`` — DeepSeek's Engram demo (``NgramHashMapping``): multipliers ``2·r+1`` with ``r`` drawn by
  ``numpy.random.default_rng(seed + 10007·layer_id)``, primes ascending from each order's vocabulary size,
  never reused across heads/layers; orders 2..max_n.

No I/O, no torch here (torch rows: :mod:`polymem.torch.idrows`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from polymem.errors import FormatError, PolymemError
from polymem.hash.layout import Layout
from polymem.hash.xor import XorHashSpec, _is_prime

ID_HASH_FORMAT = "polymem.id-hash"
ORIGINS = ("polymem-xor", "engram")


def engram_multipliers(layer_id: int, vocab_size: int, count: int, *, seed: int = 0) -> tuple[int, ...]:
    """The odd multipliers of one Engram layer (Engram's demo ``NgramHashMapping``, and DeepSeek-V4.1):
    ``2·default_rng(seed + 10007·layer).integers(0, (INT64_MAX // vocab_size) // 2, count) + 1``."""
    half = max(1, (np.iinfo(np.int64).max // int(vocab_size)) // 2)
    r = np.random.default_rng(int(seed + 10007 * int(layer_id))).integers(0, half, count, dtype=np.int64)
    return tuple(int(v) * 2 + 1 for v in r)


def engram_primes(layer_ids: Sequence[int], order_vocab_sizes: Sequence[int],
                  heads: int) -> dict[int, tuple[int, ...]]:
    """layer -> its primes, order by order: per order, ``heads`` times the next prime ≥ that order's vocabulary
    size not used before by any layer (layers in the order given)."""
    seen: set[int] = set()
    table: dict[int, tuple[int, ...]] = {}
    for lid in layer_ids:
        ps: list[int] = []
        for size in order_vocab_sizes:
            c = int(size) - 1
            for _ in range(heads):
                c += 1
                while not _is_prime(c) or c in seen:
                    c += 1
                seen.add(c)
                ps.append(c)
        table[int(lid)] = tuple(ps)
    return table


@dataclass(frozen=True, kw_only=True)
class IdHashSpec:
    """Token-id XOR hash with a prime modulus per (order, head), bound to one tokenizer."""

    orders: tuple[int, ...]  # e.g. (1, 2, 3) or Engram's (2, 3)
    heads: int  # K, heads per order
    primes: tuple[int, ...]  # len(orders)·K moduli, order-major: primes[i·K + k]
    multipliers: tuple[int, ...]  # m_0..m_{max(orders)-1}, uint64
    stride: int  # rows reserved per (order, head) sub-table, ≥ max(primes)
    tokenizer: Mapping[str, str]  # {"name", "fingerprint"}
    vocab_size: int  # ids hashed are in [0, vocab_size)
    pad_id: int = 0
    origin: str = "polymem-xor"
    params: Mapping[str, Any] = field(default_factory=dict)  # how primes/multipliers were derived (JSON)
    tokenizer_bound: bool = field(default=True, init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "orders", tuple(int(o) for o in self.orders))
        object.__setattr__(self, "primes", tuple(int(p) for p in self.primes))
        object.__setattr__(self, "multipliers", tuple(int(m) for m in self.multipliers))
        object.__setattr__(self, "tokenizer", dict(self.tokenizer))
        object.__setattr__(self, "params", dict(self.params))
        o = self.orders
        if not o or list(o) != sorted(set(o)) or o[0] < 1 or o[-1] > 32:
            raise PolymemError(f"id-hash orders {o!r} must be distinct increasing integers in 1..32, e.g. (2, 3)")
        if not 1 <= self.heads <= 64:
            raise PolymemError(f"id-hash heads={self.heads} must be in 1..64")
        if len(self.primes) != len(o) * self.heads:
            raise PolymemError(
                f"id-hash needs len(orders)·heads = {len(o) * self.heads} primes, got {len(self.primes)}")
        if len(self.multipliers) < o[-1] or any(not 0 < m < 1 << 64 for m in self.multipliers):
            raise PolymemError(f"id-hash needs {o[-1]} multipliers in (0, 2^64), got {len(self.multipliers)}")
        if min(self.primes) < 2 or max(self.primes) > self.stride:
            raise PolymemError(f"id-hash primes must be in [2, stride={self.stride}]; got {min(self.primes)}..{max(self.primes)}")
        if self.origin not in ORIGINS:
            raise PolymemError(f"id-hash origin {self.origin!r} is unknown; accepted: {', '.join(ORIGINS)}")
        if not {"name", "fingerprint"} <= set(self.tokenizer):
            raise PolymemError(f"id-hash tokenizer {self.tokenizer!r} must name 'name' and 'fingerprint'")
        if self.vocab_size < 1 or not 0 <= self.pad_id < max(self.vocab_size, self.pad_id + 1):
            raise PolymemError(f"id-hash vocab_size={self.vocab_size} / pad_id={self.pad_id} are invalid")

    # ---- constructors
    @classmethod
    def from_xor(cls, xor: XorHashSpec, *, tokenizer: Mapping[str, str], vocab_size: int) -> "IdHashSpec":
        """The spec of a table trained with :class:`XorHashSpec` (same residues; sub-tables at fixed strides)."""
        return cls(orders=tuple(xor.orders), heads=xor.heads, primes=xor.primes, multipliers=xor.multipliers,
                   stride=xor.head_rows, tokenizer=tokenizer, vocab_size=vocab_size, pad_id=0, origin="polymem-xor",
                   params={"head_rows": xor.head_rows, "seed": xor.seed})

    @classmethod
    def engram(
        cls, *, layer_id: int, seed: int, vocab_size: int, max_n: int, heads: int,
        order_vocab_sizes: Sequence[int], tokenizer: Mapping[str, str], pad_id: int = 0,
        layer_ids: Sequence[int] | None = None, primes: Sequence[int] | None = None,
    ) -> "IdHashSpec":
        """The hash of Engram's demo ``NgramHashMapping`` for one layer (orders 2..max_n).

        ``vocab_size`` is the (compressed) tokenizer vocabulary the multipliers are bounded by;
        ``order_vocab_sizes`` is ``engram_vocab_size`` (one per order 2..max_n). Primes are searched as the demo
        does over ``layer_ids`` (default: just this layer); pass ``primes`` to take stored ones instead.
        """
        if max_n < 2 or len(order_vocab_sizes) != max_n - 1:
            raise PolymemError(f"Engram max_n={max_n} needs one vocabulary size per order 2..max_n, got {list(order_vocab_sizes)}")
        mults = engram_multipliers(layer_id, vocab_size, max_n, seed=seed)
        if primes is None:
            table = engram_primes(list(layer_ids) if layer_ids is not None else [layer_id], order_vocab_sizes, heads)
            if int(layer_id) not in table:
                raise PolymemError(f"layer_id {layer_id} is not in layer_ids {list(layer_ids or [])}")
            primes = table[int(layer_id)]
        primes = tuple(int(p) for p in primes)
        return cls(orders=tuple(range(2, max_n + 1)), heads=heads, primes=primes, multipliers=mults,
                   stride=max(primes), tokenizer=tokenizer, vocab_size=int(vocab_size), pad_id=int(pad_id),
                   origin="engram", params={"layer_id": int(layer_id), "seed": int(seed),
                                            "order_vocab_sizes": [int(v) for v in order_vocab_sizes]})

    # ---- geometry
    def layout(self, head_dim: int) -> Layout:
        """The storage layout: independent heads, one region per head holding a sub-table per order."""
        return Layout(pages=len(self.orders) * self.stride, heads=self.heads, slots=1, head_dim=head_dim,
                      kind="independent-heads")

    @property
    def num_rows(self) -> int:
        return len(self.orders) * self.stride * self.heads

    def offsets(self) -> np.ndarray:
        """int64 [len(orders), K]: first row of each (order, head) sub-table."""
        i = np.arange(len(self.orders), dtype=np.int64)[:, None]
        k = np.arange(self.heads, dtype=np.int64)[None, :]
        return k * (len(self.orders) * self.stride) + i * self.stride

    def check_layout(self, layout: Layout) -> None:
        """FormatError unless ``layout`` is this spec's own (:meth:`layout` at its head width): a table's rows
        must be where the spec puts them."""
        want = self.layout(layout.head_dim)
        if layout != want:
            raise FormatError(
                f"layout {layout.to_dict()} does not fit id-hash (orders {list(self.orders)}, heads {self.heads}, "
                f"stride {self.stride}); expected {want.to_dict()}")

    # ---- hashing
    def residues(self, ids: Any, special: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """ids int [..., T] -> (u int64 [..., T, len(orders), K] = mix mod p, valid bool [..., T, len(orders)])."""
        x = np.asarray(ids, dtype=np.int64)
        if x.size and (int(x.min()) < 0):
            raise PolymemError(f"token id {int(x.min())} is negative; ids must be in [0, {self.vocab_size})")
        xu = x.astype(np.uint64)
        T = x.shape[-1]
        bad = np.zeros(x.shape, dtype=bool) if special is None else np.asarray(special, dtype=bool)[x]
        primes = np.array(self.primes, dtype=np.uint64).reshape(len(self.orders), self.heads)
        u = np.empty(x.shape + (len(self.orders), self.heads), dtype=np.int64)
        valid = np.zeros(x.shape + (len(self.orders),), dtype=bool)
        with np.errstate(over="ignore"):
            mix = xu * np.uint64(self.multipliers[0])
            any_bad = bad.copy()
            done = 1
            for oi, n in enumerate(self.orders):
                while done < n:  # extend leftwards: ids shifted by `done`, pad_id before the start
                    sh = np.full_like(xu, np.uint64(self.pad_id))
                    sb = np.zeros_like(bad)
                    if done < T:
                        sh[..., done:] = xu[..., : T - done]
                        sb[..., done:] = bad[..., : T - done]
                    mix = mix ^ (sh * np.uint64(self.multipliers[done]))
                    any_bad = any_bad | sb
                    done += 1
                u[..., oi, :] = (mix[..., None] % primes[oi]).astype(np.int64)
                v = ~any_bad
                v[..., : min(n - 1, T)] = False
                valid[..., oi] = v
        return u, valid

    def rows(self, ids: Any, special: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """ids int [..., T] -> (rows int64 [..., T, len(orders), K] (-1 where invalid), valid [..., T, len(orders)])."""
        u, valid = self.residues(ids, special)
        rows = u + self.offsets()
        rows[~valid] = -1
        return rows, valid

    # ---- JSON
    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON-ready data (what a ``--hash xor`` asset records); :meth:`from_dict` reads it back."""
        return {
            "format": ID_HASH_FORMAT, "version": 1, "kind": "xor-mod-prime", "tokenizer_bound": True,
            "origin": self.origin, "tokenizer": dict(self.tokenizer), "vocab_size": self.vocab_size,
            "orders": list(self.orders), "heads": self.heads, "primes": list(self.primes),
            "multipliers": [f"0x{m:016x}" for m in self.multipliers], "pad_id": self.pad_id, "stride": self.stride,
            "params": dict(self.params),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "IdHashSpec":
        """The spec :meth:`to_dict` wrote; FormatError naming the field for anything else."""
        if not isinstance(d, Mapping) or d.get("format") != ID_HASH_FORMAT:
            raise FormatError(f"id-hash spec format is {d.get('format') if isinstance(d, Mapping) else d!r}, expected {ID_HASH_FORMAT!r}")
        if d.get("version") != 1 or d.get("kind") != "xor-mod-prime":
            raise FormatError(f"id-hash spec version {d.get('version')!r} / kind {d.get('kind')!r}: this polymem reads version 1, 'xor-mod-prime'")
        try:
            return cls(orders=tuple(d["orders"]), heads=int(d["heads"]), primes=tuple(d["primes"]),
                       multipliers=tuple(int(str(m), 16) for m in d["multipliers"]), stride=int(d["stride"]),
                       tokenizer=d["tokenizer"], vocab_size=int(d["vocab_size"]), pad_id=int(d.get("pad_id", 0)),
                       origin=str(d.get("origin", "polymem-xor")), params=d.get("params", {}))
        except KeyError as e:
            raise FormatError(f"id-hash spec is missing field {e.args[0]!r}") from None
        except (TypeError, ValueError, PolymemError) as e:
            raise FormatError(f"id-hash spec is malformed: {e}") from None

    @property
    def spec_id(self) -> str:
        import hashlib
        import json

        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:12]


def is_id_hash_dict(d: Any) -> bool:
    return isinstance(d, Mapping) and d.get("format") == ID_HASH_FORMAT


__all__ = ["ID_HASH_FORMAT", "IdHashSpec", "is_id_hash_dict"]
