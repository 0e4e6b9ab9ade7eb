"""Every file-system mutation the asset writers make, behind one small indirection.

Writers call ``_fs.write / fsync / replace / link / unlink / rmtree / mkdtemp`` instead of ``os``; the
fault-injection tests (tests/asset/test_writer_faults.py) wrap these to fail the k-th operation for every k and
check that the asset is then old, new, or refused with an error ``polymem verify --repair`` fixes.
Also the writer lock (``fcntl.flock`` on ``ASSET/.polymem-lock``), and the containment rule for paths derived
from data (:func:`check_key`, :func:`contained`): a key read from a file (a marker entry, an object key of a
remote asset) is a relative path of plain segments, and no directory between the root and the file is a
symbolic link, else it is refused; every file is created with ``O_EXCL | O_NOFOLLOW`` (a stale name, link
or not, is unlinked first), so no writer follows a link out of the asset.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import IO, Any, Iterator

from polymem import _io
from polymem.errors import MissingError, PolymemError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory locks
    fcntl = None  # type: ignore[assignment]


_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def open_write(path: Path) -> IO[bytes]:
    """A new file at ``path``: whatever had the name (a stale temp file, a link) is unlinked first, then the file
    is created exclusively, so a link planted there is never followed."""
    Path(path).unlink(missing_ok=True)
    return os.fdopen(os.open(path, _CREATE, 0o644), "wb")


def write(f: IO[bytes], data: Any) -> None:
    f.write(data)


def fsync(f: IO[bytes]) -> None:
    f.flush()
    os.fsync(f.fileno())


def replace(src: Path, dst: Path) -> None:
    os.replace(src, dst)


def link(src: Path, dst: Path) -> None:
    os.link(src, dst, follow_symlinks=False)


def unlink(path: Path) -> None:
    Path(path).unlink(missing_ok=True)


def rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def mkdtemp(prefix: str, parent: Path) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))


def _libc_renameat2() -> Any:
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):  # not Linux/glibc >= 2.28
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return fn


_RENAMEAT2 = _libc_renameat2()
_AT_FDCWD, _RENAME_NOREPLACE = -100, 1


def rename_noreplace(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst`` only if nothing has that name; FileExistsError otherwise. Atomic where the
    kernel has ``renameat2(RENAME_NOREPLACE)``; elsewhere a check then ``os.rename``, which still refuses a
    non-empty directory or a file at ``dst``."""
    if _RENAMEAT2 is not None:
        if _RENAMEAT2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.ENOSYS, errno.EINVAL):  # EINVAL: the file system lacks the flag
            raise OSError(err, os.strerror(err), str(dst))
    if os.path.lexists(dst):
        raise FileExistsError(errno.EEXIST, "File exists", str(dst))
    try:
        os.rename(src, dst)
    except OSError as e:
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
            raise FileExistsError(errno.EEXIST, "File exists", str(dst)) from None
        raise


def write_file(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` and fsync (no rename: callers rename)."""
    with open_write(path) as f:
        write(f, data)
        fsync(f)


def fsync_dir(path: Path) -> None:
    _io.fsync_dir(path)  # through this module, so the fault-injection tests can fail it


# ------------------------------------------------------------------------------------------ containment
def check_key(key: str, where: str) -> str:
    """``key`` (read from a file or a listing) as a relative path of plain segments, else a PolymemError."""
    parts = key.split("/")
    bad = (not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts)
           or any(c in key for c in "\\\x00"))
    if bad:
        raise PolymemError(
            f"{where}: {key!r} is not a path inside the asset (a key must be relative, with no empty, '.' or '..' "
            "segment, no backslash or NUL); refusing to touch anything outside it. Remove that entry or object "
            "from the source")
    return key


def contained(root: Path, key: str, where: str) -> Path:
    """``root / key`` after :func:`check_key`, refusing a symbolic link on any directory between ``root`` and
    the file (a write through it would land outside the asset). Directories not yet there are fine: the
    writer creates them."""
    path = root
    for part in check_key(key, where).split("/")[:-1]:
        path = path / part
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            break
        if not stat.S_ISDIR(mode):
            kind = "a symbolic link" if stat.S_ISLNK(mode) else "not a directory"
            raise PolymemError(
                f"{where}: {str(path)!r} is {kind}; polymem writes only inside the asset and never through a link. "
                "Replace it with the real directory (or restore the asset) and retry")
    return root / key


# ------------------------------------------------------------------------------------------ writer lock
DEFAULT_LOCK_TIMEOUT = 60.0


@contextlib.contextmanager
def writer_lock(root: Path, lock_name: str, timeout: float | None, where: str) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``root/lock_name`` (``fcntl.flock``).

    Waits up to ``timeout`` seconds (None: the default, 0: do not wait) for another writer, then raises a
    PolymemError naming the holder. Readers never take it. After acquiring, checks the lock file still is
    the one in ``root`` (the asset was not replaced while we waited).
    """
    if fcntl is None:  # pragma: no cover
        yield
        return
    timeout = DEFAULT_LOCK_TIMEOUT if timeout is None else float(timeout)
    path = root / lock_name
    fd = _open_lock(path, lock_name, where)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown"
                    raise PolymemError(
                        f"{where}: another writer holds the asset lock ({holder}); waited {timeout:g} s. "
                        "Retry when it finishes, or pass a longer lock_timeout"
                    ) from None
                time.sleep(0.02)
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            raise PolymemError(f"{where}: the asset was replaced or removed while this writer waited for its lock; "
                               "reopen it and write again")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the flock


def lock_dir(path: Path) -> int | None:
    """An fd of directory ``path`` holding an exclusive flock (close it to release), or None when another
    process holds it. Locks a directory itself, so the lock leaves no file behind and moves with a rename."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
                 | getattr(os, "O_CLOEXEC", 0))
    if fcntl is None:  # pragma: no cover
        return fd
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def locked_mkdtemp(prefix: str, parent: Path, tries: int = 5) -> tuple[Path, int]:
    """A new temporary directory ``parent/prefix*`` and an fd holding its flock (close it when done). The
    clean-up of stale directories (:func:`stale_dirs`) removes only unlocked ones; if it takes this one between
    its creation and its lock, another is made."""
    for _ in range(tries):
        path = mkdtemp(prefix, parent)
        try:
            fd = lock_dir(path)
        except FileNotFoundError:
            continue
        if fd is not None:
            return path, fd
    raise PolymemError(f"cannot hold a temporary directory in {str(parent)!r}: another process keeps removing "
                       f"{prefix}* directories there; stop it and retry")


@contextlib.contextmanager
def stale_dirs(parent: Path, prefix: str) -> Iterator[list[Path]]:
    """The directories ``parent/prefix*`` (the prefix taken literally) that no live writer holds: each is locked
    while the caller handles it, so a writer that starts meanwhile cannot be taken for a dead one. Links are
    passed over."""
    import glob as _glob

    held: list[tuple[Path, int]] = []
    try:
        for p in sorted(parent.glob(_glob.escape(prefix) + "*")):
            if p.is_symlink() or not p.is_dir():
                continue
            try:
                fd = lock_dir(p)
            except OSError:
                continue
            if fd is not None:
                held.append((p, fd))
        yield [p for p, _ in held]
    finally:
        for _, fd in held:
            os.close(fd)


_LOCK_FLAGS = (os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
               | getattr(os, "O_CLOEXEC", 0))


def _open_lock(path: Path, lock_name: str, where: str) -> int:
    """The lock file, opened without following a link; refused unless it is a regular file with one name (a
    hard link to a file outside the asset would be truncated when the pid is written)."""
    try:
        fd = os.open(path, _LOCK_FLAGS, 0o644)
    except FileNotFoundError:
        raise MissingError(f"{where}: no asset directory here (removed or replaced)", path.parent) from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise PolymemError(
                f"{where}: the writer lock {lock_name!r} is a symbolic link (to {os.readlink(path)!r}); polymem "
                f"never writes through a link. Remove it (rm {str(path)!r}) and retry") from None
        raise PolymemError(f"{where}: cannot create the writer lock {lock_name!r} ({e.strerror}); the asset "
                           "directory must be writable to write to it") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        kind = "not a regular file" if not stat.S_ISREG(st.st_mode) else f"a file with {st.st_nlink} hard links"
        raise PolymemError(f"{where}: the writer lock {lock_name!r} is {kind}; polymem writes the pid of the "
                           f"writer into it. Remove it (rm {str(path)!r}) and retry")
    return fd
