"""zarr-python and tensorstore access to the ``pages`` array — the portable fallback path.

This is the only place in polymem that imports zarr (tensorstore is optional). zarr-python writes the array
metadata when an asset is created (so the file is what zarr itself would write) and reads pages for stores
the fast path does not handle (fsspec URLs). Not here: header validation (``_format``), shard bytes
(``_shards``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from polymem._paths import is_url
from polymem.asset._format import ARRAY_NAME, Geometry
from polymem.errors import FormatError

if TYPE_CHECKING:
    from zarr.core.array_spec import ArrayConfigParams


def _checked(read: Any, ids: np.ndarray, geom: Geometry | None, where: str) -> np.ndarray:
    """``read(ids)``; a failed crc32c (zarr-python: ValueError 'checksum', tensorstore: 'DATA_LOSS' / 'Digest')
    becomes a FormatError naming the shard and page of the first bad chunk."""
    try:
        return np.asarray(read(ids))
    except Exception as e:  # noqa: BLE001 - re-raised below unless it is a checksum failure
        msg = str(e)
        if not any(k in msg for k in ("checksum", "Digest", "DATA_LOSS")) or geom is None:
            raise
        from polymem.asset._shards import corrupt_chunk

        for c in sorted({int(c) for c in np.asarray(ids).reshape(-1)}):
            try:
                read(np.array([c]))
            except Exception:  # noqa: BLE001
                s, i = divmod(c, geom.chunks_per_shard)
                raise corrupt_chunk(geom, s, i, where) from None
        raise FormatError(f"{where}: a chunk failed its checksum ({msg}); run `polymem verify {where}`") from None


def create_array_metadata(root: Path, geom: Geometry) -> None:
    """Write ``root/pages/zarr.json`` with zarr-python (no chunks): bytes codec (+ crc32c from format v2), index
    at the end."""
    import zarr
    from zarr.codecs import BytesCodec, Crc32cCodec

    group = zarr.open_group(str(root), mode="w-", zarr_format=3)  # "w" would delete and re-create root: its flock is on the old inode
    # zarr imports NotRequired from typing (Python 3.11+), so mypy's 3.10 target reads "order" as required
    config: ArrayConfigParams = {"write_empty_chunks": True}  # type: ignore[typeddict-item]
    group.create_array(
        ARRAY_NAME, shape=geom.shape, dtype=geom.data_type, chunks=geom.chunk_shape, shards=geom.shard_shape,
        compressors=[Crc32cCodec()] if geom.crc else None, filters=None, serializer=BytesCodec(endian="little"), fill_value=0,
        config=config,
    )


def write_with_zarr(root: Path, geom: Geometry, stored: np.ndarray) -> None:
    """Write the whole stored array through zarr-python (slow; the reference the shard writer is tested against)."""
    import zarr

    # zarr 3.1's open_array ignores config=...; only the global setting keeps all-zero pages in the shards
    with zarr.config.set({"array.write_empty_chunks": True}):
        arr = zarr.open_array(str(root / ARRAY_NAME), mode="r+")
        arr[...] = stored


class ZarrReader:
    """Chunks through zarr-python (any store zarr can open, including fsspec URLs)."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None, geom: Geometry | None = None,
                 where: str = "") -> None:
        import zarr

        kw: dict[str, Any] = {"storage_options": storage_options} if storage_options and is_url(url) else {}
        try:
            self._arr = zarr.open_array(url.rstrip("/") + "/" + ARRAY_NAME, mode="r", **kw)
        except OSError:
            raise  # a missing or unreadable file (NodeNotFoundError is one): not the metadata's fault
        except (ValueError, TypeError, KeyError, AttributeError, NotImplementedError) as e:  # zarr's metadata errors
            msg = " ".join(str(e).split())[:300]
            raise FormatError(f"{where or url}: zarr-python cannot open its pages/zarr.json ({type(e).__name__}: "
                              f"{msg}); restore the asset, or open it with backend='fast'") from None
        self._geom, self._where = geom, where or url

    def read_chunks(self, ids: np.ndarray) -> np.ndarray:
        return _checked(lambda i: self._arr.oindex[i], ids, self._geom, self._where)

    def invalidate(self, shards: "list[int] | None" = None) -> None:
        pass

    def close(self) -> None:
        pass


class TensorstoreReader:
    """Chunks through tensorstore's zarr3 driver (local files only here)."""

    def __init__(self, root: Path, geom: Geometry | None = None, where: str = "") -> None:
        from polymem._optional import optional_import

        self._geom, self._where = geom, where or str(root)
        ts = optional_import("tensorstore", extra="fast", purpose="the asset backend 'tensorstore'")
        spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(root / ARRAY_NAME)}}
        self._ts = ts
        self._spec = spec
        self._arr = ts.open(spec, read=True).result()

    def read_chunks(self, ids: np.ndarray) -> np.ndarray:
        return _checked(lambda i: self._arr[i].read().result(), ids, self._geom, self._where)

    def invalidate(self, shards: "list[int] | None" = None) -> None:
        self._arr = self._ts.open(self._spec, read=True).result()

    def close(self) -> None:
        pass
