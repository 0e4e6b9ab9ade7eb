"""``convert``: re-address a tokenizer-bound table by bytes. Torch-free. CLI: ``polymem convert``.

:func:`convert` replays a corpus with the source tokenizer; for every n-gram occurrence it reads the source
table's rows through the token-id hash and accumulates them into the byte-hash rows of the target layout (head k
of order n → head k of order n); each target row is the occurrence-weighted mean of what it received.

Sources: a polymem asset or table file written by ``polymem train --hash xor`` (or any tokenizer-bound asset),
or an Engram demo table in the safetensors form of docs/asset-format.md §10 (:mod:`.engram`). An imported
engine table (``polymem import``) is re-addressed by :func:`polymem.engines.convert.convert_engine`, a stage
above this one; ``polymem convert`` dispatches between the two.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from polymem.errors import PolymemError, SpecMismatchError
from polymem.hash.layout import Layout
from polymem.hash.spec import HashSpec
from polymem.ops._opbase import AssetLike, Progress, _check_out, _documents, _noop, _now, target_layout
from polymem.ops.engram import IdTable, open_id_table


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
    src: IdTable | AssetLike, tokenizer: Any, corpus: Any, out: str | os.PathLike[str], *, spec: HashSpec | None = None,
    layout: Layout | None = None, dtype: str = "float32", overwrite: bool = False, progress: Progress | None = None,
) -> ConvertReport:
    """Re-address a tokenizer-bound table by bytes (see the module doc). Returns the report; writes ``out`` atomically.

    src: a ``--hash xor`` asset / table file, an Engram safetensors file, or an :class:`IdTable`. tokenizer: the
    source's tokenizer (its fingerprint must match the one the source names, when it names one). corpus: paths.
    layout: the target layout (default: page-local, the source's K heads and r, about the source's row count).
    An imported engine table (``polymem import``) is refused here: :func:`polymem.engines.convert.convert_engine`
    re-addresses those (``polymem convert`` on the command line picks the right one).
    """
    from polymem.asset.core import MemoryAsset
    from polymem.hash.token_hashes import TokenHashes
    from polymem.tokenizers import load_tokenizer

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
    layout = target_layout(layout, heads=s.heads, head_dim=r, source_rows=idt.table.shape[0], source="the source")
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


__all__ = ["ConvertReport", "convert"]
