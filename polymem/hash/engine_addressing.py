"""An engine's token-id addressing as data: :class:`EngineAddressing`, its JSON form and its ``rows()``.

Both released engine tables (DeepSeek-V4.1's Engram, Qwen3.8's PLE) address rows the same way; only the
constants and the id preprocessing differ. For one sequence ``x_0 … x_{T-1}`` starting at position 0 and each
table layer with multipliers ``m_0 … m_{N-1}`` (N = the highest order)::

    g_s(p) = map(x_{p-s})  if p-s ≥ first(p)  else fill_id     (s = 0 … N-1; sticky: older positions fill too)
    h      = g_0·m_0;  for s = 1 … N-1:  h ^= g_s·m_s;  the heads of order s+1 read  h % prime_c + offset_c

with column ``c = (n − 2)·heads + head``, ``offset_c`` = the sum of the earlier columns' primes, ``map`` the
engine's id map (DeepSeek's compressed ids; the identity for Qwen) and ``first(p)`` = 0, or the position of
the last ``boundary_id`` at or before p (Qwen's EOS: n-grams never reach back across a document end).

Arithmetic is the engines' numpy/torch int64. Every multiplier is at most ``INT64_MAX // hashed_vocab`` (both
engines draw them below that bound), so no product ``g·m`` wraps and every ``h`` is non-negative: signed and
unsigned readings agree, and ``h % prime`` is the same in numpy, torch, C and Python. A spec whose multipliers
break that bound is refused rather than computed one way that some engine might not share.

This module holds no engine constants (see :mod:`polymem.engines.deepseek`, :mod:`polymem.engines.qwen`), no I/O
and no row encodings. It sits in ``hash/`` because an imported engine table's header holds the addressing and the
asset format parses it (:mod:`polymem.asset.engine_table`); ``polymem.engines.addressing`` re-exports it.
"""

from __future__ import annotations

import base64
import hashlib
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from polymem.errors import FormatError, PolymemError
from polymem.hash.xor import _is_prime

ADDRESSING_FORMAT = "polymem.engine-addressing"
ADDRESSING_VERSION = 1
ID_MAP_ENCODING = "zlib-base64-int32le-id-minus-mapped"
INT64_MAX = int(np.iinfo(np.int64).max)
_CHUNK = 16384  # tokens per block of rows() (a few MB of output)
MAX_ID_MAP = 1 << 24  # ids an id map may hold (as the tokenizers' MAX_VOCAB_SIZE): 128 MiB of int64


@dataclass(frozen=True, kw_only=True)
class LayerTable:
    """One table layer: its multipliers, one prime per column, and the rows stored (≥ the primes' sum)."""

    layer: int  # the engine's own layer number (tensor names use it)
    multipliers: tuple[int, ...]  # m_0 … m_{N-1}
    primes: tuple[int, ...]  # one per column c = (n - 2)·heads + head
    stored_rows: int  # rows in the stored tensor; rows past sum(primes) are padding, never addressed

    @property
    def offsets(self) -> tuple[int, ...]:
        """First row of each column: the cumulative sum of the earlier columns' primes."""
        return tuple(int(v) for v in np.concatenate([[0], np.cumsum(self.primes[:-1], dtype=np.int64)]))

    @property
    def logical_rows(self) -> int:
        return sum(self.primes)


@dataclass(frozen=True, kw_only=True, eq=False)
class EngineAddressing:
    """How an engine turns one sequence of token ids into table rows (see the module docstring)."""

    name: str  # e.g. "deepseek-v4.1"
    vocab_size: int  # ids accepted by rows(): [0, vocab_size)
    orders: tuple[int, ...]  # 2 … N
    heads: int  # heads per order
    layers: tuple[LayerTable, ...]
    fill_id: int  # the mapped id read for predecessors before first(p)
    boundary_id: int | None = None  # raw id that starts a new document (Qwen's EOS), None: only the start
    id_map: np.ndarray | None = None  # int64 [vocab_size] raw id -> hashed id; None: identity
    params: Mapping[str, Any] = field(default_factory=dict)  # how the constants were derived (JSON values)

    def __post_init__(self) -> None:
        _check_geometry(self)

    # ---- geometry
    @property
    def columns(self) -> int:
        return len(self.orders) * self.heads

    @property
    def hashed_vocab(self) -> int:
        """How many distinct ids are hashed (DeepSeek: the compressed vocabulary)."""
        return self.vocab_size if self.id_map is None else int(self.id_map.max()) + 1

    @property
    def num_rows(self) -> tuple[int, ...]:
        """Rows of each layer's stored table, in layer order."""
        return tuple(t.stored_rows for t in self.layers)

    @property
    def layer_ids(self) -> tuple[int, ...]:
        return tuple(t.layer for t in self.layers)

    # ---- addressing
    def rows(self, ids: Any) -> np.ndarray:
        """ids int [T] (one sequence from position 0) -> rows int64 [T, layers, columns]."""
        x = _check_ids(ids, self.vocab_size)
        back = self._predecessors(x)  # [N, T]
        out = np.empty((x.shape[0], len(self.layers), self.columns), dtype=np.int64)
        for start in range(0, x.shape[0], _CHUNK):  # chunks keep the strided writes in cache
            stop = start + _CHUNK
            for li, table in enumerate(self.layers):
                self._hash_into(out[start:stop, li], back[:, start:stop], table)
        return out

    def _predecessors(self, x: np.ndarray) -> np.ndarray:
        """x int64 [T] -> int64 [N, T]: row s holds g_s, the mapped id s positions back, or the fill."""
        T = x.shape[0]
        g = x if self.id_map is None else self.id_map[x]
        pos = np.arange(T, dtype=np.int64)
        first = np.zeros(T, dtype=np.int64)
        if self.boundary_id is not None:  # the last boundary at or before p
            first = np.maximum.accumulate(np.where(x == self.boundary_id, pos, 0))
        back = np.empty((self.orders[-1], T), dtype=np.int64)
        back[0] = g
        for s in range(1, self.orders[-1]):
            back[s] = np.where(pos - s >= first, g[np.maximum(pos - s, 0)], self.fill_id)
        return back

    def _hash_into(self, out: np.ndarray, back: np.ndarray, table: LayerTable) -> None:
        """out int64 [t, columns] <- the rows of one layer for predecessors back [N, t]."""
        primes = np.array(table.primes, dtype=np.int64).reshape(len(self.orders), self.heads)
        offsets = np.array(table.offsets, dtype=np.int64).reshape(len(self.orders), self.heads)
        h = back[0] * table.multipliers[0]  # [t]; never wraps (multiplier bound), so h ≥ 0
        for s in range(1, self.orders[-1]):
            h ^= back[s] * table.multipliers[s]
            block = out[:, (s - 1) * self.heads:s * self.heads]  # order s + 1: [t, heads]
            np.remainder(h[:, None], primes[s - 1], out=block)
            block += offsets[s - 1]

    # ---- JSON
    def to_json(self) -> dict[str, Any]:
        """The spec as plain JSON values (64-bit multipliers as hex strings, as in the hash spec)."""
        return {
            "format": ADDRESSING_FORMAT, "version": ADDRESSING_VERSION, "name": self.name,
            "vocab_size": self.vocab_size, "orders": list(self.orders), "heads": self.heads,
            "fill_id": self.fill_id, "boundary_id": self.boundary_id,
            "arithmetic": "int64, no wrap: h = g0*m0 ^ g1*m1 ^ ...; row = h % prime + offset",
            "layers": [{"layer": t.layer, "multipliers": [f"0x{m:016x}" for m in t.multipliers],
                        "primes": list(t.primes), "offsets": list(t.offsets), "stored_rows": t.stored_rows}
                       for t in self.layers],
            "id_map": None if self.id_map is None else encode_id_map(self.id_map),
            "params": dict(self.params),
        }

    @classmethod
    def from_json(cls, d: Any) -> "EngineAddressing":
        """Read a spec written by :meth:`to_json`; a bad field raises FormatError naming it and the fix."""
        return parse_addressing(d)


def encode_id_map(id_map: np.ndarray) -> dict[str, str]:
    """int64 [V] id map -> {"encoding", "sha256" (of the int32le map), "data"}; ``id − map`` compresses best."""
    raw = id_map.astype("<i4").tobytes()
    delta = (np.arange(id_map.shape[0], dtype=np.int64) - id_map).astype("<i4").tobytes()
    return {"encoding": ID_MAP_ENCODING, "sha256": hashlib.sha256(raw).hexdigest(),
            "data": base64.b64encode(zlib.compress(delta, 9)).decode("ascii")}


def decode_id_map(d: Mapping[str, Any], vocab_size: int) -> np.ndarray:
    """The inverse of :func:`encode_id_map`; refuses another encoding, a wrong length or checksum."""
    if d.get("encoding") != ID_MAP_ENCODING:
        raise FormatError(f"engine addressing field 'id_map.encoding' is {d.get('encoding')!r}; this polymem "
                          f"reads {ID_MAP_ENCODING!r}; fix: rewrite the spec with to_json()")
    if vocab_size > MAX_ID_MAP:
        raise FormatError(f"engine addressing field 'vocab_size' is {vocab_size:,} with an id map; an id map holds at "
                          f"most {MAX_ID_MAP:,} ids (the engines' have 129,280); {_FIX}")
    try:  # decompressed up to one id past vocab_size: a small field never expands to gigabytes
        raw = zlib.decompressobj().decompress(base64.b64decode(str(d["data"]), validate=True), 4 * vocab_size + 4)
        delta = np.frombuffer(raw[:len(raw) // 4 * 4], dtype="<i4")
    except (KeyError, ValueError, zlib.error) as e:
        raise FormatError(f"engine addressing field 'id_map.data' cannot be decoded ({e}); fix: rewrite the spec "
                          "with to_json()") from None
    id_map = np.arange(delta.shape[0], dtype=np.int64) - delta.astype(np.int64)
    if id_map.shape[0] != vocab_size or hashlib.sha256(id_map.astype("<i4").tobytes()).hexdigest() != d.get("sha256"):
        raise FormatError(f"engine addressing field 'id_map' holds {id_map.shape[0]} ids or fails its sha256; "
                          f"expected {vocab_size} ids matching 'id_map.sha256'; fix: rewrite the spec with to_json()")
    return id_map


def _check_ids(ids: Any, vocab_size: int) -> np.ndarray:
    x = np.asarray(ids)
    if x.ndim != 1 or (x.size and x.dtype.kind not in "iu"):
        raise PolymemError(f"rows() takes one sequence of integer token ids, shape [T]; got shape {x.shape} "
                           f"dtype {x.dtype}; fix: pass one sequence at a time")
    x = x.astype(np.int64)
    if x.size and (int(x.min()) < 0 or int(x.max()) >= vocab_size):
        bad = int(x.min()) if int(x.min()) < 0 else int(x.max())
        raise PolymemError(f"token id {bad} is outside this engine's vocabulary [0, {vocab_size}); "
                           "fix: encode with the engine's own tokenizer")
    return x


def _check_geometry(a: EngineAddressing) -> None:
    """Every sentence of the module docstring that the data could break, checked once."""
    if list(a.orders) != list(range(2, len(a.orders) + 2)):
        raise PolymemError(f"engine orders {list(a.orders)} must be 2, 3, … without gaps (the rolling hash adds "
                           "one predecessor per order)")
    if a.heads < 1 or not a.layers:
        raise PolymemError(f"engine addressing needs heads ≥ 1 and at least one layer; got heads={a.heads}, "
                           f"{len(a.layers)} layers")
    if a.id_map is not None and (a.id_map.shape != (a.vocab_size,) or int(a.id_map.min()) < 0):
        raise PolymemError(f"engine id_map must be {a.vocab_size} non-negative ids; got shape {a.id_map.shape}")
    if not 0 <= a.fill_id < a.hashed_vocab:
        raise PolymemError(f"engine fill_id={a.fill_id} must be a hashed id in [0, {a.hashed_vocab})")
    if a.boundary_id is not None and not 0 <= a.boundary_id < a.vocab_size:
        raise PolymemError(f"engine boundary_id={a.boundary_id} is a token id outside the vocabulary [0, "
                           f"{a.vocab_size}) (vocab_size {a.vocab_size}): no token would ever end a document; it "
                           "must be the id of the engine's end-of-text token")
    bound = INT64_MAX // a.hashed_vocab
    for t in a.layers:
        if len(t.multipliers) != a.orders[-1] or any(not 0 < m <= bound for m in t.multipliers):
            raise PolymemError(f"layer {t.layer} needs {a.orders[-1]} multipliers in [1, INT64_MAX // "
                               f"{a.hashed_vocab} = {bound}] so no product wraps; got {list(t.multipliers)}")
        if len(t.primes) != a.columns or not all(_is_prime(p) for p in t.primes):
            raise PolymemError(f"layer {t.layer} needs {a.columns} primes (orders × heads); got {list(t.primes)}")
        if not t.logical_rows <= t.stored_rows < 1 << 62:
            raise PolymemError(f"layer {t.layer} stores {t.stored_rows} rows, fewer than its primes' sum "
                               f"{t.logical_rows}")


__all__ = ["ADDRESSING_FORMAT", "ADDRESSING_VERSION", "EngineAddressing", "LayerTable", "decode_id_map",
           "encode_id_map"]


# Reading a spec from JSON: one parse function per field, each error one line naming the field, the value
# received, what is accepted and the fix. Checks that span fields (multiplier bound, prime count, row count)
# are EngineAddressing's own and are reported as FormatError.

_FIX = "fix: write the spec with EngineAddressing.to_json() or polymem.engines.addressing(name).to_json()"


def _bad(name: str, value: Any, accepted: str) -> FormatError:
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return FormatError(f"engine addressing field {name!r} is {shown}; expected {accepted}; {_FIX}")


def _field(d: Mapping[str, Any], key: str, where: str = "") -> Any:
    if key not in d:
        raise FormatError(f"engine addressing is missing field {where + key!r}; {_FIX}")
    return d[key]


def _int(value: Any, name: str, *, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise _bad(name, value, f"an integer ≥ {low}")
    return value


def _ints(value: Any, name: str, *, low: int = 0) -> tuple[int, ...]:
    if not isinstance(value, list) or not value:
        raise _bad(name, value, "a non-empty list of integers")
    return tuple(_int(v, f"{name}[{i}]", low=low) for i, v in enumerate(value))


def _hex64(value: Any, name: str) -> int:
    try:
        if not isinstance(value, str) or not value.startswith("0x"):
            raise ValueError
        return int(value, 16)
    except ValueError:
        raise _bad(name, value, "a hex string such as '0x000045b24cdcfca5'") from None


def _layer(d: Any, i: int) -> LayerTable:
    where = f"layers[{i}]."
    if not isinstance(d, Mapping):
        raise _bad(f"layers[{i}]", d, "an object with layer, multipliers, primes, offsets, stored_rows")
    mults = _field(d, "multipliers", where)
    if not isinstance(mults, list) or not mults:
        raise _bad(where + "multipliers", mults, "a non-empty list of hex strings")
    table = LayerTable(layer=_int(_field(d, "layer", where), where + "layer"),
                       multipliers=tuple(_hex64(m, f"{where}multipliers[{k}]") for k, m in enumerate(mults)),
                       primes=_ints(_field(d, "primes", where), where + "primes", low=2),
                       stored_rows=_int(_field(d, "stored_rows", where), where + "stored_rows", low=1))
    offsets = _ints(_field(d, "offsets", where), where + "offsets")
    if offsets != table.offsets:
        raise _bad(where + "offsets", list(offsets), f"the cumulative sums of the primes, {list(table.offsets)}")
    return table


def _or_none(value: Any, parse: Callable[[Any], Any]) -> Any:
    return None if value is None else parse(value)


def parse_addressing(d: Any) -> EngineAddressing:
    """JSON values (as written by :meth:`EngineAddressing.to_json`) -> the spec, checked field by field."""
    if not isinstance(d, Mapping) or d.get("format") != ADDRESSING_FORMAT:
        got = d.get("format") if isinstance(d, Mapping) else type(d).__name__
        raise _bad("format", got, repr(ADDRESSING_FORMAT))
    if d.get("version") != ADDRESSING_VERSION:
        raise _bad("version", d.get("version"), f"{ADDRESSING_VERSION} (the only version this polymem reads)")
    name = _field(d, "name")
    if not isinstance(name, str) or not name:
        raise _bad("name", name, "a non-empty string such as 'deepseek-v4.1'")
    vocab_size = _int(_field(d, "vocab_size"), "vocab_size", low=1)
    layers = _field(d, "layers")
    if not isinstance(layers, list) or not layers:
        raise _bad("layers", layers, "a non-empty list of layer objects")
    id_map = _field(d, "id_map")
    if id_map is not None and not isinstance(id_map, Mapping):
        raise _bad("id_map", id_map, "null or an object with encoding, sha256, data")
    params = d.get("params", {})
    if not isinstance(params, Mapping):
        raise _bad("params", params, "an object")
    try:
        return EngineAddressing(
            name=name, vocab_size=vocab_size, orders=_ints(_field(d, "orders"), "orders", low=2),
            heads=_int(_field(d, "heads"), "heads", low=1), layers=tuple(_layer(t, i) for i, t in enumerate(layers)),
            fill_id=_int(_field(d, "fill_id"), "fill_id"),
            boundary_id=_or_none(_field(d, "boundary_id"), lambda v: _int(v, "boundary_id")),
            id_map=_or_none(id_map, lambda v: decode_id_map(v, vocab_size)), params=dict(params))
    except FormatError:
        raise
    except PolymemError as e:
        raise FormatError(f"engine addressing is inconsistent: {e}; {_FIX}") from None
