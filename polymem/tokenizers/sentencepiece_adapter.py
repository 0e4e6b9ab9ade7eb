"""SentencePiece `.model` files behind the Tokenizer interface.

Byte rules, per piece type:
    CONTROL (<s>, </s>, [INST], ...), UNKNOWN (<unk>), UNUSED  -> None
    BYTE (<0x0A>)                                              -> that one byte
    NORMAL, USER_DEFINED                                       -> the piece with "▁" (U+2581) -> b" ", UTF-8
(`▁` is only mapped when the model escapes whitespace, which is the default.)

`dummy_prefix` is the model's `normalizer_spec.add_dummy_prefix`: encode("Hello") gives "▁Hello", so the token
bytes are b" Hello" — one space more than the text. `lossy` is True when the normaliser is not "identity" or
extra whitespace is removed (then bytes cannot come back: NFKC folds "①" to "1", runs of spaces collapse).
Both settings are read from the model file itself with a small protobuf reader (no protobuf dependency).

What this module does not do: sampling/n-best encoding, or add BOS/EOS.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from polymem.errors import TokenizerError
from polymem.tokenizers.base import Tokenizer, check_text

_SPACE_MARK = "\u2581"  # "▁"


@dataclass(frozen=True)
class NormalizerSettings:
    """The parts of a SentencePiece NormalizerSpec that decide byte fidelity."""

    name: str = ""  # "identity", "nmt_nfkc", ... ("" when the field is absent)
    add_dummy_prefix: bool = True  # protobuf default
    remove_extra_whitespaces: bool = True  # protobuf default
    escape_whitespaces: bool = True  # protobuf default


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return result, pos


def _fields(buf: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of one protobuf message; varints as int, length-delimited/fixed as bytes."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            yield field, value
        elif wire == 2:
            size, pos = _varint(buf, pos)
            if pos + size > len(buf):
                raise ValueError("truncated length-delimited field")
            yield field, buf[pos : pos + size]
            pos += size
        elif wire == 1:
            yield field, buf[pos : pos + 8]
            pos += 8
        elif wire == 5:
            yield field, buf[pos : pos + 4]
            pos += 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")


def read_normalizer_settings(model_proto: bytes) -> NormalizerSettings:
    """Read ModelProto.normalizer_spec (field 3): name (1), add_dummy_prefix (3), remove_extra_whitespaces (4),
    escape_whitespaces (5), as in sentencepiece_model.proto."""
    settings: dict[str, Any] = {}
    for field, value in _fields(model_proto):
        if field == 3 and isinstance(value, bytes):
            for sub, sub_value in _fields(value):
                if sub == 1 and isinstance(sub_value, bytes):
                    settings["name"] = sub_value.decode("utf-8", "replace")
                elif sub == 3 and isinstance(sub_value, int):
                    settings["add_dummy_prefix"] = bool(sub_value)
                elif sub == 4 and isinstance(sub_value, int):
                    settings["remove_extra_whitespaces"] = bool(sub_value)
                elif sub == 5 and isinstance(sub_value, int):
                    settings["escape_whitespaces"] = bool(sub_value)
    return NormalizerSettings(**settings)


class SentencePieceTokenizer(Tokenizer):
    """A `sentencepiece.SentencePieceProcessor` behind the Tokenizer interface."""

    def __init__(self, processor: Any, *, name: str, model_proto: bytes | None = None) -> None:
        self._sp = processor
        proto = model_proto if model_proto is not None else processor.serialized_model_proto()
        try:
            self.normalizer = read_normalizer_settings(proto)
        except ValueError as exc:
            raise TokenizerError(f"cannot read the normalizer spec of SentencePiece model {name!r}: {exc}") from exc
        lossy = self.normalizer.name not in ("identity", "") or self.normalizer.remove_extra_whitespaces
        super().__init__(
            name=name,
            family="sentencepiece",
            vocab_size=int(processor.get_piece_size()),
            dummy_prefix=self.normalizer.add_dummy_prefix,
            lossy=lossy,
        )

    def _encode(self, text: str) -> list[int]:
        ids: list[int] = self._sp.encode(text, out_type=int, add_bos=False, add_eos=False)
        return ids

    def encode_batch(self, texts: Iterable[str]) -> list[np.ndarray]:
        batch = [check_text(t) for t in texts]
        out = self._sp.encode(batch, out_type=int, add_bos=False, add_eos=False)
        return [np.asarray(ids, dtype=np.int64) for ids in out]

    def _compute_all_token_bytes(self) -> list[bytes | None]:
        sp = self._sp
        ids = list(range(self.vocab_size))
        pieces: list[str] = sp.id_to_piece(ids)
        escape = self.normalizer.escape_whitespaces
        table: list[bytes | None] = []
        for i, piece in enumerate(pieces):
            if sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i):
                table.append(None)
            elif sp.is_byte(i):  # "<0xNN>"
                table.append(bytes([int(piece[3:5], 16)]))
            else:
                table.append((piece.replace(_SPACE_MARK, " ") if escape else piece).encode("utf-8"))
        return table


def load_sentencepiece_path(path: Path, *, name: str | None = None) -> SentencePieceTokenizer:
    """A SentencePiece `.model` file; a missing or corrupt file raises TokenizerError naming it."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TokenizerError(
            f"SentencePiece model {str(path)!r} does not exist; pass the path of a .model file"
        ) from None
    except OSError as exc:
        raise TokenizerError(f"cannot read SentencePiece model {str(path)!r}: {exc}") from exc
    return load_sentencepiece_bytes(data, name=name or path.stem, source=repr(str(path)))


def load_sentencepiece_bytes(data: bytes, *, name: str, source: str) -> SentencePieceTokenizer:
    """A SentencePiece model from its serialized ModelProto; `source` is named in errors."""
    import sentencepiece as spm

    try:
        processor = spm.SentencePieceProcessor(model_proto=data)
        if processor.get_piece_size() <= 0:
            raise RuntimeError("the model has no pieces")
    except (RuntimeError, OSError, ValueError, TypeError) as exc:
        raise TokenizerError(
            f"{source} is not a valid SentencePiece model (expected a serialized ModelProto .model file): "
            f"{str(exc).strip()[:200]}. Fix: pass a real .model file (e.g. tokenizer.model from the model's repo)"
        ) from exc
    return SentencePieceTokenizer(processor, name=name, model_proto=data)
