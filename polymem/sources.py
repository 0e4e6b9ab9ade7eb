"""Corpus files as fsspec URLs, globs and partitions: what :class:`polymem.corpus.Corpus` reads beyond local paths.

    s3://bucket/shard-*.jsonl.zst     a glob: every matching object, in sorted order
    s3://bucket/corpus/                a "directory": every object under it with a corpus suffix
    gs://…, https://…, file://…        any fsspec protocol (its package installed: s3fs for s3://)

Formats, by suffix (a compression suffix .gz or .zst first is stripped and the stream decompressed):
    .jsonl                 one document per line (a JSON object with the text field)
    .txt .md               one document per file
    .parquet               one document per row of the text column (``text_field``), row group by row group

A corpus is cut into **partitions** of about ``partition_mb`` MB of text, each read on its own (by a Dask worker
or in turn in one process), so no process holds more than a partition of documents:
    plain .jsonl           byte ranges of the file, cut at line starts (a line belongs to the range it starts in)
    compressed .jsonl      ranges of the *decompressed* stream, estimated from the compressed size (x COMPRESSED_RATIO);
                           the last range runs to the end, so every line is read exactly once whatever the real
                           ratio; a range's reader decompresses (and discards) what comes before it
    .parquet               runs of row groups (their uncompressed size from the footer)
    .txt/.md and small     whole files, several to a partition
    files

Labels: a JSONL line is ``URL:LINE``; in a byte range of a plain file that does not start at 0 the line number is
not known without reading the file up to it, so it is ``URL@BYTE`` (the line's byte offset). A Parquet row is
``URL#ROW``.
"""

from __future__ import annotations

import io
import math
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from polymem._paths import is_url, kind_of
from polymem.errors import PolymemError

COMPRESSED_RATIO = 4.0  # decompressed / compressed size assumed when cutting a compressed file into ranges
# Largest document read (a text file, a JSONL line, a Parquet value), in bytes: counting one costs ~130 bytes
# of memory per byte of text (`coverage` of one 16 MB JSONL line peaked at 2.2 GB), so this bounds a document's
# peak at ~2.2 GB. A longer one is skipped ("document too large") without being held whole in memory.
MAX_DOCUMENT_BYTES = 16 << 20
# More partitions than this is refused: each is a task, and a plan of millions (a tiny partition_mb) takes
# hundreds of MB and minutes before any work.
MAX_PARTITIONS = 1_000_000
_GLOB = re.compile(r"[*?\[]")
_SKIP_CHUNK = 1 << 20


def filesystem(url: str, storage_options: dict[str, Any] | None = None) -> tuple[Any, str]:
    """(fsspec filesystem, path) for a URL; a clear error when its protocol's package is missing."""
    import fsspec

    try:
        fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    except ImportError as e:
        proto = url.split("://", 1)[0]
        if proto in ("s3", "s3a"):
            from polymem._optional import missing_extra

            raise missing_extra("s3fs", "s3", f"reading {url}") from None
        raise PolymemError(f"cannot read {url!r}: {e}; install the fsspec package for {proto}://") from None
    except ValueError as e:  # fsspec: "Protocol not known: xyz"
        if "protocol" not in str(e).lower():
            raise
        from fsspec.registry import known_implementations

        known = ", ".join(f"{p}://" for p in ("s3", "gs", "az", "http", "https", "file") if p in known_implementations)
        raise PolymemError(f"cannot read {url!r}: {url.split('://', 1)[0]!r} is not a protocol fsspec knows "
                           f"(e.g. {known}); check the URL's spelling, or give a local path") from None
    return fs, path


@dataclass(frozen=True)
class FileInfo:
    url: str  # protocol-qualified (s3://bucket/key) or a local path
    size: int
    kind: str  # text | jsonl | parquet
    compression: str | None


def expand(url: str, storage_options: dict[str, Any] | None = None) -> tuple[list[FileInfo], int]:
    """The files a URL names (a glob, a directory/prefix, or one object): (files in sorted order, files passed
    over under a directory for their suffix). A URL that names nothing raises PolymemError."""
    fs, path = filesystem(url, storage_options)
    proto = url.split("://", 1)[0] if is_url(url) else None

    def qualify(p: str) -> str:
        return fs.unstrip_protocol(p) if proto is not None else p

    ignored = 0
    out: list[FileInfo] = []
    if _GLOB.search(path):
        found = fs.glob(path, detail=True)
        entries = sorted((p, d) for p, d in found.items() if d.get("type") != "directory")
        explicit = True
    else:
        try:
            info = fs.info(path)
        except FileNotFoundError:
            info = None
        except OSError as e:
            raise PolymemError(f"cannot read {url!r}: {e}") from None
        if info is None:
            raise PolymemError(f"input {url!r} does not exist; pass existing files, prefixes or globs "
                               "(e.g. s3://bucket/shard-*.jsonl.gz)")
        if info.get("type") == "directory":
            entries = sorted(fs.find(path, detail=True).items())
            explicit = False
        else:
            entries, explicit = [(path, info)], True
    for p, d in entries:
        name = p.rsplit("/", 1)[-1]
        if name.startswith("."):
            continue
        kind, comp = kind_of(name)
        if kind is None:
            if not explicit:
                ignored += 1
                continue
            kind = "text"  # an explicitly named file of another type is read as text
        out.append(FileInfo(qualify(p), int(d.get("size") or 0), kind, comp))
    if not out and _GLOB.search(path):
        raise PolymemError(f"input {url!r} matches no file; check the pattern (e.g. s3://bucket/shard-*.jsonl.gz)")
    return out, ignored


# ------------------------------------------------------------------------------------------------ pieces
@dataclass(frozen=True)
class Piece:
    """Part of one file: a byte range of its (decompressed) stream, or a run of Parquet row groups."""

    file: FileInfo
    start: int = 0
    stop: int | None = None  # None: to the end

    def est_bytes(self) -> float:
        if self.stop is not None:
            return self.stop - self.start
        f = self.file
        total = f.size * (COMPRESSED_RATIO if f.compression else 1.0)
        return max(total - self.start, 0.0)


def plan_pieces(files: list[FileInfo], partition_bytes: int, storage_options: dict[str, Any] | None = None
                ) -> list[list[Piece]]:
    """Group the files into partitions of about ``partition_bytes`` of text (see the module docstring); more than
    MAX_PARTITIONS partitions is a PolymemError saying which size would do."""
    _check_partition_count(files, partition_bytes)
    parts: list[list[Piece]] = []
    cur: list[Piece] = []
    cur_size = 0.0

    def push(piece: Piece) -> None:
        nonlocal cur, cur_size
        size = piece.est_bytes()
        if cur and cur_size + size > partition_bytes:
            parts.append(cur)
            cur, cur_size = [], 0.0
        cur.append(piece)
        cur_size += size

    for f in files:
        if f.kind == "parquet":
            for lo, hi in _row_group_runs(f, partition_bytes, storage_options):
                push(Piece(f, lo, hi))
            continue
        est = f.size * (COMPRESSED_RATIO if f.compression else 1.0)
        if f.kind != "jsonl" or est <= partition_bytes:
            push(Piece(f))
            continue
        n = math.ceil(est / partition_bytes)
        step = math.ceil(est / n)
        for i in range(n):
            push(Piece(f, i * step, None if i == n - 1 else (i + 1) * step))
    if cur:
        parts.append(cur)
    return parts


def _parquet() -> Any:
    from polymem._optional import optional_import

    return optional_import("pyarrow.parquet", extra="corpus", purpose="reading Parquet corpora")


def _check_partition_count(files: list[FileInfo], partition_bytes: int) -> None:
    total = sum(f.size * (COMPRESSED_RATIO if f.compression else 1.0) for f in files)
    if total / partition_bytes > MAX_PARTITIONS:
        least = math.ceil(total / MAX_PARTITIONS / 1e3) / 1e3
        raise PolymemError(
            f"partitions of {partition_bytes / 1e6:g} MB would cut the corpus (about {total / 1e6:,.1f} MB of text) "
            f"into about {total / partition_bytes:,.0f} partitions; at most {MAX_PARTITIONS:,} are allowed. Use "
            f"partitions of at least {least:g} MB (--partition-mb / partition_mb), e.g. the default")


def _row_group_runs(f: FileInfo, partition_bytes: int, storage_options: dict[str, Any] | None
                    ) -> list[tuple[int, int | None]]:
    """Runs of row groups of about ``partition_bytes``; a file whose footer cannot be read is one run, which its
    reader then skips, saying why."""
    pq = _parquet()
    import pyarrow

    fs, path = filesystem(f.url, storage_options)
    try:
        with fs.open(path, "rb") as fh:
            meta = pq.ParquetFile(fh).metadata
    except (OSError, ValueError, pyarrow.ArrowException):
        return [(0, None)]
    runs: list[tuple[int, int | None]] = []
    lo, size = 0, 0
    for g in range(meta.num_row_groups):
        s = meta.row_group(g).total_byte_size
        if g > lo and size + s > partition_bytes:
            runs.append((lo, g))
            lo, size = g, 0
        size += s
    if meta.num_row_groups:
        runs.append((lo, meta.num_row_groups))
    return runs


def open_raw(f: FileInfo, storage_options: dict[str, Any] | None = None) -> Any:
    """A binary file object over the file's stored (compressed) bytes (the caller closes it)."""
    from fsspec.spec import AbstractBufferedFile

    fs, path = filesystem(f.url, storage_options)
    fh = fs.open(path, "rb")
    # fsspec's remote files take no size in readline(); read_line needs one to bound what a line may hold
    return io.BufferedReader(fh) if isinstance(fh, AbstractBufferedFile) else fh


def decompress(raw: Any, compression: str | None) -> Any:
    """A buffered binary stream of ``raw``'s decompressed bytes (``raw`` itself when not compressed)."""
    if compression is None:
        return raw
    if compression == "gzip":
        import gzip

        return gzip.GzipFile(fileobj=raw, mode="rb")
    from polymem._optional import optional_import

    zstandard = optional_import("zstandard", extra="corpus", purpose="reading .zst corpora")
    return io.BufferedReader(_ZstdReader(raw, zstandard), buffer_size=1 << 20)


class _ZstdReader(io.RawIOBase):
    """Decompress a zstandard stream of one or more frames; a stream that ends inside a frame raises ZstdError
    (zstandard's own stream reader reports a truncated file as a clean end)."""

    def __init__(self, raw: Any, zstd: Any) -> None:
        self.raw, self.zstd = raw, zstd
        self.dobj = zstd.ZstdDecompressor().decompressobj()
        self.fed = False  # bytes given to the current frame's decompressor
        self.buf = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self.buf:
            chunk = self.raw.read(1 << 20)
            if not chunk:
                if self.fed and not self.dobj.eof:
                    raise self.zstd.ZstdError("truncated zstandard stream: the file ends inside a frame")
                return 0
            while chunk:
                self.fed = True
                self.buf += self.dobj.decompress(chunk)
                chunk = b""
                if self.dobj.eof:  # a frame ended: the rest (if any) starts the next frame
                    chunk = self.dobj.unused_data
                    self.dobj = self.zstd.ZstdDecompressor().decompressobj()
                    self.fed = False
        n = min(len(b), len(self.buf))
        b[:n] = self.buf[:n]
        self.buf = self.buf[n:]
        return n


@dataclass
class LineState:
    """Where a decompressed stream stands: byte ``pos`` (a line start) after ``line_no`` lines; ``ended`` once a
    piece's range ended there (the stream can go on with a later piece of the same file)."""

    pos: int = 0
    line_no: int = 0
    ended: bool = False


def jsonl_lines(fh: Any, piece: Piece, state: LineState | None = None, limit: int = MAX_DOCUMENT_BYTES
                ) -> Iterator[tuple[str, bytes | LongLine]]:
    """(label, raw line) for the lines that start in the piece's byte range of the decompressed stream; a line
    over ``limit`` bytes comes as a LongLine (see :func:`read_line`).
    ``state``: where ``fh`` already stands (a stream a previous piece of the file left at a line start at or
    before this piece's start, see :class:`OpenStreams`); it is updated as the lines are read."""
    url, start, stop = piece.file.url, piece.start, piece.stop
    st = state if state is not None else LineState()
    pos, line_no = st.pos, st.line_no
    known = True
    if start > pos:
        if piece.file.compression is None and hasattr(fh, "seek"):
            fh.seek(start - 1)
            pos, known = start - 1, False
        else:  # decompress and discard up to start - 1, counting lines
            while pos < start - 1:
                chunk = fh.read(min(_SKIP_CHUNK, start - 1 - pos))
                if not chunk:
                    return
                pos += len(chunk)
                line_no += chunk.count(b"\n")
        if pos == start - 1:  # pos == start: a line starts right at the range's start
            rest = read_line(fh, limit)  # the end of the line holding byte start-1: it belongs to the previous range
            if not rest:
                return
            pos += len(rest)
            line_no += 1 if isinstance(rest, LongLine) or rest.endswith(b"\n") else 0
    while True:
        st.pos, st.line_no = pos, line_no
        if stop is not None and pos >= stop:
            st.ended = True  # stopped before the next line, which is still unread
            return
        raw = read_line(fh, limit)
        if not raw:
            return
        line_no += 1
        yield (f"{url}:{line_no}" if known else f"{url}@{pos}"), raw
        pos += len(raw)


@dataclass(frozen=True)
class LongLine:
    """A line of more than the document bound, read through but not kept: only its length is known."""

    nbytes: int

    def __len__(self) -> int:  # its length in bytes, like a line's
        return self.nbytes


def read_line(fh: Any, limit: int) -> bytes | LongLine:
    """The next line of ``fh`` (b"" at the end). A line of more than ``limit`` bytes (before its newline) is
    read through in pieces of 1 MiB and returned as LongLine(its length)."""
    line = fh.readline(limit + 1)
    if len(line) <= limit or line.endswith(b"\n"):
        return line
    n = len(line)
    while line and not line.endswith(b"\n"):
        line = fh.readline(_SKIP_CHUNK)
        n += len(line)
    return LongLine(n)


def bounded_lines(fh: Any, limit: int) -> Iterator[bytes | LongLine]:
    """``iter(fh)``, each line through :func:`read_line`."""
    while line := read_line(fh, limit):
        yield line


class OpenStreams:
    """The decompressed stream of a compressed JSONL file that a finished piece left open, kept (one per thread)
    so that a later piece of the same file, in the same partitioning, goes on from there instead of
    decompressing the file from its start again (reading partitions in order decompresses each file once). Per
    thread: the tasks on several threads of one process each go on with their own stream. Kept in one table of
    the process (by thread), so that :meth:`close_all` can close the streams of threads that have ended."""

    _left: dict[int, tuple[Any, Piece, Any, Any, LineState]] = {}
    _lock = threading.Lock()

    @classmethod
    def keep(cls, token: Any, piece: Piece, raw: Any, f: Any, state: LineState) -> None:
        cls.close()
        with cls._lock:
            cls._left[threading.get_ident()] = (token, piece, raw, f, state)

    @classmethod
    def take(cls, token: Any, piece: Piece) -> tuple[Any, Any, LineState] | None:
        """(raw, decompressed stream, its state) left by an earlier piece of this file at or before
        ``piece.start``, or None (and whatever was kept is closed)."""
        with cls._lock:
            left = cls._left.pop(threading.get_ident(), None)
        if left is not None:
            t, prev, raw, f, state = left
            if t == token and prev.file == piece.file and prev.stop is not None and prev.stop <= piece.start:
                return raw, f, state
            _close(left)
        return None

    @classmethod
    def kept(cls) -> Piece | None:
        """The piece whose stream this thread keeps open, or None."""
        left = cls._left.get(threading.get_ident())
        return None if left is None else left[1]

    @classmethod
    def close(cls) -> None:
        """Close this thread's kept stream (if any)."""
        with cls._lock:
            left = cls._left.pop(threading.get_ident(), None)
        if left is not None:
            _close(left)

    @classmethod
    def close_all(cls) -> None:
        """Close the kept streams of every thread (the end of a run: its threads may be gone). A stream in use
        is not kept (:meth:`take` removed it), so only idle ones close; a thread's next piece then opens its file
        again."""
        with cls._lock:
            lefts, cls._left = list(cls._left.values()), {}
        for left in lefts:
            _close(left)


def _close(left: tuple[Any, Piece, Any, Any, LineState]) -> None:
    left[3].close()
    left[2].close()


def parquet_texts(f: FileInfo, lo: int, hi: int | None, text_field: str, storage_options: dict[str, Any] | None
                  ) -> Iterator[tuple[str, Any, Any]]:
    """(label, text value, id value or None) for each row of row groups lo:hi, one row group in memory at a
    time. A missing column raises KeyError naming the columns there are."""
    pq = _parquet()

    fs, path = filesystem(f.url, storage_options)
    with fs.open(path, "rb") as fh:
        pf = pq.ParquetFile(fh)
        names = pf.schema_arrow.names
        if text_field not in names:
            raise KeyError(f"no {text_field!r} column: the file has {', '.join(names[:8])}; choose the column "
                           "with --text-field")
        cols = [text_field] + (["id"] if "id" in names and text_field != "id" else [])
        hi = pf.metadata.num_row_groups if hi is None else hi
        first = sum(pf.metadata.row_group(k).num_rows for k in range(lo))
        for g in range(lo, hi):
            table = pf.read_row_group(g, columns=cols)
            texts = table.column(text_field).to_pylist()
            ids = table.column("id").to_pylist() if len(cols) > 1 else [None] * len(texts)
            for k, (t, i) in enumerate(zip(texts, ids)):
                yield f"{f.url}#{first + k}", t, i
            first += len(texts)
