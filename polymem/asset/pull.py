"""``pull``: stage a remote asset (any fsspec URL, or a local directory) on local disk, verified, atomically.

    asset = pull("s3://bucket/table.pmem", "/data/table.pmem")     # CLI: polymem pull URL DIR

Every file of the asset is copied into a temporary sibling of DIR; each shard's sha256 is computed while it
streams and compared with the checksums of the *staged* header (so a source rewritten mid-copy cannot slip
through); the staged copy is then opened and validated like any asset, and only then renamed to DIR. On any
failure the temporary copy is removed and DIR is untouched. Not here: serving remote assets without staging
them (:mod:`polymem.asset.pages` reads URLs directly).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from polymem.asset import _fs
from polymem.asset._format import WRITING_MARKER
from polymem.asset._validate import Raw, validate
from polymem.errors import FormatError, PolymemError

_STEP = 1 << 22


def _list_files(raw: Raw) -> list[str]:
    """Keys (relative paths) of every file of the asset; dot-files (temp files, markers) are skipped."""
    if raw.local is not None:
        root = raw.local
        keys = [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()]
    else:
        root_s = raw._root.rstrip("/")
        keys = [str(p)[len(root_s) + 1:] for p in raw._fs.find(root_s) if str(p).startswith(root_s + "/")]
    return sorted(k for k in keys if not any(part.startswith(".") for part in k.split("/")))


def _copy(raw: Raw, key: str, dest: Path) -> str:
    """Copy one file, fsync it, return its sha256."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    src = open(raw.local / key, "rb") if raw.local is not None else raw._fs.open(raw._p(key), "rb")
    with src, open(dest, "wb") as f:
        while chunk := src.read(_STEP):
            h.update(chunk)
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
    return h.hexdigest()


def pull(
    url: str | os.PathLike[str], dest: str | os.PathLike[str], *, overwrite: bool = False, workers: int = 4,
    progress: Callable[[str, int], Any] | None = None,
) -> Any:
    """Copy the asset at ``url`` to the local directory ``dest`` with every checksum verified; returns it opened.

    progress(key, nbytes) is called after each file."""
    from polymem.asset.core import MemoryAsset

    location = os.fspath(url)
    raw = Raw(location)
    header = validate(raw, location)  # a broken source is refused before anything is copied
    out = Path(os.fspath(dest))
    if "://" in str(dest):
        raise PolymemError(f"pull writes a local directory; {str(dest)!r} is a URL — give a path such as ./table.pmem")
    if out.exists() and not overwrite:
        raise PolymemError(f"{str(out)!r} already exists; pass overwrite=True (CLI: --overwrite) or pick another directory")
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise PolymemError(f"workers={workers!r} must be a positive integer, e.g. 4")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.pull-", dir=out.parent))
    try:
        keys = _list_files(raw)
        shards = set(header.checksums["shards"])
        missing = sorted(shards - set(keys))
        if missing:
            raise FormatError(f"{location}: shard {missing[0]!r} is missing; restore the source asset")
        sums: dict[str, str] = {}

        def one(key: str) -> None:
            sums[key] = _copy(raw, key, tmp / key)
            if progress is not None:
                progress(key, (tmp / key).stat().st_size)

        with ThreadPoolExecutor(max_workers=workers) as pool:
            for f in [pool.submit(one, k) for k in keys]:
                f.result()
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
        old = None
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.replace(out, old / "asset")
        os.replace(tmp, out)
        _fs.fsync_dir(out.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return MemoryAsset.open(out)



__all__ = ["pull"]
