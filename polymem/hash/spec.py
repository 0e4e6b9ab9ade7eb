"""The byte-level polynomial hash (spec ``polymem.hash-spec`` v1), in plain Python.

This module defines the hash: the byte table h, the ring (64-bit wrap-around), the base, the per-byte
normalisers and the finaliser that turns a 64-bit n-gram hash into row addresses. It is the readable
reference the fast paths (numba/numpy in :mod:`polymem.hash.ngram`, torch in :mod:`polymem.torch.hash`) are
tested against, bit for bit. See ``docs/hash-spec.md`` for the normative text and golden vectors.

Worked example (hand-checkable with the definitions below)::

    Hash(b"ab") = h[a]*base^2 + h[b]*base^1            (mod 2^64)
    Hash(b"ab" + b"c") = Hash(b"ab")*base^1 + Hash(b"c")

What this module does *not* do: tokenise, vectorise, read or write files.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
import operator
from typing import Any, Mapping

from polymem.errors import FormatError, PolymemError

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15  # 2^64 / phi, odd: the stream offset of the finaliser and splitmix64's step
FMIX_M1, FMIX_M2 = 0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53  # MurmurHash3 fmix64 multipliers
# A layout kind as the kernels take it (numba, torch): plain constants here so the kernels need not import
# hash/layout.py, which calls them. The names ("page-local" …) and the layouts themselves live in layout.py.
KIND_PAGE_LOCAL, KIND_FLAT, KIND_INDEPENDENT = 0, 1, 2

HASH_SPEC_FORMAT = "polymem.hash-spec"
SUPPORTED_HASH_SPEC_VERSIONS = (1,)
DEFAULT_BASE = 0xC2B2AE3D27D4EB4F  # odd (base^p never reaches 0); ≡ -1 mod 16, order 2^60 (see base_order_log2)
MIN_BASE_ORDER_LOG2 = 56  # a base must have multiplicative order >= 2^56 mod 2^64 (docs/hash-spec.md §2)
DEFAULT_BYTE_SEED = 0x706F6C796D656D31  # ASCII "polymem1"
FINALIZER = "fmix64-golden-v1"
MAX_ORDER = 32  # the longest n-gram any table, cache or site hashes (orders 1..MAX_ORDER)


# --------------------------------------------------------------------------------------------- mixers
def splitmix64(state: int) -> tuple[int, int]:
    """One step of splitmix64: returns (new_state, output). Used to derive the byte table from a seed."""
    state = (state + GOLDEN) & MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return state, z ^ (z >> 31)


def fmix64(k: int) -> int:
    """MurmurHash3's 64-bit finaliser: a bijection of [0, 2^64) with full avalanche."""
    k &= MASK64
    k ^= k >> 33
    k = (k * FMIX_M1) & MASK64
    k ^= k >> 33
    k = (k * FMIX_M2) & MASK64
    k ^= k >> 33
    return k


def finalize(h: int, stream: int) -> int:
    """Address stream ``stream`` (0, 1, 2, ...) of an n-gram hash: ``fmix64(h + (stream+1)*GOLDEN)``.

    Layouts draw their page and slot numbers from independent streams of the same byte hash, so the
    address stays tokenizer-agnostic.
    """
    return fmix64((h + (stream + 1) * GOLDEN) & MASK64)


def fastrange(z: int, m: int) -> int:
    """Map a uniform 64-bit ``z`` to [0, m) by multiply-high: ⌊z·m / 2^64⌋ (Lemire's fast range; no division).

    Defined for 0 < m < 2^32, which layouts enforce.
    """
    return ((z & MASK64) * m) >> 64


def base_order_log2(base: int, *, bits: int = 64) -> int:
    """log2 of the multiplicative order of an odd ``base`` modulo 2^bits.

    The units mod 2^k form {±1} x <5> (a cyclic group of order 2^(k-2) times a sign), so the order is a power
    of two read off the 2-adic valuation: with t = v2(base - 1) when base ≡ 1 (mod 4) and t = v2(base + 1)
    when base ≡ 3 (mod 4), the order is 2^(k-t); the one exception is base ≡ -1, of order 2. The maximum,
    2^(k-2), is reached iff base ≡ 3 or 5 (mod 8). Example: base = 5 mod 2^4 is 5, 9, 13, 1: order 4 = 2^(4-2).
    """
    m = 1 << bits
    b = base % m
    if b % 2 == 0:
        raise PolymemError(f"base {base!r} is even; only odd numbers have a multiplicative order mod 2^{bits}")
    if b == 1:
        return 0
    if b == m - 1:
        return 1
    near = (b - 1) if b % 4 == 1 else (b + 1)  # the one of b-1, b+1 divisible by 4
    t = (near & -near).bit_length() - 1
    return bits - t


def _check_base(base: object) -> None:
    """Refuse a base that is not odd, or whose order mod 2^64 is short (docs/hash-spec.md §2)."""
    if not isinstance(base, int) or isinstance(base, bool) or not (0 < base <= MASK64) or base % 2 == 0:
        raise PolymemError(
            f"hash base {base!r} must be an odd integer in (0, 2^64); an even base loses bits "
            "of the hash with every power. Use the default base or an odd constant."
        )
    k = base_order_log2(base)
    if k >= MIN_BASE_ORDER_LOG2:
        return
    sign, near = (1, base - 1) if base % 4 == 1 else (-1, base + 1)
    t = 64 if near % (1 << 64) == 0 else (near & -near).bit_length() - 1
    raise PolymemError(
        f"hash base 0x{base:016x} has multiplicative order {'1' if k == 0 else '2' if k == 1 else f'2^{k}'} "
        f"mod 2^64 (base ≡ {sign} (mod 2^{t})): the low {t} bits of every hash are "
        + ("the plain sum of its byte values, blind to their order (Hash(ab) ≡ Hash(ba) there)" if sign == 1 else
           "an alternating sum of its byte values (Hash(aa) ≡ 0 there)")
        + f"; a base must have "
        f"order at least 2^{MIN_BASE_ORDER_LOG2}, i.e. base ≢ ±1 (mod 2^{64 - MIN_BASE_ORDER_LOG2 + 1}). Use the "
        f"default base 0x{DEFAULT_BASE:016x}, or an odd constant ≡ 3 or 5 (mod 8) (order 2^62, the maximum)."
    )


def make_byte_table(seed: int) -> tuple[int, ...]:
    """h(b) for b = 0..255: successive splitmix64 outputs from ``seed``, skipping 0 (never happens in practice).

    A zero entry would let leading bytes vanish from the polynomial, so it is excluded by construction.
    """
    out: list[int] = []
    state = seed & MASK64
    while len(out) < 256:
        state, v = splitmix64(state)
        if v != 0:
            out.append(v)
    return tuple(out)


# --------------------------------------------------------------------------------------------- orders
def check_max_n(max_n: Any, *, hint: str = "pass e.g. max_n=3 (--max-n 3)") -> int:
    """``max_n`` as an int, checked: the n-gram orders hashed are 1..max_n, 1 ≤ max_n ≤ MAX_ORDER."""
    n = _as_int(max_n)
    if n is None or not 1 <= n <= MAX_ORDER:
        raise PolymemError(
            f"max_n={max_n!r} is out of range: the n-gram orders are 1..max_n, with max_n an integer from 1 to "
            f"{MAX_ORDER}; {hint}"
        )
    return n


def check_orders(orders: Any) -> tuple[int, ...]:
    """A non-empty set of n-gram orders in 1..MAX_ORDER, as a sorted tuple: (3, 1, 2, 2) -> (1, 2, 3)."""
    try:
        maybe = [_as_int(o) for o in orders] if not isinstance(orders, (str, bytes)) else [None]
    except TypeError:  # not iterable
        maybe = [None]
    ints = [o for o in maybe if o is not None]
    if len(ints) != len(maybe):
        raise PolymemError(f"orders {orders!r} must be integers in 1..{MAX_ORDER}, e.g. (1, 2, 3) or --orders 1,2,3")
    out = tuple(sorted(set(ints)))
    if not out or out[0] < 1 or out[-1] > MAX_ORDER:
        raise PolymemError(f"orders {orders!r} must be a non-empty set of integers in 1..{MAX_ORDER}, e.g. (1, 2, 3)")
    return out


def _as_int(o: Any) -> int | None:
    """An integer (Python or numpy), else None; bools are not orders."""
    if isinstance(o, bool):
        return None
    try:
        return operator.index(o)
    except TypeError:
        return None


# ----------------------------------------------------------------------------------------- normalisers
def _identity_map() -> bytes:
    return bytes(range(256))


def _ascii_lower_map() -> bytes:
    m = bytearray(range(256))
    for b in range(ord("A"), ord("Z") + 1):
        m[b] = b + 32
    return bytes(m)


def _ascii_fold_ws_map() -> bytes:
    m = bytearray(_ascii_lower_map())
    for b in b"\t\n\r\x0b\x0c":
        m[b] = ord(" ")
    return bytes(m)


#: Normalisers are per-byte maps, the only kind that keeps norm(a‖b) = norm(a)‖norm(b) for *any* split of a
#: byte string into tokens (byte-level BPE splits inside UTF-8 characters). Unicode-aware maps (NFKC,
#: str.lower, accent stripping) are context-dependent and break byte-equivalence; they are not offered.
#: ASCII bytes never occur inside a multi-byte UTF-8 sequence, so ASCII maps are safe on UTF-8 text.
NORMALIZERS: Mapping[str, bytes] = {
    "none": _identity_map(),
    "ascii-lower": _ascii_lower_map(),
    "ascii-lower-ws": _ascii_fold_ws_map(),
}


def normalize_bytes(normalizer: str, data: bytes) -> bytes:
    """Apply a named per-byte normaliser to ``data``."""
    return data.translate(_normalizer_map(normalizer))


def _normalizer_map(name: str) -> bytes:
    try:
        return NORMALIZERS[name]
    except KeyError:
        raise PolymemError(
            f"unknown normalizer {name!r}; accepted: {', '.join(sorted(NORMALIZERS))}. "
            "Unicode normalisers (NFKC, lowercase) are not offered: they break byte-equivalence across "
            "token boundaries (docs/hash-spec.md §normalisers)."
        ) from None


# ------------------------------------------------------------------------------------------- the spec
@dataclass(frozen=True, kw_only=True)
class HashSpec:
    """Everything needed to reproduce n-gram hashes and row addresses bit for bit, in any language.

    Stored in every token cache and every asset (as JSON, see :meth:`to_dict`).
    """

    base: int = DEFAULT_BASE  # odd 64-bit multiplier, of multiplicative order >= 2^56 mod 2^64
    byte_seed: int = DEFAULT_BYTE_SEED  # splitmix64 seed of the byte table h
    normalizer: str = "none"  # per-byte map applied before h (NORMALIZERS)
    version: int = 1
    byte_table: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.version not in SUPPORTED_HASH_SPEC_VERSIONS:
            raise FormatError(
                f"hash spec version {self.version!r} is not supported; supported: "
                f"{list(SUPPORTED_HASH_SPEC_VERSIONS)}. Upgrade polymem to read newer specs."
            )
        _check_base(self.base)
        if not isinstance(self.byte_seed, int) or not (0 <= self.byte_seed <= MASK64):
            raise PolymemError(f"byte_seed {self.byte_seed!r} must be an integer in [0, 2^64)")
        _normalizer_map(self.normalizer)
        object.__setattr__(self, "byte_table", make_byte_table(self.byte_seed))

    # effective h after normalisation: h'(b) = h(norm(b))
    @property
    def effective_byte_table(self) -> tuple[int, ...]:
        m = _normalizer_map(self.normalizer)
        return tuple(self.byte_table[m[b]] for b in range(256))

    def hash_bytes(self, data: bytes) -> int:
        """Hash(S) = Σ_i h(s_i)·base^(m-i) mod 2^64, by Horner: ((h(s0)·base + h(s1))·base + …)·base."""
        table = self.effective_byte_table
        acc = 0
        for b in data:
            acc = ((acc + table[b]) * self.base) & MASK64
        return acc

    def power(self, p: int) -> int:
        """B(p) = base^p mod 2^64."""
        return pow(self.base, p, 1 << 64)

    def concat(self, hash_a: int, hash_b: int, len_b: int) -> int:
        """Hash(A‖B) = Hash(A)·B(|B|) + Hash(B)."""
        return (hash_a * self.power(len_b) + hash_b) & MASK64

    # ---- serialisation
    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON-ready data (what an asset's header and a token cache record); :meth:`from_dict` reads
        it back."""
        return {
            "format": HASH_SPEC_FORMAT,
            "version": self.version,
            "kind": "byte-poly64",
            "ring": "uint64 wrap-around",
            "base": f"0x{self.base:016x}",
            "byte_seed": f"0x{self.byte_seed:016x}",
            "byte_table": [f"0x{v:016x}" for v in self.byte_table],
            "normalizer": self.normalizer,
            "finalizer": FINALIZER,
        }

    def to_json(self) -> str:
        """The spec as canonical JSON (sorted keys, no spaces): the bytes :attr:`spec_id` hashes."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @property
    def spec_id(self) -> str:
        """Short stable id of the spec (first 12 hex of sha256 of the canonical JSON)."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:12]

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "HashSpec":
        """The spec :meth:`to_dict` wrote; FormatError naming the field for anything else."""
        if not isinstance(d, Mapping):
            raise FormatError(f"hash spec must be a JSON object, got {type(d).__name__}")
        fmt = d.get("format")
        if fmt != HASH_SPEC_FORMAT:
            raise FormatError(f"hash spec format is {fmt!r}, expected {HASH_SPEC_FORMAT!r}")
        version = d.get("version")
        if version not in SUPPORTED_HASH_SPEC_VERSIONS:
            raise FormatError(
                f"hash spec version {version!r} is not supported; supported: "
                f"{list(SUPPORTED_HASH_SPEC_VERSIONS)}. Upgrade polymem to read newer specs."
            )
        for key, expected in (("kind", "byte-poly64"), ("finalizer", FINALIZER)):
            if d.get(key) != expected:
                raise FormatError(f"hash spec {key} is {d.get(key)!r}; this version supports only {expected!r}")
        try:
            spec = cls(
                base=_parse_u64(d["base"], "base"),
                byte_seed=_parse_u64(d["byte_seed"], "byte_seed"),
                normalizer=str(d["normalizer"]),
                version=int(version),
            )
        except KeyError as e:
            raise FormatError(f"hash spec is missing field {e.args[0]!r}") from None
        except FormatError:
            raise
        except PolymemError as e:
            raise FormatError(f"stored hash spec is invalid: {e}") from None
        table = d.get("byte_table")
        if table is not None:
            parsed = tuple(_parse_u64(v, "byte_table entry") for v in table)
            if parsed != spec.byte_table:
                raise FormatError(
                    "hash spec byte_table does not match the table generated from byte_seed "
                    f"0x{spec.byte_seed:016x}: the spec was edited or corrupted"
                )
        return spec

    @classmethod
    def from_json(cls, text: str) -> "HashSpec":
        """The spec :meth:`to_json` wrote; FormatError for text that is not such JSON."""
        try:
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as e:
            raise FormatError(f"hash spec is not valid JSON: {e}") from None


def _parse_u64(v: Any, what: str) -> int:
    try:
        x = int(v, 0) if isinstance(v, str) else int(v)
    except (TypeError, ValueError):
        raise FormatError(f"hash spec {what} {v!r} is not an integer (hex string like '0x…' expected)") from None
    if not 0 <= x <= MASK64:
        raise FormatError(f"hash spec {what} {v!r} is outside [0, 2^64)")
    return x
