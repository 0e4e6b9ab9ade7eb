"""Atomic file writes: every file polymem writes appears whole under its name, or not at all.

    >>> atomic_write_json("report.json", {"docs": 3})          # bytes, text and JSON
    >>> with atomic_path("plot.png") as tmp:                     # anything that writes to a path (savefig,
    ...     fig.savefig(tmp)                                     # safetensors.save_file, np.savez ...)

The data goes to a hidden temporary file next to the target (``.NAME.tmp-PID-RANDOM.SUFFIX``: same directory,
so the rename stays on one file system; same suffix, so writers that pick the format from it still work), is
optionally fsynced, then ``os.replace``-d over the target. A reader sees the old file or the new one, never a
part. If writing fails, the temporary file is removed and the old file is left as it was; a process killed
outright (SIGKILL, power loss) can leave a ``.NAME.tmp-…`` file behind, never a torn NAME.

A location that cannot be written (a parent that is a regular file, a read-only or pseudo file system, no
permission, no space) raises :class:`OutputError`, one line naming the path, the reason and the fix; it is both
a :class:`~polymem.errors.PolymemError` (the CLI prints it and exits 2) and an ``OSError``.
:func:`check_output_path` runs the same check before long work starts.

What this module does not do: write directories atomically (the asset writer has its own temp-dir + rename),
lock, or merge concurrent writers (the last rename wins).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from polymem.errors import OutputError

_REASONS = {
    errno.ENOTDIR: "a part of the path is a file, not a directory",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EROFS: "the file system is read-only",
    errno.ENOSPC: "no space left on the device",
    getattr(errno, "EDQUOT", -2): "the disk quota is exceeded",
    errno.ENOENT: "the directory cannot be created there",
    errno.EISDIR: "it is a directory",
    errno.EEXIST: "a part of the path is a file, not a directory",
}


def output_error(path: str | os.PathLike[str], exc: OSError) -> OutputError:
    """A one-line OutputError for ``exc`` met while writing ``path`` (naming the blocking part of the path)."""
    reason = _REASONS.get(exc.errno or -1, exc.strerror or type(exc).__name__)
    where = ""
    blocker = _file_in_parents(Path(path))
    if blocker is not None:
        reason, where = "a part of the path is a file, not a directory", f" ({str(blocker)!r} is a file)"
    return OutputError.for_path(
        path, f"cannot write {str(path)!r}: {reason}{where}; choose an output path in a writable directory",
        errno=exc.errno)


def _file_in_parents(path: Path) -> Path | None:
    for parent in [path, *path.parents]:
        if parent.exists():
            return parent if (parent != path and not parent.is_dir()) else None
    return None


def ensure_parent(path: str | os.PathLike[str]) -> Path:
    """Create the directory that will hold ``path``; an OutputError when that is impossible."""
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise output_error(p, e) from None
    return p


def check_output_path(path: str | os.PathLike[str], *, directory: bool = False) -> Path:
    """Fail early, before long work, if ``path`` cannot be written: create its parent and write (then remove) a
    probe file there. ``directory=True``: ``path`` itself is a directory to be created (an asset). Checks the real
    thing rather than permission bits, which say nothing for root or on a read-only mount."""
    p = ensure_parent(path)
    if p.is_dir() and not directory:
        raise output_error(p, IsADirectoryError(errno.EISDIR, "is a directory"))
    probe = p.parent / f".{p.name}.probe-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise output_error(p, e) from None
    return p


def check_output_paths(*paths: str | os.PathLike[str] | None) -> None:
    """:func:`check_output_path` for each file output given (None and "-", stdout, are skipped)."""
    for p in paths:
        if p is not None and str(p) != "-":
            check_output_path(p)


def temp_path_for(path: Path) -> Path:
    """The hidden temporary sibling of ``path`` (same directory, same suffix)."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}{path.suffix}")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], *, fsync: bool = False) -> Iterator[Path]:
    """Yield a temporary path to write; on success it replaces ``path``, on any error it is removed.

    fsync=True flushes the file (and the directory entry) to disk before returning, for files that must
    survive a power cut (caches, tables); reports and plots skip it.
    """
    final = ensure_parent(path)
    tmp = temp_path_for(final)
    try:
        yield tmp
        if not tmp.exists():
            raise OutputError.for_path(final, f"nothing was written for {str(final)!r} (the writer did not "
                                              f"create {tmp.name!r})", errno=errno.ENOENT)
        if fsync:
            _fsync_file(tmp)
        os.replace(tmp, final)
        if fsync:
            fsync_dir(final.parent)
    except OSError as e:
        _remove(tmp)
        if isinstance(e, OutputError):
            raise
        raise output_error(final, e) from e
    except BaseException:
        _remove(tmp)
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, fsync: bool = False) -> Path:
    """Write ``data`` to ``path`` atomically; returns the path."""
    with atomic_path(path, fsync=fsync) as tmp:
        with open(tmp, "xb") as f:
            f.write(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike[str], text: str, *, encoding: str = "utf-8",
                      fsync: bool = False) -> Path:
    """Write ``text`` (UTF-8 by default) to ``path`` atomically; returns the path."""
    return atomic_write_bytes(path, text.encode(encoding), fsync=fsync)


def atomic_write_json(path: str | os.PathLike[str], obj: Any, *, indent: int | None = 2, sort_keys: bool = False,
                      fsync: bool = False) -> Path:
    """Write ``obj`` as JSON (plus a final newline) to ``path`` atomically; returns the path.

    The JSON is built completely before anything touches the disk, so an object that cannot be serialised
    leaves the old file in place."""
    text = json.dumps(obj, indent=indent, sort_keys=sort_keys) + "\n"
    return atomic_write_text(path, text, fsync=fsync)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory (so a rename in it is durable); a no-op where the platform or file system cannot."""
    with contextlib.suppress(OSError):  # not every platform/file system can fsync a directory
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()
