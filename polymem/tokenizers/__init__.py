"""Tokenizer adapters: one interface (`Tokenizer`) over tiktoken, Hugging Face tokenizers, SentencePiece and
raw bytes, a resolver (`load_tokenizer`) and a byte-fidelity check (`check_fidelity`).

    >>> from polymem.tokenizers import load_tokenizer, check_fidelity
    >>> tok = load_tokenizer("bytes")
    >>> tok.encode("hé").tolist(), tok.token_bytes(104)
    ([104, 195, 169], b'h')

See docs/tokenizers.md for the accepted specs, the per-family byte rules and the fingerprint definition.
"""

from polymem.tokenizers.base import FINGERPRINT_VERSION, Tokenizer
from polymem.tokenizers.fidelity import FidelityReport, check_fidelity
from polymem.tokenizers.registry import known_tokenizers, load_tokenizer

__all__ = [
    "FINGERPRINT_VERSION",
    "FidelityReport",
    "Tokenizer",
    "check_fidelity",
    "known_tokenizers",
    "load_tokenizer",
]
