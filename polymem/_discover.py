"""Which files a corpus input names, and opening them safely (local ``**`` globs: :mod:`polymem._globs`): a file
reached twice read once (by device and inode), and only regular files opened (a FIFO, socket or device is refused
without being read, so a named pipe nobody writes to cannot block a run). Used by :mod:`polymem.corpus`; URLs are listed by
:mod:`polymem.sources`.

    >>> open_regular(Path("notes.txt"))      # an open binary file, or why not ("not a regular file: ...")
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from polymem._paths import is_url, kind_of
from polymem.sources import FileInfo

_SPECIAL_FILES = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _not_regular(mode: int) -> str:
    kind = next((name for test, name in _SPECIAL_FILES if test(mode)), "not a file")
    return (f"not a regular file: {kind}; only regular files are read (to read a stream, "
            "pipe its output to stdin with -)")


def open_regular(path: Path) -> BinaryIO | str:
    """Open `path` for binary reading if it is a regular file, else return why not. Never blocks.

    stat() first, so a FIFO or device is never opened; then open with O_NONBLOCK (a FIFO swapped in after the
    stat opens at once instead of waiting for a writer) and fstat() the descriptor, so what is read is what
    was checked.
    """
    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            return _not_regular(mode)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except OSError as e:
        return oserr(e)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            return _not_regular(mode)
        if getattr(os, "O_NONBLOCK", 0):
            os.set_blocking(fd, True)
    except OSError as e:
        os.close(fd)
        return oserr(e)
    return open(fd, "rb")  # noqa: SIM115 - the caller closes it


def unseen(files: Iterable[FileInfo], seen: set[object]) -> Iterator[FileInfo]:
    """The files not in ``seen`` yet, which records them: a regular file by (device, inode), so that one reached
    again (named twice, through a link, by a glob and a directory) is read once; anything else by its name."""
    for info in files:
        key: object = info.url
        path = info.url.removeprefix("file://")
        if not is_url(path):
            with contextlib.suppress(OSError):
                st = os.stat(path)
                key = (st.st_dev, st.st_ino) if stat.S_ISREG(st.st_mode) else key
        if key not in seen:
            seen.add(key)
            yield info


def local_info(path: Path, *, explicit: bool) -> FileInfo:
    """A local file as a corpus lists it: its kind from the name, and its size (0 when it cannot be stat'ed:
    the error is reported when it is opened). ``explicit``: named by the user, so a file of another type is
    read as text (a directory's walk passes such files over before they get here)."""
    kind, comp = kind_of(path.name)
    try:
        size = os.stat(path).st_size
    except OSError:
        size = 0  # reported when it is opened
    return FileInfo(str(path), size, kind or "text", comp)


def oserr(e: OSError) -> str:
    """An OSError as a skip reason: "unreadable file: Permission denied"."""
    return f"unreadable file: {e.strerror or type(e).__name__}"
