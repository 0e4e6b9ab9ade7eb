"""Assets in object stores (``s3://…`` and other fsspec URLs): commit semantics without rename.

An object store has no atomic rename of a directory, so a remote asset is committed by **order**:

1. the data objects (the shard files), uploaded in parallel;
2. the array metadata (``pages/zarr.json``);
3. last, the group metadata (``zarr.json``), which holds the sha256 checksums of everything above.

``MemoryAsset.open`` starts from the group metadata and checks the objects against its checksums, so a reader
never opens a half-written asset: until step 3 lands there is no asset at the URL, and a writer that dies
before it leaves only orphan objects, which ``polymem verify URL`` lists (``orphans``). Overwriting first
deletes the old group metadata (the old asset stops being openable at once), then the old objects, then
writes the new ones in the order above. One writer at a time: object stores have no locks.

What this module does not do: build an asset (the local writer in :mod:`.core` does, in a temporary directory
that is then uploaded), or read one (fsspec range requests in :mod:`.pages` / :mod:`._validate`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from polymem._paths import is_url
from polymem.errors import FormatError, MissingError, PolymemError

GROUP_META = "zarr.json"


def is_remote(location: str) -> bool:
    return is_url(location, remote=True)


def filesystem(url: str, storage_options: dict[str, Any] | None = None) -> tuple[Any, str]:
    from polymem.sources import filesystem as _fs

    fs, root = _fs(url, storage_options)
    return fs, root.rstrip("/")


def upload(local: Path, url: str, storage_options: dict[str, Any] | None, *, overwrite: bool,
           stop_before_metadata: bool = False) -> None:
    """Commit the local asset directory ``local`` to ``url``: data objects, array metadata, group metadata last.
    ``stop_before_metadata`` (tests, and to stage an upload) leaves out the group metadata."""
    fs, root = filesystem(url, storage_options)
    group = f"{root}/{GROUP_META}"
    if fs.exists(group):
        if not overwrite:
            raise PolymemError(f"{url!r} already holds an asset; pass overwrite=True (CLI: --overwrite) or pick "
                               "another URL")
        fs.rm(group)  # from here on no reader can open the old asset
    left = _objects(fs, root)
    if left:
        if not overwrite and not _all_ours(left):
            raise PolymemError(f"{url!r} is not empty ({len(left)} objects, e.g. {left[0]!r}) and holds no asset; "
                               "pass overwrite=True to replace them, or pick another URL")
        fs.rm(left)
        fs.invalidate_cache(root)
    files = sorted(p for p in local.rglob("*") if p.is_file() and not p.name.startswith("."))
    rel = {p: p.relative_to(local).as_posix() for p in files}
    data = [p for p in files if p.name != GROUP_META]
    arrays = [p for p in files if p.name == GROUP_META and rel[p] != GROUP_META]
    if data:
        fs.put([str(p) for p in data], [f"{root}/{rel[p]}" for p in data])
    for p in arrays:
        fs.put_file(str(p), f"{root}/{rel[p]}")
    if not stop_before_metadata:
        fs.put_file(str(local / GROUP_META), group)
    fs.invalidate_cache(root)


def _all_ours(keys: list[str]) -> bool:
    """Objects that an interrupted polymem upload would leave: shard files and array metadata."""
    return all(k.split("/")[-1] == GROUP_META or "/pages/" in f"/{k}" for k in keys)


def _objects(fs: Any, root: str) -> list[str]:
    try:
        return sorted(fs.find(root))
    except FileNotFoundError:
        return []


def orphans(url: str, storage_options: dict[str, Any] | None = None) -> list[str]:
    """The objects under ``url`` when it holds no group metadata (an unfinished or interrupted write); [] when
    the group metadata is there."""
    fs, root = filesystem(url, storage_options)
    if fs.exists(f"{root}/{GROUP_META}"):
        return []
    return [fs.unstrip_protocol(k) for k in _objects(fs, root)]


def missing_asset_error(url: str, storage_options: dict[str, Any] | None) -> FormatError | None:
    """The error for a URL without group metadata: names the orphan objects of an interrupted write."""
    left = orphans(url, storage_options)
    if not left:
        return None
    shown = ", ".join(left[:5]) + (f" and {len(left) - 5} more" if len(left) > 5 else "")
    return MissingError(
        f"{url!r} is not an asset: its group metadata ({GROUP_META}) is missing, and {len(left)} orphan objects "
        f"from an unfinished or interrupted write are there ({shown}); write the asset again (overwrite=True / "
        "--overwrite) or delete them"
    )


def download(url: str, local: Path, storage_options: dict[str, Any] | None) -> None:
    """Copy a remote asset's objects into the local directory ``local``."""
    fs, root = filesystem(url, storage_options)
    from polymem.asset import _fs

    keys = _objects(fs, root)
    dests = [_fs.contained(local, _fs.check_key(k[len(root) + 1:], f"{url}: object"), f"{url}: object") for k in keys]
    for dest in dests:
        os.makedirs(dest.parent, exist_ok=True)
    fs.get(keys, [str(d) for d in dests])
