"""``merge``: combine rows of assets with the same hash spec and layout, weighted by their update counts.
Torch-free. CLI: ``polymem merge``.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from polymem.errors import PolymemError, SpecMismatchError
from polymem.ops._opbase import AssetLike, Progress, _check_out, _noop, _now

MERGE_HOWS = ("count-weighted", "mean", "first")


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


def _effective_counts(rc: np.ndarray | None, KS: int, pages: np.ndarray, first: int) -> np.ndarray:
    """Row counts of the rows in ``pages`` (float64 [n·K·S]; ``rc``: the asset's stored counts, ``KS``: rows per
    page); without stored counts: 1 per non-zero row."""
    if rc is not None:
        return rc[first * KS : first * KS + pages.shape[0] * KS].astype(np.float64)
    return (np.abs(pages).reshape(-1, pages.shape[-1]).max(axis=1) > 0).astype(np.float64)


def _sum(xs: Sequence[np.ndarray]) -> np.ndarray:
    """Σ xs elementwise, added as the builtin ``sum`` adds them (0 + xs[0] + xs[1] + …)."""
    total: np.ndarray = 0 + xs[0]
    for x in xs[1:]:
        total = total + x
    return total


def merge(
    assets: Sequence[AssetLike], out: str | os.PathLike[str], *, how: str = "count-weighted", dtype: str | None = None,
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
    for other in srcs[1:]:
        if other.spec.to_dict() != a0.spec.to_dict():
            raise SpecMismatchError(
                f"cannot merge {other.path} into {a0.path}: hash specs differ ({other.spec.spec_id} vs {a0.spec.spec_id}); "
                "rows are only comparable under one hash spec — convert or retrain one of them")
        if other.layout != a0.layout:
            diff = {k: (v, other.layout.to_dict()[k]) for k, v in a0.layout.to_dict().items() if other.layout.to_dict()[k] != v}
            raise SpecMismatchError(
                f"cannot merge {other.path} into {a0.path}: layouts differ at {diff} (first vs this); merge needs the "
                "same layout (row i must mean the same address in every input)")
    if any(p.resolve() == dest.resolve() for p in (Path(s.path) for s in srcs if "://" not in s.path)):
        raise PolymemError(f"output {str(dest)!r} is one of the inputs; write the merge to a new path")
    counts = [s.row_counts() for s in srcs]
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
        cs = [_effective_counts(c, KS, x.reshape(b - a, KS, r), a) for c, x in zip(counts, xs)]
        for i, m in enumerate(nz):
            rows_from[i] += int(m.sum())
        if how == "count-weighted":
            w = [np.where(m, c, 0.0) for m, c in zip(nz, cs)]
            tot = _sum(w)
            num = _sum([wi[:, None] * x for wi, x in zip(w, xs)])
            res = np.where(tot[:, None] > 0, num / np.where(tot > 0, tot, 1)[:, None], 0.0)
            # non-zero rows all counted 0 (inconsistent inputs): fall back to the mean of the non-zero ones
            k = _sum([m.astype(np.float64) for m in nz])
            fb = (tot == 0) & (k > 0)
            if fb.any():
                res[fb] = (_sum(xs)[fb]) / k[fb, None]
        elif how == "mean":
            k = _sum([m.astype(np.float64) for m in nz])
            res = _sum(xs) / np.where(k > 0, k, 1)[:, None]
        else:
            res = np.zeros_like(xs[0])
            done = np.zeros(res.shape[0], dtype=bool)
            for x, m in zip(xs, nz):
                take = m & ~done
                res[take] = x[take]
                done |= take
        out_table[a * KS : b * KS] = res.astype(np.float32)
        out_counts[a * KS : b * KS] = _sum(cs)
        say("merging pages", b, L.pages)
    prov: dict[str, Any] = {"created": _now(), "created_by": "polymem merge", "merge": {
        "how": how, "inputs": [{"path": s.path, "attributes_sha256": s._header.checksums["attributes"],
                                "provenance": s.provenance, "has_row_counts": c is not None} for s, c in zip(srcs, counts)]}}
    toks = [s.provenance.get("tokenizer") for s in srcs if s.provenance.get("tokenizer")]
    if toks and all(t == toks[0] for t in toks):
        prov["tokenizer"] = toks[0]
    MemoryAsset.from_array(dest, out_table, a0.spec, L, orders=sorted(set().union(*[set(s.orders) for s in srcs])),
                           dtype=dtype or a0.dtype, provenance=prov, overwrite=overwrite,
                           row_counts=np.minimum(out_counts, np.iinfo(np.uint32).max).astype(np.uint32))
    return MergeReport(path=str(dest), inputs=[s.path for s in srcs], how=how,
                       rows_nonzero=int((np.abs(out_table).max(axis=1) > 0).sum()), rows_from=rows_from,
                       seconds=time.perf_counter() - t0)


__all__ = ["MERGE_HOWS", "MergeReport", "merge"]
