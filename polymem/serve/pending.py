"""Reads in flight: :class:`Pending` (the chunks of one fetch still being read by the pool or joined from another
consumer), :class:`IORead` (chunks handed to the service's I/O thread) and the I/O thread's loop.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Union

import numpy as np

if TYPE_CHECKING:
    from polymem.serve.service import PageService


class Pending:
    """The chunks of one :meth:`PageService.fetch_into` still being read by the pool (or by another consumer).
    :meth:`wait` blocks until they are done and copies them into the consumer's buffer (read errors raise)."""

    __slots__ = ("service", "out", "parts")

    def __init__(self, service: "PageService", out: np.ndarray) -> None:
        self.service, self.out = service, out
        self.parts: list[tuple[ChunkRead, np.ndarray, np.ndarray]] = []  # (read, rows of out, rows of its result)

    def done(self) -> bool:
        return all(f.done() for f, _, _ in self.parts)

    def wait(self) -> None:
        t0 = time.perf_counter()
        waited = not self.done()
        out = self.out
        for fut, rows, src in self.parts:
            out[rows] = fut.result()[src]
        if waited:
            self.service.note_wait(time.perf_counter() - t0)


class IORead:
    """Chunks handed to the service's I/O thread: done / result like the Future of a pool read (so reads are
    joined alike). The thread only reads (one compiled call, GIL released); the first consumer that waits
    re-reads any chunk that failed (the precise error), counts and caches them."""

    __slots__ = ("service", "chunks", "buf", "slots", "gen", "queued", "ok", "io", "_res", "_exc", "_lock")

    def __init__(self, service: "PageService", chunks: np.ndarray, slots: np.ndarray | None = None) -> None:
        self.service, self.chunks = service, chunks
        # lane reads (slots given) land straight in their reserved slots of the cache slab
        self.slots = slots
        self.buf = np.empty((chunks.shape[0], service.geom.chunk_bytes), dtype=np.uint8) if slots is None \
            else service._slab
        self.gen = service._gen
        self.queued = True  # False: a lane read made (blocking) in the consumer's thread; only failures are left
        self.ok = np.zeros(chunks.shape[0], dtype=bool)
        self.io = threading.Lock()  # held until the I/O thread has read the chunks
        self.io.acquire()
        self._res: np.ndarray | None = None
        self._exc: BaseException | None = None
        self._lock = threading.Lock()

    def done(self) -> bool:
        return not self.io.locked()

    def result(self) -> np.ndarray:
        self.settle()
        if self.slots is not None:  # a lane read: a copy of its chunks (for a consumer that joined it)
            chunks: np.ndarray = self.buf[self.slots]
            return chunks
        assert self._res is not None  # settle() set it or raised
        return self._res

    def _wait_io(self) -> None:  # under self._lock
        if self.io.locked():
            t0 = time.perf_counter()
            self.io.acquire()
            self.service.note_wait(time.perf_counter() - t0)
        else:
            self.io.acquire()
        self.io.release()

    def settle(self) -> None:
        """Wait for the I/O thread, then (once) re-read failures, count and cache; read errors raise."""
        with self._lock:
            if self._res is None and self._exc is None:
                self._wait_io()
                try:
                    if self.slots is not None:
                        self.service._lane_settle(self)
                        self._res = self.slots
                    else:
                        self._res = self.service._finish_read(self.chunks, self.buf, self.ok)
                except BaseException as e:
                    self._exc = e
            if self._exc is not None:
                raise self._exc


# a read in flight: a pool task's Future or an I/O-thread read (both have done() and result())
ChunkRead = Union["Future[np.ndarray]", IORead]


def _io_loop(q: "queue.SimpleQueue[Any]", read_rows: Any, crc: bool) -> None:
    """The I/O thread of a service: blocking reads of whole jobs, each one compiled call with the GIL released
    (the thread holds the GIL only to take a job and to signal it done, so the model's thread barely notices)."""
    while True:
        job = q.get()
        if job is None:
            return
        fds, offs, buf, rows, ok, done = job
        job = None  # hold nothing between jobs: the service must stay collectable
        try:
            read_rows(fds, offs, buf, rows, crc, 0, ok)
        except BaseException:  # noqa: BLE001 - ok stays False: the consumer re-reads for the precise error
            pass
        finally:
            done.release()
            fds = offs = buf = rows = ok = done = None


def _stop_io(q: "queue.SimpleQueue[Any]", t: threading.Thread) -> None:
    q.put(None)
    if t is not threading.current_thread():
        t.join()


__all__ = ["ChunkRead", "IORead", "Pending"]
