"""``pull``: stage a remote asset (any fsspec URL, or a local directory) on local disk, verified, atomically.

    asset = pull("s3://bucket/table.pmem", "/data/table.pmem")     # CLI: polymem pull URL DIR

Every file of the asset is copied into a temporary sibling of DIR; each shard's sha256 is computed while it
streams and compared with the checksums of the *staged* header (so a source rewritten mid-copy cannot slip
through); the staged copy is then opened and validated like any asset, and only then renamed to DIR. On any
failure the temporary copy is removed and DIR is untouched. Object keys are data: one that is not a plain
relative path (an empty, ``.`` or ``..`` segment, a leading ``/``) is refused before anything is copied
(:func:`_fs.check_key`). The staging directory ``.DIR.pull-*`` holds a lock while its pull runs; one whose
pull was killed (its lock is free) is removed by the next pull or ``polymem verify --repair DIR``. DIR is
committed like every asset (:func:`_commit.install`: never over one that appeared meanwhile unless
overwriting). Not here: serving remote assets without staging them (:mod:`polymem.serve` reads URLs
directly).
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from polymem._paths import is_url
from polymem.asset import _commit, _fs
from polymem.asset._commit import remove_stale_staging
from polymem.asset._format import WRITING_MARKER
from polymem.asset._validate import Raw, validate
from polymem.errors import FormatError, MissingError, PolymemError

if TYPE_CHECKING:  # annotations only; the functions import it when they run
    from polymem.asset.core import MemoryAsset

_STEP = 1 << 22


def _list_files(raw: Raw, location: str, header: Any) -> list[str]:
    """Keys (relative paths) of the files the asset's header names (group and array metadata, shards, row
    counts) that the source holds; anything else there is not copied. A key that is not a plain relative path,
    and a file of a local source that is a link, are refused."""
    if raw.local is not None:
        root = raw.local
        links = [p for p in root.rglob("*") if p.is_symlink()]
        if links:
            raise FormatError(f"{location}: {str(links[0].relative_to(root))!r} is a symbolic link; a pulled asset "
                              "holds only its own files. Replace the link with the file (or pull the real asset)")
        keys = [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()]
    else:
        root_s = raw._root.rstrip("/")
        keys = [str(p)[len(root_s) + 1:] for p in raw._fs.find(root_s) if str(p).startswith(root_s + "/")]
    keys = [_fs.check_key(k, f"{location}: object") for k in keys]
    named = {"zarr.json", "pages/zarr.json", *header.checksums["shards"], *header.checksums.get("row_counts", {})}
    return sorted(k for k in keys if k in named)


def _copy(raw: Raw, key: str, dest: Path) -> str:
    """Copy one file, fsync it, return its sha256."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    src = open(raw.local / key, "rb") if raw.local is not None else raw._fs.open(raw._p(key), "rb")
    with src, _fs.open_write(dest) as f:
        while chunk := src.read(_STEP):
            h.update(chunk)
            f.write(chunk)
        _fs.fsync(f)
    return h.hexdigest()


def pull(
    url: str | os.PathLike[str], dest: str | os.PathLike[str], *, overwrite: bool = False, workers: int = 4,
    progress: Callable[[str, int], Any] | None = None, storage_options: dict[str, Any] | None = None,
) -> MemoryAsset:
    """Copy the asset at ``url`` to the local directory ``dest`` with every checksum verified; returns it opened.

    progress(key, nbytes) is called after each file; storage_options go to fsspec (e.g. an S3 endpoint)."""
    from polymem.asset.core import MemoryAsset

    location = os.fspath(url)
    raw = Raw(location, storage_options)
    header = validate(raw, location)  # a broken source is refused before anything is copied
    out = Path(os.fspath(dest))
    if is_url(os.fspath(dest)):
        raise PolymemError(f"pull writes a local directory; {str(dest)!r} is a URL — give a path such as ./table.pmem")
    if out.exists() and not overwrite:
        raise PolymemError(f"{str(out)!r} already exists; pass overwrite=True (CLI: --overwrite) or pick another directory")
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise PolymemError(f"workers={workers!r} must be a positive integer, e.g. 4")
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(out)
    keys = _list_files(raw, location, header)
    shards = set(header.checksums["shards"])
    missing = sorted(shards - set(keys))
    if missing:
        raise MissingError(f"{location}: shard {missing[0]!r} is missing; restore the source asset")
    with _commit.building(out, "pull") as tmp:
        sums: dict[str, str] = {}

        def one(key: str) -> None:
            sums[key] = _copy(raw, key, _fs.contained(tmp, key, f"{location}: object"))
            if progress is not None:
                progress(key, (tmp / key).stat().st_size)

        with ThreadPoolExecutor(max_workers=workers) as pool:
            for f in [pool.submit(one, k) for k in keys]:
                f.result()
        _check_staged(tmp, location, header, sums)
        _commit.install(tmp, out, overwrite=overwrite, lock_timeout=None)
    return MemoryAsset.open(out)


def _check_staged(tmp: Path, location: str, header: Any, sums: dict[str, str]) -> None:
    staged = validate(Raw(str(tmp)), location)  # metadata checksums, sizes, shard indexes of the copy
    for key, want in sorted(staged.checksums["shards"].items()):
        if sums.get(key) != want:
            raise FormatError(
                f"{location}: shard {key!r} checksum mismatch (header {want[:12]}…, copied bytes "
                f"{(sums.get(key) or '?')[:12]}…): the source is corrupt or changed while it was copied; "
                "nothing was written — restore the source and pull again"
            )
    if header.checksums["attributes"] != staged.checksums["attributes"]:
        raise FormatError(f"{location}: the asset changed while it was copied; pull again")
    if (tmp / WRITING_MARKER).exists():
        raise FormatError(f"{location}: a writer is replacing shards; pull again when it is done")



__all__ = ["pull"]
