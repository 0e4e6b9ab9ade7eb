"""polymem.corpus: every input kind, and every kind of bad input recorded (never raised mid-stream)."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import signal
import socket
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polymem.corpus import Corpus, Document, as_documents, iter_documents
from polymem.errors import PolymemError


def texts(corpus: Corpus) -> list[str]:
    return [d.text for d in corpus]


def reasons(corpus: Corpus) -> dict[str, str]:
    return {Path(s.source).name: s.reason for s in corpus.skipped}


# ------------------------------------------------------------------------------------------------ good input
def test_text_markdown_and_explicit_other_suffix_are_one_document_each(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("alpha\nbeta\n", encoding="utf-8")
    (tmp_path / "b.md").write_text("# title\n", encoding="utf-8")
    (tmp_path / "c.rst").write_text("gamma", encoding="utf-8")
    c = Corpus([tmp_path / "a.txt", tmp_path / "b.md", tmp_path / "c.rst"])
    docs = list(c)
    assert [d.text for d in docs] == ["alpha\nbeta\n", "# title\n", "gamma"]
    assert docs[0].id == str(tmp_path / "a.txt") and docs[0].nbytes == 11
    assert c.skipped == [] and c.replaced == 0


def test_jsonl_one_document_per_line_with_ids_and_text_field(tmp_path: Path) -> None:
    p = tmp_path / "d.jsonl"
    p.write_text(
        json.dumps({"id": "first", "body": "one"}) + "\n\n" + json.dumps({"body": "two"}) + "\n", encoding="utf-8"
    )
    docs = list(Corpus([p], text_field="body"))
    assert [(d.id, d.text) for d in docs] == [("first", "one"), (f"{p}:3", "two")]


def test_gzip_of_text_and_jsonl(tmp_path: Path) -> None:
    with gzip.open(tmp_path / "a.txt.gz", "wt", encoding="utf-8") as f:
        f.write("zipped text")
    with gzip.open(tmp_path / "b.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write(json.dumps({"text": "x1"}) + "\n" + json.dumps({"text": "x2"}) + "\n")
    assert texts(Corpus([tmp_path])) == ["zipped text", "x1", "x2"]


def test_directory_is_recursive_sorted_and_passes_over_hidden_and_other_files(tmp_path: Path) -> None:
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    (tmp_path / ".git").mkdir()
    (tmp_path / "b.txt").write_text("B", encoding="utf-8")
    (tmp_path / "a.txt").write_text("A", encoding="utf-8")
    (tmp_path / "sub" / "deeper" / "c.md").write_text("C", encoding="utf-8")
    (tmp_path / ".git" / "x.txt").write_text("hidden", encoding="utf-8")
    (tmp_path / ".hidden.txt").write_text("hidden", encoding="utf-8")
    (tmp_path / "image.png").write_bytes(b"\x89PNG\r\n")
    c = Corpus([tmp_path])
    assert texts(c) == ["A", "B", "C"]
    assert c.ignored_files == 1 and c.skipped == []


def test_stdin_as_text_and_as_jsonl() -> None:
    c = Corpus(["-"], stdin=io.BytesIO("from a pipe ü".encode()))
    assert [(d.id, d.text) for d in c] == [("<stdin>", "from a pipe ü")]
    lines = (json.dumps({"text": "l1"}) + "\n" + json.dumps({"text": "l2"}) + "\n").encode()
    assert texts(Corpus(["-"], stdin=io.BytesIO(lines), stdin_format="jsonl")) == ["l1", "l2"]


def test_iter_documents_and_as_documents(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("A", encoding="utf-8")
    (tmp_path / "e.txt").write_text("", encoding="utf-8")
    skipped: list = []
    assert [d.text for d in iter_documents(tmp_path, skipped=skipped)] == ["A"]
    assert [s.reason for s in skipped] == ["empty document: no text"]
    docs = list(as_documents(["x", Document(id="k", text="y", source="s")]))
    assert [(d.id, d.text) for d in docs] == [("doc 0", "x"), ("k", "y")]
    with pytest.raises(PolymemError, match="text 1 is a bytes"):
        list(as_documents(["x", b"y"]))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), min_size=1),
                min_size=1, max_size=5))
def test_every_format_round_trips_any_text_without_nul(tmp_path_factory: pytest.TempPathFactory, items: list[str]) -> None:
    d = tmp_path_factory.mktemp("rt")
    (d / "all.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in items), encoding="utf-8")
    with gzip.open(d / "all.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in items))
    (d / "one.txt").write_bytes(items[0].encode("utf-8"))
    got = texts(Corpus([d / "all.jsonl", d / "all.jsonl.gz", d / "one.txt"]))
    assert got == items + items + [items[0]]


# ------------------------------------------------------------------------------------------------ bad input
def test_binary_files_are_skipped_with_the_reason(tmp_path: Path) -> None:
    (tmp_path / "bin.txt").write_bytes(b"ab\x00cd" * 10)
    (tmp_path / "bin.jsonl").write_bytes(b"\x00\x01\x02")
    (tmp_path / "ok.txt").write_text("fine", encoding="utf-8")
    c = Corpus([tmp_path])
    assert texts(c) == ["fine"]
    r = reasons(c)
    assert r["bin.txt"].startswith("binary file: NUL byte at offset 2")
    assert r["bin.jsonl"].startswith("binary file")


def test_invalid_utf8_is_replaced_and_counted_or_skipped(tmp_path: Path) -> None:
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1"))
    (tmp_path / "lines.jsonl").write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    c = Corpus([tmp_path])
    got = texts(c)
    assert got == ["caf\ufffd", "ok", "caf\ufffd"]
    assert c.replaced == 2 and c.skipped == []
    s = Corpus([tmp_path], invalid_utf8="skip")
    assert texts(s) == ["ok"]
    assert sorted(x.reason.split(":")[0] for x in s.skipped) == ["invalid UTF-8", "invalid UTF-8"]
    assert s.skipped_by_reason() == {"invalid UTF-8": 2}


def test_json_lone_surrogates_are_treated_as_invalid_utf8(tmp_path: Path) -> None:
    (tmp_path / "s.jsonl").write_text('{"text": "a\\ud800b"}\n', encoding="utf-8")
    c = Corpus([tmp_path / "s.jsonl"])
    assert texts(c) == ["a?b"] and c.replaced == 1
    s = Corpus([tmp_path / "s.jsonl"], invalid_utf8="skip")
    assert texts(s) == [] and "lone surrogate U+D800" in s.skipped[0].reason


def test_bad_jsonl_lines_are_skipped_one_by_one(tmp_path: Path) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_text("\n".join([
        '{"text": "good"}', "not json", "[1, 2]", '{"body": "no text field"}', '{"text": 7}', '{"text": ""}',
    ]) + "\n", encoding="utf-8")
    c = Corpus([p])
    assert texts(c) == ["good"]
    got = [(s.source.rsplit(":", 1)[1], s.reason) for s in c.skipped]
    assert got[0] == ("2", "invalid JSON: Expecting value at column 1")
    assert got[1] == ("3", 'not a JSON object: got an array; expected {"text": ...}')
    assert got[2][1] == "no 'text' field: the object has body; choose the field with --text-field"
    assert got[3][1] == "field 'text' holds a number, expected a string"
    assert got[4][1] == "empty document: no text"


def test_unreadable_files_are_skipped(tmp_path: Path) -> None:
    (tmp_path / "dangling.txt").symlink_to(tmp_path / "nowhere.txt")
    (tmp_path / "corrupt.txt.gz").write_bytes(b"\x1f\x8b\x08\x00garbage-not-deflate")
    good = gzip.compress(b"truncated gzip stream " * 100)
    (tmp_path / "truncated.txt.gz").write_bytes(good[: len(good) // 2])
    (tmp_path / "ok.md").write_text("fine", encoding="utf-8")
    c = Corpus([tmp_path])
    assert texts(c) == ["fine"]
    r = reasons(c)
    assert r["dangling.txt"].startswith("unreadable file")
    assert r["corrupt.txt.gz"].startswith("corrupt gzip")
    assert r["truncated.txt.gz"].startswith("corrupt gzip")


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads files whatever their mode")
def test_permission_denied_is_skipped(tmp_path: Path) -> None:
    p = tmp_path / "secret.txt"
    p.write_text("x", encoding="utf-8")
    p.chmod(0)
    c = Corpus([p])
    assert texts(c) == [] and c.skipped[0].reason.startswith("unreadable file")


def test_user_errors_raise_up_front(tmp_path: Path) -> None:
    with pytest.raises(PolymemError, match=r"input path '.*missing.txt' does not exist"):
        Corpus([tmp_path / "missing.txt"])
    with pytest.raises(PolymemError, match="no input paths"):
        Corpus([])
    with pytest.raises(PolymemError, match="invalid_utf8='ignore' is not a policy; accepted: replace, skip"):
        Corpus(["-"], invalid_utf8="ignore")
    with pytest.raises(PolymemError, match="stdin was given|more than once"):
        Corpus(["-", "-"])
    with pytest.raises(PolymemError, match="stdin_format"):
        Corpus(["-"], stdin_format="csv")


# ------------------------------------------------------------------------------------------------ special files
class _Hung(Exception):
    pass


@contextlib.contextmanager
def _hang_guard(seconds: int = 20):
    """Turn a read that blocks forever (the bug) into a test failure instead of a hung suite."""

    def on_alarm(signum, frame):  # noqa: ARG001 - signal handler signature
        raise _Hung(f"reading the corpus blocked for {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX FIFOs")
def test_fifos_sockets_and_devices_are_skipped_without_blocking(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("alpha", encoding="utf-8")
    os.mkfifo(tmp_path / "feed.txt")  # nobody ever writes to it: opening it for reading would block forever
    os.mkfifo(tmp_path / "stream.jsonl.gz")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock.md"))
    (tmp_path / "link.txt").symlink_to(tmp_path / "feed.txt")  # a symlink is judged by what it points to
    os.mkfifo(tmp_path / "named.fifo")
    try:
        with _hang_guard():
            c = Corpus([tmp_path, tmp_path / "named.fifo", "/dev/null"])
            assert texts(c) == ["alpha"]
    finally:
        sock.close()
    r = {s.source: s.reason for s in c.skipped}
    assert set(r) == {str(tmp_path / n) for n in ("feed.txt", "stream.jsonl.gz", "sock.md", "link.txt", "named.fifo")} | {
        "/dev/null"}
    assert r[str(tmp_path / "feed.txt")].startswith("not a regular file: a FIFO (named pipe)")
    assert r[str(tmp_path / "link.txt")].startswith("not a regular file: a FIFO (named pipe)")
    assert r[str(tmp_path / "sock.md")].startswith("not a regular file: a socket")
    assert r["/dev/null"].startswith("not a regular file: a character device")
    assert "pipe its output to stdin" in r[str(tmp_path / "named.fifo")]
    assert c.skipped_by_reason() == {"not a regular file": 6}


# ------------------------------------------------------------------------------------------------ truncation
def test_truncated_jsonl_gz_says_how_much_of_it_was_used(tmp_path: Path) -> None:
    lines = [json.dumps({"text": f"document number {i} " + "x" * (i % 7)}) + "\n" for i in range(2000)]
    whole = gzip.compress("".join(lines).encode("utf-8"), mtime=0)
    (tmp_path / "cut.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    c = Corpus([tmp_path / "cut.jsonl.gz"])
    got = texts(c)
    assert 0 < len(got) < 2000
    assert got == [json.loads(x)["text"] for x in lines[: len(got)]]  # a prefix, in order, nothing invented
    (s,) = c.skipped
    used_bytes = sum(len(x.encode("utf-8")) for x in lines[: len(got)])
    assert s.reason.startswith("corrupt gzip: ")
    assert f"the first {len(got)} documents (lines 1-{len(got)}, {used_bytes:,} bytes) were used" in s.reason
    assert (s.documents_used, s.bytes_used) == (len(got), used_bytes)


def test_truncated_text_gz_says_nothing_of_it_was_used(tmp_path: Path) -> None:
    whole = gzip.compress(b"one text document " * 500, mtime=0)
    (tmp_path / "cut.txt.gz").write_bytes(whole[: len(whole) // 2])
    c = Corpus([tmp_path / "cut.txt.gz"])
    assert texts(c) == []
    (s,) = c.skipped
    assert s.reason.startswith("corrupt gzip: ") and "nothing of it was used" in s.reason
    assert (s.documents_used, s.bytes_used) == (0, 0)


@pytest.mark.slow  # a local Dask cluster: ~25 s
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX FIFOs")
def test_fifo_and_truncated_gz_in_a_partitioned_run(tmp_path: Path) -> None:
    """The same skips, and the same counted prefix, when files are read by Dask tasks (coverage --workers 2)."""
    pytest.importorskip("distributed")
    import polymem

    (tmp_path / "a.txt").write_text("hello world text", encoding="utf-8")
    os.mkfifo(tmp_path / "f.txt")
    lines = "".join(json.dumps({"text": f"doc {i} " + "x" * (i % 7)}) + "\n" for i in range(2000)).encode()
    whole = gzip.compress(lines, mtime=0)
    (tmp_path / "cut.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    reports = []
    with _hang_guard(120):
        for workers in (1, 2):
            reports.append(polymem.coverage("bytes", "bytes", Corpus([tmp_path]), max_n=2, workers=workers))
    one, two = reports
    assert one.docs == two.docs and 1 < one.docs < 2001
    for r in reports:
        reasons = {Path(s["source"]).name: s["reason"] for s in r.skipped}
        assert reasons["f.txt"].startswith("not a regular file: a FIFO")
        assert f"the first {one.docs - 1} documents" in reasons["cut.jsonl.gz"]
