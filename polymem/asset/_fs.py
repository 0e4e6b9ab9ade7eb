"""Every file-system mutation the asset writers make, behind one small indirection.

Writers call ``_fs.write / fsync / replace / link / unlink / rmtree / mkdtemp`` instead of ``os``; the
fault-injection tests (tests/test_asset_faults.py) wrap these to fail the k-th operation for every k and
check that the asset is then old, new, or refused with an error ``polymem verify --repair`` fixes.
Also the writer lock (``fcntl.flock`` on ``ASSET/.polymem-lock``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import IO, Any, Iterator

from polymem import _io
from polymem.errors import PolymemError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory locks
    fcntl = None  # type: ignore[assignment]


def open_write(path: Path) -> IO[bytes]:
    return open(path, "wb")


def write(f: IO[bytes], data: Any) -> None:
    f.write(data)


def fsync(f: IO[bytes]) -> None:
    f.flush()
    os.fsync(f.fileno())


def replace(src: Path, dst: Path) -> None:
    os.replace(src, dst)


def link(src: Path, dst: Path) -> None:
    os.link(src, dst)


def unlink(path: Path) -> None:
    Path(path).unlink(missing_ok=True)


def rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def mkdtemp(prefix: str, parent: Path) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))


def write_file(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` and fsync (no rename: callers rename)."""
    with open_write(path) as f:
        write(f, data)
        fsync(f)


def fsync_dir(path: Path) -> None:
    _io.fsync_dir(path)  # through this module, so the fault-injection tests can fail it


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
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    except FileNotFoundError:
        raise PolymemError(f"{where}: no asset directory here (removed or replaced)") from None
    except OSError as e:
        raise PolymemError(f"{where}: cannot create the writer lock {lock_name!r} ({e.strerror}); the asset "
                           "directory must be writable to write to it") from None
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
