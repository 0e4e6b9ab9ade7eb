"""Hostile and careless inputs: tokenizer files, token caches, corpus files, globs and partition sizes whose
numbers would size an allocation or a plan, or whose shape would stop a run. Every file is made here, in
tmp_path; huge sizes are sparse files (os.truncate) or crafted headers, never real allocations (tracemalloc)."""

from __future__ import annotations

import gzip
import io
import json
import os
import tracemalloc
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.lib import format as npformat

import polymem
from polymem.corpus import Corpus
from polymem.errors import FormatError, PolymemError, TokenizerError
from polymem.hash.token_hashes import TokenHashes
from polymem.sources import MAX_DOCUMENT_BYTES
from polymem.tokenizers import load_tokenizer

MiB = 1 << 20


def _peak(fn: Callable[[], Any]) -> tuple[Any, int]:
    """(what fn returned or raised, peak bytes traced while it ran)."""
    tracemalloc.start()
    try:
        try:
            out: Any = fn()
        except Exception as e:  # noqa: BLE001 - returned for the test to check
            out = e
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _main(args: list[str], capsys: Any, monkeypatch: Any) -> tuple[int, str]:
    """The console entry point (what the `polymem` script runs): exit code and stderr, as one line."""
    from polymem.cli.app import main

    monkeypatch.setattr("sys.argv", ["polymem", *args])
    with pytest.raises(SystemExit) as e:
        main()
    return e.value.code, " ".join(capsys.readouterr().err.split())


def _docs(corpus: Corpus) -> list[str]:
    return [d.text for d in corpus]


def _part_docs(corpus: Corpus, partition_mb: float) -> tuple[list[str], list[Any]]:
    skipped: list[Any] = []
    return [d.text for p in corpus.partitions(partition_mb) for d in p.read(skipped)], skipped


# ------------------------------------------------------------------------------------------ tokenizer files
def _added(id_: int) -> dict[str, Any]:
    return {"id": id_, "content": f"<x{id_}>", "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True}


def _tokenizer_json(vocab: dict[str, int], added: list[dict[str, Any]] | None = None) -> str:
    return json.dumps({"version": "1.0", "truncation": None, "padding": None, "added_tokens": added or [],
                       "normalizer": None, "pre_tokenizer": None, "post_processor": None, "decoder": None,
                       "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "a"}})


def test_a_tokenizer_json_with_a_huge_id_is_refused_before_allocating(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text(_tokenizer_json({"a": 0, "b": 1}), encoding="utf-8")
    assert load_tokenizer(path).vocab_size == 2  # (its imports, before tracing)
    path.write_text(_tokenizer_json({"a": 0, "b": 4_000_000_000}), encoding="utf-8")
    assert path.stat().st_size < 300  # a few bytes ask for a table of 4e9 entries
    err, peak = _peak(lambda: load_tokenizer(path))
    assert isinstance(err, TokenizerError), err
    msg = str(err)
    assert "\n" not in msg and str(path) in msg
    assert "declares token id 4,000,000,000 but has 2 distinct ids; ids must lie in 0..1,027" in msg
    assert "at most 16,777,215" in msg and "Fix: pass the complete, unedited tokenizer.json" in msg
    assert peak < MiB


def test_sparse_tokenizer_ids_are_refused_and_a_small_gap_is_not(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text(_tokenizer_json({"a": 0, "b": 1}, [_added(5000)]))
    with pytest.raises(TokenizerError, match=r"declares token id 5,000 but has 3 distinct ids"):
        load_tokenizer(path)
    path.write_text(_tokenizer_json({"a": 0, "b": 1}, [_added(40)]))
    tok = load_tokenizer(path)  # padding ids (holes) within the slack stay accepted
    assert tok.vocab_size == 41 and tok.token_bytes(40) is None and tok.token_bytes(1) == b"b"


# ------------------------------------------------------------------------------------------ token caches
def _rewrite_cache(src: Path, dst: Path, **members: bytes | np.ndarray) -> Path:
    """A copy of cache ``src`` with some members replaced: an array (saved as .npy) or raw .npy bytes."""
    with zipfile.ZipFile(src) as z, zipfile.ZipFile(dst, "w") as out:
        for name in z.namelist():
            new = members.get(name[: -len(".npy")])
            if isinstance(new, np.ndarray):
                buf = io.BytesIO()
                np.save(buf, new, allow_pickle=False)
                new = buf.getvalue()
            out.writestr(name, z.read(name) if new is None else new)
    return dst


def _npy_header_only(shape: tuple[int, ...], dtype: str) -> bytes:
    """A .npy member whose header claims ``shape`` but that holds 64 bytes of data."""
    buf = io.BytesIO()
    npformat.write_array_header_1_0(buf, {"descr": dtype, "fortran_order": False, "shape": shape})
    return buf.getvalue() + bytes(64)


@pytest.fixture
def bytes_cache(tmp_path: Path, raw_bytes) -> Path:
    return TokenHashes.build(raw_bytes).save(tmp_path / "bytes.npz")


@pytest.mark.parametrize("member", ["C", "powers"])
def test_a_token_cache_whose_shapes_claim_gibs_is_refused_before_decompressing(
        tmp_path: Path, bytes_cache: Path, member: str) -> None:
    bomb = _rewrite_cache(bytes_cache, tmp_path / "bomb.npz", **{member: _npy_header_only((2**31,), "<u8")})
    assert bomb.stat().st_size < 20_000  # a few KB that claim 16 GiB
    err, peak = _peak(lambda: TokenHashes.load(bomb))
    assert isinstance(err, FormatError), err
    assert (f"array {member!r} is uint64 of shape (2147483648,); expected a 1-D uint64 array of at most "
            "16,777,216 entries") in str(err) and "rebuild it" in str(err)
    assert peak < MiB


@pytest.mark.parametrize(("member", "dtype"), [("C", np.float64), ("L", np.int64), ("special", np.uint8)])
def test_a_token_cache_with_other_dtypes_is_refused(tmp_path: Path, bytes_cache: Path, member: str, dtype: Any
                                                    ) -> None:
    arr = np.load(bytes_cache)[member].astype(dtype)  # the same values, another dtype: loaded silently before
    other = _rewrite_cache(bytes_cache, tmp_path / "other.npz", **{member: arr})
    with pytest.raises(FormatError, match=rf"array '{member}' is {np.dtype(dtype)} of shape \(256,\); expected a "
                                          r"1-D \w+ array"):
        TokenHashes.load(other)


def test_a_token_cache_with_altered_values_is_refused(tmp_path: Path, bytes_cache: Path, raw_bytes) -> None:
    z = np.load(bytes_cache)
    C, L, special = z["C"].copy(), z["L"].copy(), z["special"].copy()
    C[65] ^= np.uint64(1)  # one hash changed; the zip's CRC recomputed, as any tool rewriting the file does
    altered = _rewrite_cache(bytes_cache, tmp_path / "c.npz", C=C)
    with pytest.raises(FormatError, match=r"1 of its 256 values of C differ from those of tokenizer 'bytes' under "
                                          r"the cache's spec \(first at id 65\); the file was changed after it was "
                                          r"built\. Rebuild it"):
        TokenHashes.load(altered, tokenizer=raw_bytes)
    assert TokenHashes.load(altered).C[65] == C[65]  # without the tokenizer only what follows from the file is checked
    L[66] = 0  # a length that its P does not follow
    with pytest.raises(FormatError, match=r"P is not base\^L; its values were changed"):
        TokenHashes.load(_rewrite_cache(bytes_cache, tmp_path / "l.npz", L=L))
    special[67] = True
    with pytest.raises(FormatError, match=r"special ids have a non-zero hash or length"):
        TokenHashes.load(_rewrite_cache(bytes_cache, tmp_path / "s.npz", special=special))


def test_a_token_cache_header_without_its_fields_is_a_format_error(tmp_path: Path, bytes_cache: Path) -> None:
    header = json.loads(np.load(bytes_cache)["header"].tobytes())
    for drop, expect in (("vocab_size", r"without a valid 'vocab_size' field"),
                         ("tokenizer", r"without the tokenizer's name and fingerprint"),
                         ("spec", r"without a valid 'spec' field")):
        bad = np.frombuffer(json.dumps({k: v for k, v in header.items() if k != drop}).encode(), dtype=np.uint8)
        with pytest.raises(FormatError, match=expect):
            TokenHashes.load(_rewrite_cache(bytes_cache, tmp_path / f"no-{drop}.npz", header=bad))


# ------------------------------------------------------------------------------------------ corpus files
def _sparse(path: Path, size: int, head: bytes = b"", tail: bytes = b"") -> Path:
    """``head``, then zeros up to ``size`` bytes (a hole: no disk, no memory), then ``tail``."""
    path.write_bytes(head)
    os.truncate(path, size)
    with open(path, "ab") as f:
        f.write(tail)
    return path


def test_a_binary_file_is_judged_from_a_bounded_peek(tmp_path: Path) -> None:
    p = _sparse(tmp_path / "zeros.txt", 64 * MiB)
    c = Corpus([p])
    docs, peak = _peak(lambda: _docs(c))
    assert docs == [] and [s.reason for s in c.skipped] == ["binary file: NUL byte at offset 0; expected UTF-8 text"]
    assert peak < MiB  # before: the whole 64 MiB file was read first


def test_a_document_over_the_size_bound_is_skipped_in_bounded_memory(tmp_path: Path) -> None:
    head = b'{"text": "before"}\n' * 500 + b'{"text": "'
    p = _sparse(tmp_path / "long.jsonl", 64 * MiB, head, b'"}\n{"text": "after"}\n')
    c = Corpus([p])
    docs, peak = _peak(lambda: _docs(c))
    assert docs == ["before"] * 500 + ["after"]
    line = 64 * MiB - len(head) + len(b'{"text": "') + len(b'"}\n')
    assert [(s.source, s.reason) for s in c.skipped] == [(f"{p}:501", (
        f"document too large: a line of {line:,} bytes; documents are at most {MAX_DOCUMENT_BYTES:,} bytes "
        "(max_document_bytes), so it was left out. Split it into smaller documents, or raise the bound"))]
    assert c.skipped_by_reason() == {"document too large": 1}
    assert peak < 2 * MAX_DOCUMENT_BYTES + 4 * MiB  # before: the 64 MiB line, then its str and JSON copies
    # in byte ranges (a range may start inside the long line): the same documents, the same one skipped
    docs, skipped = _part_docs(Corpus([p], max_document_bytes=MiB), 4.0)
    assert docs == ["before"] * 500 + ["after"] and [s.reason.split(":")[0] for s in skipped] == [
        "document too large"]


def test_text_gzip_and_parquet_documents_over_the_bound_are_skipped(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "small.txt").write_text("fits", encoding="utf-8")
    _sparse(tmp_path / "big.txt", 3 * MiB, b"text " * 2000)
    (tmp_path / "big.txt.gz").write_bytes(gzip.compress(b"x" * (3 * MiB)))
    pq.write_table(pa.table({"text": ["short", "y" * (2 * MiB)]}), tmp_path / "rows.parquet")
    c = Corpus([tmp_path], max_document_bytes=MiB)
    assert sorted(_docs(c)) == ["fits", "short"]
    assert sorted(s.source for s in c.skipped) == sorted(
        [str(tmp_path / "big.txt"), str(tmp_path / "big.txt.gz"), f"{tmp_path / 'rows.parquet'}#1"])
    assert c.skipped_by_reason() == {"document too large": 3}
    with pytest.raises(PolymemError, match=r"max_document_bytes=0 must be a positive integer"):
        Corpus([tmp_path], max_document_bytes=0)


def test_json_lines_nested_too_deep_or_with_huge_integers_are_skipped_lines(tmp_path: Path) -> None:
    p = tmp_path / "hostile.jsonl"
    p.write_text('{"text": "one"}\n' + "[" * 100_000 + "]" * 100_000 + "\n" + '{"text": "x", "n": ' + "9" * 5000
                 + "}\n" + '{"text": "two"}\n', encoding="utf-8")
    for docs, skipped in ((_docs(c := Corpus([p])), c.skipped), _part_docs(Corpus([p]), 0.05)):
        assert docs == ["one", "two"]
        reasons = [s.reason for s in skipped]
        assert reasons[0].startswith("invalid JSON: nested deeper than Python's limit (")
        assert reasons[1].startswith("invalid JSON: Exceeds the limit (4300 digits) for integer string conversion")
        assert all("\n" not in r for r in reasons) and len(reasons) == 2


def _broken_parquets(tmp_path: Path) -> list[Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"text": [f"row {i}" for i in range(300)]}), good, row_group_size=100)
    data = good.read_bytes()
    (tmp_path / "truncated.parquet").write_bytes(data[: len(data) // 2])
    (tmp_path / "not.parquet").write_bytes(b"PAR1 this is not a parquet file")
    return [tmp_path / "truncated.parquet", tmp_path / "not.parquet"]


def test_a_truncated_or_non_parquet_file_is_skipped_with_one_line(tmp_path: Path, capsys, monkeypatch) -> None:
    broken = _broken_parquets(tmp_path)
    for reader in (lambda c: (_docs(c), c.skipped), lambda c: _part_docs(c, 1.0)):
        docs, skipped = reader(Corpus([tmp_path]))
        assert len(docs) == 300
        assert sorted(s.source for s in skipped) == sorted(map(str, broken))
        assert all(s.reason.startswith("unreadable Parquet file: ArrowInvalid: ") and "\n" not in s.reason
                   for s in skipped)
    code, err = _main(["coverage", str(broken[0]), "-t", "bytes", "-r", "bytes", "-q", "--workers", "2"], capsys,
                      monkeypatch)
    assert code == 2 and err.startswith("error: empty corpus") and "unreadable Parquet file: ArrowInvalid" in err


# ------------------------------------------------------------------------------------------ globs and walks
@pytest.fixture
def looped(tmp_path: Path) -> Path:
    """a.txt, sub/b.txt, a link to a.txt, and sub/up -> .. (a loop)."""
    root = tmp_path / "corpus"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("alpha", encoding="utf-8")
    (root / "sub" / "b.txt").write_text("beta", encoding="utf-8")
    (root / "alias.txt").symlink_to(root / "a.txt")
    (root / "sub" / "up").symlink_to(root)
    return root


@pytest.mark.parametrize("pattern", ["**/*.txt", "**", "*/**/*.txt"])
def test_a_recursive_glob_does_not_follow_link_loops_or_count_a_file_twice(looped: Path, pattern: str) -> None:
    base = looped if pattern != "*/**/*.txt" else looped.parent
    c = Corpus([str(base / pattern)])
    assert sorted(_docs(c)) == ["alpha", "beta"]  # before: each document 41 times (or 82 with the alias)
    assert sorted(_part_docs(Corpus([str(base / pattern)]), 1.0)[0]) == ["alpha", "beta"]


def test_a_file_named_twice_or_through_a_link_is_read_once(looped: Path) -> None:
    named = [looped, looped / "a.txt", looped / "alias.txt", looped / "sub", f"file://{looped}/**"]
    assert sorted(_docs(Corpus(named))) == ["alpha", "beta"]
    assert sorted(_part_docs(Corpus(named), 1.0)[0]) == ["alpha", "beta"]


# ------------------------------------------------------------------------------------------ partition sizes
def test_a_partition_size_that_would_make_millions_of_partitions_is_refused(tmp_path: Path) -> None:
    p = _sparse(tmp_path / "big.jsonl", 3 * 10**6)  # its size plans the partitions; it is never read
    err, peak = _peak(lambda: Corpus([p]).partitions(1e-6))
    assert isinstance(err, PolymemError), err
    assert str(err) == ("partitions of 1e-06 MB would cut the corpus (about 3.0 MB of text) into about 3,000,000 "
                        "partitions; at most 1,000,000 are allowed. Use partitions of at least 0.001 MB "
                        "(--partition-mb / partition_mb), e.g. the default")
    assert peak < MiB
    assert len(Corpus([p]).partitions(0.001)) == 3000  # the size it names is accepted


@pytest.mark.parametrize("value", ["inf", "1e-9", "0", "nan"])
def test_partition_mb_out_of_bounds_exits_2(tmp_path: Path, value: str, capsys, monkeypatch) -> None:
    p = _sparse(tmp_path / "big.jsonl", 3 * 10**6)
    code, err = _main(["coverage", str(p), "-t", "bytes", "-r", "bytes", "-q", "--partition-mb", value], capsys,
                      monkeypatch)
    assert code == 2 and err.startswith("error: partition")
    with pytest.raises(PolymemError, match="partition"):
        polymem.coverage("bytes", "bytes", Corpus([p]), max_n=2, partition_mb=float(value))


def test_every_command_globs_a_folder_of_link_loops_in_time(tmp_path: Path) -> None:
    """`c/**/*.jsonl` over c/loop -> ., c/sub/up -> .. and c/sub/cycle -> ../c, through the CLI: the corpus reader
    and the outputs-against-inputs check (which every command runs first) both stop at linked folders. Before, the
    check expanded the glob with glob.glob(recursive=True) and ran past 60 s."""
    import subprocess
    import sys

    c = tmp_path / "c"
    (c / "sub").mkdir(parents=True)
    (c / "doc.jsonl").write_text(json.dumps({"text": "one real document " * 20}) + "\n", encoding="utf-8")
    (c / "loop").symlink_to(".")
    (c / "sub" / "up").symlink_to("..")
    (c / "sub" / "cycle").symlink_to("../c")
    run = subprocess.run([sys.executable, "-m", "polymem.cli.app", "coverage", "-t", "bytes", "-r", "bytes",
                          "c/**/*.jsonl", "--max-n", "2", "--json", "cov.json"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads((tmp_path / "cov.json").read_text())["docs"] == 1
