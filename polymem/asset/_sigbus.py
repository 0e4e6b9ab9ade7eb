"""SIGBUS-safe memory maps of shard files: a fault on a mapped shard becomes a failed crc32c check, not a signal.

A memory-mapped file that shrinks under its reader (``truncate`` in place) makes the next access to a page past
the new end raise SIGBUS, which kills a Python process. This module installs one process-wide SIGBUS handler
(a numba ``cfunc``: native code, no Python, nothing but two system calls) that knows the address ranges of the
shards polymem has mapped. A fault inside one of them is answered by mapping a page of zeros over the faulting
page (``mmap(MAP_FIXED | MAP_ANONYMOUS)``) and counting the fault for that range; the interrupted copy then
finishes with zeros, the page's crc32c check fails (a chunk that is read as zeros never matches its stored
crc: the residue of zeros is not the crc32c residue), and the reader re-reads the chunk with ``pread`` to give
the precise error ("is truncated"), dropping the damaged map. Any other SIGBUS — a fault outside our maps, or
a signal sent with ``kill`` — goes to the handler that was installed before ours (restored first, so it sees
the signal exactly as it would have without polymem): default behaviour for everyone else is unchanged.

The guard is used only where it is known to be sound: Linux on x86_64 or aarch64 (the ``struct sigaction`` and
``siginfo_t`` layouts are written out below) with numba available, and not when ``POLYMEM_NO_MMAP`` is set
in the environment. Elsewhere ``available()`` is False and readers use ``pread`` only. Documented limit: a
library that installs its own SIGBUS handler *after* a shard was mapped takes the signal first; polymem
re-installs its handler (chaining to the newcomer) each time it maps a shard.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import sys
import threading
from typing import Any, Callable

import numpy as np

_SIGBUS = 7  # Linux x86_64 / aarch64
_SA_SIGINFO, _SA_ONSTACK = 0x4, 0x08000000
_SA_SIZE, _SA_FLAGS = 152, 136  # glibc struct sigaction: handler @0, mask @8 (128 B), flags @136, restorer @144
_PROT_READ, _MAP_SHARED, _MAP_PRIVATE, _MAP_FIXED, _MAP_ANONYMOUS = 0x1, 0x01, 0x02, 0x10, 0x20
_MADV_RANDOM = 1
_MAP_FAILED = (1 << 64) - 1
SLOTS = 1 << 16  # mapped shards at once (vm.max_map_count is ~65k by default anyway)

_lock = threading.RLock()
_state: Any = None  # None: not tried; False: unavailable; else a _Guard


class _Guard:
    def __init__(self) -> None:
        from numba import cfunc, types
        from numba.extending import intrinsic

        libc = ctypes.CDLL(None, use_errno=True)
        # registry: [0] = slots in use (high-water mark), then per slot (start, end, faults); uint64
        self.reg = np.zeros(1 + 3 * SLOTS, np.uint64)
        self.free: list[int] = []
        self.old = (ctypes.c_char * 256)()  # the action we chain to (struct sigaction)
        self.cur = (ctypes.c_char * 256)()
        c_mmap = libc.mmap
        c_mmap.argtypes = [ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_ssize_t]
        c_mmap.restype = ctypes.c_size_t
        c_sigaction = libc.sigaction
        c_sigaction.argtypes, c_sigaction.restype = [ctypes.c_int, ctypes.c_size_t, ctypes.c_size_t], ctypes.c_int
        c_raise = libc.raise_ if hasattr(libc, "raise_") else getattr(libc, "raise")
        c_raise.argtypes, c_raise.restype = [ctypes.c_int], ctypes.c_int
        self._sigaction = c_sigaction
        self.mmap = libc.mmap  # the same function object the handler calls (argtypes above)
        self.munmap = libc.munmap
        self.munmap.argtypes, self.munmap.restype = [ctypes.c_size_t, ctypes.c_size_t], ctypes.c_int
        self.madvise = libc.madvise
        self.madvise.argtypes, self.madvise.restype = [ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
        REG = int(self.reg.ctypes.data)
        OLD = ctypes.addressof(self.old)
        PS = mmap.PAGESIZE
        MASK = (1 << 64) - PS
        FLAGS = _MAP_PRIVATE | _MAP_FIXED | _MAP_ANONYMOUS

        @intrinsic
        def _u64p(typingctx: Any, addr: Any) -> tuple[Any, Callable[..., Any]]:  # integer address -> uint64*
            sig = types.CPointer(types.uint64)(addr)

            def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
                return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

            return sig, codegen

        @cfunc(types.void(types.int32, types.CPointer(types.uint64), types.voidptr))  # (always nopython)
        def handler(sig: int, info: Any, ctx: int) -> None:  # pragma: no cover - runs in signal context
            # compiled code calls an intrinsic without its typing context, which numba's stub counts as an argument
            reg: Any = _u64p(REG)  # type: ignore[call-arg]
            code = info[1] & 0xFFFFFFFF  # si_code (int32 @ 8); > 0: sent by the kernel for a fault
            fault = code != 0 and code < 0x80000000
            if fault:
                addr = info[2]  # si_addr @ 16
                for k in range(reg[0]):
                    if reg[1 + 3 * k] <= addr and addr < reg[2 + 3 * k]:
                        page = addr & MASK
                        if c_mmap(page, PS, _PROT_READ, FLAGS, -1, 0) == page:
                            reg[3 + 3 * k] += 1
                            return
                        break
            c_sigaction(_SIGBUS, OLD, 0)  # not ours: the previous action, exactly as before us
            if not fault:
                c_raise(_SIGBUS)  # a sent signal does not repeat by itself: deliver it again (blocked until we return)

        self.handler = handler  # keep the compiled code alive
        self.act = (ctypes.c_char * 256)()
        address = handler.address
        if address is None:  # pragma: no cover - cfunc compiles when it decorates
            raise RuntimeError("numba did not compile the SIGBUS handler")
        ctypes.memmove(self.act, ctypes.byref(ctypes.c_uint64(address)), 8)
        ctypes.memmove(ctypes.addressof(self.act) + _SA_FLAGS, ctypes.byref(ctypes.c_int(_SA_SIGINFO | _SA_ONSTACK)), 4)
        self.ensure_installed()

    def ensure_installed(self) -> None:
        """Install our handler unless it is the current one (chaining to whatever is there now)."""
        if self._sigaction(_SIGBUS, 0, ctypes.addressof(self.cur)) != 0:
            raise OSError(ctypes.get_errno(), "sigaction(SIGBUS) failed")
        if ctypes.c_uint64.from_buffer(self.cur).value == self.handler.address:
            return
        if self._sigaction(_SIGBUS, ctypes.addressof(self.act), ctypes.addressof(self.old)) != 0:
            raise OSError(ctypes.get_errno(), "sigaction(SIGBUS) failed")

    def register(self, start: int, size: int) -> int:
        """Guard [start, start + size); returns the slot (or -1 when all slots are taken)."""
        with _lock:
            self.ensure_installed()
            reg = self.reg
            if self.free:
                k = self.free.pop()
            elif int(reg[0]) < SLOTS:
                k = int(reg[0])
            else:
                return -1
            reg[2 + 3 * k] = 0  # end first: a half-written slot never matches
            reg[3 + 3 * k] = 0
            reg[1 + 3 * k] = start
            reg[2 + 3 * k] = start + size
            if k == int(reg[0]):
                reg[0] = k + 1
            return k

    def unregister(self, k: int) -> None:
        with _lock:
            self.reg[2 + 3 * k] = 0
            self.reg[1 + 3 * k] = 0
            self.free.append(k)

    def faults(self, k: int) -> int:
        return int(self.reg[3 + 3 * k])


def guard() -> "_Guard | None":
    """The process-wide SIGBUS guard (compiled and installed on first use), or None where it is not used."""
    global _state
    if _state is None:
        with _lock:
            if _state is None:
                _state = False
                if (sys.platform.startswith("linux") and platform.machine() in ("x86_64", "aarch64", "arm64")
                        and not os.environ.get("POLYMEM_NO_MMAP")):
                    try:
                        _state = _Guard()
                    except Exception:  # noqa: BLE001 - no numba / no libc symbols: readers use pread only
                        _state = False
    return _state or None


def available() -> bool:
    return guard() is not None


class GuardedMap:
    """A read-only shared map of one shard file (``mmap(2)`` through libc: no duplicated descriptor), guarded by
    the SIGBUS handler while it lives.

    ``mv`` (a memoryview of the mapped bytes; slicing + ``bytearray``/``bytes`` copies under the GIL) and ``addr``
    (its first byte, for numba kernels) stay valid until the object is collected: the guard slot is released
    first, then the range is unmapped. Users hold the object itself (not ``mv``) while they read through it.
    """

    __slots__ = ("mv", "addr", "size", "slot", "_g", "__weakref__")

    def __init__(self, g: _Guard, fd: int, size: int) -> None:
        self._g, self.size, self.slot, self.addr = g, size, -1, 0
        addr = g.mmap(0, size, _PROT_READ, _MAP_SHARED, fd, 0)
        if addr == _MAP_FAILED:
            raise OSError(ctypes.get_errno(), f"mmap of {size} bytes failed")
        self.addr = addr
        g.madvise(addr, size, _MADV_RANDOM)
        self.slot = g.register(addr, size)
        if self.slot < 0:
            raise OSError("no free SIGBUS guard slot")
        self.mv = memoryview((ctypes.c_char * size).from_address(addr)).cast("B")

    def faults(self) -> int:
        return self._g.faults(self.slot)

    def __del__(self) -> None:
        try:
            if self.slot >= 0:
                self._g.unregister(self.slot)  # unguard before unmapping: nothing reads it any more
                self.slot = -1
            if self.addr:
                mv = getattr(self, "mv", None)
                if mv is not None:
                    mv.release()
                self._g.munmap(self.addr, self.size)
                self.addr = 0
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
