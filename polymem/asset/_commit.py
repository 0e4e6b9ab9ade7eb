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
``.old`` / ``.tmp`` leftovers are stale and removed. Every file-system call goes through :mod:`_fs`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from polymem.asset import _fs
from polymem.asset._format import WRITING_MARKER
from polymem.errors import PolymemError

STALE_SUFFIXES = (".new", ".old")
TMP_FILES = (".zarr.json.tmp", WRITING_MARKER + ".tmp")


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
    out = [p for p in (root / "pages" / "c").rglob("*") if p.is_file() and p.suffix in STALE_SUFFIXES]
    return sorted(out) + [root / t for t in TMP_FILES if (root / t).exists()]


def recover(root: Path) -> list[str]:
    """Roll an interrupted page write back (or finish it if it had committed); remove stale temporary files.
    Returns what was done, one line each. Caller holds the writer lock (or the writer itself calls it)."""
    done: list[str] = []
    marker = root / WRITING_MARKER
    if marker.exists():
        try:
            info: Any = json.loads(marker.read_bytes())
            keys = [str(k) for k in info["replacing"]]
            new_sha = str(info["new_zarr_json_sha256"])
        except (ValueError, KeyError, TypeError):
            keys, new_sha = [], ""
            keys = sorted(str(p.relative_to(root))[: -len(".old")] for p in (root / "pages" / "c").rglob("*.old"))
        try:
            cur = hashlib.sha256((root / "zarr.json").read_bytes()).hexdigest()
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


def recover_siblings(dest: Path) -> list[str]:
    """Stale ``.NAME.tmp-*`` build directories next to the asset go; an ``.NAME.old-*/asset`` left by an
    interrupted overwrite is moved back when NAME is missing (else removed)."""
    done: list[str] = []
    parent = dest.parent
    if not parent.is_dir():
        return done
    for p in sorted(parent.glob(f".{dest.name}.old-*")):
        if (p / "asset").is_dir() and not dest.exists():
            _fs.replace(p / "asset", dest)
            done.append(f"restored {dest.name!r} from {p.name!r} (an overwrite was interrupted between its renames)")
        _fs.rmtree(p)
        if p.exists():
            continue
        if not done or not done[-1].startswith("restored"):
            done.append(f"removed stale directory {p.name!r}")
    for p in sorted(parent.glob(f".{dest.name}.tmp-*")):
        _fs.rmtree(p)
        done.append(f"removed stale build directory {p.name!r}")
    return done
