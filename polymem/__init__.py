"""polymem: tokenizer-agnostic hashed n-gram memory tables, addressed by the bytes of an n-gram.

The data flow, one sub-package per stage (docs/architecture.md)::

    text ──tokenizers──▶ ids ──hash──▶ n-gram hashes ──hash.layout──▶ rows ──asset──▶ pages ──torch──▶ vectors → model
                                                         analysis: coverage, iosim, crosscheck (read-only studies)

Public API::

    tok = polymem.load_tokenizer("cl100k_base")
    hashes = polymem.TokenHashes.build(tok, polymem.HashSpec())
    h, valid = hashes.ngram_hashes(tok.encode("Hello world"), max_n=3)

``import polymem`` loads no heavy dependency (numba, torch, zarr): every name below is imported on first use.
"""

from __future__ import annotations

import warnings
from typing import Any

from polymem.errors import (FormatError, MissingError, OutputError, PolymemError, SpecMismatchError, TokenizerBoundError,
                            TokenizerError)

__version__ = "0.1.0"

# name -> (module, attribute); imported on first access so `import polymem` stays light.
_LAZY = {
    "HashSpec": ("polymem.hash.spec", "HashSpec"),
    "Layout": ("polymem.hash.layout", "Layout"),
    "TokenHashes": ("polymem.hash.token_hashes", "TokenHashes"),
    "XorHashSpec": ("polymem.hash.xor", "XorHashSpec"),
    "load_tokenizer": ("polymem.tokenizers", "load_tokenizer"),
    "check_fidelity": ("polymem.tokenizers", "check_fidelity"),
    "Tokenizer": ("polymem.tokenizers", "Tokenizer"),
    "coverage": ("polymem.analysis.coverage", "coverage"),
    "MemoryAsset": ("polymem.asset", "MemoryAsset"),
    "IdHashSpec": ("polymem.hash.idhash", "IdHashSpec"),
    "convert": ("polymem.ops", "convert"),
    "subset": ("polymem.ops", "subset"),
    "merge": ("polymem.ops", "merge"),
    "attach": ("polymem.torch.attach", "attach"),
    "AttachHandle": ("polymem.torch.attach", "AttachHandle"),
    "load_attached": ("polymem.torch.attach", "load_attached"),
}

# Old public names kept for one release (0.2 removes them).
_DEPRECATED = {"TokenCache": "TokenHashes"}


def __getattr__(name: str) -> Any:
    import importlib

    if name in _DEPRECATED:
        new = _DEPRECATED[name]
        warnings.warn(f"polymem.{name} is deprecated; use polymem.{new}", DeprecationWarning, stacklevel=2)
        return __getattr__(new)
    if name in _LAZY:
        mod, attr = _LAZY[name]
        value = getattr(importlib.import_module(mod), attr)
        globals()[name] = value  # later lookups skip __getattr__
        return value
    raise AttributeError(f"module 'polymem' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = ["FormatError", "MissingError", "OutputError", "PolymemError", "SpecMismatchError", "TokenizerBoundError", "TokenizerError", "__version__",
           *_LAZY]
