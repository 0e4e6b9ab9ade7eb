"""The one tokenizer interface that the rest of polymem codes against.

A `Tokenizer` turns text into token ids and says which bytes each id stands for. polymem hashes n-grams by
those bytes, so the byte map (`token_bytes`) matters more than the segmentation (`encode`).

What this module does not do: load anything (see `registry.py`), or know about any backend library
(see the `*_adapter.py` modules). It holds the shared checks, the byte-map cache and the fingerprint.

Fingerprint, version 1 (`FINGERPRINT_VERSION`): the lowercase sha256 hex digest of

    b"polymem-tokenizer-fingerprint/v1\\x00"
    + uint64_le(vocab_size)
    + for each id in 0 .. vocab_size-1, in order:
        b"\\x00"                                   if token_bytes(id) is None (special/control/unused/<unk>)
        b"\\x01" + uint32_le(len(b)) + b           otherwise, with b = token_bytes(id)

It identifies the id -> bytes map only: two tokenizers with the same vocabulary and special flags but another
pre-tokenizer regex, normaliser or dummy-prefix setting get the same fingerprint (their ids mean the same bytes,
which is what a per-token hash cache depends on).
"""

from __future__ import annotations

import abc
import contextlib
import hashlib
import struct
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from polymem.errors import TokenizerError

FINGERPRINT_VERSION = 1
_FINGERPRINT_MAGIC = b"polymem-tokenizer-fingerprint/v1\x00"
FAMILIES = ("tiktoken", "hf", "sentencepiece", "bytes")
# Largest vocabulary a tokenizer file may declare: 64x the largest real one (Gemma's 262,144). Tables are sized
# by it ([None] * vocab_size, the token-hash cache's arrays), so a few bytes in a file must not ask for more.
MAX_VOCAB_SIZE = 1 << 24


@contextlib.contextmanager
def rust_panics_as_errors(name: str) -> Iterator[None]:
    """Turn a panic in a Rust tokenizer core (pyo3's PanicException, a BaseException that escapes every
    ``except Exception``) into a TokenizerError, so one bad document or file cannot kill a whole run.
    KeyboardInterrupt and SystemExit pass through."""
    try:
        yield
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException as e:  # noqa: BLE001 - only pyo3's PanicException is converted, see below
        if type(e).__name__ != "PanicException":
            raise
        msg = str(e).strip().splitlines()[0] if str(e).strip() else "no message"
        raise TokenizerError(
            f"tokenizer {name!r} failed inside its Rust core (a panic: {msg}); its file is probably broken "
            "(missing byte tokens, duplicate ranks); check it, or load the complete file"
        ) from None


def check_text(text: object) -> str:
    """Return `text` if it is a str that UTF-8 can encode; raise TokenizerError naming the problem otherwise."""
    if not isinstance(text, str):
        raise TokenizerError(
            f"expected text as str, got {type(text).__name__} ({text!r:.60}); "
            "decode bytes first, e.g. data.decode('utf-8')"
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start]
        raise TokenizerError(
            f"text has a lone surrogate {bad!r} (U+{ord(bad):04X}) at character position {exc.start}, which has "
            "no UTF-8 bytes; only valid Unicode text is accepted. Fix: repair it first, e.g. "
            "text.encode('utf-8', 'replace').decode() (or 'surrogatepass' if it is a UTF-16 pair split in two)"
        ) from None
    return text


def fingerprint_of(vocab_size: int, token_bytes: Sequence[bytes | None]) -> str:
    """The version-1 fingerprint (see the module docstring) of an ordered id -> bytes map."""
    if len(token_bytes) != vocab_size:
        raise TokenizerError(
            f"byte map has {len(token_bytes)} entries but vocab_size is {vocab_size}; they must be equal "
            "(this is a bug in the tokenizer adapter: please report it)"
        )
    pack = struct.Struct("<I").pack
    parts: list[bytes] = [_FINGERPRINT_MAGIC, struct.pack("<Q", vocab_size)]
    for b in token_bytes:
        if b is None:
            parts.append(b"\x00")
        else:
            parts.append(b"\x01" + pack(len(b)))
            parts.append(b)
    return hashlib.sha256(b"".join(parts)).hexdigest()


def check_pinned_sha256(data: bytes, expected: str, *, path: object, what: str, fix: str) -> bytes:
    """``data`` if its sha256 is ``expected`` (a pinned tokenizer file); else a TokenizerError naming the file,
    both hashes and the fix."""
    got = hashlib.sha256(data).hexdigest()
    if got != expected:
        raise TokenizerError(
            f"{str(path)!r} has sha256 {got}, expected {expected} ({what}); the file is corrupt or another "
            f"version. Fix: {fix}"
        )
    return data


def pack_token_bytes(token_bytes: Sequence[bytes | None]) -> tuple[np.ndarray, np.ndarray]:
    """The byte map as one buffer for kernels: (buf uint8 [Σ len], offsets int64 [V+1]); token t is
    buf[offsets[t]:offsets[t+1]] (empty for None)."""
    lengths = np.fromiter((0 if b is None else len(b) for b in token_bytes), dtype=np.int64, count=len(token_bytes))
    offsets = np.zeros(len(token_bytes) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    buf = np.frombuffer(b"".join(b for b in token_bytes if b is not None), dtype=np.uint8)
    return buf, offsets


class Tokenizer(abc.ABC):
    """One tokenizer, whatever its backend: ids <-> bytes.

    Attributes:
        name: short name, e.g. "cl100k_base", "mistral-v1", or a file's stem.
        family: "tiktoken" | "hf" | "sentencepiece" | "bytes".
        vocab_size: ids are 0 .. vocab_size-1; holes are allowed (their token_bytes is None).
        dummy_prefix: True when encode() adds a leading space that is not in the text
            (SentencePiece add_dummy_prefix, Metaspace prepend, ByteLevel add_prefix_space).
        lossy: True when token bytes are known not to concatenate back to the text (WordPiece,
            lowercasing or whitespace-dropping normalisers and pre-tokenizers).

    Subclasses implement `_encode` and `_compute_all_token_bytes`; everything else lives here.
    """

    name: str
    family: str
    vocab_size: int
    dummy_prefix: bool
    lossy: bool

    def __init__(self, *, name: str, family: str, vocab_size: int, dummy_prefix: bool, lossy: bool) -> None:
        if family not in FAMILIES:
            raise TokenizerError(f"unknown tokenizer family {family!r}; expected one of {FAMILIES}")
        if vocab_size <= 0:
            raise TokenizerError(f"tokenizer {name!r} has vocab_size {vocab_size}; expected a positive size")
        self.name = name
        self.family = family
        self.vocab_size = int(vocab_size)
        self.dummy_prefix = bool(dummy_prefix)
        self.lossy = bool(lossy)
        self._all_bytes: list[bytes | None] | None = None
        self._fingerprint: str | None = None

    # -- backend hooks -------------------------------------------------------------------------------

    @abc.abstractmethod
    def _encode(self, text: str) -> Sequence[int] | np.ndarray:
        """Token ids for valid text, no BOS/EOS, special-token strings in the text treated as text."""

    @abc.abstractmethod
    def _compute_all_token_bytes(self) -> list[bytes | None]:
        """The byte map, length vocab_size. Called once; the result is cached."""

    # -- public interface ----------------------------------------------------------------------------

    def encode(self, text: str) -> np.ndarray:
        """Token ids (int64, shape [T]) of `text`; no BOS/EOS is added.

        Raises TokenizerError for non-str input and for lone surrogates (naming the position).
        """
        text = check_text(text)
        with rust_panics_as_errors(self.name):
            ids = self._encode(text)
        return np.asarray(ids, dtype=np.int64).reshape(-1)

    def encode_batch(self, texts: Iterable[str]) -> list[np.ndarray]:
        """`[encode(t) for t in texts]`; backends override this with a faster bulk route where they have one."""
        return [self.encode(t) for t in texts]

    def all_token_bytes(self) -> list[bytes | None]:
        """Bytes of every id 0 .. vocab_size-1 (None: special/control/unused/<unk>); computed once, cached.

        Returns a fresh list each call (a shallow copy of the cache), so callers may modify it.
        """
        return list(self._table())

    def token_bytes(self, id: int) -> bytes | None:  # noqa: A002 - the interface name is `id`
        """Bytes of one id; None for special/control tokens, unused ids and <unk>."""
        self._check_id(id)
        return self._table()[int(id)]

    def decode_bytes(self, ids: Iterable[int] | np.ndarray) -> bytes:
        """Concatenation of token_bytes(id) over ids, with None counted as b""."""
        arr = np.asarray(ids if isinstance(ids, np.ndarray) else list(ids))
        if arr.size == 0:
            return b""
        if arr.dtype.kind not in "iu":
            raise TokenizerError(
                f"token ids must be integers, got an array of dtype {arr.dtype}; pass e.g. tok.encode(text)"
            )
        arr = arr.reshape(-1)
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0:
            self._check_id(lo)
        if hi >= self.vocab_size:
            self._check_id(hi)
        table = self._table()
        return b"".join([table[i] or b"" for i in arr.tolist()])

    @property
    def fingerprint(self) -> str:
        """sha256 hex of the ordered id -> bytes map and special flags (definition: module docstring)."""
        if self._fingerprint is None:
            self._fingerprint = fingerprint_of(self.vocab_size, self._table())
        return self._fingerprint

    # -- helpers ---------------------------------------------------------------------------------------

    def _table(self) -> list[bytes | None]:
        """The cached byte map (not a copy: never hand it out)."""
        if self._all_bytes is None:
            table = self._compute_all_token_bytes()
            if len(table) != self.vocab_size:
                raise TokenizerError(
                    f"tokenizer {self.name!r} produced {len(table)} token byte entries for vocab_size "
                    f"{self.vocab_size}; this is a bug in the {self.family} adapter: please report it"
                )
            self._all_bytes = table
        return self._all_bytes

    def _check_id(self, id: object) -> None:  # noqa: A002
        if isinstance(id, (bool, np.bool_)) or not isinstance(id, (int, np.integer)):
            raise TokenizerError(
                f"token id must be an int, got {type(id).__name__} {id!r:.40}; "
                f"valid ids for {self.name!r} are 0 .. {self.vocab_size - 1}"
            )
        if not 0 <= int(id) < self.vocab_size:
            raise TokenizerError(
                f"token id {int(id)} is out of range for tokenizer {self.name!r} (vocab_size {self.vocab_size}); "
                f"valid ids are 0 .. {self.vocab_size - 1}. Check that the ids came from this tokenizer"
            )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(name={self.name!r}, family={self.family!r}, vocab_size={self.vocab_size}, "
            f"dummy_prefix={self.dummy_prefix}, lossy={self.lossy})"
        )
