"""The one lazy loader of the page service's numba kernels (:mod:`._kernels`): the service, its cache index
and the torch consumer (:mod:`polymem.torch.pages`) all get them from :func:`kernels`. Imports no numba itself.
"""

from __future__ import annotations

from typing import Any

_MODULE: Any = None  # None: not tried; False: numba missing; else polymem.serve._kernels
_IO: Any = None  # None: not tried; else whether the kernels' C reads are linked and compiled


def kernels(io: bool = False) -> Any:
    """The page service's numba kernels (:mod:`._kernels`), imported once; None where numba is missing.

    io=True: only where the compiled reads run too — libc ``preadv2`` and google-crc32c's C ``crc32c_value``
    called from numba (:mod:`polymem.asset._ckern`), every kernel compiled (or loaded from numba's cache) now, so
    that a missing symbol shows here and nothing compiles mid-forward; else None (the Python loops do the same
    work). Tests switch the compiled reads off by setting ``_IO = False``."""
    global _MODULE, _IO
    if _MODULE is None:
        try:
            from polymem.serve import _kernels

            _MODULE = _kernels
        except ImportError:  # pragma: no cover - numba is a dependency; the numpy paths stay correct
            _MODULE = False
    if not _MODULE:
        return None
    if io and _IO is None:
        try:
            from polymem.asset import _ckern

            if not _ckern.link():
                raise RuntimeError("no C crc32c")
            _MODULE.warm_up()
            _IO = True
        except Exception:  # noqa: BLE001 - any missing piece: the Python loop does the same work
            _IO = False
    return _MODULE if (not io or _IO) else None
