"""Portable memory assets: a hashed n-gram table as a zarr v3 group (docs/asset-format.md).

Public: :class:`MemoryAsset`. The package is the only part of polymem that imports zarr (in ``_zarr``).
"""

from __future__ import annotations

from polymem.asset._format import ASSET_FORMAT, DTYPES, SUPPORTED_ASSET_VERSIONS
from polymem.asset.core import BACKENDS, MemoryAsset

__all__ = ["ASSET_FORMAT", "BACKENDS", "DTYPES", "MemoryAsset", "SUPPORTED_ASSET_VERSIONS"]
