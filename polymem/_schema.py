"""Declared schemas for the JSON files polymem writes and later reads back (a checkpoint's ``state.json``, the
model cache's manifests), checked before any field is used.

A schema is a value built from the small set of node types below; :func:`validate` walks a parsed JSON value
against it and raises one error naming the first field that does not fit, the value found and what is accepted:

    >>> STATE = Obj({"step": Int(0, 10**9), "losses": ListOf(Num()), "train_s": Num(0)})
    >>> validate({"step": -1, "losses": [], "train_s": 0}, STATE, where="ckpt/state.json", fix="remove it")
    FormatError: ckpt/state.json: field 'step' is -1; expected an integer in [0, 1000000000]: remove it

Booleans are never numbers here (JSON ``true`` is not a step), floats must be finite, and an integer-valued float
(``9.0``) is not an integer. What this module does not do: coerce values, fill defaults or check relations between
fields (a caller checks those after the schema holds). Written by hand rather than with a validation library:
the rules are a few lines each, and the error wording is polymem's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from polymem.errors import FormatError


class _Misfit(Exception):
    def __init__(self, path: str, value: Any, want: str) -> None:
        super().__init__(path)
        self.path, self.value, self.want = path, value, want


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class Schema:
    """One node of a schema: ``check(value, path)`` raises a misfit naming ``path`` when ``value`` does not fit."""

    want = "a value"

    def check(self, value: Any, path: str) -> None:  # pragma: no cover - every node overrides it
        raise NotImplementedError


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class Int(Schema):
    """An integer (not a bool, not a float) in [lo, hi]."""

    lo: int | None = None
    hi: int | None = None

    @property
    def want(self) -> str:  # type: ignore[override]
        if self.lo is not None and self.hi is not None:
            return f"an integer in [{self.lo}, {self.hi}]"
        return "an integer" + (f" >= {self.lo}" if self.lo is not None else "") + (
            f" <= {self.hi}" if self.hi is not None else "")

    def check(self, value: Any, path: str) -> None:
        if not _is_int(value) or (self.lo is not None and value < self.lo) or (self.hi is not None and value > self.hi):
            raise _Misfit(path, value, self.want)


@dataclass(frozen=True)
class Num(Schema):
    """A finite number (an integer or a float, not a bool) in [lo, hi]; ``finite=False`` lets inf and NaN in."""

    lo: float | None = None
    hi: float | None = None
    finite: bool = True  # False: inf and NaN are numbers too (a diverged run's loss)

    @property
    def want(self) -> str:  # type: ignore[override]
        kind = "a finite number" if self.finite else "a number"
        return kind + (f" >= {self.lo}" if self.lo is not None else "") + (f" <= {self.hi}" if self.hi is not None else "")

    def check(self, value: Any, path: str) -> None:
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
              and (math.isfinite(value) or not self.finite)
              and (self.lo is None or value >= self.lo) and (self.hi is None or value <= self.hi))
        if not ok:
            raise _Misfit(path, value, self.want)


@dataclass(frozen=True)
class Str(Schema):
    """A string of at most ``max_len`` characters (non-empty unless ``empty``)."""

    max_len: int = 4096
    empty: bool = False

    @property
    def want(self) -> str:  # type: ignore[override]
        return f"a {'' if self.empty else 'non-empty '}string of at most {self.max_len:,} characters"

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, str) or len(value) > self.max_len or (not value and not self.empty):
            raise _Misfit(path, value, self.want)


@dataclass(frozen=True)
class Const(Schema):
    """Exactly one of ``values`` (compared with ==, type too: 1 is not True)."""

    values: tuple[Any, ...]

    @property
    def want(self) -> str:  # type: ignore[override]
        return "one of " + ", ".join(map(repr, self.values))

    def check(self, value: Any, path: str) -> None:
        if not any(type(value) is type(v) and value == v for v in self.values):
            raise _Misfit(path, value, self.want)


@dataclass(frozen=True)
class Nullable(Schema):
    """None (JSON null) or a value of ``inner``."""

    inner: Schema

    @property
    def want(self) -> str:  # type: ignore[override]
        return f"null or {self.inner.want}"

    def check(self, value: Any, path: str) -> None:
        if value is not None:
            try:
                self.inner.check(value, path)
            except _Misfit as m:
                raise _Misfit(m.path, m.value, self.want if m.path == path else m.want) from None


@dataclass(frozen=True)
class AnyOf(Schema):
    """A value of one of ``options`` (the first that fits)."""

    options: tuple[Schema, ...]

    @property
    def want(self) -> str:  # type: ignore[override]
        return " or ".join(o.want for o in self.options)

    def check(self, value: Any, path: str) -> None:
        for o in self.options:
            try:
                o.check(value, path)
                return
            except _Misfit:
                continue
        raise _Misfit(path, value, self.want)


@dataclass(frozen=True)
class ListOf(Schema):
    """A list of ``min_len`` to ``max_len`` items, each of ``item``."""

    item: Schema
    max_len: int = 1 << 24
    min_len: int = 0

    @property
    def want(self) -> str:  # type: ignore[override]
        size = f"at most {self.max_len:,}" if not self.min_len else f"{self.min_len:,} to {self.max_len:,}"
        return f"a list of {size} items, each {self.item.want}"

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, list) or not self.min_len <= len(value) <= self.max_len:
            raise _Misfit(path, value, self.want)
        for i, v in enumerate(value):
            self.item.check(v, f"{path}[{i}]")


@dataclass(frozen=True)
class MapOf(Schema):
    """An object of at most ``max_len`` entries, each value of ``value`` (keys are strings in JSON)."""

    value: Schema
    max_len: int = 1 << 16

    @property
    def want(self) -> str:  # type: ignore[override]
        return f"an object of at most {self.max_len:,} entries, each {self.value.want}"

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, dict) or len(value) > self.max_len:
            raise _Misfit(path, value, self.want)
        for k, v in value.items():
            self.value.check(v, f"{path}.{k}")


@dataclass(frozen=True)
class Obj(Schema):
    """An object holding every field of ``fields`` (but those in ``optional``), each of its schema; other fields
    are allowed (a newer writer may add some)."""

    fields: dict[str, Schema]
    optional: frozenset[str] = field(default_factory=frozenset)

    want = "an object"

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, dict):
            raise _Misfit(path, value, "an object")
        for name, schema in self.fields.items():
            where = f"{path}.{name}" if path else name
            if name not in value:
                if name in self.optional:
                    continue
                raise _Misfit(where, "(missing)", schema.want)
            schema.check(value[name], where)


def validate(value: Any, schema: Schema, *, where: str, fix: str, error: type[Exception] = FormatError) -> Any:
    """``value`` when it fits ``schema``; else ``error``: ``WHERE: field 'F' is V; expected W: FIX``."""
    try:
        schema.check(value, "")
    except _Misfit as m:
        name = f"field {m.path!r}" if m.path else "the file"
        shown = m.value if m.value == "(missing)" else _shown(m.value)
        raise error(f"{where}: {name} is {shown}; expected {m.want}: {fix}") from None
    return value
