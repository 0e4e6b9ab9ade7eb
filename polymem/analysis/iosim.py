"""I/O simulator: page reads per token of a token stream through equal-parameter layouts (Table 6 of the PageGram report).

Each valid n-gram of the asset's orders reads the storage blocks (zarr inner chunks: one page, or a 4 KiB
block of NF4 pages) that hold its K head rows — one block for page-local and flat, K for independent heads —
deduplicated within the n-gram. Positions are visited token by token, order by order, head by head. The
block stream goes through an LRU cache of C blocks (C = cache bytes // block bytes); every miss is one read.
"Uncached" is the stream length (every lookup goes to storage).

Worked example (capacity 2): blocks 1 2 1 3 2 1 -> miss miss hit miss(evicts 2) miss(evicts 1) miss = 5.

The simulator needs only the layout geometry and the block size, not the table, so a 20B-parameter table is
simulated without disk. Not here: tokenising or reading corpora (the CLI does that), plotting.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numba
import numpy as np

from polymem.asset._format import Geometry, geometry
from polymem.hash.token_hashes import TokenHashes
from polymem.errors import PolymemError
from polymem.hash.layout import LAYOUT_KINDS, Layout
from polymem.hash.spec import check_orders

IOSIM_FORMAT = "polymem.analysis.iosim"


# ------------------------------------------------------------------------------------ block streams
def ngram_blocks(rows: np.ndarray, geom: Geometry) -> np.ndarray:
    """rows int64 [T, O, K] (-1 invalid) -> the block stream int64 [M]: per (t, o), its distinct blocks in head order."""
    T, O, K = rows.shape
    blocks = np.where(rows >= 0, rows // geom.rows_per_page // geom.pages_per_chunk, -1)  # [T, O, K]
    return distinct_in_groups(blocks.reshape(T * O, K))  # t, then o, then k; a block once per n-gram


@numba.njit(cache=True, nogil=True)
def distinct_in_groups(ids):  # pragma: no cover - compiled
    """ids int64 [M, X] (-1: none) -> int64 [*]: each row's distinct ids in column order, row after row."""
    out = np.empty(ids.size, dtype=np.int64)
    n = 0
    for m in range(ids.shape[0]):
        first = n
        for x in range(ids.shape[1]):
            p = ids[m, x]
            seen = p < 0
            for j in range(first, n):
                seen = seen or out[j] == p
            if not seen:
                out[n] = p
                n += 1
    return out[:n]


@numba.njit(cache=True, nogil=True)
def _lru_run(stream, capacity, prev, nxt, state):  # pragma: no cover - compiled
    # Doubly-linked list over block ids; state = [head (MRU), tail (LRU), size, misses]; -1 = none.
    # prev[b] == -2 marks "not cached".
    head, tail, size, misses = state[0], state[1], state[2], state[3]
    for i in range(stream.shape[0]):
        b = stream[i]
        if prev[b] != -2:  # hit: move b to the front
            if b != head:
                p, n = prev[b], nxt[b]
                nxt[p] = n
                if n != -1:
                    prev[n] = p
                else:
                    tail = p
                prev[b] = -1
                nxt[b] = head
                prev[head] = b
                head = b
            continue
        misses += 1
        if capacity == 0:
            continue
        if size == capacity:  # evict the least recently used
            t = tail
            tail = prev[t]
            if tail != -1:
                nxt[tail] = -1
            else:
                head = -1
            prev[t] = -2
            size -= 1
        prev[b] = -1
        nxt[b] = head
        if head != -1:
            prev[head] = b
        head = b
        if tail == -1:
            tail = b
        size += 1
    state[0], state[1], state[2], state[3] = head, tail, size, misses


@dataclass
class LRUCache:
    """LRU cache over block ids 0..n_blocks-1 holding ``capacity`` blocks; feed streams, read ``misses``."""

    capacity: int
    n_blocks: int
    _prev: np.ndarray = field(init=False, repr=False)
    _next: np.ndarray = field(init=False, repr=False)
    _state: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.capacity < 0:
            raise PolymemError(f"cache capacity {self.capacity} must be >= 0 blocks")
        links = np.int32 if self.n_blocks < 2**31 else np.int64  # half the memory for tables up to 8 TiB of 4 KiB
        self._prev = np.full(self.n_blocks, -2, dtype=links)
        self._next = np.full(self.n_blocks, -1, dtype=links)
        self._state = np.array([-1, -1, 0, 0], dtype=np.int64)

    def feed(self, stream: np.ndarray) -> None:
        s = np.ascontiguousarray(stream, dtype=np.int64)
        if s.size and (int(s.min()) < 0 or int(s.max()) >= self.n_blocks):
            raise PolymemError(f"block ids must lie in [0, {self.n_blocks}), got {int(s.min())}..{int(s.max())}")
        _lru_run(s, self.capacity, self._prev, self._next, self._state)

    @property
    def misses(self) -> int:
        return int(self._state[3])


def lru_misses_reference(stream: Iterable[int], capacity: int) -> int:
    """Readable reference of :class:`LRUCache` (OrderedDict); for tests and small streams."""
    cache: OrderedDict[int, None] = OrderedDict()
    misses = 0
    for b in stream:
        if b in cache:
            cache.move_to_end(b)
            continue
        misses += 1
        if capacity:
            if len(cache) == capacity:
                cache.popitem(last=False)
            cache[b] = None
    return misses


# ------------------------------------------------------------------------------------ the simulation
@dataclass(frozen=True, kw_only=True)
class IoResult:
    """Reads per token of one layout kind at every cache size."""

    kind: str
    tokens: int
    ngrams: int  # valid n-grams looked up
    uncached_reads: int
    cache_bytes: tuple[int, ...]
    cache_blocks: tuple[int, ...]
    cached_reads: tuple[int, ...]

    @property
    def uncached_per_token(self) -> float:
        return self.uncached_reads / max(self.tokens, 1)

    def per_token(self) -> list[float]:
        return [m / max(self.tokens, 1) for m in self.cached_reads]


@dataclass(frozen=True, kw_only=True)
class IoSimulation:
    """Equal-parameter layouts over one token stream."""

    base: Layout
    dtype: str
    orders: tuple[int, ...]
    block_bytes: int
    pages_per_block: int
    table_bytes: int
    results: tuple[IoResult, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": IOSIM_FORMAT, "version": 1,
            "layout": {**self.base.to_dict(), "orders": list(self.orders)}, "dtype": self.dtype,
            "params": self.base.params, "table_bytes": self.table_bytes, "block_bytes": self.block_bytes,
            "pages_per_block": self.pages_per_block,
            "results": [
                {
                    "kind": r.kind, "tokens": r.tokens, "ngrams": r.ngrams, "uncached_reads": r.uncached_reads,
                    "uncached_reads_per_token": r.uncached_per_token,
                    "cache": [
                        {"bytes": b, "blocks": c, "reads": m, "reads_per_token": m / max(r.tokens, 1)}
                        for b, c, m in zip(r.cache_bytes, r.cache_blocks, r.cached_reads)
                    ],
                }
                for r in self.results
            ],
        }


def equal_param_layouts(base: Layout, kinds: Sequence[str] = LAYOUT_KINDS) -> list[Layout]:
    """The same P, K, S, r under each layout kind (same parameters, same page geometry)."""
    for k in kinds:
        if k not in LAYOUT_KINDS:
            raise PolymemError(f"layout kind {k!r} is unknown; accepted: {', '.join(LAYOUT_KINDS)}")
    return [Layout(pages=base.pages, heads=base.heads, slots=base.slots, head_dim=base.head_dim, kind=k) for k in kinds]


def simulate(
    token_streams: Iterable[np.ndarray], cache: TokenHashes, base: Layout, *, orders: Sequence[int] = (1, 2, 3),
    dtype: str = "nf4", cache_bytes: Sequence[int] = (), kinds: Sequence[str] = LAYOUT_KINDS,
    max_tokens: int | None = None,
) -> IoSimulation:
    """Replay ``token_streams`` (one int array per document) through each layout kind and every cache size."""
    orders_t = check_orders(orders)
    layouts = equal_param_layouts(base, kinds)
    geom = geometry(base, dtype)
    n_blocks = geom.num_chunks
    # a cache of more blocks than the table has holds all of it (and a size like 1e30 bytes cannot overflow)
    caps = [min(int(b) // geom.chunk_bytes, n_blocks) for b in cache_bytes]
    lrus = {L.kind: [LRUCache(c, n_blocks) for c in caps] for L in layouts}
    uncached = dict.fromkeys(lrus, 0)
    ngrams = 0
    tokens = 0
    cols = np.array(orders_t) - 1
    max_n = orders_t[-1]
    for ids in token_streams:
        ids = np.asarray(ids, dtype=np.int64)
        if max_tokens is not None:
            ids = ids[: max(0, max_tokens - tokens)]
        if ids.size == 0:
            if max_tokens is not None and tokens >= max_tokens:
                break
            continue
        tokens += ids.shape[0]
        for L in layouts:
            rows = cache.ngram_rows(ids, L, max_n)[:, cols, :]  # [T, O, K]
            if L is layouts[0]:
                ngrams += int((rows[..., 0] >= 0).sum())
            stream = ngram_blocks(rows, geom)
            uncached[L.kind] += int(stream.shape[0])
            for lru in lrus[L.kind]:
                lru.feed(stream)
    results = tuple(
        IoResult(
            kind=L.kind, tokens=tokens, ngrams=ngrams, uncached_reads=uncached[L.kind],
            cache_bytes=tuple(int(b) for b in cache_bytes), cache_blocks=tuple(caps),
            cached_reads=tuple(lru.misses for lru in lrus[L.kind]),
        )
        for L in layouts
    )
    return IoSimulation(
        base=base, dtype=dtype, orders=orders_t, block_bytes=geom.chunk_bytes, pages_per_block=geom.pages_per_chunk,
        table_bytes=n_blocks * geom.chunk_bytes, results=results,
    )


def plot(sim: IoSimulation, path: str) -> None:
    """Reads per token vs cache size, one line per layout kind (uncached as a dashed level)."""
    from polymem._optional import pyplot

    plt = pyplot("iosim --plot")

    from matplotlib.ticker import NullLocator, ScalarFormatter

    fig, ax = plt.subplots(figsize=(6, 4))
    mb = [b / 2**20 for b in sim.results[0].cache_bytes]
    for i, r in enumerate(sim.results):
        # layouts that read alike (flat and page-local, often) draw as a wide line with a thin one on top
        style = dict(color=f"C{i}", marker="os^"[i % 3], ms=9 - 2 * (i % 3), lw=4 - 1.3 * (i % 3), alpha=0.85)
        same = [q.kind for q in sim.results[:i] if q.per_token() == r.per_token()]
        label = r.kind + (f" (= {same[0]})" if same else "")
        if mb:
            ax.plot(mb, r.per_token(), label=label, **style)
        ax.axhline(r.uncached_per_token, color=style["color"], ls="--", lw=0.8)
    if mb:
        ax.set_xscale("log")
        ax.set_xticks(mb, [f"{m:,.0f}" for m in mb])  # one label per cache size simulated, no 3×10¹ clutter
        ax.xaxis.set_minor_locator(NullLocator())
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.set_xlabel("LRU page cache (MiB)")
    ax.set_ylabel("storage reads per token")
    L = sim.base
    ax.set_title(
        f"{L.params / 1e6:,.0f}M params, K={L.heads} S={L.slots} r={L.head_dim}, {sim.dtype}, "
        f"orders {','.join(map(str, sim.orders))}\n(dashed: uncached; table {sim.table_bytes / 2**30:.2f} GiB)",
        fontsize=9,
    )
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    from polymem._optional import save_figure

    save_figure(fig, path)
