"""Reading and writing tables as assets from the torch side.

``save_table`` writes a :class:`polymem.MemoryAsset` (zarr) when :mod:`polymem.asset` is importable, and
otherwise — or when the path ends in ``.safetensors`` — a *table file*: ``NAME.safetensors`` (one fp32
tensor ``table``) plus a JSON header in the safetensors metadata (format ``polymem.table-file`` v1: hash spec,
layout, orders, provenance). ``open_table`` opens either and returns an object with the asset contract's
read side (``spec, layout, orders, dtype, provenance, path, read_pages, to_numpy``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from polymem._paths import is_url
from polymem.errors import FormatError, PolymemError
from polymem.hash.spec import HashSpec
from polymem.hash.layout import Layout

if TYPE_CHECKING:
    from polymem.hash.idhash import IdHashSpec

TABLE_FILE_FORMAT = "polymem.table-file"


class TableFile:
    """A table stored as one safetensors file; duck-types the read side of :class:`polymem.MemoryAsset`."""

    def __init__(self, path: Path, table: np.ndarray, spec: HashSpec | IdHashSpec, layout: Layout, orders,
                 provenance) -> None:
        self.path, self._table, self.spec, self.layout = path, table, spec, layout
        self.orders, self.provenance, self.dtype = tuple(orders), dict(provenance or {}), "float32"

    _counts: "np.ndarray | None" = None

    def to_numpy(self) -> np.ndarray:
        return self._table

    def row_counts(self) -> "np.ndarray | None":
        return self._counts

    @property
    def tokenizer_bound(self) -> bool:
        return bool(getattr(self.spec, "tokenizer_bound", False))

    def read_pages(self, page_ids) -> np.ndarray:
        ids = np.asarray(page_ids)
        if ids.size and not np.issubdtype(ids.dtype, np.integer):
            raise PolymemError(f"page ids must be integers, got dtype {ids.dtype}; pass integer ids")
        n = self.layout.rows_per_page
        t = self._table.reshape(self.layout.pages, n, self.layout.head_dim)
        return t[ids.astype(np.int64, copy=False)]


def _hash_spec_from_dict(d: dict[str, Any]) -> HashSpec | IdHashSpec:
    from polymem.hash.idhash import IdHashSpec, is_id_hash_dict

    if is_id_hash_dict(d):
        return IdHashSpec.from_dict(d)
    from_dict = getattr(HashSpec, "from_dict", None)
    if from_dict is not None:
        return from_dict(d)
    return HashSpec(base=int(d["base"], 16), byte_seed=int(d["byte_seed"], 16), normalizer=d["normalizer"],
                    version=int(d["version"]))


def _table_header(meta: dict[str, str], p: Path) -> tuple[dict[str, Any], HashSpec | IdHashSpec, Layout]:
    """The polymem header of a table file's metadata: (header, hash spec, layout); FormatError in one line."""
    if "polymem" not in meta:
        raise FormatError(f"{str(p)!r} is a safetensors file without a polymem header; it is not a table file")
    try:
        header = json.loads(meta["polymem"])
    except json.JSONDecodeError as e:
        raise FormatError(f"{str(p)!r}: its polymem header is not JSON ({e}); re-save the table with save_table") from None
    if not isinstance(header, dict) or header.get("format") != TABLE_FILE_FORMAT or header.get("version") != 1:
        h = header if isinstance(header, dict) else {}
        raise FormatError(f"{str(p)!r} has format {h.get('format')!r} v{h.get('version')!r}; "
                          f"this polymem reads {TABLE_FILE_FORMAT!r} v1")
    try:
        return header, _hash_spec_from_dict(header["hash_spec"]), Layout.from_dict(header["layout"])
    except (KeyError, TypeError, ValueError, PolymemError) as e:
        raise FormatError(f"{str(p)!r}: its polymem header has a bad hash_spec or layout ({e}); "
                          "re-save the table with save_table") from None


def _check_tensor(f: Any, name: str, shape: list[int], dtype: str, p: Path) -> None:
    """Refuse tensor ``name`` unless it is ``dtype`` ``shape`` (from the header's layout) — before it is loaded."""
    if name not in f.keys():
        raise FormatError(f"{str(p)!r} has no tensor {name!r}; it is not a table file")
    sl = f.get_slice(name)
    got, got_dtype = list(sl.get_shape()), sl.get_dtype()
    if got != shape or got_dtype != dtype:
        raise FormatError(f"{str(p)!r}: tensor {name!r} is {got_dtype} {got}, but the header's layout needs {dtype} "
                          f"{shape}; the file was edited or mixed up, re-save the table with save_table")


def save_table(
    path: str | os.PathLike[str], table: np.ndarray, spec: HashSpec, layout: Layout, *,
    orders=(1, 2, 3), provenance: dict[str, Any] | None = None, overwrite: bool = False, row_counts: Any = None,
) -> Path:
    """Write ``table`` (fp32 [num_rows, r]) as an asset (zarr) or, for ``*.safetensors``, a table file.
    ``row_counts`` (uint32 [num_rows]): per-row update counts (the asset's ``counts`` array / tensor ``counts``)."""
    path = Path(path)
    table = np.ascontiguousarray(table, dtype=np.float32)
    if path.exists() and not overwrite:
        raise PolymemError(f"{str(path)!r} exists; pass --overwrite (overwrite=True) or choose another path")
    if path.suffix != ".safetensors":  # an asset directory (any other name); a table file only when asked for
        from polymem.asset import MemoryAsset

        MemoryAsset.from_array(path, table, spec, layout, orders=tuple(orders), dtype="float32",
                               provenance=provenance, overwrite=overwrite, row_counts=row_counts)
        return path
    from safetensors.numpy import save_file

    header = {"format": TABLE_FILE_FORMAT, "version": 1, "hash_spec": spec.to_dict(), "layout": layout.to_dict(),
              "orders": list(orders), "provenance": provenance or {}}
    from polymem._io import atomic_path

    tensors = {"table": table}
    if row_counts is not None:
        tensors["counts"] = np.ascontiguousarray(row_counts, dtype=np.uint32)
    with atomic_path(path, fsync=True) as tmp:
        save_file(tensors, str(tmp), metadata={"polymem": json.dumps(header, sort_keys=True)})
    return path


def open_table(path: str | os.PathLike[str]) -> Any:
    """Open an asset directory (zarr) or a table file (``.safetensors``)."""
    p = Path(path)
    if p.suffix == ".safetensors" or (not p.exists() and p.with_suffix(".safetensors").exists()):
        p = p if p.suffix == ".safetensors" else p.with_suffix(".safetensors")
        if not p.is_file():
            raise PolymemError(f"table file {str(p)!r} does not exist; make one with `polymem train --out ...`")
        from safetensors import safe_open

        with safe_open(str(p), framework="numpy") as f:
            header, spec, layout = _table_header(f.metadata() or {}, p)
            _check_tensor(f, "table", [layout.num_rows, layout.head_dim], "F32", p)
            if "counts" in f.keys():
                _check_tensor(f, "counts", [layout.num_rows], "U32", p)
            table = f.get_tensor("table")
            counts = f.get_tensor("counts") if "counts" in f.keys() else None
        tf = TableFile(p, table, spec, layout, header["orders"], header.get("provenance"))
        tf._counts = counts
        return tf
    from polymem.asset import MemoryAsset

    if not p.exists() and not is_url(os.fspath(path)):
        raise PolymemError(f"asset {str(p)!r} does not exist; make one with `polymem train --out {p}`")
    return MemoryAsset.open(path)
