"""The page-write commit protocol and its recovery (docs/asset-format.md §7).

A page write, under the writer lock:

1. writes every touched shard in full to ``SHARD.new`` (fsync);
2. writes the marker ``.polymem-writing`` (tmp + rename): the keys being replaced and the sha256 of the new
   ``zarr.json``;
3. per shard: hard-links ``SHARD`` to ``SHARD.old``, renames ``SHARD.new`` over ``SHARD``;
4. replaces ``zarr.json`` (the new checksums) by rename — **the commit point**;
5. removes the marker, then the ``.old`` links.

Recovery (:func:`recover`, run by a failing writer and by ``polymem verify --repair``): with the marker
present, if ``zarr.json`` already is the new one, finish (drop ``.old``/``.new`` and the marker); otherwise
roll back (``SHARD.old`` back over ``SHARD``, drop ``.new``, drop the marker). Without a marker, ``.new`` /
``.old`` / ``.tmp`` leftovers are stale and removed. The marker's keys are data: each must be a shard key
(``pages/c/N/…``) inside the asset with no link on the way (:func:`_fs.contained`), else recovery refuses
and touches nothing. Every file-system call goes through :mod:`_fs`.

A whole asset (a new one, an overwrite, a subset, a pull) is committed by :func:`install`: its finished
temporary directory is renamed into place, never over an asset that appeared meanwhile unless overwriting,
and an overwrite holds the old asset's writer lock across the swap.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

from polymem.asset import _fs
from polymem.asset._format import WRITING_MARKER
from polymem.errors import PolymemError

STALE_SUFFIXES = (".new", ".old")
TMP_FILES = (".zarr.json.tmp", WRITING_MARKER + ".tmp")
_SHARD_KEY = re.compile(r"pages/c(/[0-9]{1,12})+")
STAGING = ".{name}.pull-"  # prefix of a pull's staging directory beside its destination (building(out, "pull"))


def shard_path(root: Path, key: str) -> Path:
    """``root / key`` for a shard key (from the geometry or a marker), contained in the asset."""
    where = f"{root}: the page-write marker {WRITING_MARKER!r}"
    if not isinstance(key, str) or not _SHARD_KEY.fullmatch(key):
        raise PolymemError(f"{where} lists {key!r}, which is not a shard key (pages/c/N/...); refusing to touch it. "
                           f"Check the asset with `polymem verify`, then remove {WRITING_MARKER!r} by hand")
    return _fs.contained(root, key, where)


def group_json_bytes(body: dict[str, Any], checksums: dict[str, Any]) -> bytes:
    header = dict(body)
    header["checksums"] = checksums
    doc = {"attributes": {"polymem": header}, "zarr_format": 3, "node_type": "group"}
    return json.dumps(doc, indent=2, allow_nan=False).encode()


def write_group_json(root: Path, body: dict[str, Any], checksums: dict[str, Any]) -> bytes:
    """Write root/zarr.json (the group, attributes.polymem = header) via temp file + rename; returns its bytes."""
    data = group_json_bytes(body, checksums)
    tmp = root / ".zarr.json.tmp"
    _fs.write_file(tmp, data)
    _fs.replace(tmp, root / "zarr.json")
    return data


def write_marker(root: Path, keys: list[str], new_group_sha256: str) -> None:
    tmp = root / (WRITING_MARKER + ".tmp")
    _fs.write_file(tmp, json.dumps({"replacing": keys, "new_zarr_json_sha256": new_group_sha256}).encode())
    _fs.replace(tmp, root / WRITING_MARKER)
    _fs.fsync_dir(root)


def swap(root: Path, keys: list[str], group_json: bytes) -> None:
    """Steps 2-5 above (step 1 done by the caller). On failure before the commit point: roll back, re-raise
    (the write has not landed). After it: finish, and if that fails say the write was committed."""
    committed = False
    try:
        write_marker(root, keys, hashlib.sha256(group_json).hexdigest())
        for key in keys:
            shard_path(root, key)
            _fs.unlink(root / (key + ".old"))
            _fs.link(root / key, root / (key + ".old"))
            _fs.replace(root / (key + ".new"), root / key)
            _fs.fsync_dir((root / key).parent)
        tmp = root / ".zarr.json.tmp"
        _fs.write_file(tmp, group_json)
        _fs.replace(tmp, root / "zarr.json")
        committed = True
        _fs.fsync_dir(root)
        finish(root, keys)
    except BaseException as e:
        if committed:
            raise PolymemError(
                f"{root}: the pages were written (committed), but finishing the write failed ({e!r}); if the asset "
                f"refuses to open, `polymem verify --repair {root}` finishes it"
            ) from e
        try:
            recover(root)
        except BaseException as e2:  # noqa: BLE001 - report both; the marker keeps the asset refused
            raise PolymemError(
                f"{root}: the page write failed ({e!r}) and could not be rolled back ({e2!r}); the asset refuses "
                f"to open until `polymem verify --repair {root}` rolls it back"
            ) from e
        raise


def finish(root: Path, keys: list[str]) -> None:
    _fs.unlink(root / WRITING_MARKER)
    _fs.fsync_dir(root)
    for key in keys:
        _fs.unlink(root / (key + ".old"))
        _fs.unlink(root / (key + ".new"))


def _stale_files(root: Path) -> list[Path]:
    """``.new`` / ``.old`` files under the shard tree (walked without following links; a linked ``pages`` or
    ``pages/c`` is refused) and the fixed temp files."""
    _fs.contained(root, "pages/c/x", f"{root}: the shard tree")
    out = []
    for d, dirs, files in os.walk(root / "pages" / "c", followlinks=False):
        out += [Path(d) / f for f in files if Path(f).suffix in STALE_SUFFIXES]
    return sorted(out) + [root / t for t in TMP_FILES if os.path.lexists(root / t)]


def _read_small(path: Path, what: str) -> bytes:
    """A metadata file, read only if it is a regular file of at most MAX_JSON_BYTES (no link, no giant)."""
    from polymem.asset._format import MAX_JSON_BYTES

    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_JSON_BYTES:
        kind = "not a regular file" if not stat.S_ISREG(st.st_mode) else f"{st.st_size:,} bytes"
        raise PolymemError(f"{path}: the {what} is {kind}; a polymem {what} is a regular file of at most "
                           f"{MAX_JSON_BYTES:,} bytes. Check the asset with `polymem verify`, then remove it by hand")
    return path.read_bytes()


def recover(root: Path) -> list[str]:
    """Roll an interrupted page write back (or finish it if it had committed); remove stale temporary files.
    Returns what was done, one line each. Caller holds the writer lock (or the writer itself calls it)."""
    done: list[str] = []
    marker = root / WRITING_MARKER
    if marker.exists():
        raw = _read_small(marker, "page-write marker")
        try:
            info: Any = json.loads(raw)
            keys = [str(k) for k in info["replacing"]]
            new_sha = str(info["new_zarr_json_sha256"])
        except (ValueError, KeyError, TypeError, RecursionError):  # a damaged marker: roll back what .old files say
            keys, new_sha = [], ""
            keys = sorted(str(p.relative_to(root))[: -len(".old")] for p in _stale_files(root) if p.suffix == ".old")
        for key in keys:  # all checked before anything is touched
            shard_path(root, key)
        try:
            cur = hashlib.sha256(_read_small(root / "zarr.json", "group metadata")).hexdigest()
        except FileNotFoundError:
            cur = ""
        if new_sha and cur == new_sha:
            finish(root, keys)
            done.append(f"finished an interrupted page write that had committed ({len(keys)} shard(s))")
        else:
            restored = 0
            for key in keys:
                old = root / (key + ".old")
                if old.exists():
                    _fs.replace(old, root / key)
                    restored += 1
                _fs.unlink(root / (key + ".new"))
            _fs.fsync_dir(root)
            _fs.unlink(marker)
            _fs.fsync_dir(root)
            done.append(f"rolled back an interrupted page write ({restored} of {len(keys)} shard(s) restored)")
    for p in _stale_files(root):
        _fs.unlink(p)
        done.append(f"removed stale temporary file {str(p.relative_to(root))!r}")
    return done


_OUT_OF_ROOM = {errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", -2)}


@contextmanager
def building(dest: Path, kind: str = "tmp") -> Iterator[Path]:
    """A fresh ``.NAME.<kind>-*`` directory beside ``dest`` to build the new asset (or copy) in, held by an flock
    while the writer runs (so `verify --repair` leaves it alone) and removed afterwards; once :func:`install`
    renamed it to ``dest`` there is nothing left to remove. A removal that fails leaves a stale directory,
    which `verify --repair` removes, and so does the next build of the same ``dest``: the ``.NAME.<kind>-*``
    directories no live writer holds (a killed writer's) are removed first. A write that runs out of room (no
    space, a quota, a file size limit) is one PolymemError naming ``dest``, the build directory removed."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        with _fs.stale_dirs(dest.parent, f".{dest.name}.{kind}-") as stale:
            for p in stale:
                _fs.rmtree(p)
        tmp, fd = _fs.locked_mkdtemp(f".{dest.name}.{kind}-", dest.parent)
    except OSError as e:
        raise PolymemError(f"cannot create {str(dest)!r}: {e.strerror} ({e.filename}); pick a writable directory") from None
    try:
        yield tmp
    except OSError as e:
        if e.errno not in _OUT_OF_ROOM:
            raise
        from polymem._io import reason

        raise PolymemError(f"cannot write {str(dest)!r}: {reason(e)}; nothing was left behind (the "
                           "partial build was removed); free some space, raise the limit, or write it elsewhere") from None
    finally:
        try:
            _fs.rmtree(tmp)
        except OSError:
            pass
        finally:
            os.close(fd)


def install(tmp: Path, dest: Path, *, overwrite: bool, lock_timeout: float | None,
            check: Callable[[], None] | None = None) -> None:
    """Commit the finished asset directory ``tmp`` as ``dest`` (same parent). Without ``overwrite``, an asset
    (or anything) that appeared at ``dest`` while ``tmp`` was built is never replaced (atomic no-replace
    rename). With it, the old asset is moved aside under its writer lock, the new one renamed in, and the old
    one removed; a failure puts the old one back (or leaves it at ``.NAME.old-*/asset`` for ``--repair``).
    Raises before the rename on failure; after it, a PolymemError that says the asset was committed.
    ``check`` runs under the old asset's lock before the swap (an in-place rewrite refuses to drop a write that
    another writer committed while it read the asset)."""
    if overwrite and dest.exists():
        _swap_in(tmp, dest, lock_timeout, check)
        return
    try:
        _fs.rename_noreplace(tmp, dest)
    except FileExistsError:
        if overwrite:  # appeared since the check above
            _swap_in(tmp, dest, lock_timeout, check)
            return
        raise PolymemError(f"{str(dest)!r} was created by another writer while this one was building its asset; "
                           "nothing was replaced. Pass overwrite=True (CLI: --overwrite) to replace it, or pick "
                           "another path") from None
    _committed(dest, _fs.fsync_dir, dest.parent)


def _swap_in(tmp: Path, dest: Path, lock_timeout: float | None, check: Callable[[], None] | None) -> None:
    from polymem.asset._format import LOCK_FILE

    if dest.is_symlink():
        raise PolymemError(f"{str(dest)!r} is a symbolic link (to {str(dest.resolve())!r}); polymem replaces a "
                           "directory, never writes through a link: pass the real path, or remove the link")
    if not dest.is_dir():
        raise PolymemError(f"{str(dest)!r} is a file, not an asset directory; remove it or pick another path")
    with _fs.writer_lock(dest, LOCK_FILE, lock_timeout, str(dest)):
        if check is not None:
            check()
        old, fd = _fs.locked_mkdtemp(f".{dest.name}.old-", dest.parent)
        try:
            _swap_locked(tmp, dest, old)
        finally:
            os.close(fd)
    try:
        _fs.rmtree(old)
    except OSError:  # a stale .NAME.old-XXXX: harmless, `verify --repair` removes it
        pass


def _swap_locked(tmp: Path, dest: Path, old: Path) -> None:
    _fs.replace(dest, old / "asset")
    try:
        _fs.replace(tmp, dest)
    except BaseException:
        try:  # put the old asset back (if this fails too, `verify --repair` does it)
            _fs.replace(old / "asset", dest)
            _fs.rmtree(old)
        except OSError:
            pass
        raise
    _committed(dest, _fs.fsync_dir, dest.parent)


def _committed(dest: Path, fn: Any, *args: Any) -> None:
    try:
        fn(*args)
    except BaseException as e:
        raise PolymemError(f"{dest}: the asset was written (committed), but finishing failed ({e!r}); `polymem "
                           f"verify --repair {dest}` removes what is left over") from e


def recover_siblings(dest: Path) -> list[str]:
    """Stale ``.NAME.tmp-*`` build directories next to the asset go; an ``.NAME.old-*/asset`` left by an
    interrupted overwrite is moved back when NAME is missing (else removed). A directory a live writer holds
    (its flock) is left alone; links are never followed."""
    done: list[str] = []
    parent = dest.parent
    if not parent.is_dir():
        return done
    with _fs.stale_dirs(parent, f".{dest.name}.old-") as olds:
        for p in olds:
            restored = (p / "asset").is_dir() and not (p / "asset").is_symlink() and not os.path.lexists(dest)
            if restored:
                _fs.replace(p / "asset", dest)
                done.append(f"restored {dest.name!r} from {p.name!r} (an overwrite was interrupted between its renames)")
            _fs.rmtree(p)
            if not restored and not p.exists():
                done.append(f"removed stale directory {p.name!r}")
    with _fs.stale_dirs(parent, f".{dest.name}.tmp-") as tmps:
        for p in tmps:
            _fs.rmtree(p)
            done.append(f"removed stale build directory {p.name!r}")
    return done + remove_stale_staging(dest)


def remove_stale_staging(out: Path) -> list[str]:
    """Remove the staging directories of pulls into ``out`` that were killed: their lock can be taken."""
    with _fs.stale_dirs(out.parent, STAGING.format(name=out.name)) as stale:
        for d in stale:
            _fs.rmtree(d)
    return [f"removed the staging directory of an interrupted pull {d.name!r}" for d in stale]
