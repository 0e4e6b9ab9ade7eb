"""One cache entry: a folder of files plus a manifest written last, put in place by one rename.

The model caches (:mod:`polymem.models._tokcache`, :mod:`polymem.models._weightcache`) keep each entry as a folder
``<cache dir>/models/<kind>/<key>/`` holding the saved files and a JSON manifest that lists every file's size and
crc32c. An entry is written to a hidden temporary folder beside it (``.<key>.tmp-<pid>-<random>``), the manifest
last, then renamed into place, so a reader never sees half of one; two processes writing the same entry both end
fine (the second rename loses and its copy is dropped). A read uses an entry only when its manifest is a regular
file of at most 4 MiB that fits its declared schema and its own crc32c, the entry holds only regular files (no
link, even to a file elsewhere), and every file's size and crc32c match; anything else is reported as damaged and
rebuilt. These checks catch accidents; the cache is the user's own folder (docs/real-models.md#the-model-cache).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import stat
import sys
from pathlib import Path
from typing import Any, Callable

_BLOCK = 1 << 22


MAX_MANIFEST_BYTES = 4 << 20  # a manifest lists a few files and a model's weight names: KBs


def file_crc32c(path: Path) -> str:
    """crc32c of a regular file as 8 hex digits, read in 4 MiB blocks (hardware crc32c: about 5 GB/s, against under
    1.5 GB/s for sha256). The cache is the user's own folder: its checks are against accidents (a truncated write,
    a flipped block, a file swapped for another by mistake), not against someone who edits an entry on purpose, so
    a fast checksum is enough (docs/real-models.md#the-model-cache says what the cache trusts)."""
    import google_crc32c

    from polymem._io import open_regular

    crc = 0
    with open_regular(path, what="cached file", max_bytes=1 << 50, error=ValueError) as f:
        while block := f.read(_BLOCK):
            crc = google_crc32c.extend(crc, block)
    return f"{crc:08x}"


def manifest_crc(meta: dict[str, Any]) -> str:
    """crc32c of a manifest's fields but its own checksum (canonical JSON), so an edited field is a damaged entry."""
    import google_crc32c

    body = {k: v for k, v in meta.items() if k != "manifest_crc32c"}
    return f"{google_crc32c.value(json.dumps(body, sort_keys=True).encode()):08x}"


def own_files(folder: Path, manifest: str) -> list[str]:
    """The names of the entry's files but the manifest; ValueError for anything in it that is not a regular file
    (a link, even to a file elsewhere, a FIFO, a folder): an entry holds only its own files."""
    from polymem._io import file_kind

    if folder.is_symlink():
        raise ValueError(f"the entry is a symbolic link (to {os.readlink(folder)!r}); an entry is a folder of its own")
    names = []
    for p in folder.iterdir():
        st = p.lstat()
        if stat.S_ISLNK(st.st_mode):
            raise ValueError(f"{p.name} is a symbolic link (to {os.readlink(p)!r}); an entry holds only its own files, "
                             "never a link to one elsewhere")
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{p.name} is {file_kind(st.st_mode)}; an entry holds only regular files")
        if p.name != manifest:
            names.append(p.name)
    return sorted(names)


def file_hashes(folder: Path, manifest: str) -> dict[str, dict[str, Any]]:
    """{name: {"bytes", "crc32c"}} of every file in ``folder`` but the manifest."""
    return {name: {"bytes": (folder / name).stat().st_size, "crc32c": file_crc32c(folder / name)}
            for name in own_files(folder, manifest)}


def manifest_schema(fmt: int, fields: dict[str, Any]) -> Any:
    """The declared schema of a manifest of format ``fmt``: format, every file's size and crc32c, its own
    checksum, and the kind's ``fields``."""
    from polymem._schema import Const, Int, MapOf, Obj, Str

    return Obj({"format": Const((fmt,)), "manifest_crc32c": Str(8),
                "files": MapOf(Obj({"bytes": Int(0, 1 << 50), "crc32c": Str(8)}), max_len=64), **fields})


def read_manifest(folder: Path, manifest: str, fmt: int, fields: dict[str, Any] | None = None) -> dict[str, Any]:
    """The entry's manifest once it and its files check out; ValueError saying what is wrong otherwise. The
    manifest is read only if it is a regular file of at most 4 MiB (no wait on a FIFO), then checked against its
    declared schema (:func:`manifest_schema` with the kind's ``fields``) and its own checksum; sizes are compared
    before any file is hashed, so a truncated entry is caught without reading it."""
    from polymem._io import read_json
    from polymem._schema import validate

    present = own_files(folder, manifest)
    try:
        meta = read_json(folder / manifest, what="manifest", max_bytes=MAX_MANIFEST_BYTES, error=ValueError,
                         fix="the entry is damaged")
    except ValueError as e:  # the note names the entry's folder already: the file by its name
        raise ValueError(str(e).replace(repr(str(folder / manifest)), repr(manifest))) from None
    except OSError as e:
        raise ValueError(f"no readable {manifest} ({type(e).__name__})") from None
    validate(meta, manifest_schema(fmt, fields or {}), where=manifest, fix="the entry is damaged", error=ValueError)
    if meta["manifest_crc32c"] != manifest_crc(meta):
        raise ValueError(f"{manifest} differs from what was written (its own crc32c)")
    listed: dict[str, Any] = meta["files"]
    if present != sorted(listed):
        raise ValueError(f"it holds {present}, its manifest lists {sorted(listed)}")
    for name, want in listed.items():
        if (folder / name).stat().st_size != want["bytes"]:
            raise ValueError(f"{name} is {(folder / name).stat().st_size:,} bytes, its manifest says {want['bytes']!r}")
    for name, want in listed.items():
        if file_crc32c(folder / name) != want["crc32c"]:
            raise ValueError(f"{name} differs from the file its manifest lists (crc32c)")
    return meta


def note(text: str) -> None:
    """One line on stderr: what the cache did instead of what was asked (never an error: the load goes on)."""
    print(f"note: {text}", file=sys.stderr, flush=True)


def write_entry(folder: Path, manifest: str, fill: Callable[[Path], dict[str, Any]],
                errors: tuple[type[BaseException], ...] = ()) -> str | None:
    """Make the entry ``folder``: ``fill(tmp)`` saves its files into a temporary folder and returns the manifest's
    other fields; the manifest (with every file's size and crc32c) is written last and the folder renamed into
    place (a damaged entry already there is moved aside first). Returns None when written, else why not (the
    cache is not writable, the disk filled up; an OSError or one of ``errors``, the writer's own failures): the
    caller says so in one line and goes on without the cache."""
    tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    failures: tuple[type[BaseException], ...] = (OSError, *errors)
    try:
        tmp.mkdir(parents=True)
        meta = fill(tmp)
        meta["files"] = file_hashes(tmp, manifest)
        meta["manifest_crc32c"] = manifest_crc(meta)
        (tmp / manifest).write_text(json.dumps(meta, indent=1), encoding="utf-8")
        if folder.exists():  # a damaged entry: moved aside first (a rename onto a full folder fails)
            old = folder.with_name(f".{folder.name}.old-{os.getpid()}-{secrets.token_hex(4)}")
            try:
                os.rename(folder, old)
            except OSError:
                pass  # another process moved or replaced it
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.rename(tmp, folder)
        except OSError:
            if not folder.is_dir():
                raise
            # another process put its entry there first: theirs is as good as ours
        return None
    except failures as exc:
        return f"{getattr(exc, 'strerror', None) or exc} ({type(exc).__name__})"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def entries(root: Path, name: re.Pattern[str] | None = None) -> list[Path]:
    """The entry folders under ``root``: real folders (never a link), named as the cache names them (``name``),
    hidden temporary and moved-aside folders left out. Anything else there is not the cache's and is never listed
    or removed."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")
                  and (name is None or name.fullmatch(p.name)))


def leftovers(root: Path) -> list[Path]:
    """Temporary or moved-aside folders under ``root`` whose writer is gone (its pid no longer runs)."""
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        if p.name.startswith(".") and (".tmp-" in p.name or ".old-" in p.name) and not p.is_symlink():
            pid = p.name.rsplit("-", 2)[-2]
            if not (pid.isdigit() and _alive(int(pid))):
                out.append(p)
    return sorted(out)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def tree_bytes(path: Path) -> int:
    """Bytes of a file, or of every file under a folder."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
