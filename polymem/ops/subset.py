"""``subset``: a sparse copy of an asset holding only the pages a corpus's n-grams touch (and/or pages holding a
row updated at least ``min_count`` times); absent chunks are not stored (a sparse asset, docs/asset-format.md
§12). Torch-free. CLI: ``polymem subset``.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from polymem.errors import PolymemError
from polymem.ops._opbase import AssetLike, Progress, _check_out, _documents, _noop, _now

if TYPE_CHECKING:  # annotations only; the functions import it when they run
    from polymem.asset.core import MemoryAsset


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


def _corpus_pages(asset: MemoryAsset, tokenizer: Any, texts: Sequence[str], orders: Sequence[int]) -> np.ndarray:
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
    asset: AssetLike, out: str | os.PathLike[str], *, tokenizer: Any = None, corpus: Any = None, min_count: int | None = None,
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


__all__ = ["SubsetReport", "subset"]
