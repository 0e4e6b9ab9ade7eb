"""Hostile .tiktoken files: a clear TokenizerError before tiktoken's Rust code can panic.

A pyo3 PanicException is a BaseException: it escapes `except Exception`, so a bad file would kill a coverage
run mid-corpus. Every case below panicked (at load or at the first encode) before the checks existed.
"""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from polymem import coverage
from polymem.corpus import Document
from polymem.errors import TokenizerError
from polymem.tokenizers import load_tokenizer
from polymem.tokenizers.tiktoken_adapter import TiktokenTokenizer

BYTES = [(bytes([i]), i) for i in range(256)]


def write(path: Path, ranks: list[tuple[bytes, int]]) -> Path:
    path.write_bytes(b"".join(base64.b64encode(t) + b" " + str(r).encode() + b"\n" for t, r in ranks))
    return path


def test_a_good_small_file_loads_and_encodes(tmp_path: Path) -> None:
    tok = load_tokenizer(write(tmp_path / "ok.tiktoken", BYTES + [(b"he", 256), (b"ll", 257)]))
    assert tok.vocab_size == 258 and list(tok.encode("hello")) == [256, 257, ord("o")]


def test_duplicate_rank_is_an_error_naming_both_lines(tmp_path: Path) -> None:
    p = write(tmp_path / "dup.tiktoken", BYTES + [(b"ab", 256), (b"cd", 256)])
    with pytest.raises(TokenizerError, match=r"dup\.tiktoken.*rank 256 is given twice: line 257 \(b'ab'\) and "
                                             r"line 258 \(b'cd'\).*each rank once"):
        load_tokenizer(p)


def test_duplicate_token_is_an_error(tmp_path: Path) -> None:
    p = write(tmp_path / "twice.tiktoken", BYTES + [(b"ab", 256), (b"ab", 257)])
    with pytest.raises(TokenizerError, match=r"token b'ab' is given twice: line 257 \(rank 256\) and line 258"):
        load_tokenizer(p)


def test_missing_byte_tokens_are_an_error_listing_them(tmp_path: Path) -> None:
    ranks = [(t, i) for i, (t, _) in enumerate(x for x in BYTES if x[0] not in (b"e", b"\x80"))]
    p = write(tmp_path / "holes.tiktoken", ranks + [(b"he", 254)])
    with pytest.raises(TokenizerError, match=r"lacks 2 of the 256 single-byte tokens \(0x65 'e', 0x80\).*"
                                             r"every byte"):
        load_tokenizer(p)


@pytest.mark.parametrize("rank,why", [(-1, "negative"), (2**32, "at most"), (10**9, "holes")])
def test_impossible_ranks_are_errors(tmp_path: Path, rank: int, why: str) -> None:
    p = write(tmp_path / "r.tiktoken", BYTES + [(b"ab", rank)])
    with pytest.raises(TokenizerError, match=why):
        load_tokenizer(p)


def test_a_panicking_encoding_never_escapes_mid_corpus() -> None:
    """An Encoding built in code (no file check) that lacks byte 'e': encode raises TokenizerError, and coverage
    skips that document and goes on instead of dying with a PanicException."""
    import tiktoken

    ranks = {t: i for i, (t, _) in enumerate(x for x in BYTES if x[0] != b"e")}
    enc = tiktoken.Encoding(name="holes", pat_str=r"\S+|\s+", mergeable_ranks=ranks, special_tokens={})
    tok = TiktokenTokenizer(enc)
    with pytest.raises(TokenizerError, match=r"tokenizer 'holes' failed inside its Rust core \(a panic: no entry found"):
        tok.encode("text with an e")
    assert list(tok.encode("abc")) == [ord("a"), ord("b"), ord("c")]
    docs = [Document(id="a", text="abc dog", source="a"), Document(id="b", text="the end", source="b"),
            Document(id="c", text="cat", source="c")]
    rep = coverage(tok, "bytes", docs, max_n=2)
    assert rep.docs == 2
    assert [s["source"] for s in rep.skipped] == ["b"] and "tokenizer error" in rep.skipped[0]["reason"]
