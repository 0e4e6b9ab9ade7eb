"""One asset written by several processes at once, each writing the shards of its own pages (a table sharded by
rows across the processes of a training run): :func:`write_together`.

The lead process (rank 0) checks the destination, creates the build directory beside it (holding its flock, as
every writer does: :func:`polymem.asset._commit.building`) and tells the others where it is; every process
writes its shards' files there from its own rows, with no process ever holding another's rows; the lead gathers
the shards' digests (a few bytes each), writes the metadata and installs the asset with the one commit protocol
(a rename; an existing asset is replaced only with ``overwrite``). A process that fails tells the others: every
process raises, and nothing is left behind.

``comm`` carries the few objects exchanged: ``rank``, ``broadcast(obj)`` (rank 0's object, on every rank) and
``gather(obj)`` (every rank's object, on every rank). :mod:`polymem.torch.sharded` builds it on torch.distributed.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

from polymem.asset import _codec, _commit, _fs
from polymem.asset._format import canonical_json, check_provenance, geometry, header_body, sha256_hex
from polymem.asset._shards import file_sha256, read_shard_ids, write_shard
from polymem.errors import PolymemError
from polymem.hash.layout import Layout
from polymem.hash.spec import check_orders

if TYPE_CHECKING:
    from polymem.asset.core import MemoryAsset


def shard_pages(layout: Layout, world: int, dtype: str = "float32") -> tuple[int, int]:
    """(chunks_per_shard, pages per shard) for a table written by ``world`` processes: the format's default
    shard size, made smaller where the table has fewer shards than processes (each process needs a shard)."""
    g = geometry(layout, dtype)
    units = g.num_shards
    cps = g.chunks_per_shard
    if units < world:
        chunks = -(-layout.pages // g.pages_per_chunk)
        if chunks < world:
            raise PolymemError(f"a table of {layout.pages:,} pages cannot be split over {world} processes (each "
                               f"writes whole chunks of its own); use at most {chunks} processes or a larger table")
        cps = -(-chunks // world)
    return cps, cps * g.pages_per_chunk


def write_together(
    cls: type[MemoryAsset], path: str | os.PathLike[str], spec: Any, layout: Layout,
    source: Callable[[int, int], Any], *, shards: Sequence[int], chunks_per_shard: int, comm: Any,
    orders: Any, provenance: Mapping[str, Any] | None, overwrite: bool, dtype: str = "float32",
    row_counts: Callable[[], Any] | None = None,
) -> MemoryAsset:
    """Write shards ``shards`` of a new asset at ``path`` from ``source`` (pages [a, b) -> float32 [b-a, K*S, r],
    this process's rows only); rank 0 also writes the metadata (and ``row_counts()``, the rows' update counts,
    when given) and installs. Collective: every process calls it, with its own shards. Returns the asset."""
    from polymem.asset._write import check_disk_space

    dest = Path(os.fspath(path).removeprefix("file://"))
    lead = comm.rank == 0
    geom = geometry(layout, dtype, chunks_per_shard)
    problem = None
    if lead:
        try:
            if dest.exists() and not overwrite:
                raise PolymemError(f"{str(dest)!r} already exists; pass --overwrite or pick another path")
            orders_t, prov = check_orders(orders), check_provenance(provenance)
            check_disk_space(dest, geom.num_chunks * geom.stride + geom.num_shards * geom.tail_bytes)
        except PolymemError as e:
            problem = str(e)
    with (_commit.building(dest) if lead and problem is None else _nothing()) as tmp:
        if tmp is not None:
            from polymem.asset import _zarr

            try:
                _zarr.create_array_metadata(tmp, geom)
            except OSError as e:
                problem = f"cannot write {str(dest)!r}: {e}"
        where = comm.broadcast([str(tmp) if tmp is not None else None, problem])
        if where[1] is not None:
            raise PolymemError(where[1])
        root = Path(where[0])
        digests: dict[str, str] = {}
        mine = None
        try:
            for s in shards:
                key = geom.shard_key(s)
                (root / key).parent.mkdir(parents=True, exist_ok=True)
                a = s * geom.chunks_per_shard * geom.pages_per_chunk
                b = min(geom.pages, (s * geom.chunks_per_shard + geom.chunks_in_shard(s)) * geom.pages_per_chunk)
                pages = _codec.check_pages(source(a, b), geom, b - a)
                digests[key] = write_shard(root / key, geom, s, _codec.pages_to_chunks(_codec.encode_pages(pages, geom), geom))
                _fs.fsync_dir((root / key).parent)
        except (OSError, PolymemError) as e:
            mine = f"rank {comm.rank}: {e}"
        counts = row_counts() if row_counts is not None else None
        everyone = comm.gather([digests, mine])
        failed = [m for _, m in everyone if m]
        if failed:
            raise PolymemError(f"writing {str(dest)!r} failed ({failed[0]}); nothing was left behind")
        shard_sums: dict[str, str] = {}
        for d, _ in everyone:
            shard_sums.update(d)
        if sorted(shard_sums) != sorted(geom.shard_key(s) for s in range(geom.num_shards)):
            missing = sorted({geom.shard_key(s) for s in range(geom.num_shards)} - set(shard_sums))
            raise PolymemError(f"writing {str(dest)!r}: no process wrote shard(s) {missing[:4]}; each shard belongs to "
                               "exactly one process")
        done = None
        if lead:
            try:
                extras: dict[str, Any] = {}
                count_sums: dict[str, str] = {}
                if counts is not None:
                    from polymem.asset._counts import check_counts, write_counts

                    extras["row_counts"], count_sums = write_counts(root, check_counts(counts, layout.num_rows))
                body = header_body(spec, layout, orders_t, dtype, geom, prov, extras)
                checksums: dict[str, Any] = {"algorithm": "sha256", "attributes": sha256_hex(canonical_json(body)),
                                             "array_metadata": file_sha256(root / "pages" / "zarr.json"),
                                             "shards": shard_sums}
                if geom.shard_id:
                    checksums["shard_ids"] = read_shard_ids(root, geom, shard_sums)
                if count_sums:
                    checksums["row_counts"] = count_sums
                _commit.write_group_json(root, body, checksums)
                _fs.fsync_dir(root)
                _fs.fsync_dir(root / "pages")
                _commit.install(root, dest, overwrite=overwrite, lock_timeout=None)
            except (OSError, PolymemError) as e:
                done = f"{e}"
        done = comm.broadcast(done)
        if done is not None:
            raise PolymemError(f"writing {str(dest)!r} failed: {done}")
    return cls.open(dest)


@contextlib.contextmanager
def _nothing() -> Iterator[None]:
    yield None
