"""C functions that the asset readers' numba kernels call, declared as external symbols.

The compiled code links to them by name when it is loaded, so the kernels are cached on disk like the package's
other kernels (a ctypes function object bakes its address into the code, so a kernel calling one has to be
compiled again in every process: 0.5-4 s at first use). libc's are in every process; google-crc32c's
``crc32c_value`` lives in its extension module, which :func:`link` loads into the symbol table first. Used by
:mod:`._shards` (the asset reader's kernels) and :mod:`polymem.serve._kernels` (the page service; it sits a stage
above the format and imports these from here).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np
from numba import types

RWF_NOWAIT = getattr(os, "RWF_NOWAIT", 0)
if TYPE_CHECKING:  # how compiled code calls them, for mypy (numba's stubs type an ExternalFunction as a type)
    _Int = int | np.integer[Any]

    def preadv2(fd: _Int, iov: _Int, iovcnt: _Int, offset: _Int, flags: _Int) -> int: ...
    def preadv(fd: _Int, iov: _Int, iovcnt: _Int, offset: _Int) -> int: ...
    def pread(fd: _Int, buf: _Int, count: _Int, offset: _Int) -> int: ...
    def memcpy(dst: _Int, src: _Int, count: _Int) -> int: ...
    def crc32c_value(buf: _Int, count: _Int) -> int: ...
else:  # addresses are passed as uintp (the same registers as pointers in the C calling convention)
    preadv2 = types.ExternalFunction("preadv2", types.intp(types.int32, types.uintp, types.int32, types.int64, types.int32))
    preadv = types.ExternalFunction("preadv", types.intp(types.int32, types.uintp, types.int32, types.int64))
    pread = types.ExternalFunction("pread", types.intp(types.int32, types.uintp, types.uintp, types.int64))
    memcpy = types.ExternalFunction("memcpy", types.uintp(types.uintp, types.uintp, types.uintp))
    crc32c_value = types.ExternalFunction("crc32c_value", types.uint32(types.uintp, types.uintp))

_LINKED: Any = None


def link() -> bool:
    """Make google-crc32c's ``crc32c_value`` visible to compiled code (once). False where its C extension or
    llvmlite's loader is missing (the callers then use their Python paths)."""
    global _LINKED
    if _LINKED is None:
        try:
            import llvmlite.binding as llvm
            from google_crc32c import _crc32c

            llvm.load_library_permanently(_crc32c.__file__)
            _LINKED = True
        except Exception:  # noqa: BLE001 - no C crc32c here
            _LINKED = False
    return bool(_LINKED)
