"""A FIFO that cannot hang a test: ``with fifo(path):`` makes a named pipe at ``path`` and, if a reader is still
blocked on it after ``release_s`` seconds, opens and closes its write end so the reader sees end-of-file. A test
asserts its call returned well before that, so code that waits on the pipe fails the test instead of hanging it."""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
from pathlib import Path
from typing import Iterator

RELEASE_S = 8.0


@contextlib.contextmanager
def fifo(path: Path, release_s: float = RELEASE_S) -> Iterator[Path]:
    os.mkfifo(path)
    done = threading.Event()

    def release() -> None:
        if done.wait(release_s):
            return
        while not done.is_set():
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))  # a blocked reader now reads EOF
            except OSError as e:
                if e.errno not in (errno.ENXIO, errno.ENOENT):
                    return
            time.sleep(0.05)

    t = threading.Thread(target=release, daemon=True)
    t.start()
    try:
        yield path
    finally:
        done.set()
        t.join(5)


def quick(fn, *args, limit_s: float = RELEASE_S / 2, **kwargs):
    """(result or exception, seconds) of ``fn(*args, **kwargs)``; asserts it took less than ``limit_s``."""
    t = time.perf_counter()
    try:
        out = fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - the caller checks which
        out = e
    took = time.perf_counter() - t
    assert took < limit_s, f"took {took:.1f} s: it waited on the FIFO"
    return out
