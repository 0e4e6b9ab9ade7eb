"""The fuzzing harness of tests/test_fuzz_parsers.py: mutators, the rule every parser obeys, and its run settings.

    @fuzz(20)                                   # 20 examples; POLYMEM_FUZZ_EXAMPLES=2000 for a long run
    @given(data=st.data())
    def test_x(data):
        blob = mutate_bytes(data, seed)         # byte flips, truncation, inserted / deleted / repeated runs,
        doc = mutate_json(data, doc)            # ... or a JSON field replaced (wrong type, huge, negative, ...)
        with Watch(tmp) as w:                   # nothing under tmp changes but what w.allowed names
            result = refused_or(parse, path)    # the result, or None after a PolymemError

The rule (docs/reliability.md, "Fuzzing"): a parser of untrusted input returns a correct result or raises a
:class:`polymem.errors.PolymemError` — never another exception (a traceback), never a hang (each call runs under
a time budget, :func:`budget`), and never writes outside its target.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator

from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import strategies as st

from polymem.errors import PolymemError

LONG = int(os.environ.get("POLYMEM_FUZZ_EXAMPLES", "0") or 0)  # examples per target in a long run (0: default tier)
BUDGET_S = float(os.environ.get("POLYMEM_FUZZ_BUDGET_S", "20"))  # one parser call; generous for busy machines


def fuzz(default: int) -> settings:
    """Hypothesis settings of one fuzz target: ``default`` examples, derandomized (the same inputs every run) in the
    default tier; POLYMEM_FUZZ_EXAMPLES examples from a random start in a long run."""
    return settings(max_examples=LONG or default, deadline=None, derandomize=not LONG, database=None,
                    suppress_health_check=list(HealthCheck), phases=[p for p in Phase if p is not Phase.explain],
                    print_blob=bool(LONG))


# ------------------------------------------------------------------------------------------------ the rule
class Hang(BaseException):
    """A parser call ran past its time budget (a BaseException: no ``except Exception`` in a parser swallows it)."""


@contextlib.contextmanager
def budget(seconds: float = BUDGET_S) -> Iterator[None]:
    """Raise :class:`Hang` in the block once it has run ``seconds`` (SIGALRM: Python code is interrupted at the next
    bytecode; a call stuck inside a C extension is interrupted when it returns)."""
    def on_alarm(signum: int, frame: Any) -> None:
        raise Hang(f"the parser ran past its budget of {seconds:g} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def crash_site(e: BaseException) -> tuple[str, str, str]:
    """(exception type, file, function) of the innermost frame of polymem that an exception passed through."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if f"{os.sep}polymem{os.sep}" in f.filename]
    last = frames[-1] if frames else None
    where = (os.path.relpath(last.filename, Path(__file__).resolve().parents[1]), last.name) if last else ("?", "?")
    return (type(e).__name__, *where)


def refused_or(fn: Callable[..., Any], *args: Any, known: dict[tuple[str, str, str], str] | None = None,
               **kw: Any) -> Any:
    """``fn(*args, **kw)`` under the time budget: its result, or None when it raised a PolymemError. Any other
    exception propagates (the fuzz test fails with it and hypothesis shrinks the input), except a crash in a file
    this harness may not fix that ``known`` lists by :func:`crash_site` (each one also pinned by a strict xfail
    test): that one counts as refused."""
    name = getattr(fn, "__qualname__", "call")
    try:
        with budget():
            result = fn(*args, **kw)
    except PolymemError as e:
        event(f"{name}: {type(e).__name__}")  # --hypothesis-show-statistics: how often each parser got how far
        return None
    except Exception as e:
        if known and crash_site(e) in known:
            event(f"{name}: known crash {crash_site(e)}")
            return None
        raise
    event(f"{name}: result")
    return result


# ------------------------------------------------------------------------------------------ no stray writes
def tree(root: Path) -> dict[str, tuple[Any, ...]]:
    """Every entry under ``root``: relative path -> (kind, size, mtime_ns, link target); links are not followed."""
    out: dict[str, tuple[Any, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            s = os.lstat(p)
            link = os.readlink(p) if os.path.islink(p) else None
            out[os.path.relpath(p, root)] = (s.st_mode >> 12, s.st_size if not os.path.isdir(p) else 0,
                                              s.st_mtime_ns if not os.path.isdir(p) else 0, link)
    return out


class Watch:
    """Asserts on exit that nothing under ``root`` changed (a file written, created, removed or touched) except
    the paths under the relative names in ``allowed`` (a writer's target)."""

    def __init__(self, root: Path, allowed: tuple[str, ...] = ()) -> None:
        self.root, self.allowed = root, allowed

    def _mine(self, rel: str) -> bool:
        return any(rel == a or rel.startswith(a + os.sep) for a in self.allowed)

    def __enter__(self) -> "Watch":
        self.before = {k: v for k, v in tree(self.root).items() if not self._mine(k)}
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is not None:
            return
        after = {k: v for k, v in tree(self.root).items() if not self._mine(k)}
        changed = sorted(k for k in set(self.before) | set(after) if self.before.get(k) != after.get(k))
        assert not changed, f"the parser changed files outside its target: {changed}"


# ------------------------------------------------------------------------------------------------ mutators
class Raw(str):
    """JSON text written as is: numbers no Python value prints (``1e999``, 5000 digits), NaN, deep nesting."""

    def __repr__(self) -> str:
        text = str(self)
        return f"Raw({text!r})" if len(text) <= 40 else f"Raw({text[:20]!r} ... {len(text)} characters)"


class Pairs(list):  # type: ignore[type-arg]
    """A JSON object as (key, value) pairs, so a key can be given twice."""


HOSTILE: list[Any] = [
    None, True, False, 0, 1, -1, 2, 3, 8, 255, 256, 4096, 2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63,
    2**64, 2**64 + 1, -(2**63), 10**30, 0.5, -0.0, 1.0, 3.0, 1e308, -1e-308, float("nan"), float("inf"),
    float("-inf"), Raw("1e999"), Raw("-1e999"), Raw("1" * 5000), Raw("[" * 3000 + "]" * 3000), "", "0", "1", "-1",
    "x", "nan", "0x10", "0xffffffffffffffffff", "true", "../outside.safetensors", "/etc/passwd", "a/b", "..", ".",
    "\x00", "\ud800", "\x1b[2J", "é" * 3, "x" * 5000, [], [0], [None], [[]], [1, 2, 3], {}, {"": None}, {"a": 1},
]


def dumps(v: Any) -> str:
    """JSON text of ``v``, with :class:`Raw` values and :class:`Pairs` objects written as they are."""
    if isinstance(v, Raw):
        return str(v)
    if isinstance(v, Pairs):
        return "{" + ",".join(json.dumps(str(k)) + ":" + dumps(x) for k, x in v) + "}"
    if isinstance(v, dict):
        return "{" + ",".join(json.dumps(str(k)) + ":" + dumps(x) for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(dumps(x) for x in v) + "]"
    return json.dumps(v)


def _swap(data: st.DataObject, node: Any) -> Any:
    """``node`` as another type or scale of itself: a list for an object, an object for a list, a number's string,
    its negative or a huge multiple, a float for an int, a string's repeat, ..."""
    if isinstance(node, Raw):
        options = [0, "", []]
    elif isinstance(node, dict):
        options = [list(node.values()), [node], list(node.keys()), {}, Pairs(list(node.items()) * 2)]
    elif isinstance(node, list):
        options = [{str(i): v for i, v in enumerate(node)}, node[:1], node[1:], node * 2, node[::-1], [node]]
    elif isinstance(node, bool):
        options = [int(node), str(node).lower(), not node]
    elif isinstance(node, int):
        options = [str(node), -node, node + 1, node - 1, node * 2**32, float(node) + 0.5, float(node), [node]]
    elif isinstance(node, float):
        options = [int(node) if node == node and abs(node) < 1e300 else 0, -node, node * 1e300, str(node)]
    elif isinstance(node, str):
        options = [node * 200, node[:-1], node + "\x00", node.upper(), int(node) if node.isdigit() else len(node), [node]]
    else:
        options = [0, "", []]
    return data.draw(st.sampled_from(options))


def _replacement(data: st.DataObject, node: Any) -> Any:
    how = data.draw(st.sampled_from(["hostile", "swap", "int", "text"]))
    if how == "hostile":
        return copy.deepcopy(data.draw(st.sampled_from(HOSTILE)))  # a copy: later edits must not change HOSTILE
    if how == "swap":
        return _swap(data, node)
    if how == "int":
        return data.draw(st.integers(-(2**70), 2**70))
    return data.draw(st.text(max_size=12))


def _walk(data: st.DataObject, doc: Any) -> tuple[Any, Any, Any]:
    """(parent, key, node): a random walk from the root, descending two times in three at each container."""
    parent, key, node = None, None, doc
    while isinstance(node, (dict, list)) and not isinstance(node, Pairs) and node and data.draw(st.integers(0, 2)):
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        key = data.draw(st.sampled_from(keys))
        parent, node = node, node[key]
    return parent, key, node


def mutate_json(data: st.DataObject, doc: Any, max_ops: int = 3) -> Any:
    """A copy of ``doc`` with 1..max_ops edits, each at a node a random walk reaches: replaced (a hostile value,
    a type swap, a random integer or text), removed, given twice (a repeated key) or given a new sibling."""
    doc = copy.deepcopy(doc)
    for _ in range(data.draw(st.integers(1, max_ops))):
        parent, key, node = _walk(data, doc)
        op = data.draw(st.sampled_from(["replace", "replace", "delete", "repeat", "add"]))
        if parent is None and op != "replace" and isinstance(node, dict):
            node[data.draw(st.sampled_from(["extra", "", "__metadata__"]))] = _replacement(data, None)
        elif parent is None or isinstance(parent, Pairs):
            doc = _replacement(data, node)
        elif op == "replace":
            parent[key] = _replacement(data, node)
        elif op == "delete":
            del parent[key]
        elif op == "repeat" and isinstance(parent, dict):
            parent[key] = node  # keep it, and give it again below with another value
            pairs = Pairs(list(parent.items()) + [(key, _replacement(data, node))])
            parent.clear()
            parent["__pairs__"] = pairs  # written by dumps_pairs
        elif isinstance(parent, list):
            parent.insert(key, _replacement(data, node))
        else:
            parent[data.draw(st.sampled_from(["extra", "", "__metadata__", "x" * 300]))] = _replacement(data, node)
    return _resolve_pairs(doc)


def _resolve_pairs(v: Any) -> Any:
    if isinstance(v, dict):
        if set(v) == {"__pairs__"} and isinstance(v["__pairs__"], Pairs):
            return Pairs((k, _resolve_pairs(x)) for k, x in v["__pairs__"])
        return {k: _resolve_pairs(x) for k, x in v.items()}
    if isinstance(v, list) and not isinstance(v, Pairs):
        return [_resolve_pairs(x) for x in v]
    return v


INTERESTING = [0, 1, 2, 7, 8, 24, 255, 256, 4096, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**62, 2**63, 2**64 - 1]


def mutate_bytes(data: st.DataObject, blob: bytes, max_ops: int = 4) -> bytes:
    """``blob`` with 1..max_ops edits: a bit flipped, a byte set, cut short, bytes inserted, deleted or repeated,
    or 4 / 8 bytes overwritten with an interesting little-endian integer (a length, a count, an offset)."""
    b = bytearray(blob)
    for _ in range(data.draw(st.integers(1, max_ops))):
        op = data.draw(st.sampled_from(["flip", "set", "truncate", "insert", "delete", "repeat", "int"]))
        pos = data.draw(st.integers(0, max(len(b) - 1, 0)))
        if op == "flip" and b:
            b[pos] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "set" and b:
            b[pos] = data.draw(st.sampled_from([0, 0xFF, 0x7F, 0x80, ord("{"), ord('"'), ord("\n"), 0xC3]))
        elif op == "truncate":
            del b[pos:]
        elif op == "insert":
            b[pos:pos] = data.draw(st.binary(min_size=1, max_size=16))
        elif op == "delete":
            del b[pos:pos + data.draw(st.integers(1, 64))]
        elif op == "repeat":
            b[pos:pos] = b[pos:pos + data.draw(st.integers(1, 64))]
        elif op == "int":
            width = data.draw(st.sampled_from([4, 8]))
            value = data.draw(st.sampled_from(INTERESTING + [len(blob), len(blob) + 1])) % (1 << (8 * width))
            b[pos:pos + width] = value.to_bytes(width, "little")
    return bytes(b)
