"""The asset's writers: a new asset built in a sibling temp directory and installed (:func:`write_new`, behind
``MemoryAsset.create`` / ``from_array`` / ``quantize`` / ``upgrade`` and the importers), page writes that replace
whole shards behind a marker file (:func:`write_pages`, docs/asset-format.md §7), and both on URLs (copy here,
write, commit back in order: :func:`write_remote`, :func:`write_pages_remote`). The commit protocol itself is
:mod:`._commit`; the reads are :mod:`.core`, which calls these (``self``: the :class:`MemoryAsset`).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np

from polymem.asset import _codec, _commit, _fs, _remote
from polymem.asset._format import (
    ASSET_VERSION, LOCK_FILE, canonical_json, check_dtype, check_provenance, geometry, header_body,
    parse_header, sha256_hex,
)
from polymem.asset._shards import file_sha256, read_shard_checked, read_shard_ids, write_shard
from polymem.asset._validate import Raw as _Raw
from polymem.asset._validate import validate as _validate
from polymem.errors import PolymemError
from polymem.hash.layout import Layout
from polymem.hash.spec import HashSpec, check_orders

if TYPE_CHECKING:  # core.py imports this module (its writers); these only annotate
    from polymem.asset.core import MemoryAsset

PageSource = Callable[[int, int], np.ndarray]  # (first page, stop page) -> float32 [stop-first, K*S, r]
ChunkSource = Callable[[int], np.ndarray]  # shard s -> its stored chunks (any dtype, C-contiguous)


def unchanged_since(src: MemoryAsset | None, dest: Path) -> Callable[[], None] | None:
    """For a rewrite of ``src`` over itself: a check (run under the writer lock, before the swap) that no other
    writer committed since ``src`` was opened; their pages would be lost."""
    if src is None or src._raw.local is None or not dest.exists() or not os.path.samefile(dest, src._raw.local):
        return None

    def check() -> None:
        if _validate(_Raw(str(dest)), src.path).checksums != src._header.checksums:
            raise PolymemError(f"{src.path}: another writer committed pages while this rewrite read the asset; "
                               "nothing was replaced (their pages would have been lost). Run it again")

    return check


def write_remote(cls: type[MemoryAsset], url: str, storage_options: Mapping[str, Any] | None, overwrite: bool,
                 build: Callable[[Path], object]) -> MemoryAsset:
    """Build the asset in a local temporary directory (``build(path)``), then commit it to ``url``: data
    objects first, the group metadata with the checksums last (polymem/asset/_remote.py)."""
    opts = dict(storage_options or {})
    with tempfile.TemporaryDirectory(prefix="polymem-upload-") as d:
        build(Path(d) / "asset")
        _remote.upload(Path(d) / "asset", url, opts, overwrite=overwrite)
    return cls.open(url, storage_options=opts)


def check_disk_space(dest: Path, need: int) -> None:
    """Refuse, before a byte is written, an asset of ``need`` bytes that the file system holding ``dest`` has no
    room for (the new asset is built beside ``dest``, so an overwrite needs the room too)."""
    from polymem._io import free_bytes

    free = free_bytes(dest.parent)
    if free is not None and need > free:  # None: no answer, the write itself will say
        gib = 2**30
        raise PolymemError(f"{str(dest)!r} needs {need / gib:,.2f} GiB ({need:,} bytes) and its file system has "
                           f"{free / gib:,.2f} GiB free; free some space, pick another place, or a smaller --params")


def write_new(
    cls: type[MemoryAsset], path: str | os.PathLike[str], spec: Any, layout: Layout, source: PageSource | None, *,
    dtype: str, orders: Any, provenance: Mapping[str, Any] | None, overwrite: bool,
    chunks_per_shard: int | None, chunk_source: ChunkSource | None = None, lock_timeout: float | None = None,
    storage_options: Mapping[str, Any] | None = None, format_version: int = ASSET_VERSION,
    row_counts: Any = None, fp8_scale: float | None = None, based_on: MemoryAsset | None = None,
) -> MemoryAsset:
    """:meth:`MemoryAsset._write_new`: a new asset at ``path`` (a local directory, or a URL committed by order)
    whose pages come from ``source`` (pages [a, b) -> float32), ``chunk_source`` (shard -> its stored chunks) or
    neither (zeros); built in a sibling temp directory and installed (``cls`` opens the result)."""
    location = os.fspath(path)
    if _remote.is_remote(location):
        return write_remote(cls, location, storage_options, overwrite, lambda local: write_new(cls, 
            local, spec, layout, source, dtype=dtype, orders=orders, provenance=provenance, overwrite=False,
            chunks_per_shard=chunks_per_shard, chunk_source=chunk_source, format_version=format_version,
            row_counts=row_counts, fp8_scale=fp8_scale))
    dest = Path(location.removeprefix("file://"))
    from polymem.hash.idhash import IdHashSpec

    from polymem.asset.engine_table import EngineTableSpec

    if not isinstance(spec, (HashSpec, IdHashSpec, EngineTableSpec)) or not isinstance(layout, Layout):
        raise PolymemError("spec must be a polymem.HashSpec (or an IdHashSpec, EngineTableSpec) and layout a "
                           "polymem.Layout")
    if isinstance(spec, (IdHashSpec, EngineTableSpec)):
        spec.check_layout(layout)
    counts = None
    if row_counts is not None:
        from polymem.asset._counts import check_counts

        counts = check_counts(row_counts, layout.num_rows)
    dtype = check_dtype(dtype)
    orders_t = check_orders(orders)
    prov = check_provenance(provenance)
    geom = geometry(layout, dtype, chunks_per_shard, version=format_version,  # version 1: tests/benchmarks only
                    fp8_scale=fp8_scale)
    if dest.exists() and not overwrite:
        raise PolymemError(f"{str(dest)!r} already exists; pass overwrite=True (CLI: --overwrite) or pick another path")
    if dest.exists() and not dest.is_dir():
        raise PolymemError(f"{str(dest)!r} is a file, not an asset directory; remove it or pick another path")
    if chunk_source is None:  # every shard is written whole (a chunk source may store fewer chunks)
        check_disk_space(dest, geom.num_chunks * geom.stride + geom.num_shards * geom.tail_bytes)
    with _commit.building(dest) as tmp:
        from polymem.asset import _zarr

        _zarr.create_array_metadata(tmp, geom)
        shards: dict[str, str] = {}
        zero_digest: dict[int, str] = {}
        for s in range(geom.num_shards):
            key = geom.shard_key(s)
            (tmp / key).parent.mkdir(parents=True, exist_ok=True)
            if chunk_source is not None:
                shards[key] = write_shard(tmp / key, geom, s, chunk_source(s))
            elif source is None:  # zero shards; equal-sized ones have equal bytes
                n = geom.chunks_in_shard(s)
                shards[key] = write_shard(tmp / key, geom, s, None)
                zero_digest.setdefault(n, shards[key])
            else:
                ppc, cps = geom.pages_per_chunk, geom.chunks_per_shard
                a = s * cps * ppc
                b = min(geom.pages, (s * cps + geom.chunks_in_shard(s)) * ppc)
                pages = _codec.check_pages(source(a, b), geom, b - a)
                chunks = _codec.pages_to_chunks(_codec.encode_pages(pages, geom), geom)
                shards[key] = write_shard(tmp / key, geom, s, chunks)
        extras: dict[str, Any] = {}
        count_sums: dict[str, str] = {}
        if counts is not None:
            from polymem.asset._counts import write_counts

            extras["row_counts"], count_sums = write_counts(tmp, counts)
        body = header_body(spec, layout, orders_t, dtype, geom, prov, extras)
        checksums = {
            "algorithm": "sha256", "attributes": sha256_hex(canonical_json(body)),
            "array_metadata": file_sha256(tmp / "pages" / "zarr.json"), "shards": shards,
        }
        if geom.shard_id:
            checksums["shard_ids"] = read_shard_ids(tmp, geom, shards)
        if count_sums:
            checksums["row_counts"] = count_sums
        _commit.write_group_json(tmp, body, checksums)
        for d in [tmp, tmp / "pages", *(tmp / geom.shard_key(s) for s in range(geom.num_shards))]:
            _fs.fsync_dir(d if d.is_dir() else d.parent)
        _commit.install(tmp, dest, overwrite=overwrite, lock_timeout=lock_timeout,
                        check=unchanged_since(based_on, dest))
    return cls.open(dest)


def write_pages(self: MemoryAsset, page_ids: Any, data: Any, *, lock_timeout: float | None = None) -> None:
    """Replace pages: ids [n] (distinct), data float32 [n, K*S, r]. Atomic (docs/asset-format.md §7).

    Takes the asset's writer lock (waits up to ``lock_timeout`` s, default 60, for another writer), refuses
    to build on a shard whose bytes do not match its checksums, and either lands completely or raises
    with the asset unchanged.
    """
    root = self._raw.local
    if root is None:
        write_pages_remote(self, page_ids, data)
        return
    if self._version < ASSET_VERSION:
        raise PolymemError(
            f"{self.path}: format version {self._version} assets are read-only in this polymem; run "
            f"`polymem upgrade {self.path}` (MemoryAsset.upgrade) first"
        )
    if self.sparse:
        raise PolymemError(f"cannot write pages of {self.path!r}: it is a sparse subset (read-only); write to the full asset")
    ids, _ = self._check_ids(page_ids)
    g = self.geometry
    pages = _codec.check_pages(data, g, ids.shape[0])
    if np.unique(ids).shape[0] != ids.shape[0]:
        raise PolymemError("page ids passed to write_pages must be distinct; merge duplicate pages first")
    stored = _codec.encode_pages(pages, g)  # [n, ...]
    with _fs.writer_lock(root, LOCK_FILE, lock_timeout, self.path):
        # the asset as it is now (another writer may have committed since we opened it); no marker
        header = _validate(self._raw, self.path)
        if header.geometry != g:
            raise PolymemError(f"{self.path}: the asset was re-created with another geometry; reopen it")
        if header.checksums != self._header.checksums:
            self._reader.invalidate()
        _commit.recover(root)  # stale .new/.old/.tmp files of a killed writer (no marker: nothing to roll back)
        ppc, cps = g.pages_per_chunk, g.chunks_per_shard
        chunk_of = ids // ppc
        shard_of = chunk_of // cps
        new_sums: dict[str, str] = {}
        touched = sorted({int(s) for s in shard_of})
        for s in touched:  # contained: no link on the way to any file this write creates
            _commit.shard_path(root, g.shard_key(s))
        try:
            for s in touched:
                key = g.shard_key(s)
                c0 = s * cps
                chunks = read_shard_checked(root / key, g, s, header.checksums["shards"][key], self.path)
                chunks = chunks.view(np.dtype(g.data_type).newbyteorder("<")).reshape(
                    (chunks.shape[0],) + g.chunk_shape[1:])
                sel = np.flatnonzero(shard_of == s)
                if g.packed:
                    _codec.page_view(chunks, g)[chunk_of[sel] - c0, ids[sel] % ppc] = stored[sel]
                else:
                    chunks[chunk_of[sel] - c0] = stored[sel]
                new_sums[key] = write_shard(root / (key + ".new"), g, s, chunks)
        except BaseException:
            for s in touched:
                try:
                    _fs.unlink(root / (g.shard_key(s) + ".new"))
                except OSError:
                    pass
            raise
        checksums = dict(header.checksums)
        checksums["shards"] = {**header.checksums["shards"], **new_sums}
        if g.shard_id:
            checksums["shard_ids"] = {**header.checksums["shard_ids"], **read_shard_ids(root, g, new_sums, ".new")}
        body = header_body(header.spec, header.layout, header.orders, header.dtype, g, header.provenance,
                           header.extras)
        try:
            _commit.swap(root, sorted(new_sums), _commit.group_json_bytes(body, checksums))
        finally:
            self._reader.invalidate()
        self._header = parse_header({"polymem": {**body, "checksums": checksums}}, self.path)


def write_pages_remote(self: MemoryAsset, page_ids: Any, data: Any) -> None:
    """write_pages on a URL: copy the asset here, write the pages, commit it back in order (data objects,
    then the group metadata). Costs a download and an upload of the whole asset; for large tables write
    locally and upload."""
    opts = self._raw.storage_options
    with tempfile.TemporaryDirectory(prefix="polymem-pages-") as d:
        local = Path(d) / "asset"
        _remote.download(self.path, local, opts)
        with type(self).open(local) as a:
            a.write_pages(page_ids, data)
        _remote.upload(local, self.path, opts, overwrite=True)
    fresh = type(self).open(self.path, storage_options=opts, backend=self._backend)
    self._reader.close()
    self._raw, self._header, self._reader = fresh._raw, fresh._header, fresh._reader


__all__ = ["ChunkSource", "PageSource", "unchanged_since", "write_new", "write_pages", "write_pages_remote", "write_remote"]
