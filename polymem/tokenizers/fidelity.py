"""Byte fidelity: do a tokenizer's token bytes concatenate back to the text it encoded?

For each non-empty text t with ids = tok.encode(t) and got = tok.decode_bytes(ids):
    exact         got == t.encode("utf-8")
    dummy_prefix  got == b" " + t.encode("utf-8"), counted only when tok.dummy_prefix (else a mismatch)
    mismatched    anything else (lost or changed bytes: <unk>, normalisation, dropped whitespace, ...)
A tokenizer is `faithful` on the texts when nothing mismatched. Empty texts are skipped (they say nothing);
when no text is left, check_fidelity raises TokenizerError("nothing to check").

What this module does not do: fix a lossy tokenizer, or decide whether a mismatch is acceptable.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from polymem.errors import TokenizerError
from polymem.tokenizers.base import Tokenizer

_SNIPPET = 24  # bytes shown around the first difference


@dataclass(frozen=True)
class FidelityReport:
    """How many texts came back byte-exact, exact after the dummy prefix, or not at all."""

    docs: int  # non-empty texts checked
    exact: int  # token bytes == text bytes
    dummy_prefix: int  # token bytes == b" " + text bytes (only when the tokenizer has a dummy prefix)
    mismatched: int  # neither
    faithful: bool  # mismatched == 0
    first_mismatch: str | None  # "doc 3, byte 17 of 120: expected b'...' got b'...'", or None

    def __post_init__(self) -> None:
        if self.exact + self.dummy_prefix + self.mismatched != self.docs:
            raise TokenizerError(
                f"inconsistent FidelityReport: exact {self.exact} + dummy_prefix {self.dummy_prefix} + "
                f"mismatched {self.mismatched} != docs {self.docs}"
            )
        if self.faithful != (self.mismatched == 0):
            raise TokenizerError(
                f"inconsistent FidelityReport: faithful={self.faithful} with mismatched={self.mismatched}"
            )


def describe_mismatch(doc: int, expected: bytes, got: bytes) -> str:
    """A short human description of where two byte strings first differ.

    >>> describe_mismatch(0, b"Hello world", b"hello world")
    "doc 0, byte 0 of 11 (got 11): expected b'Hello world' got b'hello world'"
    """
    off = next((i for i, (a, b) in enumerate(zip(expected, got)) if a != b), min(len(expected), len(got)))
    lo = max(0, off - _SNIPPET // 3)
    return (
        f"doc {doc}, byte {off} of {len(expected)} (got {len(got)}): "
        f"expected {expected[lo:off + _SNIPPET]!r} got {got[lo:off + _SNIPPET]!r}"
    )


def check_fidelity(tok: Tokenizer, texts: Iterable[str]) -> FidelityReport:
    """Encode each text, concatenate the token bytes and compare with the text's UTF-8 (module docstring)."""
    if isinstance(texts, str):
        raise TokenizerError(
            "check_fidelity expects an iterable of texts, got one str; wrap it in a list: check_fidelity(tok, [text])"
        )
    docs = exact = prefixed = mismatched = 0
    first: str | None = None
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise TokenizerError(f"text {index} is a {type(text).__name__}, expected str; decode it first")
        if not text:
            continue
        docs += 1
        got = tok.decode_bytes(tok.encode(text))  # encode() rejects lone surrogates with the position
        want = text.encode("utf-8")
        if got == want:
            exact += 1
        elif tok.dummy_prefix and got == b" " + want:
            prefixed += 1
        else:
            mismatched += 1
            if first is None:
                expected = b" " + want if tok.dummy_prefix and got.startswith(b" ") else want
                first = describe_mismatch(index, expected, got)
    if docs == 0:
        raise TokenizerError(
            "nothing to check: check_fidelity got no texts, or only empty ones; pass at least one non-empty "
            "text, e.g. the sample in polymem/_samples/sample_multilingual.txt"
        )
    return FidelityReport(
        docs=docs, exact=exact, dummy_prefix=prefixed, mismatched=mismatched,
        faithful=mismatched == 0, first_mismatch=first,
    )
