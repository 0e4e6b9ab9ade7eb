"""Fault injection for writers: fail the k-th file-system call that goes through :mod:`polymem.asset._fs`.

``crash``: that call and every later one fail (nothing after it reaches the disk, not even clean-up, like a killed
process); ``error``: only that call fails, so the writer's own rollback runs; ``none``: count the calls.
"""

from __future__ import annotations

import errno
from typing import Callable

import pytest

from polymem.asset import _fs

OPS = ("open_write", "write", "fsync", "replace", "rename_noreplace", "link", "unlink", "rmtree", "mkdtemp", "fsync_dir")


class Injector:
    def __init__(self, k: float, mode: str) -> None:
        self.k, self.mode, self.n, self.log = k, mode, 0, []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for name in OPS:
            monkeypatch.setattr(_fs, name, self._wrap(getattr(_fs, name), name))

    def _wrap(self, fn: Callable, name: str) -> Callable:
        def wrapped(*a, **kw):
            self.n += 1
            self.log.append(name)
            if self.n == self.k or (self.mode == "crash" and self.n > self.k):
                raise OSError(errno.EIO, f"injected failure of _fs.{name} (call {self.n})")
            return fn(*a, **kw)

        return wrapped
