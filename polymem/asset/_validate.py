"""Raw byte access to an asset's files (local or fsspec) and the checks ``MemoryAsset.open`` runs.

Validation reads only metadata, shard sizes and shard indexes (docs/asset-format.md §6); hashing shard
contents is ``verify``'s job. Not here: reading pages, writing.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from polymem._paths import is_url
from polymem.asset._format import (
    MAX_JSON_BYTES, WRITING_MARKER, Header, check_array_metadata, parse_header, sha256_hex,
)
from polymem.asset._shards import check_shard_index, file_sha256, index_of_tail
from polymem.errors import FormatError, MissingError


# ------------------------------------------------------------------------------------------- raw access
class Raw:
    """Bytes of the group's files, local (os) or remote (fsspec). Used for validation and verify."""

    def __init__(self, location: str, storage_options: dict[str, Any] | None = None) -> None:
        self.location = location
        self.storage_options = dict(storage_options or {})
        self.local: Path | None = None
        if not is_url(location, remote=True):
            self.local = Path(location.removeprefix("file://"))
            self._fs: Any = None
            self._root = ""
        else:
            from polymem.sources import filesystem

            self._fs, self._root = filesystem(location, self.storage_options)

    def _p(self, key: str) -> str:
        return f"{self._root.rstrip('/')}/{key}"

    def exists(self, key: str) -> bool:
        return (self.local / key).is_file() if self.local else bool(self._fs.isfile(self._p(key)))

    def cat(self, key: str) -> bytes:
        if self.local:
            return (self.local / key).read_bytes()
        return bytes(self._fs.cat_file(self._p(key)))

    def size(self, key: str) -> int:
        return (self.local / key).stat().st_size if self.local else int(self._fs.size(self._p(key)))

    def tail(self, key: str, n: int) -> bytes:
        if self.local:
            with open(self.local / key, "rb") as f:
                f.seek(-n, os.SEEK_END)
                return f.read(n)
        size = self.size(key)
        return bytes(self._fs.cat_file(self._p(key), start=size - n, end=size))

    def sha256(self, key: str) -> str:
        if self.local:
            return file_sha256(self.local / key)
        import hashlib

        h = hashlib.sha256()
        with self._fs.open(self._p(key), "rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
        return h.hexdigest()


def _load_json(raw: Raw, key: str, where: str) -> tuple[dict[str, Any], bytes]:
    if not raw.exists(key):
        what = "group metadata" if key == "zarr.json" else "array metadata"
        hint = " (is this a polymem asset? create one with `polymem init`)" if key == "zarr.json" else "; restore the asset"
        raise MissingError(f"{where}: {what} {key!r} is missing{hint}")
    size = raw.size(key)
    if size > MAX_JSON_BYTES:
        raise FormatError(f"{where}: {key!r} is {size:,} bytes; asset metadata is at most {MAX_JSON_BYTES:,} "
                          "(this is not a polymem asset, or it was overwritten); restore the asset")
    data = raw.cat(key)
    try:
        obj = json.loads(data)
    except RecursionError:
        raise FormatError(f"{where}: {key!r} is not asset metadata (JSON nested deeper than Python's limit of "
                          f"{sys.getrecursionlimit():,}); restore the asset") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an integer of more than 4300 digits
        raise FormatError(f"{where}: {key!r} is not valid JSON ({e}); restore the asset") from None
    if not isinstance(obj, dict):
        raise FormatError(f"{where}: {key!r} must hold a JSON object")
    return obj, data


def validate(raw: Raw, where: str) -> Header:
    """Everything `open` checks (docs/asset-format.md §6), without hashing shard contents."""
    if raw.local is not None and not raw.local.is_dir():
        raise MissingError(f"{where}: no asset directory here; create one with `polymem init {where}`", raw.local)
    if raw.exists(WRITING_MARKER):
        raise FormatError(
            f"{where}: a page write was interrupted while replacing shards (marker {WRITING_MARKER!r} present), so "
            f"the asset may be half-written and is refused; run `polymem verify --repair {where}` to roll the "
            "interrupted write back"
        )
    group, _ = _load_json(raw, "zarr.json", where)
    if group.get("node_type") != "group" or group.get("zarr_format") != 3:
        raise FormatError(f"{where}: zarr.json is not a zarr v3 group (node_type {group.get('node_type')!r})")
    header = parse_header(group.get("attributes", {}), where)
    geom = header.geometry
    meta, meta_bytes = _load_json(raw, "pages/zarr.json", where)
    if sha256_hex(meta_bytes) != header.checksums.get("array_metadata"):
        check_array_metadata(meta, geom, where)  # names the field when it can
        raise FormatError(f"{where}: field 'checksums.array_metadata' does not match pages/zarr.json; it was edited")
    check_array_metadata(meta, geom, where)
    if "row_counts" in header.extras:
        from polymem.asset._counts import check_counts_checksums, check_counts_files

        check_counts_checksums(header.extras["row_counts"], header.checksums.get("row_counts"), where)
        check_counts_files(raw, header.extras["row_counts"], where)
    if header.sparse:
        from polymem.asset._sparse import validate_sparse

        validate_sparse(raw, header, where)
        return header
    shards = header.checksums["shards"]
    for s in range(geom.num_shards):
        key = geom.shard_key(s)
        if key not in shards:
            raise FormatError(f"{where}: field 'checksums.shards' has no entry for shard {key!r}")
        if not raw.exists(key):
            raise MissingError(f"{where}: shard {key!r} is missing; restore it or re-create the asset")
        size, want = raw.size(key), geom.shard_size(s)
        if size != want:
            raise FormatError(
                f"{where}: shard {key!r} is {size} bytes, expected {want} (truncated or overwritten); restore the asset"
            )
        tail = raw.tail(key, geom.tail_bytes)
        check_shard_index(geom, s, index_of_tail(geom, s, tail, header.checksums.get("shard_ids"), where), where)
    return header
