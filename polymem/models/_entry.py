"""One cache entry: a folder of files plus a manifest written last, put in place by one rename.

The model caches (:mod:`polymem.models._tokcache`, :mod:`polymem.models._weightcache`) keep each entry as a folder
``<cache dir>/models/<kind>/<key>/`` holding the saved files and a JSON manifest that lists every file's size and
crc32c. An entry is written to a hidden temporary folder beside it (``.<key>.tmp-<pid>-<random>``), the manifest
last, then renamed into place, so a reader never sees half of one; two processes writing the same entry both end
fine (the second rename loses and its copy is dropped). A read trusts an entry only when its manifest is readable,
of the right format, and every file's size and crc32c match; anything else is reported as damaged and rebuilt.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
from pathlib import Path
from typing import Any, Callable

_BLOCK = 1 << 22


def file_crc32c(path: Path) -> str:
    """crc32c of a file as 8 hex digits, read in 4 MiB blocks (hardware crc32c: about 5 GB/s, against under
    1.5 GB/s for sha256; an entry's manifest sits beside its files, so a cryptographic hash would add nothing
    against a deliberate edit, while this one catches every truncation and corrupted block)."""
    import google_crc32c

    crc = 0
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            crc = google_crc32c.extend(crc, block)
    return f"{crc:08x}"


def file_hashes(folder: Path, manifest: str) -> dict[str, dict[str, Any]]:
    """{name: {"bytes", "crc32c"}} of every file in ``folder`` but the manifest."""
    return {p.name: {"bytes": p.stat().st_size, "crc32c": file_crc32c(p)}
            for p in sorted(folder.iterdir()) if p.is_file() and p.name != manifest}


def read_manifest(folder: Path, manifest: str, fmt: int) -> dict[str, Any]:
    """The entry's manifest once its files check out; ValueError saying what is wrong otherwise. Sizes are
    compared before any file is hashed, so a truncated entry is caught without reading it."""
    try:
        meta = json.loads((folder / manifest).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"no readable {manifest} ({type(exc).__name__})") from exc
    if not isinstance(meta, dict) or meta.get("format") != fmt or not isinstance(meta.get("files"), dict):
        raise ValueError(f"{manifest} is not format {fmt}")
    listed: dict[str, Any] = meta["files"]
    present = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != manifest)
    if present != sorted(listed):
        raise ValueError(f"it holds {present}, its manifest lists {sorted(listed)}")
    for name, want in listed.items():
        if not isinstance(want, dict) or (folder / name).stat().st_size != want.get("bytes"):
            raise ValueError(f"{name} is {(folder / name).stat().st_size:,} bytes, its manifest says "
                             f"{want.get('bytes') if isinstance(want, dict) else want!r}")
    for name, want in listed.items():
        if file_crc32c(folder / name) != want.get("crc32c"):
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


def entries(root: Path) -> list[Path]:
    """The entry folders under ``root`` (hidden temporary and moved-aside folders left out)."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def leftovers(root: Path) -> list[Path]:
    """Temporary or moved-aside folders under ``root`` whose writer is gone (its pid no longer runs)."""
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        if p.name.startswith(".") and (".tmp-" in p.name or ".old-" in p.name):
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
