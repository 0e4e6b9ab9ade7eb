"""Error types. Every error names the offending value, what would be accepted, and the fix."""

from __future__ import annotations

import errno as _errno


class PolymemError(ValueError):
    """Base class for all polymem errors raised on bad user input or bad files."""


class TokenizerError(PolymemError):
    """A tokenizer could not be resolved, loaded, or used on the given input."""


class SpecMismatchError(PolymemError):
    """A stored object (cache, asset) was made with another hash spec or tokenizer than the one in use."""


class TokenizerBoundError(SpecMismatchError):
    """A tokenizer-bound (token-id hashed) asset was used where byte-hash addressing is required."""


class FormatError(PolymemError):
    """A stored file has an unknown format name/version, or is corrupt."""


class MissingError(FormatError, FileNotFoundError):
    """An asset, or a file it lists (metadata, shard, row counts), is not there. Both a polymem error (the CLI
    exits 2 with the one-line message) and a ``FileNotFoundError``, so ``except FileNotFoundError`` and
    ``except OSError`` catch it as they catch a missing file anywhere else; ``errno`` is ``ENOENT``."""

    def __init__(self, message: str, path: object = None) -> None:
        super().__init__(message)  # one argument: str(err) is the message (OSError's (errno, text) form shows a tuple)
        self.errno, self.filename = _errno.ENOENT, None if path is None else str(path)

    def __str__(self) -> str:  # OSError's would print "[Errno 2] None: 'path'"
        return str(self.args[0]) if self.args else ""


class OutputError(PolymemError, OSError):
    """An output path cannot be written (a parent that is a file, read-only or pseudo file system, no
    permission, no space). Both a PolymemError (the CLI exits 2 with the one-line message) and an OSError."""

    @classmethod
    def for_path(cls, path: object, message: str, *, errno: int | None = None) -> "OutputError":
        """The error for output ``path``: ``message`` as its text, ``errno`` and ``filename`` set as an OSError's."""
        err = cls(message)  # one argument: str(err) is the message (OSError's (errno, text) form would show a tuple)
        err.errno, err.filename = errno, str(path)
        return err

    def __str__(self) -> str:  # OSError's would print "[Errno N] None: 'path'" once errno is set
        return str(self.args[0]) if self.args else ""


class WorkerError(PolymemError, RuntimeError):
    """A worker process died or failed; the message is one line, ``worker_traceback`` holds the details."""

    worker_traceback: str = ""
