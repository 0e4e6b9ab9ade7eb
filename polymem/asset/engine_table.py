"""An engine's table inside a polymem asset: :class:`EngineTableSpec`, the asset header's ``hash_spec``.

An imported DeepSeek-V4.1 or Qwen3.8 table is one asset holding every table layer of the engine end to end:
layer i's row j is asset row ``row_base[i] + j`` (each layer starts on a page boundary; rows between layers are
zero padding, never addressed). The header records the engine's addressing (``EngineAddressing.to_json()``)
and ``row_base``, so the asset says which token-id sequence reads which row without the engine's code::

    {"format": "polymem.engine-table", "version": 1, "addressing": {...}, "row_base": [0, 384006180]}

Such an asset is tokenizer-bound (rows are addressed by the engine's token ids): byte-hash readers refuse it
as they refuse ``--hash xor`` tables. No I/O here; import and export are :mod:`polymem.engines.io`. It is part of the format (the header's
``hash_spec``), so the asset validates it without importing ``engines/``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from polymem.hash.engine_addressing import EngineAddressing
from polymem.errors import FormatError

TABLE_FORMAT = "polymem.engine-table"
TABLE_VERSION = 1


@dataclass(frozen=True, kw_only=True, eq=False)
class EngineTableSpec:
    """An engine's addressing and the first asset row of each of its layers."""

    addressing: EngineAddressing
    row_base: tuple[int, ...]  # one per layer of ``addressing``, increasing

    tokenizer_bound = True  # rows are addressed by the engine's token ids, never by byte hashes

    @property
    def tokenizer(self) -> dict[str, str]:
        """The engine's name and a fingerprint of its addressing (sha256 of its canonical JSON)."""
        blob = json.dumps(self.addressing.to_json(), sort_keys=True, separators=(",", ":")).encode()
        return {"name": self.addressing.name, "fingerprint": hashlib.sha256(blob).hexdigest()}

    @property
    def vocab_size(self) -> int:
        return self.addressing.vocab_size

    def rows(self, ids: Any) -> np.ndarray:
        """ids int [T] (one sequence from position 0) -> asset rows int64 [T, layers, columns]."""
        return self.addressing.rows(ids) + np.asarray(self.row_base, dtype=np.int64)[:, None]

    def to_dict(self) -> dict[str, Any]:
        """The header section as JSON-ready data: format, version, the addressing's JSON and each layer's first row."""
        return {"format": TABLE_FORMAT, "version": TABLE_VERSION, "addressing": self.addressing.to_json(),
                "row_base": list(self.row_base)}

    @classmethod
    def from_dict(cls, d: Any) -> "EngineTableSpec":
        """Read :meth:`to_dict`'s form; a bad field raises FormatError naming it and the fix."""
        if not isinstance(d, Mapping) or d.get("format") != TABLE_FORMAT or d.get("version") != TABLE_VERSION:
            got = (d.get("format"), d.get("version")) if isinstance(d, Mapping) else d
            raise FormatError(f"engine table spec has format/version {got!r}; this polymem reads "
                              f"({TABLE_FORMAT!r}, {TABLE_VERSION}); fix: re-import the table")
        a = EngineAddressing.from_json(d.get("addressing"))
        base = d.get("row_base")
        if not isinstance(base, list) or len(base) != len(a.layers) or not all(
                type(b) is int and b >= 0 for b in base):
            raise FormatError(f"engine table field 'row_base' is {base!r}; expected {len(a.layers)} non-negative "
                              "integers (the first asset row of each layer); fix: re-import the table")
        return cls(addressing=a, row_base=tuple(base))

    def check_layout(self, layout: Any) -> None:
        """Each layer starts on a page boundary, after the one before, and fits in the asset's rows."""
        end = 0
        for b, t in zip(self.row_base, self.addressing.layers, strict=True):
            if b % layout.rows_per_page or b < end:
                raise FormatError(f"engine table layer {t.layer} starts at row {b}: it must start on a page "
                                  f"boundary (K·S = {layout.rows_per_page}) at or after row {end}; re-import it")
            end = b + t.stored_rows
        if end > layout.num_rows:
            raise FormatError(f"engine table needs {end} rows, the layout holds {layout.num_rows}; re-import it")


def is_table_dict(d: Any) -> bool:
    return isinstance(d, Mapping) and d.get("format") == TABLE_FORMAT


__all__ = ["TABLE_FORMAT", "TABLE_VERSION", "EngineTableSpec", "is_table_dict"]
