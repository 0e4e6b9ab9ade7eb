"""Error types. Every error names the offending value, what would be accepted, and the fix."""

from __future__ import annotations


class PolymemError(ValueError):
    """Base class for all polymem errors raised on bad user input or bad files."""


class TokenizerError(PolymemError):
    """A tokenizer could not be resolved, loaded, or used on the given input."""


class SpecMismatchError(PolymemError):
    """A stored object (cache, asset) was made with another hash spec or tokenizer than the one in use."""


class FormatError(PolymemError):
    """A stored file has an unknown format name/version, or is corrupt."""
