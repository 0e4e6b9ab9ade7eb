"""Hugging Face `tokenizers` (tokenizer.json) behind the Tokenizer interface.

The byte map is read from the tokenizer's JSON (`to_str()`), by scheme:

    byte-level   (a ByteLevel pre-tokenizer or decoder; GPT-2, Llama-3, Qwen, DeepSeek): each character is
                 mapped back through GPT-2's bytes_to_unicode table ("Ġ" -> b" ", "Ċ" -> b"\\n").
    metaspace    (a Metaspace pre-tokenizer/decoder, a Replace "▁" -> " " decoder, or byte_fallback; Llama-2,
                 Mistral, T5 conversions): "▁" -> b" ", and with byte_fallback "<0xNN>" -> that byte.
    wordpiece    (model WordPiece, BERT): a "##" continuation drops the prefix ("##ing" -> b"ing"); every other
                 token gets one leading space ("play" -> b" play"), so a word reads like it would in a
                 byte-level vocabulary. Whitespace kind and count, case and accents are lost: lossy=True.
    plain        (anything else): the token string as UTF-8.

Added tokens override the model vocabulary: special=True -> None; special=False -> their content as UTF-8
(they are matched in the raw text). The model's unk token and ids in neither table -> None.

`dummy_prefix` is set by a Metaspace pre-tokenizer with prepend_scheme "always"/"first" (older files:
add_prefix_space=true), a Prepend("▁") normaliser, a ByteLevel pre-tokenizer with add_prefix_space=true, or a
WordPiece model (through the leading space above). `lossy` is set for WordPiece, for normalisers that change
text (Lowercase, NFD/NFKC/NFKD, StripAccents, Strip, BertNormalizer, Precompiled) and for pre-tokenizers that
drop whitespace (BertPreTokenizer, Whitespace, WhitespaceSplit, CharDelimiterSplit). NFC is not counted as
lossy (it changes only text that is not NFC already); `check_fidelity` measures what these rules only predict.

What this module does not do: training, truncation/padding, post-processing (BOS/EOS are never added).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from polymem.errors import TokenizerError
from polymem.tokenizers.base import MAX_VOCAB_SIZE, Tokenizer, check_text, rust_panics_as_errors

_SPACE_MARK = "\u2581"  # "▁"
_BYTE_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
_LOSSY_NORMALIZERS = {"Lowercase", "NFD", "NFKC", "NFKD", "StripAccents", "Strip", "BertNormalizer", "Precompiled"}
_LOSSY_PRETOKENIZERS = {"BertPreTokenizer", "Whitespace", "WhitespaceSplit", "CharDelimiterSplit"}


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (printable latin-1 bytes map to themselves,
    the other 68 bytes to U+0100 upwards in byte order)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1)
    )
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


# str.translate table: byte-level character -> the character with the byte's code point (then .encode("latin-1")).
_BYTE_LEVEL_DECODE = {ord(ch): b for b, ch in bytes_to_unicode().items()}


def _components(node: dict[str, Any] | None) -> Iterator[dict[str, Any]]:
    """Every component of a normalizer/pre_tokenizer/decoder tree, Sequences flattened."""
    if not node:
        return
    if node.get("type") == "Sequence":
        for key in ("normalizers", "pretokenizers", "decoders", "processors"):
            for child in node.get(key) or []:
                yield from _components(child)
    else:
        yield node


class HFTokenizer(Tokenizer):
    """A `tokenizers.Tokenizer` behind the Tokenizer interface."""

    def __init__(self, backend: Any, *, name: str, config: dict[str, Any] | None = None,
                 source: str | None = None) -> None:
        self._tok = backend
        # Special-token strings in the text are tokenized as text (like tiktoken's encode_ordinary).
        if hasattr(backend, "encode_special_tokens"):
            backend.encode_special_tokens = True
        cfg = config if config is not None else json.loads(backend.to_str())
        model = cfg.get("model") or {}
        self.model_type: str = str(model.get("type", ""))
        normalizers = list(_components(cfg.get("normalizer")))
        pre_tokenizers = list(_components(cfg.get("pre_tokenizer")))
        decoders = list(_components(cfg.get("decoder")))
        types = {c.get("type") for c in normalizers + pre_tokenizers + decoders}
        self.scheme = self._scheme(model, types, normalizers, decoders)
        self._model = model
        self._byte_fallback = bool(model.get("byte_fallback")) or "ByteFallback" in types
        self._added = [a for a in cfg.get("added_tokens") or [] if isinstance(a, dict)]
        dummy = any(
            (c.get("type") == "Metaspace" and (c.get("prepend_scheme") in ("always", "first")
                                             or c.get("add_prefix_space") is True))
            or (c.get("type") == "ByteLevel" and c.get("add_prefix_space") is True)
            for c in pre_tokenizers
        ) or any(c.get("type") == "Prepend" and c.get("prepend") == _SPACE_MARK for c in normalizers)
        lossy = (
            self.model_type == "WordPiece"
            or any(c.get("type") in _LOSSY_NORMALIZERS for c in normalizers)
            or any(c.get("type") in _LOSSY_PRETOKENIZERS for c in pre_tokenizers)
        )
        super().__init__(
            name=name,
            family="hf",
            vocab_size=self._vocab_size(model, self._added, source or f"tokenizer {name!r}"),
            dummy_prefix=dummy or self.model_type == "WordPiece",
            lossy=lossy,
        )

    @staticmethod
    def _scheme(model: dict[str, Any], types: set[Any], normalizers: list[dict[str, Any]],
                decoders: list[dict[str, Any]]) -> str:
        if model.get("type") == "WordPiece":
            return "wordpiece"
        if "ByteLevel" in types:
            return "byte-level"
        replaces_mark = any(
            c.get("type") == "Replace" and (c.get("pattern") or {}).get("String") == _SPACE_MARK
            and c.get("content") == " " for c in decoders
        ) or any(
            c.get("type") == "Replace" and (c.get("pattern") or {}).get("String") == " "
            and c.get("content") == _SPACE_MARK for c in normalizers
        )
        if "Metaspace" in types or "ByteFallback" in types or replaces_mark or model.get("byte_fallback"):
            return "metaspace"
        return "plain"

    @staticmethod
    def _vocab_size(model: dict[str, Any], added: list[dict[str, Any]], source: str) -> int:
        vocab = model.get("vocab")
        ids = {int(i) for i in vocab.values()} if isinstance(vocab, dict) else set(range(len(vocab or ())))
        ids.update(int(a.get("id", -1)) for a in added)
        ids.discard(-1)
        if not ids:
            raise TokenizerError(
                f"tokenizer.json model of type {model.get('type')!r} has an empty vocabulary; "
                "expected a trained tokenizer (model.vocab non-empty)"
            )
        _check_id_bound(max(ids), len(ids), source)
        return max(ids) + 1

    @property
    def backend(self) -> Any:
        """The wrapped `tokenizers.Tokenizer`."""
        return self._tok

    def _encode(self, text: str) -> list[int]:
        try:
            ids: list[int] = self._tok.encode(text, add_special_tokens=False).ids
        except Exception as exc:  # noqa: BLE001 - the Rust core reports its errors as plain Exceptions
            raise self._encode_error(exc) from None
        return ids

    def encode_batch(self, texts: Iterable[str]) -> list[np.ndarray]:
        batch = [check_text(t) for t in texts]
        with rust_panics_as_errors(self.name):
            try:
                out = self._tok.encode_batch(batch, add_special_tokens=False)
            except Exception as exc:  # noqa: BLE001 - as in _encode
                raise self._encode_error(exc) from None
        return [np.asarray(e.ids, dtype=np.int64) for e in out]

    def _encode_error(self, exc: Exception) -> TokenizerError:
        """A backend encode error (e.g. a Unigram model without unk_id meeting a character it lacks) as one line."""
        return TokenizerError(
            f"tokenizer {self.name!r} cannot encode this text: {str(exc)[:200]} ({type(exc).__name__}); its "
            "tokenizer.json does not cover every character it met (a model with no unknown token, or an edited file). "
            "Fix: pass the model's complete tokenizer.json"
        )

    def _vocab_lists(self) -> tuple[list[str], list[int]]:
        """(token strings, their ids) of the model vocabulary."""
        vocab = self._model.get("vocab")
        if isinstance(vocab, dict):
            return list(vocab.keys()), list(vocab.values())
        if isinstance(vocab, list):  # Unigram: [[piece, score], ...], id = position
            return [str(entry[0]) for entry in vocab], list(range(len(vocab)))
        return [], []

    def _compute_all_token_bytes(self) -> list[bytes | None]:
        table: list[bytes | None] = [None] * self.vocab_size
        strings, ids = self._vocab_lists()
        if self.scheme == "byte-level":
            converted = _byte_level_bulk(strings)
        elif self.scheme == "metaspace":
            converted = [_metaspace_bytes(t, self._byte_fallback) for t in strings]
        elif self.scheme == "wordpiece":
            prefix = str(self._model.get("continuing_subword_prefix") or "##")
            converted = [t[len(prefix):].encode("utf-8") if t.startswith(prefix) else b" " + t.encode("utf-8")
                         for t in strings]
        else:
            converted = [t.encode("utf-8") for t in strings]
        for i, b in zip(ids, converted):
            table[i] = b
        # The model's unknown token has no bytes.
        unk = self._model.get("unk_token")
        vocab = self._model.get("vocab")
        if isinstance(unk, str) and isinstance(vocab, dict) and unk in vocab:
            table[int(vocab[unk])] = None
        unk_id = self._model.get("unk_id")
        if isinstance(unk_id, int) and 0 <= unk_id < self.vocab_size and isinstance(vocab, list):
            table[unk_id] = None
        # Added tokens override: special -> None, others are matched in the raw text -> their UTF-8.
        for a in self._added:
            i = int(a["id"])
            table[i] = None if a.get("special") else str(a.get("content", "")).encode("utf-8")
        return table


def _check_id_bound(top: int, count: int, source: str) -> None:
    """Refuse a largest id that would size a table far beyond the file's tokens (tables hold one entry per id):
    above MAX_VOCAB_SIZE - 1, or past twice the number of tokens + 1024 (real files number ids 0..N-1)."""
    limit = min(MAX_VOCAB_SIZE, 2 * count + 1024) - 1
    if top > limit:
        raise TokenizerError(
            f"{source} declares token id {top:,} but has {count:,} distinct ids; ids must lie in 0..{limit:,} (at most "
            f"{MAX_VOCAB_SIZE - 1:,}, and at most twice the number of tokens + 1024), since polymem sizes tables by "
            "the largest id. Fix: pass the complete, unedited tokenizer.json"
        )


def _metaspace_bytes(token: str, byte_fallback: bool) -> bytes:
    if byte_fallback:
        m = _BYTE_PIECE.match(token)
        if m:
            return bytes([int(m.group(1), 16)])
    return token.replace(_SPACE_MARK, " ").encode("utf-8")


def _byte_level_bulk(tokens: list[str]) -> list[bytes]:
    """Byte-level strings -> bytes, with one str.translate over all tokens at once (fast for 150k vocabs)."""
    sep = "\uffff"  # not in the byte-level alphabet; checked below
    parts = sep.join(tokens).translate(_BYTE_LEVEL_DECODE).split(sep)
    if len(parts) != len(tokens):  # a token contained the separator: do it one by one
        parts = [t.translate(_BYTE_LEVEL_DECODE) for t in tokens]
    out: list[bytes] = []
    for part, token in zip(parts, tokens):
        try:
            out.append(part.encode("latin-1"))
        except UnicodeEncodeError:  # a character outside the byte-level alphabet: keep the token's own UTF-8
            out.append(token.encode("utf-8"))
    return out


def hf_tokenizer_from_json_text(text: str, *, name: str, source: str) -> HFTokenizer:
    """Build from the text of a tokenizer.json; `source` (a path or a description) is named in errors."""
    from tokenizers import Tokenizer as BackendTokenizer

    try:
        cfg = json.loads(text)
        if not isinstance(cfg, dict) or "model" not in cfg:
            raise ValueError("the JSON has no 'model' object")
        backend = BackendTokenizer.from_str(text)
    except Exception as exc:  # noqa: BLE001 - json and the Rust backend raise assorted types
        raise TokenizerError(
            f"{source} is not a valid Hugging Face tokenizer.json (expected the JSON written by "
            f"tokenizers.Tokenizer.save / save_pretrained): {type(exc).__name__}: {str(exc)[:200]}. "
            "Fix: pass the model's tokenizer.json (not tokenizer_config.json or vocab.json)"
        ) from exc
    return HFTokenizer(backend, name=name, config=cfg, source=source)
