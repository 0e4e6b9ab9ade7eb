"""The byte-level n-gram hash and its addressing (docs/hash-spec.md): text ids → n-gram hashes → table rows.

``spec`` (HashSpec, constants; the definition in plain Python), ``reference`` (slow reference for tests),
``ngram`` (numpy), ``_numba`` (the fast kernels), ``token_hashes`` (TokenHashes: C(t), L(t), P(t) per token),
``layout`` (hashes → rows: page-local, flat, independent heads), ``xor`` (Engram's tokenizer-bound id hash, the
baseline). numba loads only when a kernel is first used.
"""

from polymem.hash.layout import LAYOUT_KINDS, Layout
from polymem.hash.spec import HashSpec

__all__ = ["LAYOUT_KINDS", "HashSpec", "Layout"]
