"""Layouts: pure functions from 64-bit n-gram hashes to table rows (the PageGram report).

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

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from polymem.errors import FormatError, PolymemError
from polymem.hash.spec import KIND_FLAT, KIND_INDEPENDENT, KIND_PAGE_LOCAL  # codes the kernels take

LAYOUT_KINDS = ("page-local", "flat", "independent-heads")
_KIND_CODE = {"page-local": KIND_PAGE_LOCAL, "flat": KIND_FLAT, "independent-heads": KIND_INDEPENDENT}


def bool_mask(valid: Any, name: str = "valid") -> np.ndarray:
    """A validity mask as a numpy bool array. Only booleans are a mask: a float mask (0.5?) or an integer one (is 2
    valid? an index?) is refused rather than cast, so a mask of the wrong kind cannot select rows silently."""
    v = np.asarray(valid)
    if v.dtype != np.bool_ and v.size == 0:  # an empty list has no dtype to judge
        return v.astype(bool)
    if v.dtype != np.bool_:
        first = v.reshape(-1)[0].item()
        raise PolymemError(f"{name} must be a boolean mask, got dtype {v.dtype} (first value {first!r}); pass "
                           f"booleans, e.g. {name} > 0.5 or {name}.astype(bool) if that is what you mean")
    return v


@dataclass(frozen=True, kw_only=True)
class Layout:
    """Table geometry and addressing. ``rows(h)`` maps hashes [...] to rows [..., K]."""

    pages: int  # P
    heads: int = 8  # K, head rows per n-gram
    slots: int = 4  # S, slots per head per page (S=4 was best for convergence in the PageGram report)
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
        cls, params: int | float, *, heads: int = 8, slots: int = 4, head_dim: int = 64, kind: str = "page-local"
    ) -> "Layout":
        """The layout with the most pages whose table holds at most ``params`` scalars.

        ``params`` may be a float holding a whole number (``2.5e6``, ``20e9``); a fraction, inf or nan is refused."""
        params = _whole_count(params)
        for name, v, hi in (("heads", heads, 64), ("slots", slots, 1 << 16), ("head_dim", head_dim, 1 << 16)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or not 1 <= v <= hi:
                raise PolymemError(f"layout {name}={v!r} must be an integer in [1, {hi}]")
        per_page = heads * slots * head_dim
        if params < per_page:
            raise PolymemError(
                f"parameter budget {params} is smaller than one page ({heads}×{slots}×{head_dim} = {per_page}); "
                "raise --params or lower --heads/--slots/--head-dim"
            )
        return cls(pages=params // per_page, heads=heads, slots=slots, head_dim=head_dim, kind=kind)

    def rows(self, hashes: np.ndarray, valid: np.ndarray | None = None, *, backend: str = "numba") -> np.ndarray:
        """uint64 hashes [...] -> int64 rows [..., K]; -1 where ``valid`` is False (may be a non-contiguous view).

        ``backend="numpy"`` runs the vectorised numpy path (:func:`polymem.hash.ngram.rows_numpy`), same bits.
        """
        h = np.ascontiguousarray(hashes, dtype=np.uint64)
        v = np.ones(h.shape, dtype=bool) if valid is None else np.ascontiguousarray(bool_mask(valid))
        if v.shape != h.shape:
            raise PolymemError(f"valid has shape {v.shape}, hashes {h.shape}; they must match")
        if backend == "numpy":
            from polymem.hash.ngram import rows_numpy

            return np.where(v[..., None], rows_numpy(self, h), -1)
        if backend != "numba":
            raise PolymemError(f"backend {backend!r} is unknown; accepted: 'numba', 'numpy'")
        from polymem.hash import _numba  # numba loads on first use, not on `import polymem`

        planar = _numba.rows_planar(
            h.reshape(-1), v.reshape(-1), _KIND_CODE[self.kind], self.heads, self.slots, self.pages
        )  # [K, M]
        rows: np.ndarray = planar.T.reshape(h.shape + (self.heads,))  # a view when possible
        return rows

    def page_of(self, rows: np.ndarray) -> np.ndarray:
        """Page index of each row (same page geometry for every kind: K·S rows per page)."""
        return np.asarray(rows) // self.rows_per_page

    @property
    def kind_code(self) -> int:
        return _KIND_CODE[self.kind]

    def to_dict(self) -> dict[str, Any]:
        """The layout as JSON-ready data (kind, heads, slots, pages, head_dim); :meth:`from_dict` reads it
        back."""
        return {"kind": self.kind, "heads": self.heads, "slots": self.slots, "pages": self.pages, "head_dim": self.head_dim}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Layout":
        """The layout :meth:`to_dict` wrote; FormatError naming the field for anything else."""
        try:
            return cls(
                kind=str(d["kind"]), heads=int(d["heads"]), slots=int(d["slots"]),
                pages=int(d["pages"]), head_dim=int(d["head_dim"]),
            )
        except KeyError as e:
            raise FormatError(f"layout is missing field {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            raise FormatError(f"layout field is malformed: {e}") from None


def _whole_count(params: object) -> int:
    """A parameter budget as an int: ints pass, floats must be finite and whole (2.5e6 -> 2_500_000)."""
    if isinstance(params, bool) or not isinstance(params, (int, float, np.integer, np.floating)):
        raise PolymemError(f"params={params!r} must be a number of parameters such as 2_000_000 or 2.5e6 "
                           "(the CLI also takes 2M, 1.5G)")
    if isinstance(params, (int, np.integer)):
        return int(params)
    if not math.isfinite(params):
        raise PolymemError(f"params={params!r} is not a finite number; pass a parameter budget such as 2.5e6")
    if not float(params).is_integer():
        raise PolymemError(f"params={params!r} is not a whole number of parameters; round it, e.g. "
                           f"{math.floor(params)}")
    return int(params)
