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
:func:`check_output_path` runs the same check before long work starts; :func:`check_outputs_not_inputs` refuses an
output that would replace one of the run's inputs (a report written over its corpus).

What this module does not do: write directories atomically (the asset writer has its own temp-dir + rename),
lock, or merge concurrent writers (the last rename wins).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import shutil
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from polymem._paths import is_url, kind_of
from polymem.errors import OutputError

_REASONS = {
    errno.ENOTDIR: "a part of the path is a file, not a directory",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EROFS: "the file system is read-only",
    errno.ENOSPC: "no space left on the device",
    getattr(errno, "EDQUOT", -2): "the disk quota is exceeded",
    errno.EFBIG: "the file is larger than this process may write (a file size limit: ulimit -f)",
    errno.ENOENT: "the directory cannot be created there",
    errno.EISDIR: "it is a directory",
    errno.EEXIST: "a part of the path is a file, not a directory",
}


def reason(exc: OSError) -> str:
    """Why ``exc`` stopped a write, in words (its strerror where polymem has none of its own)."""
    return _REASONS.get(exc.errno or -1, exc.strerror or type(exc).__name__)


def output_error(path: str | os.PathLike[str], exc: OSError) -> OutputError:
    """A one-line OutputError for ``exc`` met while writing ``path`` (naming the blocking part of the path)."""
    why, where = reason(exc), ""
    blocker = _file_in_parents(Path(path))
    if blocker is not None:
        why, where = "a part of the path is a file, not a directory", f" ({str(blocker)!r} is a file)"
    return OutputError.for_path(
        path, f"cannot write {str(path)!r}: {why}{where}; choose an output path in a writable directory",
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


def check_outputs_not_inputs(outputs: Mapping[str, Any], inputs: Iterable[tuple[str, Any]]) -> None:
    """Refuse, before any work, an output that would replace or change one of the run's inputs.

        check_outputs_not_inputs({"--json": "data/a.txt"}, [("corpus", "data")])
        # OutputError: --json 'data/a.txt' is an input of this run (a file of the corpus directory 'data'); ...

    ``outputs``: option -> path; ``inputs``: (what, path) pairs, e.g. ("corpus", "data/"), ("asset", "t.pmem"),
    ("tokenizer", "tok.json"). Skipped: None, "-" (stdout), URLs, and inputs that name no local file (a builtin
    tokenizer name); a local glob stands for what it matches. Paths are compared after resolving links and
    ``..``, and by (st_dev, st_ino), so a hard link or a bind mount is the same file. Refused: an output that
    *is* an input; one inside an input directory (for a corpus directory: an existing file of a kind the corpus
    reads; for any other directory, an asset say, anything inside it); a directory that holds an input."""
    found = [(what, Path(p)) for what, given in inputs for p in _local_matches(given)]
    for option, out in outputs.items():
        if out is None or not _is_local(os.fspath(out)):
            continue
        clash = _clash(Path(os.fspath(out).removeprefix("file://")), found)
        if clash:
            raise OutputError.for_path(out, f"{option} {str(out)!r} {clash}; choose another output path",
                                       errno=errno.EEXIST)


def _is_local(path: str) -> bool:
    return path != "-" and not is_url(path, remote=True)


def _local_matches(given: Any) -> list[str]:
    import glob

    from polymem._globs import glob_no_links  # ``**`` never descends into a linked folder (a loop would not end)

    if given is None or not _is_local(os.fspath(given)):
        return []
    p = os.fspath(given).removeprefix("file://")
    return [p] if os.path.exists(p) else glob_no_links(p) if glob.has_magic(p) else []


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def _parents(path: Path) -> list[tuple[int, int]]:
    """(st_dev, st_ino) of each existing parent of ``path`` (links and ``..`` resolved), nearest first."""
    return [i for i in map(_identity, Path(os.path.realpath(path)).parents) if i is not None]


def _clash(out: Path, inputs: list[tuple[str, Path]]) -> str | None:
    """Why ``out`` would replace or change one of ``inputs`` (None: it would not)."""
    me, out_parents = _identity(out), _parents(out)
    for what, p in inputs:
        ident, kind = _identity(p), "directory" if p.is_dir() else "file"
        if me is not None and me == ident:
            return f"is an input of this run (the {what} {kind} {str(p)!r})"
        if kind == "directory" and ident in out_parents:
            if what != "corpus":
                return f"is inside an input of this run (the {what} directory {str(p)!r})"
            if out.is_file() and kind_of(out.name)[0] is not None:
                return f"is an input of this run (a file of the corpus directory {str(p)!r})"
        if me is not None and out.is_dir() and me in _parents(p):
            return f"holds an input of this run (the {what} {kind} {str(p)!r})"
    return None


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def free_bytes(path: str | os.PathLike[str]) -> int | None:
    """Free bytes on the file system that holds ``path`` (or its nearest existing parent: the place a writer is
    about to create); None where the system cannot say."""
    where = Path(path)
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        return shutil.disk_usage(where).free
    except OSError:
        return None


def temp_path_for(path: Path) -> Path:
    """The hidden temporary sibling of ``path`` (same directory, same suffix)."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}{path.suffix}")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], *, fsync: bool = False, empty_ok: bool = False) -> Iterator[Path]:
    """Yield a temporary path to write; on success it replaces ``path``, on any error it is removed.

    The temporary file is created here (empty, ``O_EXCL | O_NOFOLLOW``) and the writer writes into it; left
    empty, it counts as nothing written (an OutputError, the old file kept) unless ``empty_ok``.

    fsync=True flushes the file (and the directory entry) to disk before returning, for files that must
    survive a power cut (caches, tables); reports and plots skip it.
    """
    final = ensure_parent(path)
    tmp = temp_path_for(final)
    try:
        os.close(os.open(tmp, _CREATE, 0o644))  # ours, new: a link planted at the name is never followed
        yield tmp
        if tmp.is_symlink() or not tmp.is_file() or (tmp.stat().st_size == 0 and not empty_ok):
            raise OutputError.for_path(final, f"nothing was written for {str(final)!r} (the writer left "
                                              f"{tmp.name!r} empty, removed or replaced it)", errno=errno.ENOENT)
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
    with atomic_path(path, fsync=fsync, empty_ok=True) as tmp:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_TRUNC | _NOFOLLOW), "wb") as f:
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
