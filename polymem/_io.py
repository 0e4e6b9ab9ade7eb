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
output that would replace one of the run's inputs (a report written over its corpus), including the files an input
names inside itself (the table a site's ``site.json`` records).

Reading: :func:`open_regular` is the one way polymem opens a file it reads whole (a manifest, a header, a prompts
file, a checkpoint's state): it opens non-blocking, so a FIFO or a device never makes it wait, refuses anything but
a regular file, and refuses a file larger than the reader's bound before reading it; :func:`read_bounded` and
:func:`read_json` read through it.

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
import stat
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from polymem._paths import is_url, kind_of
from polymem.errors import FormatError, OutputError

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
    reads; for any other directory, an asset say, anything inside it); a directory that holds an input. An input
    that names other files inside itself brings them in as inputs too (:func:`_named_inside`: a site folder's
    table), so a report is never written over the table a ``--site`` reads."""
    found = [(what, Path(p)) for what, given in inputs for p in _local_matches(given)]
    found += [named for _, p in found for named in _named_inside(p)]
    for option, out in outputs.items():
        if out is None or not _is_local(os.fspath(out)):
            continue
        clash = _clash(Path(os.fspath(out).removeprefix("file://")), found)
        if clash:
            raise OutputError.for_path(out, f"{option} {str(out)!r} {clash}; choose another output path",
                                       errno=errno.EEXIST)


def _named_inside(p: Path) -> list[tuple[str, Path]]:
    """The local files an input names inside itself: a site folder's table (``site.json``'s ``table.source.path``,
    taken both as written and relative to the site folder, whichever exists). A header that cannot be read names
    nothing here; the command that reads the site says what is wrong with it."""
    header = p / "site.json"
    if not header.is_file():
        return []
    try:
        head = read_json(header, what="site header", max_bytes=MAX_JSON_BYTES)
    except (OSError, ValueError):
        return []
    table = head.get("table") if isinstance(head, dict) else None
    source = table.get("source") if isinstance(table, dict) else None
    path = source.get("path") if isinstance(source, dict) else None
    if not isinstance(path, str) or not path or "\0" in path or not _is_local(path):
        return []
    path = path.removeprefix("file://")
    where = [Path(path), p / path]
    return [(f"site's table (named by {str(p)!r})", w) for w in dict.fromkeys(where) if os.path.exists(w)]


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


MAX_JSON_BYTES = 16 << 20  # a header, manifest or state file polymem writes is KBs; 16 MiB is far past any of them

_FILE_KINDS = {stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a character device",
               stat.S_IFBLK: "a block device", stat.S_IFDIR: "a directory"}


def file_kind(mode: int) -> str:
    """What a file of this ``st_mode`` is, in words ("a regular file", "a FIFO (named pipe)", ...)."""
    return "a regular file" if stat.S_ISREG(mode) else _FILE_KINDS.get(stat.S_IFMT(mode), "not a regular file")


def open_regular(path: str | os.PathLike[str], *, what: str, max_bytes: int, error: type[Exception] = FormatError,
                 fix: str = "pass the file itself") -> BinaryIO:
    """Open ``path`` for reading when it is a regular file of at most ``max_bytes`` bytes; else ``error`` (one line
    naming the path, what it is, the bound and ``fix``). A FIFO, socket, device or directory is refused from
    ``os.stat`` before it is opened (opening a FIFO waits for a writer, forever); the file is then opened
    non-blocking and checked again with ``fstat``, so one swapped in after the ``stat`` is refused too, without
    waiting. A missing file is the OSError ``stat`` raises.

        with open_regular("prompts.txt", what="prompts file", max_bytes=64 << 20) as f: ...
    """
    p = os.fspath(path)

    def check(st: os.stat_result) -> None:
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{what} {p!r} is {file_kind(st.st_mode)}, not a regular file; polymem reads only regular "
                        f"files and never opens a pipe or device: {fix}")
        if st.st_size > max_bytes:
            raise error(f"{what} {p!r} is {st.st_size:,} bytes; polymem reads one of at most {max_bytes:,} bytes "
                        f"(it was not read): {fix}")

    check(os.stat(p))
    fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        check(os.fstat(fd))  # swapped between the stat and the open
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bounded(path: str | os.PathLike[str], *, what: str, max_bytes: int, error: type[Exception] = FormatError,
                 fix: str = "pass the file itself") -> bytes:
    """The bytes of a regular file of at most ``max_bytes`` (:func:`open_regular`); a file that grows past the bound
    while it is read is refused too."""
    with open_regular(path, what=what, max_bytes=max_bytes, error=error, fix=fix) as f:
        size = os.fstat(f.fileno()).st_size  # read what is there (a read of max_bytes would allocate that much)
        parts = [f.read(size + 1)]
        got = len(parts[0])
        while size < got <= max_bytes:  # it grew while read: the rest, in pieces, up to the bound
            more = f.read(min(1 << 20, max_bytes + 1 - got))
            if not more:
                break
            parts.append(more)
            got += len(more)
        data = b"".join(parts)
    if len(data) > max_bytes:
        raise error(f"{what} {os.fspath(path)!r} grew past {max_bytes:,} bytes while it was read: {fix}")
    return data


def read_json(path: str | os.PathLike[str], *, what: str, max_bytes: int = MAX_JSON_BYTES,
              error: type[Exception] = FormatError, fix: str = "pass the file as polymem wrote it") -> Any:
    """The JSON value in a regular UTF-8 file of at most ``max_bytes`` (:func:`read_bounded`); text that is not
    UTF-8 or not JSON (nested past Python's limit, an integer of thousands of digits) is ``error``, one line."""
    data = read_bounded(path, what=what, max_bytes=max_bytes, error=error, fix=fix)
    try:
        return json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise error(f"{what} {os.fspath(path)!r} is not JSON ({type(e).__name__}: {str(e)[:120]}): {fix}") from None


def read_keyed(path: str | os.PathLike[str], key: str, *, what: str) -> dict[str, Any] | None:
    """A result a resumable run wrote earlier: its JSON object when ``path`` is there and holds ``key`` (the
    settings it belongs to), else None (the piece is computed again and the file replaced). Read through
    :func:`read_json`: a FIFO, a huge file or text that is not JSON is one error line."""
    p = Path(path)
    if not os.path.lexists(p):
        return None
    got = read_json(p, what=what, fix="remove it to compute it again")
    return got if isinstance(got, dict) and got.get("key") == key else None


@contextlib.contextmanager
def regular_path(path: str | os.PathLike[str], *, what: str, fix: str = "pass the file itself") -> Iterator[str]:
    """A path to hand a library that opens files itself (safetensors), for ``path`` checked to be a regular file:
    it is opened with :func:`open_regular` (no wait on a FIFO) and, where the system has ``/proc/self/fd``, the
    path yielded is that open file's, so a file swapped in after the check is never the one read."""
    with open_regular(path, what=what, max_bytes=1 << 50, fix=fix) as f:
        via = f"/proc/self/fd/{f.fileno()}"
        yield via if os.path.exists(via) else os.fspath(path)


def load_regular_safetensors(path: str | os.PathLike[str], *, what: str, load: Any,
                             fix: str = "pass the file itself") -> Any:
    """``load(path)`` (a safetensors loader that maps the file) when ``path`` is a regular file
    (:func:`regular_path`)."""
    with regular_path(path, what=what, fix=fix) as p:
        return load(p)


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
