"""Reading ``.npy`` headers from several threads at once.

numpy parses a ``.npy`` header with ``ast.literal_eval``. On CPython 3.11 the ``ast`` module's recursion
bookkeeping is shared between threads, and two threads parsing at once can fail with ``SystemError: AST
constructor recursion depth mismatch`` (seen once in coverage's thread pool, whose workers read their scratch
files' headers at the same time). Every ``.npy`` header polymem reads goes through :data:`LOCK`, one at a time;
a header is about 128 bytes, so the lock costs nothing measurable.
"""

from __future__ import annotations

import threading
import tokenize
from typing import IO, Any

import numpy as np
from numpy.lib import format as npformat

LOCK = threading.Lock()


# what numpy's header parser lets escape on a malformed header besides ValueError: its fallback re-reads the
# header with ``tokenize`` (TokenError on an unclosed bracket) and ``ast.literal_eval`` (SyntaxError, RecursionError)
_HEADER_ERRORS = (SyntaxError, tokenize.TokenError, RecursionError)


def read_header(f: IO[bytes]) -> tuple[tuple[int, ...], bool, np.dtype[Any]]:
    """(shape, fortran_order, dtype) of the ``.npy`` stream ``f``, left at the start of its data. ValueError for a
    format version other than 1.0 or 2.0, or a malformed header."""
    version = npformat.read_magic(f)
    if version not in ((1, 0), (2, 0)):
        raise ValueError(f".npy format version {version[0]}.{version[1]}; expected 1.0 or 2.0")
    with LOCK:
        try:
            if version == (1, 0):
                return npformat.read_array_header_1_0(f)
            return npformat.read_array_header_2_0(f)
        except _HEADER_ERRORS as e:
            raise ValueError(f"malformed .npy header ({type(e).__name__}: {e})") from None


def read_array(f: IO[bytes]) -> np.ndarray:
    """The array of the ``.npy`` stream ``f`` (no pickle), its header parsed under :data:`LOCK`. ValueError for a
    malformed header or truncated data."""
    with LOCK:
        try:
            arr: np.ndarray = npformat.read_array(f, allow_pickle=False)
        except _HEADER_ERRORS as e:
            raise ValueError(f"malformed .npy header ({type(e).__name__}: {e})") from None
    return arr
