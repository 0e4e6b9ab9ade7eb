"""polymem: tokenizer-agnostic hashed n-gram memory tables, addressed by the bytes of an n-gram.

Public API (everything else is private)::

    tok = polymem.load_tokenizer("cl100k_base")
    cache = polymem.TokenCache.build(tok, polymem.HashSpec())
    hashes, valid = cache.ngram_hashes(tok.encode("Hello world"), max_n=3)
"""

from __future__ import annotations

from typing import Any

from polymem.cache import TokenCache
from polymem.errors import FormatError, PolymemError, SpecMismatchError, TokenizerError
from polymem.hashing import HashSpec
from polymem.layout import Layout
from polymem.xorhash import XorHashSpec

__version__ = "0.1.0"

# Lazily imported names (heavy dependencies, or modules of later milestones).
_LAZY = {
    "load_tokenizer": ("polymem.tokenizers", "load_tokenizer"),
    "check_fidelity": ("polymem.tokenizers", "check_fidelity"),
    "Tokenizer": ("polymem.tokenizers", "Tokenizer"),
    "coverage": ("polymem.analyzer", "coverage"),
    "MemoryAsset": ("polymem.asset", "MemoryAsset"),
    "attach": ("polymem.torch.site", "attach"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        return getattr(importlib.import_module(mod), attr)
    raise AttributeError(f"module 'polymem' has no attribute {name!r}")


__all__ = [
    "FormatError", "HashSpec", "Layout", "PolymemError", "SpecMismatchError", "TokenCache",
    "TokenizerError", "XorHashSpec", "__version__", *_LAZY,
]
