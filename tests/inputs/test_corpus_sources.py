"""Corpus inputs beyond local .jsonl/.gz: .zst, Parquet, globs, fsspec URLs; partitions read the same documents
as iterating the corpus, whatever the partition size."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polymem.corpus import Corpus, Document, Skipped
from polymem.errors import PolymemError

zstandard = pytest.importorskip("zstandard")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def jsonl(docs: list[str], extra: list[str] = ()) -> bytes:  # type: ignore[assignment]
    lines = [json.dumps({"text": d}) for d in docs] + list(extra)
    return ("\n".join(lines) + "\n").encode()


def read_parts(corpus: Corpus, mb: float) -> tuple[list[str], list[Skipped], int]:
    parts = corpus.partitions(mb)
    texts: list[str] = []
    skipped: list[Skipped] = list(corpus.skipped)
    replaced = 0
    for p in parts:
        texts += [d.text for d in p.read(skipped)]
        replaced += p.replaced
    return texts, skipped, replaced


def read_iter(corpus: Corpus) -> tuple[list[str], list[Skipped], int]:
    texts = [d.text for d in corpus]
    return texts, list(corpus.skipped), corpus.replaced


DOCS = [f"document {i}: " + "word " * (i % 37) + "é\u4e2d" * (i % 5) for i in range(120)]


@pytest.fixture()
def mixed(tmp_path: Path) -> Path:
    d = tmp_path / "mixed"
    d.mkdir()
    bad = ["not json", json.dumps({"body": "no text field"}), "", json.dumps({"text": 3})]
    (d / "a.jsonl").write_bytes(jsonl(DOCS[:40], bad))
    (d / "b.jsonl.gz").write_bytes(gzip.compress(jsonl(DOCS[40:70]), mtime=0))
    (d / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(jsonl(DOCS[70:100])))
    table = pa.table({"id": list(range(100, 115)), "text": DOCS[100:115]})
    pq.write_table(table, d / "d.parquet", row_group_size=4)
    (d / "e.txt").write_text(DOCS[115], encoding="utf-8")
    (d / "f.md.zst").write_bytes(zstandard.ZstdCompressor().compress(DOCS[116].encode()))
    (d / "g.bin").write_bytes(b"\x00\x01")  # ignored in a directory
    (d / "h.jsonl").write_bytes(b"\xff\xfe" + jsonl(DOCS[117:120])[2:])  # invalid UTF-8 in the first line
    return d


def test_directory_reads_every_format(mixed: Path) -> None:
    c = Corpus([mixed])
    texts, skipped, replaced = read_iter(c)
    assert len(texts) == 119 - 1 + 1  # all of DOCS but the damaged first line of h.jsonl, which is replaced
    assert texts[:40] == DOCS[:40] and texts[40:100] == DOCS[40:100] and texts[100:115] == DOCS[100:115]
    assert texts[115:117] == DOCS[115:117]
    assert c.ignored_files == 1 and replaced == 0  # the damaged line is not JSON once its bytes are replaced
    reasons = [s.reason.split(":")[0] for s in skipped]
    assert reasons == ["invalid JSON", "no 'text' field", "field 'text' holds a number, expected a string",
                       "invalid JSON"]


@pytest.mark.parametrize("mb", [1e-6, 3e-4, 1e-3, 4e-3, 1.0])
def test_partitions_read_what_iteration_reads(mixed: Path, mb: float) -> None:
    c = Corpus([mixed])
    want = read_iter(c)
    got = read_parts(Corpus([mixed]), mb)
    assert got[0] == want[0]
    assert [s.reason for s in got[1]] == [s.reason for s in want[1]]
    assert got[2] == want[2]
    if mb < 1e-3:
        assert len(Corpus([mixed]).partitions(mb)) >= 10


@settings(max_examples=40, deadline=None)
@given(lines=st.lists(st.one_of(st.text(max_size=40).map(lambda t: json.dumps({"text": t})), st.just("")),
                      min_size=1, max_size=30),
       step=st.integers(min_value=1, max_value=300), comp=st.sampled_from(["", ".gz", ".zst"]),
       trailing=st.booleans())
def test_byte_ranges_cover_every_line_once(tmp_path_factory: pytest.TempPathFactory, lines: list[str], step: int,
                                           comp: str, trailing: bool) -> None:
    data = ("\n".join(lines) + ("\n" if trailing else "")).encode()
    if comp == ".gz":
        data = gzip.compress(data, mtime=0)
    elif comp == ".zst":
        data = zstandard.ZstdCompressor().compress(data)
    p = tmp_path_factory.mktemp("r") / f"x.jsonl{comp}"
    p.write_bytes(data)
    want = read_iter(Corpus([p]))
    got = read_parts(Corpus([p]), step / 1e6)
    assert got[0] == want[0] and len(got[1]) == len(want[1])


def test_globs_and_file_urls_read_the_same(mixed: Path) -> None:
    local = read_iter(Corpus([mixed / "*.jsonl*"]))
    assert local[0] == DOCS[:100] + [t for t in read_iter(Corpus([mixed / "h.jsonl"]))[0]]
    url = read_iter(Corpus([f"file://{mixed}/*.jsonl*"]))
    assert url[0] == local[0] and [s.reason for s in url[1]] == [s.reason for s in local[1]]
    assert all(s.source.startswith("file://") for s in url[1])
    assert read_iter(Corpus([f"file://{mixed}"]))[0] == read_iter(Corpus([mixed]))[0]


def test_a_glob_or_url_that_names_nothing_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(PolymemError, match=r"matches no file"):
        list(Corpus([str(tmp_path / "nothing-*.jsonl")]))
    with pytest.raises(PolymemError, match=r"matches no file"):
        list(Corpus([f"file://{tmp_path}/nothing-*.jsonl"]))
    with pytest.raises(PolymemError, match=r"does not exist"):
        list(Corpus([f"file://{tmp_path}/missing.jsonl"]))


def test_damaged_zst_and_parquet_are_skipped_not_fatal(tmp_path: Path) -> None:
    whole = zstandard.ZstdCompressor().compress(jsonl(DOCS[:50]))
    (tmp_path / "cut.jsonl.zst").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "junk.parquet").write_bytes(b"PAR1 not really")
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "nocol.parquet")
    c = Corpus([tmp_path])
    texts = [d.text for d in c]
    assert texts == DOCS[: len(texts)] and len(texts) < 50
    reasons = {Path(s.source).name: s.reason for s in c.skipped}
    assert reasons["cut.jsonl.zst"].startswith("corrupt zstd")
    assert reasons["junk.parquet"].startswith("unreadable Parquet file")
    assert reasons["nocol.parquet"] == "no 'text' column: the file has body; choose the column with --text-field"


def test_parquet_ids_and_bad_values(tmp_path: Path) -> None:
    pq.write_table(pa.table({"id": ["a", "b", "c"], "text": ["one", None, ""]}), tmp_path / "t.parquet")
    c = Corpus([tmp_path / "t.parquet"])
    docs = list(c)
    assert docs == [Document(id="a", text="one", source=f"{tmp_path / 't.parquet'}#0")]
    assert [s.reason for s in c.skipped] == ["column 'text' holds null, expected a string", "empty document: no text"]


def test_stdin_cannot_be_partitioned() -> None:
    with pytest.raises(PolymemError, match="stdin"):
        Corpus(["-"]).partitions(1.0)


@pytest.mark.parametrize("comp", [".gz", ".zst"])
def test_compressed_partitions_go_on_from_the_stream_left_open(tmp_path: Path, comp: str) -> None:
    """Partitions of one compressed file read in order go on from the stream the previous one left (each file
    decompressed once); read in any other order, or mixed with another partitioning, each still yields exactly
    its own documents."""
    from polymem.sources import OpenStreams

    data = jsonl(DOCS * 3)
    data = gzip.compress(data, mtime=0) if comp == ".gz" else zstandard.ZstdCompressor().compress(data)
    p = tmp_path / f"c.jsonl{comp}"
    p.write_bytes(data)

    def alone(part: object) -> list[str]:  # no stream to go on from
        OpenStreams.close()
        return [d.text for d in part.read([])]  # type: ignore[attr-defined]

    parts = Corpus([p]).partitions(0.0003)
    assert len(parts) >= 5
    want = [alone(q) for q in parts]
    assert sum(want, []) == DOCS * 3

    OpenStreams.close()
    got = []
    for i, q in enumerate(parts):
        got.append([d.text for d in q.read([])])
        left = OpenStreams.kept()
        if i < len(parts) - 1:  # a range that ended before the file did leaves its stream for the next one
            assert left is not None and left.stop == q.pieces[-1].stop
        else:
            assert left is None
    assert got == want
    order = [0, 2, 4, 1, 3] + list(range(5, len(parts)))  # skipping forward, and going back
    other = Corpus([p]).partitions(0.0005)  # another partitioning of the same file, in between
    for i in order:
        assert [d.text for d in parts[i].read([])] == want[i]
        assert [d.text for d in other[min(i, len(other) - 1)].read([])] == alone(other[min(i, len(other) - 1)])
    OpenStreams.close()


def test_each_thread_goes_on_from_its_own_stream(tmp_path: Path) -> None:
    """Threads reading partitions of one compressed file at the same time (a Dask worker with several threads)
    each keep their own stream: every partition yields exactly its documents, and a thread's next partition goes
    on from where its previous one ended, whatever the other thread read meanwhile."""
    import threading

    from polymem.sources import OpenStreams

    p = tmp_path / "c.jsonl.gz"
    p.write_bytes(gzip.compress(jsonl(DOCS * 8), mtime=0))
    parts = Corpus([p]).partitions(0.0003)
    assert len(parts) >= 8
    want = []
    for q in parts:
        OpenStreams.close()
        want.append([d.text for d in q.read([])])
    OpenStreams.close()
    got: dict[int, list[str]] = {}
    went_on: list[bool] = []
    barrier = threading.Barrier(2)

    def reader(first: int) -> None:
        for i in range(first, len(parts) - len(parts) % 2, 2):  # thread 0: partitions 0, 2, ...; 1: 1, 3, ...
            barrier.wait(timeout=60)  # both threads read at the same time
            before = OpenStreams.kept()
            got[i] = [d.text for d in parts[i].read([])]
            # the stream this thread kept is the one its own previous partition (i - 2) stopped in
            went_on.append(before is None if i < 2 else before == parts[i - 2].pieces[-1])
        OpenStreams.close()

    threads = [threading.Thread(target=reader, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if len(parts) % 2:
        got[len(parts) - 1] = [d.text for d in parts[-1].read([])]
        went_on.append(True)
        OpenStreams.close()
    assert [got[i] for i in range(len(parts))] == want
    assert all(went_on) and len(went_on) == len(parts)


def test_streams_kept_by_threads_that_ended_are_closed_at_the_end_of_a_run(tmp_path: Path) -> None:
    """A thread that read a partition of a compressed file keeps its stream for its next one; when the thread
    has ended (a run's pool shut down), OpenStreams.close_all closes it, and this thread's next read still yields
    its documents."""
    import threading

    from polymem.sources import OpenStreams

    p = tmp_path / "c.jsonl.gz"
    p.write_bytes(gzip.compress(jsonl(DOCS * 4), mtime=0))
    parts = Corpus([p]).partitions(0.0003)
    assert len(parts) >= 3
    OpenStreams.close_all()
    kept: list[object] = []

    def reader() -> None:
        list(parts[0].read([]))
        kept.append(OpenStreams._left[threading.get_ident()])  # (token, piece, raw, stream, state)

    t = threading.Thread(target=reader)
    t.start()
    t.join()
    (_, piece, raw, stream, _), = kept
    assert piece == parts[0].pieces[-1] and not stream.closed and not raw.closed
    list(parts[1].read([]))  # this thread's own stream, kept too
    assert len(OpenStreams._left) == 2
    OpenStreams.close_all()
    assert stream.closed and raw.closed and not OpenStreams._left and OpenStreams.kept() is None
    assert [d.text for d in parts[2].read([])] == [d.text for d in Corpus([p]).partitions(0.0003)[2].read([])]
    OpenStreams.close_all()
