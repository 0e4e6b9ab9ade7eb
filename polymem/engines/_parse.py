"""Reading an engine addressing spec from JSON: one parse function per field, each error naming the field.

Every error is one line: the field, the value received, what is accepted and the fix. Checks that span fields
(multiplier bound, prime count, row count) are :class:`EngineAddressing`'s own and are reported as FormatError.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from polymem.engines.addressing import (ADDRESSING_FORMAT, ADDRESSING_VERSION, EngineAddressing, LayerTable,
                                        decode_id_map)
from polymem.errors import FormatError, PolymemError

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


def _optional(value: Any, parse: Callable[[Any], Any]) -> Any:
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
            boundary_id=_optional(_field(d, "boundary_id"), lambda v: _int(v, "boundary_id")),
            id_map=_optional(id_map, lambda v: decode_id_map(v, vocab_size)), params=dict(params))
    except FormatError:
        raise
    except PolymemError as e:
        raise FormatError(f"engine addressing is inconsistent: {e}; {_FIX}") from None
