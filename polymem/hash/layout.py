"""Layouts: pure functions from 64-bit n-gram hashes to table rows (DESIGN §3, seed 000).

Three layouts share one geometry — P pages of K heads × S slots, ``num_rows = P·K·S`` rows of width r — so
they compare at equal parameter budgets:

* ``page-local`` (default): ``row_k = (page·K + k)·S + slot_k``. All K head rows of an n-gram sit in one
  page (one read per n-gram whatever K is).
* ``flat``: one entry of K consecutive rows per n-gram (S=1 in PageGram's terms); heads always collide together.
* ``independent-heads``: Engram-style, head k has its own sub-table of P·S rows; K reads per n-gram.

Page and slot numbers come from independent finaliser streams of the same byte hash
(:func:`polymem.hash.spec.finalize`), so a layout stays tokenizer-agnostic. No I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from polymem.errors import FormatError, PolymemError

LAYOUT_KINDS = ("page-local", "flat", "independent-heads")
KIND_PAGE_LOCAL, KIND_FLAT, KIND_INDEPENDENT = 0, 1, 2  # codes the kernels take (numba, torch)
_KIND_CODE = {"page-local": KIND_PAGE_LOCAL, "flat": KIND_FLAT, "independent-heads": KIND_INDEPENDENT}


@dataclass(frozen=True, kw_only=True)
class Layout:
    """Table geometry and addressing. ``rows(h)`` maps hashes [...] to rows [..., K]."""

    pages: int  # P
    heads: int = 8  # K, head rows per n-gram
    slots: int = 4  # S, slots per head per page (S=4 was best for convergence in seed 000)
    head_dim: int = 64  # r, width of one head row
    kind: str = "page-local"

    def __post_init__(self) -> None:
        if self.kind not in LAYOUT_KINDS:
            raise PolymemError(f"layout kind {self.kind!r} is unknown; accepted: {', '.join(LAYOUT_KINDS)}")
        for name, lo, hi in (("pages", 1, 1 << 32), ("heads", 1, 64), ("slots", 1, 1 << 16), ("head_dim", 1, 1 << 16)):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or not lo <= v <= hi:
                raise PolymemError(f"layout {name}={v!r} must be an integer in [{lo}, {hi}]")
        if self.pages * self.slots >= 1 << 32:
            raise PolymemError(
                f"layout pages×slots = {self.pages}×{self.slots} must be below 2^32 (addresses are drawn by a 32-bit "
                "multiply-high); use more heads or a wider head_dim for a table this large"
            )

    @property
    def num_rows(self) -> int:
        return self.pages * self.heads * self.slots

    @property
    def rows_per_page(self) -> int:
        return self.heads * self.slots

    @property
    def params(self) -> int:
        return self.num_rows * self.head_dim

    @classmethod
    def for_params(
        cls, params: int, *, heads: int = 8, slots: int = 4, head_dim: int = 64, kind: str = "page-local"
    ) -> "Layout":
        """The layout with the most pages whose table holds at most ``params`` scalars."""
        per_page = heads * slots * head_dim
        if params < per_page:
            raise PolymemError(
                f"parameter budget {params} is smaller than one page ({heads}×{slots}×{head_dim} = {per_page}); "
                "raise --params or lower --heads/--slots/--head-dim"
            )
        return cls(pages=params // per_page, heads=heads, slots=slots, head_dim=head_dim, kind=kind)

    def rows(self, hashes: np.ndarray, valid: np.ndarray | None = None) -> np.ndarray:
        """uint64 hashes [...] -> int64 rows [..., K]; -1 where ``valid`` is False (may be a non-contiguous view)."""
        h = np.ascontiguousarray(hashes, dtype=np.uint64)
        v = np.ones(h.shape, dtype=bool) if valid is None else np.ascontiguousarray(valid, dtype=bool)
        if v.shape != h.shape:
            raise PolymemError(f"valid has shape {v.shape}, hashes {h.shape}; they must match")
        from polymem.hash import _numba  # numba loads on first use, not on `import polymem`

        planar = _numba.rows_planar(
            h.reshape(-1), v.reshape(-1), _KIND_CODE[self.kind], self.heads, self.slots, self.pages
        )  # [K, M]
        return planar.T.reshape(h.shape + (self.heads,))  # a view when possible

    def page_of(self, rows: np.ndarray) -> np.ndarray:
        """Page index of each row (same page geometry for every kind: K·S rows per page)."""
        return np.asarray(rows) // self.rows_per_page

    @property
    def kind_code(self) -> int:
        return _KIND_CODE[self.kind]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "heads": self.heads, "slots": self.slots, "pages": self.pages, "head_dim": self.head_dim}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Layout":
        try:
            return cls(
                kind=str(d["kind"]), heads=int(d["heads"]), slots=int(d["slots"]),
                pages=int(d["pages"]), head_dim=int(d["head_dim"]),
            )
        except KeyError as e:
            raise FormatError(f"layout is missing field {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            raise FormatError(f"layout field is malformed: {e}") from None


# ------------------------------------------------------------------------ numpy path (no numba needed)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _fmix64_np(k: np.ndarray) -> np.ndarray:
    k = k ^ (k >> np.uint64(33))
    k = k * np.uint64(0xFF51AFD7ED558CCD)
    k = k ^ (k >> np.uint64(33))
    k = k * np.uint64(0xC4CEB9FE1A85EC53)
    return k ^ (k >> np.uint64(33))


def finalize_np(h: np.ndarray, stream: int) -> np.ndarray:
    return _fmix64_np(h + np.uint64(stream + 1) * _GOLDEN)


def fastrange_np(z: np.ndarray, m: int) -> np.ndarray:
    """⌊z·m / 2^64⌋ for m < 2^32 (exact, from 32-bit halves)."""
    mu = np.uint64(m)
    c = ((z & np.uint64(0xFFFFFFFF)) * mu) >> np.uint64(32)
    return (((z >> np.uint64(32)) * mu + c) >> np.uint64(32)).astype(np.int64)


def rows_numpy(layout: Layout, hashes: np.ndarray) -> np.ndarray:
    """Vectorised numpy version of :meth:`Layout.rows` (no masking); same results bit for bit."""
    h = np.asarray(hashes, dtype=np.uint64)
    K, S, P = layout.heads, layout.slots, layout.pages
    k = np.arange(K, dtype=np.int64)
    with np.errstate(over="ignore"):
        if layout.kind == "page-local":
            page = fastrange_np(finalize_np(h, 0), P)
            ws = np.stack([finalize_np(h, 1 + g) for g in range((K + 3) // 4)], axis=-1)  # [..., G]
            w = ws[..., k // 4]  # [..., K]
            field = (w >> (np.uint64(16) * (k % 4).astype(np.uint64))) & np.uint64(0xFFFF)
            slot = ((field * np.uint64(S)) >> np.uint64(16)).astype(np.int64)
            return (page[..., None] * K + k) * S + slot
        if layout.kind == "flat":
            e = fastrange_np(finalize_np(h, 0), P * S)
            return e[..., None] * K + k
        q = P * S
        u = np.stack([fastrange_np(finalize_np(h, 1 + j), q) for j in range(K)], axis=-1)
        return k * q + u
