"""Assets as portable artifacts: ``convert`` (token-id tables → byte addressing), ``subset`` (by corpus),
``merge`` (donors of one hash spec and layout). Torch-free. CLI: ``polymem convert|subset|merge``.

* :func:`convert` replays a corpus with the source tokenizer; for every n-gram occurrence it reads the source
  table's rows through the token-id hash and accumulates them into the byte-hash rows of the target layout (head k
  of order n → head k of order n); each target row is the occurrence-weighted mean of what it received.
* :func:`subset` keeps only the pages a corpus's n-grams touch (and/or pages holding a row updated at least
  ``min_count`` times); absent chunks are not stored (a sparse asset, docs/asset-format.md §12).
* :func:`merge` combines rows of assets with the same hash spec and layout, weighted by their update counts.

Sources for convert: a polymem asset or table file written by ``polymem train --hash xor`` (or any
tokenizer-bound asset), or an Engram demo table in the safetensors form of docs/asset-format.md §10
(:func:`read_engram_table`, :func:`write_engram_table`), or an imported engine table (``polymem import``),
which :mod:`polymem.engines.convert` re-addresses one layer at a time.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from polymem.asset._opbase import Progress, _check_out, _documents, _noop, _now
from polymem.errors import FormatError, PolymemError, SpecMismatchError
from polymem.hash.idhash import IdHashSpec
from polymem.hash.layout import Layout
from polymem.hash.spec import HashSpec

MERGE_HOWS = ("count-weighted", "mean", "first")
ENGRAM_FORMAT = "engram.hash-table"


# ------------------------------------------------------------------------------------- Engram form
@dataclass
class IdTable:
    """A tokenizer-bound table in memory: rows [R, r], its spec, and where each (order, head) sub-table starts."""

    spec: IdHashSpec
    table: np.ndarray  # float32 [R, r]
    offsets: np.ndarray  # int64 [len(orders), K]: first row of each sub-table in ``table``
    id_map: np.ndarray | None = None  # int64 [V_tokenizer]: tokenizer id -> hashed id (Engram's compression)
    counts: np.ndarray | None = None
    source: dict[str, Any] = field(default_factory=dict)

    def rows(self, ids: np.ndarray, special: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Tokenizer ids [T] -> (rows int64 [T, len(orders), K] into ``table`` (-1 invalid), valid [T, len(orders)])."""
        ids = np.asarray(ids, dtype=np.int64)
        hid = ids
        if self.id_map is not None:
            if ids.size and int(ids.max()) >= self.id_map.shape[0]:
                raise PolymemError(f"token id {int(ids.max())} is beyond the Engram lookup_table ({self.id_map.shape[0]} ids)")
            hid = self.id_map[ids]
        u, valid = self.spec.residues(hid, None)
        if special is not None:  # a special id (separator) breaks n-grams
            bad = np.asarray(special, dtype=bool)[ids]
            for oi, n in enumerate(self.spec.orders):
                win = bad.copy()
                for s in range(1, n):
                    win[s:] |= bad[:-s]
                valid[:, oi] &= ~win
        rows = u + self.offsets
        rows[~valid] = -1
        return rows, valid


def write_engram_table(
    path: str | os.PathLike[str], table: np.ndarray, *, layer_id: int, seed: int, vocab_size: int, max_n: int,
    heads: int, order_vocab_sizes: Sequence[int], primes: Sequence[int] | None = None, pad_id: int = 0,
    layer_ids: Sequence[int] | None = None, tokenizer: str = "", tokenizer_fingerprint: str = "",
    lookup_table: np.ndarray | None = None,
) -> Path:
    """Write one layer's Engram ``MultiHeadEmbedding`` table and its hash parameters (docs/asset-format.md §10)."""
    from safetensors.numpy import save_file

    spec = IdHashSpec.engram(layer_id=layer_id, seed=seed, vocab_size=vocab_size, max_n=max_n, heads=heads,
                             order_vocab_sizes=order_vocab_sizes, tokenizer={"name": tokenizer, "fingerprint": tokenizer_fingerprint},
                             pad_id=pad_id, layer_ids=layer_ids, primes=primes)
    t = np.ascontiguousarray(table, dtype=np.float32)
    if t.ndim != 2 or t.shape[0] != sum(spec.primes):
        raise PolymemError(f"Engram table has shape {t.shape}; its primes need [{sum(spec.primes)}, D/heads]")
    meta = {
        "format": ENGRAM_FORMAT, "version": "1", "layer_id": str(layer_id), "seed": str(seed),
        "vocab_size": str(vocab_size), "max_ngram_size": str(max_n), "n_head_per_ngram": str(heads),
        "engram_vocab_size": json.dumps([int(v) for v in order_vocab_sizes]),
        "primes": json.dumps([list(spec.primes[i * heads : (i + 1) * heads]) for i in range(max_n - 1)]),
        "multipliers": json.dumps([str(m) for m in spec.multipliers]), "pad_id": str(pad_id),
        "layer_ids": json.dumps([int(x) for x in (layer_ids or [layer_id])]),
        "tokenizer": tokenizer, "tokenizer_fingerprint": tokenizer_fingerprint,
    }
    tensors = {"multi_head_embedding.embedding.weight": t}
    if lookup_table is not None:
        tensors["lookup_table"] = np.ascontiguousarray(lookup_table, dtype=np.int64)
    return _atomic_file(Path(path), lambda tmp: save_file(tensors, str(tmp), metadata=meta))


def read_engram_table(path: str | os.PathLike[str]) -> IdTable:
    """Read the Engram safetensors form; recompute multipliers (and check the primes) from the parameters."""
    from safetensors import safe_open

    p = Path(path)
    with safe_open(str(p), framework="numpy") as f:
        meta = f.metadata() or {}
        if meta.get("format") != ENGRAM_FORMAT:
            raise FormatError(f"{str(p)!r}: safetensors metadata format is {meta.get('format')!r}, expected {ENGRAM_FORMAT!r} (docs/asset-format.md §10)")
        if meta.get("version") != "1":
            raise FormatError(f"{str(p)!r}: Engram table version {meta.get('version')!r}; this polymem reads '1'")
        keys = set(f.keys())
        wkey = next((k for k in ("multi_head_embedding.embedding.weight", "embedding.weight") if k in keys), None)
        if wkey is None:
            raise FormatError(f"{str(p)!r} has no tensor 'multi_head_embedding.embedding.weight'; tensors: {sorted(keys)}")
        table = np.asarray(f.get_tensor(wkey), dtype=np.float32)
        lut = np.asarray(f.get_tensor("lookup_table"), dtype=np.int64) if "lookup_table" in keys else None
    try:
        max_n, heads = int(meta["max_ngram_size"]), int(meta["n_head_per_ngram"])
        primes = [int(x) for row in json.loads(meta["primes"]) for x in row]
        spec = IdHashSpec.engram(
            layer_id=int(meta["layer_id"]), seed=int(meta["seed"]), vocab_size=int(meta["vocab_size"]), max_n=max_n,
            heads=heads, order_vocab_sizes=json.loads(meta["engram_vocab_size"]), pad_id=int(meta.get("pad_id", 0)),
            tokenizer={"name": meta.get("tokenizer", ""), "fingerprint": meta.get("tokenizer_fingerprint", "")},
            primes=primes)
    except KeyError as e:
        raise FormatError(f"{str(p)!r}: Engram metadata lacks {e.args[0]!r} (docs/asset-format.md §10)") from None
    except (ValueError, TypeError, PolymemError) as e:
        raise FormatError(f"{str(p)!r}: Engram metadata is malformed: {e}") from None
    from polymem.hash.xor import _is_prime

    if len(set(primes)) != len(primes) or not all(_is_prime(q) for q in primes):
        raise FormatError(f"{str(p)!r}: Engram primes {primes} must be distinct primes")
    if "multipliers" in meta and [int(m) for m in json.loads(meta["multipliers"])] != list(spec.multipliers):
        raise FormatError(f"{str(p)!r}: stored multipliers differ from those recomputed from seed/layer_id/vocab_size "
                          "(numpy default_rng); the parameters were edited")
    if table.ndim != 2 or table.shape[0] != sum(primes):
        raise FormatError(f"{str(p)!r}: table has shape {table.shape}, the primes need {sum(primes)} rows")
    offs = np.concatenate([[0], np.cumsum(primes)[:-1]]).astype(np.int64).reshape(max_n - 1, heads)
    return IdTable(spec=spec, table=table, offsets=offs, id_map=lut,
                   source={"kind": "engram-safetensors", "path": str(p), "layer_id": int(meta["layer_id"])})


def open_id_table(src: Any) -> IdTable:
    """A tokenizer-bound source: an Engram safetensors file, or a polymem asset / table file with an id-hash spec."""
    if isinstance(src, IdTable):
        return src
    from polymem.asset.core import MemoryAsset

    p = Path(os.fspath(src)) if isinstance(src, (str, os.PathLike)) else Path("")
    if p.suffix == ".safetensors":
        if not p.is_file():
            raise PolymemError(f"source {str(p)!r} does not exist")
        from safetensors import safe_open

        with safe_open(str(p), framework="numpy") as f:
            meta = f.metadata() or {}
            if meta.get("format") == ENGRAM_FORMAT:
                pass
            elif "polymem" in meta:  # a polymem table file (polymem.torch.tablefile), read without torch
                head = json.loads(meta["polymem"])
                spec_d = head.get("hash_spec", {})
                if not isinstance(spec_d, dict) or spec_d.get("format") != "polymem.id-hash":
                    raise SpecMismatchError(f"{str(p)!r}: convert re-addresses tokenizer-bound tables; this table file is byte-addressed already")
                spec = IdHashSpec.from_dict(spec_d)
                cnt = np.asarray(f.get_tensor("counts")) if "counts" in f.keys() else None
                return IdTable(spec=spec, table=np.asarray(f.get_tensor("table"), dtype=np.float32), offsets=spec.offsets(),
                               counts=cnt, source={"kind": "polymem-table-file", "path": str(p), "provenance": head.get("provenance", {})})
            else:
                raise FormatError(f"{str(p)!r}: safetensors file is neither an Engram table (metadata format {ENGRAM_FORMAT!r}) "
                                  "nor a polymem table file; see docs/asset-format.md §10")
        return read_engram_table(p)
    a = src if isinstance(src, MemoryAsset) else MemoryAsset.open(src)
    spec = a.spec
    if not isinstance(spec, IdHashSpec):
        raise SpecMismatchError(
            f"{a.path}: convert re-addresses tokenizer-bound tables, but this asset is already byte-addressed "
            f"(hash spec {spec.spec_id}); use it as is, or `polymem subset`/`merge` it")
    counts = a.row_counts() if hasattr(a, "row_counts") else None
    return IdTable(spec=spec, table=np.asarray(a.to_numpy(), dtype=np.float32), offsets=spec.offsets(), counts=counts,
                   source={"kind": "polymem", "path": str(a.path), "provenance": dict(a.provenance)})


def convert_source(src: Any) -> tuple[Any, int, int]:
    """(the opened convert source, its heads per order, its row width): what a target layout must match."""
    from polymem.engines.convert import as_engine_table

    engine = as_engine_table(src)
    if engine is not None:
        return engine, engine.spec.addressing.heads, engine.layout.head_dim
    idt = open_id_table(src)
    return idt, idt.spec.heads, idt.table.shape[1]


# ------------------------------------------------------------------------------------------- helpers
def _atomic_file(dest: Path, write: Callable[[Path], Any], overwrite: bool = True) -> Path:
    if dest.exists() and not overwrite:
        raise PolymemError(f"{str(dest)!r} already exists; pass overwrite=True (CLI: --overwrite) or pick another path")
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dest


# ------------------------------------------------------------------------------------------- convert
@dataclass
class ConvertReport:
    path: str
    documents: int
    tokens: int
    occurrences: int  # valid byte n-gram occurrences of the orders both sides have (positions × orders)
    carried: int  # ... whose source rows were read and accumulated
    carried_nonzero: int  # ... whose source rows held a non-zero (trained) vector
    rows_written: int  # target rows that received at least one occurrence
    rows_nonzero: int
    target_rows: int
    layout: dict[str, Any]
    orders: list[int]
    seconds: float

    @property
    def share_carried(self) -> float:
        return self.carried / max(self.occurrences, 1)

    @property
    def share_carried_nonzero(self) -> float:
        return self.carried_nonzero / max(self.occurrences, 1)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "share_carried": self.share_carried, "share_carried_nonzero": self.share_carried_nonzero}


def convert(
    src: Any, tokenizer: Any, corpus: Any, out: str | os.PathLike[str], *, spec: HashSpec | None = None,
    layout: Layout | None = None, dtype: str = "float32", overwrite: bool = False, progress: Progress | None = None,
    layer: int | None = None,
) -> Any:
    """Re-address a tokenizer-bound table by bytes (see the module doc). Returns the report; writes ``out`` atomically.

    src: a ``--hash xor`` asset / table file, an Engram safetensors file, or an :class:`IdTable`. tokenizer: the
    source's tokenizer (its fingerprint must match the one the source names, when it names one). corpus: paths.
    layout: the target layout (default: page-local, the source's K heads and r, about the source's row count).
    An imported engine table goes to :func:`polymem.engines.convert.convert_engine` (``layer``: which of its
    layers; ``tokenizer`` optional for DeepSeek) and returns its ``EngineConvertReport``.
    """
    from polymem.asset.core import MemoryAsset
    from polymem.engines.convert import as_engine_table, convert_engine
    from polymem.hash.token_hashes import TokenHashes
    from polymem.tokenizers import load_tokenizer

    engine = as_engine_table(src)
    if engine is not None:
        return convert_engine(engine, corpus, out, tokenizer=tokenizer, layer=layer, spec=spec, layout=layout,
                              dtype=dtype, overwrite=overwrite, progress=progress)
    if layer is not None:
        raise PolymemError(f"--layer {layer} picks a layer of an engine table (`polymem import`); this source is "
                           "not one, and has one table: drop --layer")
    say = progress or _noop
    t0 = time.perf_counter()
    dest = _check_out(out, overwrite)
    idt = open_id_table(src)
    s = idt.spec
    if tokenizer is None:
        raise PolymemError("converting a tokenizer-bound table needs its tokenizer; fix: pass --tokenizer")
    tok = load_tokenizer(tokenizer)
    want_fp = s.tokenizer.get("fingerprint")
    if want_fp and tok.fingerprint != want_fp:
        raise SpecMismatchError(
            f"the source table is bound to tokenizer {s.tokenizer.get('name')!r} (fingerprint {want_fp[:16]}…); "
            f"{tok.name!r} has fingerprint {tok.fingerprint[:16]}…: replay the corpus with the source's tokenizer")
    r = idt.table.shape[1]
    if layout is None:
        layout = Layout.for_params(max(idt.table.shape[0], s.heads * 4) * r, heads=s.heads, slots=4, head_dim=r)
    if layout.heads != s.heads or layout.head_dim != r:
        raise SpecMismatchError(
            f"target layout has K={layout.heads} heads of r={layout.head_dim}; the source has K={s.heads} heads of "
            f"r={r} per order: head k of order n is copied to head k of order n, so K and r must match")
    spec = spec or HashSpec()
    cache = TokenHashes.build(tok, spec)
    texts = _documents(corpus)
    max_n = max(s.orders)
    R = layout.num_rows
    acc = np.zeros((R, r), dtype=np.float64)
    cnt = np.zeros(R, dtype=np.int64)
    nonzero_src = np.abs(idt.table).max(axis=1) > 0
    occ = carried = carried_nz = tokens = 0
    for i, text in enumerate(texts):
        ids = np.asarray(tok.encode(text), dtype=np.int64)
        tokens += ids.size
        if ids.size:
            srows, _ = idt.rows(ids, cache.special)  # [T, O, K]
            h, v = cache.ngram_hashes(ids, max_n=max_n)  # [T, max_n]
            for oi, n in enumerate(s.orders):
                bv = v[:, n - 1]
                occ += int(bv.sum())
                ok = bv & (srows[:, oi, 0] >= 0)
                if not ok.any():
                    continue
                sr = srows[ok, oi, :]  # [m, K]
                tr = layout.rows(h[ok, n - 1])  # [m, K]
                carried += int(ok.sum())
                carried_nz += int(nonzero_src[sr].any(axis=1).sum())
                np.add.at(acc, tr.reshape(-1), idt.table[sr.reshape(-1)])
                np.add.at(cnt, tr.reshape(-1), 1)
        if i % 50 == 0 or i + 1 == len(texts):
            say("replaying corpus", i + 1, len(texts))
    written = cnt > 0
    table = np.zeros((R, r), dtype=np.float32)
    table[written] = (acc[written] / cnt[written, None]).astype(np.float32)
    say("writing asset", 0, 1)
    rep = ConvertReport(
        path=str(dest), documents=len(texts), tokens=tokens, occurrences=occ, carried=carried,
        carried_nonzero=carried_nz, rows_written=int(written.sum()),
        rows_nonzero=int((np.abs(table).max(axis=1) > 0).sum()), target_rows=R, layout=layout.to_dict(),
        orders=list(s.orders), seconds=0.0)
    prov = {
        "created": _now(), "created_by": "polymem convert", "tokenizer": {"name": tok.name, "fingerprint": tok.fingerprint},
        "corpus": ", ".join(str(c) for c in (corpus if isinstance(corpus, (list, tuple)) else [corpus])),
        "converted_from": {"source": idt.source.get("path", ""), "kind": idt.source.get("kind", ""),
                           "id_hash": {k: v for k, v in s.to_dict().items() if k not in ("primes",)},
                           "source_provenance": idt.source.get("provenance", {})},
        "convert": {k: v for k, v in rep.to_dict().items() if k not in ("path", "layout", "seconds")},
        "row_counts_meaning": "n-gram occurrences accumulated into the row during conversion",
    }
    MemoryAsset.from_array(dest, table, spec, layout, orders=s.orders, dtype=dtype, provenance=prov,
                           overwrite=overwrite, row_counts=np.minimum(cnt, np.iinfo(np.uint32).max))
    rep.seconds = time.perf_counter() - t0
    say("done", 1, 1)
    return rep


# -------------------------------------------------------------------------------------------- subset
@dataclass
class SubsetReport:
    path: str
    pages_total: int
    pages_touched: int  # pages the corpus's n-grams (orders 1..max) address
    pages_kept: int  # stored pages (touched, non-zero, above min_count) — whole chunks for nf4
    chunks_kept: int
    bytes_full: int  # on-disk bytes of the source asset's files
    bytes_subset: int  # on-disk bytes of the subset's files
    lookups: dict[str, dict[str, float]]  # corpus / heldout -> {lookups, served, share_served, lost_nonzero}
    min_count: int | None
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _disk_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def _corpus_pages(asset: Any, tokenizer: Any, texts: Sequence[str], orders: Sequence[int]) -> np.ndarray:
    """int64 [M] page of every valid (position, order, head) lookup of ``texts`` (orders 1..max)."""
    from polymem.tokenizers import load_tokenizer

    tok = load_tokenizer(tokenizer)
    cache = asset.token_cache(tok)
    L = asset.layout
    max_n = max(orders)
    sel = np.array([n - 1 for n in orders])
    out: list[np.ndarray] = []
    for t in texts:
        ids = np.asarray(tok.encode(t), dtype=np.int64)
        if not ids.size:
            continue
        rows = cache.ngram_rows(ids, L, max_n)[:, sel, :]  # [T, O, K]
        rows = rows[rows >= 0]
        out.append(rows // L.rows_per_page)
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def subset(
    asset: Any, out: str | os.PathLike[str], *, tokenizer: Any = None, corpus: Any = None, min_count: int | None = None,
    heldout: Any = None, overwrite: bool = False, keep_counts: bool = False, progress: Progress | None = None,
) -> SubsetReport:
    """Write a sparse copy of ``asset`` holding only the pages ``corpus``'s n-grams touch (under ``tokenizer``)
    and/or the pages with a row updated at least ``min_count`` times; all-zero pages are never stored.
    ``heldout``: another corpus to report the share of lookups the subset serves on unseen text."""
    from polymem.asset._sparse import write_sparse_asset
    from polymem.asset.core import MemoryAsset

    say = progress or _noop
    t0 = time.perf_counter()
    a = asset if isinstance(asset, MemoryAsset) else MemoryAsset.open(asset)
    dest = _check_out(out, overwrite)
    if corpus is None and min_count is None:
        raise PolymemError("subset needs a corpus (--corpus, with --tokenizer) and/or --min-count C")
    if corpus is not None and tokenizer is None:
        raise PolymemError("subset by corpus needs the tokenizer that reads it (--tokenizer cl100k_base, …)")
    if corpus is not None:
        a.require_byte_addressed("subset by corpus")
    L, g = a.layout, a.geometry
    orders = list(range(1, max(a.orders) + 1))
    keep = np.ones(L.pages, dtype=bool)
    touched_n = L.pages
    texts: list[str] = []
    if corpus is not None:
        say("hashing corpus", 0, 1)
        texts = _documents(corpus)
        touched = np.zeros(L.pages, dtype=bool)
        touched[_corpus_pages(a, tokenizer, texts, orders)] = True
        keep &= touched
        touched_n = int(touched.sum())
    counts = a.row_counts()
    if min_count is not None:
        if counts is None:
            raise PolymemError(f"{a.path}: --min-count needs row counts, and this asset has none (train it with polymem ≥ 0.2, or drop --min-count)")
        keep &= (counts.reshape(L.pages, -1) >= int(min_count)).any(axis=1)
    say("scanning pages", 0, 1)
    nonzero = np.zeros(L.pages, dtype=bool)
    for first, pages in a.iter_pages():
        nonzero[first : first + pages.shape[0]] = (pages != 0).any(axis=(1, 2))
    keep &= nonzero
    ppc = g.pages_per_chunk
    chunk_keep = np.zeros(g.num_chunks, dtype=bool)
    chunk_keep[np.flatnonzero(keep) // ppc] = True
    stored_pages = np.repeat(chunk_keep, ppc)[: L.pages]
    prov = {**a.provenance, "subset": {
        "of": a.path, "attributes_sha256": a._header.checksums["attributes"], "created": _now(),
        "corpus": None if corpus is None else ", ".join(str(c) for c in (corpus if isinstance(corpus, (list, tuple)) else [corpus])),
        "tokenizer": None if tokenizer is None else str(getattr(tokenizer, "name", tokenizer)), "min_count": min_count,
        "pages_kept": int(stored_pages.sum())}}
    say("writing subset", 0, 1)
    rc = None
    if keep_counts and counts is not None:
        rc = np.where(np.repeat(stored_pages, L.rows_per_page), counts, 0).astype(np.uint32)
    write_sparse_asset(dest, a, chunk_keep, prov, overwrite=overwrite, row_counts=rc)
    look: dict[str, dict[str, float]] = {}
    for name, texts_ in (("corpus", texts), ("heldout", _documents(heldout) if heldout is not None else [])):
        if not texts_ or tokenizer is None:
            continue
        pg = _corpus_pages(a, tokenizer, texts_, orders)
        served = int(stored_pages[pg].sum())
        lost = int((nonzero[pg] & ~stored_pages[pg]).sum())
        look[name] = {"lookups": int(pg.size), "served": served, "share_served": served / max(pg.size, 1),
                      "nonzero_lookups": int(nonzero[pg].sum()), "lost_nonzero": lost,
                      "share_nonzero_served": (int(nonzero[pg].sum()) - lost) / max(int(nonzero[pg].sum()), 1)}
    src_root = a._raw.local
    rep = SubsetReport(
        path=str(dest), pages_total=L.pages, pages_touched=touched_n, pages_kept=int(stored_pages.sum()),
        chunks_kept=int(chunk_keep.sum()), bytes_full=_disk_bytes(src_root) if src_root else 0,
        bytes_subset=_disk_bytes(dest), lookups=look, min_count=min_count, seconds=time.perf_counter() - t0)
    say("done", 1, 1)
    return rep


# --------------------------------------------------------------------------------------------- merge
@dataclass
class MergeReport:
    path: str
    inputs: list[str]
    how: str
    rows_nonzero: int
    rows_from: list[int]  # rows where input i contributed a non-zero row
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _effective_counts(a: Any, pages: np.ndarray, first: int) -> np.ndarray:
    """Row counts of the rows in ``pages`` (float64 [n·K·S]); without stored counts: 1 per non-zero row."""
    rc = getattr(a, "_merge_counts", None)
    KS = a.layout.rows_per_page
    if rc is not None:
        return rc[first * KS : first * KS + pages.shape[0] * KS].astype(np.float64)
    return (np.abs(pages).reshape(-1, pages.shape[-1]).max(axis=1) > 0).astype(np.float64)


def merge(
    assets: Sequence[Any], out: str | os.PathLike[str], *, how: str = "count-weighted", dtype: str | None = None,
    overwrite: bool = False, progress: Progress | None = None,
) -> MergeReport:
    """Combine assets with the same hash spec and layout into one (rows only; page by page).

    how: ``count-weighted`` — Σ cᵢ·xᵢ / Σ cᵢ per row with cᵢ the row's update count (an asset without counts
    counts 1 per non-zero row); ``mean`` — the unweighted mean of the inputs whose row is non-zero; ``first`` —
    the first input's row where it is non-zero, else the next input's. Rows zero in every input stay zero.
    The output's counts are Σ cᵢ.
    """
    from polymem.asset.core import MemoryAsset

    say = progress or _noop
    t0 = time.perf_counter()
    if how not in MERGE_HOWS:
        raise PolymemError(f"--how {how!r} is unknown; accepted: {', '.join(MERGE_HOWS)}")
    if len(assets) < 2:
        raise PolymemError(f"merge needs at least 2 assets, got {len(assets)}")
    dest = _check_out(out, overwrite)
    srcs = [x if isinstance(x, MemoryAsset) else MemoryAsset.open(x) for x in assets]
    a0 = srcs[0]
    for b in srcs[1:]:
        if b.spec.to_dict() != a0.spec.to_dict():
            raise SpecMismatchError(
                f"cannot merge {b.path} into {a0.path}: hash specs differ ({b.spec.spec_id} vs {a0.spec.spec_id}); "
                "rows are only comparable under one hash spec — convert or retrain one of them")
        if b.layout != a0.layout:
            diff = {k: (v, b.layout.to_dict()[k]) for k, v in a0.layout.to_dict().items() if b.layout.to_dict()[k] != v}
            raise SpecMismatchError(
                f"cannot merge {b.path} into {a0.path}: layouts differ at {diff} (first vs this); merge needs the "
                "same layout (row i must mean the same address in every input)")
    if any(p.resolve() == dest.resolve() for p in (Path(s.path) for s in srcs if "://" not in s.path)):
        raise PolymemError(f"output {str(dest)!r} is one of the inputs; write the merge to a new path")
    counts = [s.row_counts() for s in srcs]
    for s, c in zip(srcs, counts):
        s._merge_counts = c  # type: ignore[attr-defined]
    L = a0.layout
    KS, r = L.rows_per_page, L.head_dim
    out_table = np.zeros((L.num_rows, r), dtype=np.float32)
    out_counts = np.zeros(L.num_rows, dtype=np.float64)
    rows_from = [0] * len(srcs)
    g = a0.geometry
    step = max(1, g.chunks_per_shard * g.pages_per_chunk)
    for a in range(0, L.pages, step):
        b = min(L.pages, a + step)
        ids = np.arange(a, b)
        xs = [s.read_pages(ids).reshape(-1, r).astype(np.float64) for s in srcs]  # [n·KS, r]
        nz = [np.abs(x).max(axis=1) > 0 for x in xs]
        cs = [_effective_counts(s, x.reshape(b - a, KS, r), a) for s, x in zip(srcs, xs)]
        for i, m in enumerate(nz):
            rows_from[i] += int(m.sum())
        if how == "count-weighted":
            w = [np.where(m, c, 0.0) for m, c in zip(nz, cs)]
            tot = sum(w)
            num = sum(wi[:, None] * x for wi, x in zip(w, xs))
            res = np.where(tot[:, None] > 0, num / np.where(tot > 0, tot, 1)[:, None], 0.0)
            # non-zero rows all counted 0 (inconsistent inputs): fall back to the mean of the non-zero ones
            k = sum(m.astype(np.float64) for m in nz)
            fb = (tot == 0) & (k > 0)
            if fb.any():
                res[fb] = (sum(x for x in xs)[fb]) / k[fb, None]
        elif how == "mean":
            k = sum(m.astype(np.float64) for m in nz)
            res = sum(x for x in xs) / np.where(k > 0, k, 1)[:, None]
        else:
            res = np.zeros_like(xs[0])
            done = np.zeros(res.shape[0], dtype=bool)
            for x, m in zip(xs, nz):
                take = m & ~done
                res[take] = x[take]
                done |= take
        out_table[a * KS : b * KS] = res.astype(np.float32)
        out_counts[a * KS : b * KS] = sum(cs)
        say("merging pages", b, L.pages)
    prov = {"created": _now(), "created_by": "polymem merge", "merge": {
        "how": how, "inputs": [{"path": s.path, "attributes_sha256": s._header.checksums["attributes"],
                                "provenance": s.provenance, "has_row_counts": c is not None} for s, c in zip(srcs, counts)]}}
    toks = [s.provenance.get("tokenizer") for s in srcs if s.provenance.get("tokenizer")]
    if toks and all(t == toks[0] for t in toks):
        prov["tokenizer"] = toks[0]
    MemoryAsset.from_array(dest, out_table, a0.spec, L, orders=sorted(set().union(*[set(s.orders) for s in srcs])),
                           dtype=dtype or a0.dtype, provenance=prov, overwrite=overwrite,
                           row_counts=np.minimum(out_counts, np.iinfo(np.uint32).max).astype(np.uint32))
    for s in srcs:
        s._merge_counts = None  # type: ignore[attr-defined]
    return MergeReport(path=str(dest), inputs=[s.path for s in srcs], how=how,
                       rows_nonzero=int((np.abs(out_table).max(axis=1) > 0).sum()), rows_from=rows_from,
                       seconds=time.perf_counter() - t0)


__all__ = ["ConvertReport", "IdTable", "MERGE_HOWS", "MergeReport", "SubsetReport", "convert", "convert_source",
           "merge", "open_id_table", "read_engram_table", "subset", "write_engram_table"]
