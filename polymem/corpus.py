"""Document readers: text files, directories, JSONL (optionally gzipped) and stdin, one `Document` at a time.

    >>> corpus = Corpus(["notes.txt", "data/", "dump.jsonl.gz", "-"], text_field="text")
    >>> for doc in corpus:            # streams: one file (or one JSONL line) in memory at a time
    ...     use(doc.id, doc.text)
    >>> corpus.skipped                # [Skipped(source, reason), ...]: what was left out and why

What is a document:
    PATH.txt / .md / any explicitly named file   the whole file is one document
    PATH.jsonl                                    one document per line: a JSON object whose `text_field`
                                                  (default "text") is a string; its "id" (if any) names it
    PATH.gz / PATH.zst                            the same, gzip- or zstandard-compressed (PATH.jsonl.zst, ...)
    PATH.parquet                                  one document per row of the `text_field` column
    DIR                                           recursively, files ending in .txt .md .jsonl .parquet (and
                                                  .gz/.zst of the first three), in sorted order; hidden entries
                                                  and other files are passed over (counted in `ignored_files`)
    URL or glob                                   fsspec URLs (s3://bucket/shard-*.jsonl.zst, s3://bucket/dir/,
                                                  file://…, https://…) and local globs (data/*.jsonl.gz); URLs
                                                  use `storage_options` (see polymem.sources)
    -                                             standard input: one text document, or JSONL lines with
                                                  stdin_format="jsonl"

Only regular files are opened: a FIFO, socket or device (named, found in a directory, or behind a symlink)
is skipped as "not a regular file" without being read, so a named pipe nobody writes to cannot block the run.
A file reached twice (named twice, a link to it, a glob and a directory that both hold it) is read once; ``**``
in a local glob does not descend into linked directories, so a link to an ancestor cannot repeat the tree.

Bad input never raises mid-stream; it is recorded in `skipped` and the stream goes on:
    unreadable file (permissions, I/O error, corrupt gzip, a damaged Parquet file), binary file (a NUL byte in
    its first 8 KiB, read before the rest), document over ``max_document_bytes`` (default 16 MiB: a text file,
    JSONL line or Parquet value; never held whole), JSONL line that is not JSON (too deeply nested, an integer
    of over 4300 digits) / not an object / lacks the text field / whose field is not a string, empty document.
    A file that breaks part-way (a truncated .gz) keeps the documents read before the damage;
    its `Skipped` entry says how many (`documents_used`, `bytes_used`, and in the reason). Invalid UTF-8 is decoded with U+FFFD replacement and counted (`replaced`), or with
    invalid_utf8="skip" the document is skipped. Only a path that does not exist raises (PolymemError), up
    front, since it is a typo rather than bad data.

Partitions: ``corpus.partitions(partition_mb)`` cuts the files into parts of about that much text (byte ranges
of JSONL files, runs of Parquet row groups, groups of small files), each readable on its own — by a Dask worker,
say — with the same documents, in the same order, as iterating the corpus (polymem.sources).

Which files an input names (globs, directories, a file reached twice) and opening only regular files:
:mod:`polymem._discover`; file formats, URLs and partitions' byte ranges: :mod:`polymem.sources`.

What this module does not do: tokenise, deduplicate, or hold the corpus in memory.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
import glob as _glob
from typing import Any, BinaryIO

from polymem._discover import local_info, open_regular, oserr, unseen
from polymem._globs import glob_no_links
from polymem._paths import is_url, kind_of
from polymem.errors import PolymemError
from polymem.sources import (MAX_DOCUMENT_BYTES, FileInfo, LineState, LongLine, OpenStreams, Piece, bounded_lines,
                             decompress, expand, jsonl_lines, open_raw, parquet_texts, plan_pieces)

TEXT_SUFFIXES = (".txt", ".md")
JSONL_SUFFIXES = (".jsonl",)
INVALID_UTF8_POLICIES = ("replace", "skip")
STDIN_FORMATS = ("text", "jsonl")
_BINARY_PROBE = 8192  # bytes inspected for a NUL byte


@dataclass(frozen=True)
class Document:
    """One document: `id` (file path, or the JSONL "id" / "path:line"), its text, and where it came from."""

    id: str
    text: str
    source: str  # file path or "path:line" or "<stdin>"
    replaced: bool = False  # invalid UTF-8 was replaced by U+FFFD

    @property
    def nbytes(self) -> int:
        return len(self.text.encode("utf-8"))


@dataclass(frozen=True)
class Skipped:
    """A document (or whole file) left out, and why."""

    source: str
    reason: str
    documents_used: int = 0  # a file that broke part-way: documents read (and used) before the damage
    bytes_used: int = 0  # ... and their bytes (decompressed), so a report can say how much of the file counted


@dataclass
class Corpus:
    """An iterable over the documents under `paths` (see the module docstring); records what it skipped.

    Iterating twice reads the files twice (and resets `skipped`, `replaced`, `ignored_files`); stdin can
    only be read once.
    """

    paths: Sequence[str | os.PathLike[str]]
    text_field: str = "text"
    invalid_utf8: str = "replace"
    stdin_format: str = "text"
    stdin: BinaryIO | None = None  # default sys.stdin.buffer; tests pass a BytesIO
    skipped: list[Skipped] = field(default_factory=list, init=False)
    replaced: int = field(default=0, init=False)  # documents whose invalid UTF-8 was replaced
    ignored_files: int = field(default=0, init=False)  # files in directories with other extensions
    storage_options: dict[str, Any] | None = None  # fsspec options for URL inputs (endpoint, credentials, ...)
    max_document_bytes: int = MAX_DOCUMENT_BYTES  # a longer document is skipped unread ("document too large")

    def __post_init__(self) -> None:
        from polymem.samples import resolve_sample

        if isinstance(self.paths, (str, os.PathLike)):
            self.paths = [self.paths]
        self.paths = [resolve_sample(p) for p in self.paths]  # sample:NAME -> the shipped corpus
        if not self.paths:
            raise PolymemError("no input paths given; pass files, directories, .jsonl(.gz) files, or - for stdin")
        if self.invalid_utf8 not in INVALID_UTF8_POLICIES:
            raise PolymemError(
                f"invalid_utf8={self.invalid_utf8!r} is not a policy; accepted: {', '.join(INVALID_UTF8_POLICIES)}"
            )
        if self.stdin_format not in STDIN_FORMATS:
            raise PolymemError(
                f"stdin_format={self.stdin_format!r} is unknown; accepted: {', '.join(STDIN_FORMATS)}"
            )
        if not isinstance(self.text_field, str) or not self.text_field:
            raise PolymemError(f"text_field={self.text_field!r} must be a non-empty string such as 'text'")
        if isinstance(self.max_document_bytes, bool) or not isinstance(self.max_document_bytes, int) or \
                self.max_document_bytes < 1:
            raise PolymemError(f"max_document_bytes={self.max_document_bytes!r} must be a positive integer "
                               f"(default {MAX_DOCUMENT_BYTES:,})")
        if sum(1 for p in self.paths if str(p) == "-") > 1:
            raise PolymemError("'-' (stdin) was given more than once; stdin can be read only once")
        missing = [str(p) for p in self.paths if str(p) != "-" and not is_url(p) and not os.path.lexists(p)
                   and not _glob.has_magic(str(p))]
        if missing:
            raise PolymemError(
                f"input path {missing[0]!r} does not exist"
                + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
                + "; pass existing files or directories, or - for stdin"
            )

    # ---------------------------------------------------------------------------------------- iteration
    def __iter__(self) -> Iterator[Document]:
        self.skipped = []
        self.replaced = 0
        self.ignored_files = 0
        seen: set[object] = set()
        for p in self.paths:
            if str(p) == "-":
                yield from self._read_stdin()
            else:
                for info in unseen(self._files(p), seen):
                    yield from self._read_piece(Piece(info))

    @property
    def can_partition(self) -> bool:
        """True when every input is a file, directory, glob or URL (stdin can be read only by this process)."""
        return all(str(p) != "-" for p in self.paths)

    def partitions(self, partition_mb: float = 4.0) -> list["FilePartition"]:
        """The corpus as partitions of about ``partition_mb`` MB of text, each readable on its own
        (``part.read(skipped)``), together yielding the same documents in the same order as iterating.
        Listing problems go to ``skipped`` (reset here); the parts report their own when read."""
        if not self.can_partition:
            raise PolymemError("stdin (-) cannot be partitioned: it can be read only once, by this process")
        self.skipped, self.replaced, self.ignored_files = [], 0, 0
        files = list(unseen((info for p in self.paths for info in self._files(p)), set()))
        pieces = plan_pieces(files, max(1, int(partition_mb * 1e6)), self.storage_options)
        token = uuid.uuid4().hex  # the partitions of one plan: a stream one leaves open may serve the next
        return [FilePartition(tuple(ps), self.text_field, self.invalid_utf8, self.storage_options, token,
                              self.max_document_bytes) for ps in pieces]

    def _files(self, p: str | os.PathLike[str]) -> list[FileInfo]:
        """The files an input names: a URL or glob (fsspec), a directory (walked), or one local file."""
        if is_url(p):
            files, ignored = expand(str(p), self.storage_options)
            self.ignored_files += ignored
            return files
        if not os.path.lexists(p) and _glob.has_magic(str(p)):
            matches = sorted(glob_no_links(str(p)))
            if not matches:
                raise PolymemError(f"input {str(p)!r} matches no file; check the pattern")
            return [info for m in matches for info in self._files(m)]
        if os.path.isdir(p):
            return [local_info(f, explicit=False) for f in self._walk(Path(p))]
        return [local_info(Path(p), explicit=True)]

    def nothing_read(self) -> PolymemError:
        """The error for a corpus that gave no document: what was skipped and why (the first reason in full, e.g. a
        document over the size bound, which names the bound), or that nothing was found."""
        where = [str(p) for p in self.paths]
        if self.skipped:
            first = self.skipped[0]
            kinds = ", ".join(f"{n} {k}" for k, n in self.skipped_by_reason().items())
            return PolymemError(f"no documents read from {where}: every one was left out ({kinds}); first: "
                                f"{first.source!r}: {first.reason}")
        return PolymemError(f"no documents found in {where}; pass .txt/.md/.jsonl(.gz) files or folders")

    def skipped_by_reason(self) -> dict[str, int]:
        """{reason kind: count}, the kind being the reason up to its first ':' (e.g. 'binary file')."""
        return dict(Counter(s.reason.split(":")[0] for s in self.skipped))

    # ---------------------------------------------------------------------------------------- sources
    def _walk(self, root: Path) -> Iterator[Path]:
        for dirpath, dirnames, filenames in os.walk(root, onerror=lambda e: self._skip(str(e.filename), oserr(e))):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in sorted(filenames):
                if name.startswith("."):
                    continue
                if kind_of(name)[0] is None:
                    self.ignored_files += 1
                    continue
                yield Path(dirpath) / name

    def _read_stdin(self) -> Iterator[Document]:
        stream = self.stdin if self.stdin is not None else sys.stdin.buffer
        if self.stdin_format == "jsonl":
            yield from self._jsonl_lines(stream, "<stdin>")
            return
        try:
            data = self._read_text(stream, "<stdin>")
        except OSError as e:
            self._skip("<stdin>", oserr(e))
            return
        doc = self._text_document(data, "<stdin>", "<stdin>") if data is not None else None
        if doc is not None:
            yield doc

    def _read_piece(self, piece: Piece, token: str | None = None) -> Iterator[Document]:
        """The documents of one file, or of one part of it (a byte range, a run of Parquet row groups).
        ``token`` names the partitioning the piece belongs to: a compressed JSONL stream that an earlier piece
        of it left open (:class:`polymem.sources.OpenStreams`) is read on instead of decompressed again."""
        info = piece.file
        src, kind, comp = info.url, info.kind, info.compression
        if kind == "parquet":
            yield from self._parquet_rows(piece)
            return
        resumable = token is not None and kind == "jsonl" and comp is not None and piece.stop is not None
        left = OpenStreams.take(token, piece) if token is not None and kind == "jsonl" and comp else None
        raw: Any  # a file object (local, or fsspec's)
        f: Any  # raw, or a decompressing stream over it
        if left is not None:
            raw, f, state = left
            yield from self._read_jsonl_piece(raw, f, piece, state, token, resumable)
            return
        if is_url(src):
            try:
                raw = open_raw(info, self.storage_options)
            except (OSError, PolymemError) as e:
                self._skip(src, f"unreadable file: {type(e).__name__}: {e}")
                return
        else:
            raw = open_regular(Path(src))
            if isinstance(raw, str):
                self._skip(src, raw)
                return
        if kind == "jsonl" and (piece.start or piece.stop is not None):
            f = raw
            try:
                f = decompress(raw, comp)
                # every part checks the file's head (a binary file yields no document from any part); the part
                # at byte 0 records the skip, so a partitioned read skips it once, as a whole read does
                binary = self._binary(f, src, record=piece.start == 0)
            except _read_errors() as e:
                self._read_error(e, piece, _Progress())
                binary = True
            except BaseException:
                if f is not raw:
                    f.close()
                raw.close()
                raise
            if binary:
                if f is not raw:
                    f.close()
                raw.close()
                return
            yield from self._read_jsonl_piece(raw, f, piece, LineState(), token, resumable)
            return
        used = _Progress()
        f = raw
        try:
            f = decompress(raw, comp)
            if kind == "jsonl":
                yield from self._jsonl_lines(f, src, used)
            else:
                data = self._read_text(f, src)
                doc = self._text_document(data, src, src) if data is not None else None
                if doc is not None:
                    yield doc
        except _read_errors() as e:  # gzip.BadGzipFile is an OSError
            self._read_error(e, piece, used)
        finally:
            if f is not raw:
                f.close()
            raw.close()

    def _read_jsonl_piece(self, raw: Any, f: Any, piece: Piece, state: LineState, token: str | None,
                          resumable: bool) -> Iterator[Document]:
        """The documents of a byte range of a JSONL file whose (decompressed) stream ``f`` stands at ``state``;
        a compressed stream the range ended in is kept open for the next piece (see _read_piece)."""
        used = _Progress()
        keep = False
        try:
            yield from self._jsonl_records(jsonl_lines(f, piece, state, self.max_document_bytes), used)
            keep = resumable and state.ended
        except _read_errors() as e:  # gzip.BadGzipFile is an OSError
            self._read_error(e, piece, used)
        finally:
            if keep:
                OpenStreams.keep(token, piece, raw, f, state)
            else:
                if f is not raw:
                    f.close()
                raw.close()

    def _read_error(self, e: BaseException, piece: Piece, used: "_Progress") -> None:
        """Record a file that broke off while being read: what of it was used (see docs/coverage.md)."""
        src, kind, comp = piece.file.url, piece.file.kind, piece.file.compression
        what = f"corrupt {comp}: {e}" if comp else f"unreadable file: {type(e).__name__}: {e}"
        part = f" of the part from byte {piece.start:,}" if piece.start else ""
        lines = f"{used.lines} lines" if piece.start else f"lines 1-{used.lines}"
        if used.documents:
            what += (f"; the first {used.documents} documents{part} ({lines}, {used.nbytes:,} bytes) "
                     f"were used, the rest of the file was not")
        elif kind == "jsonl" and used.lines:
            what += f"; {lines}{part} were read but held no document, the rest of the file was not"
        else:
            what += f"; nothing of {'the part from byte ' + format(piece.start, ',') if piece.start else 'it'} was used"
        self.skipped.append(Skipped(src, what, documents_used=used.documents, bytes_used=used.nbytes))

    def _binary(self, f: Any, src: str, record: bool = True) -> bool:
        head = f.peek(_BINARY_PROBE)[:_BINARY_PROBE] if hasattr(f, "peek") else b""
        if b"\x00" in head:
            if record:
                self._skip(src, f"binary file: NUL byte at offset {head.index(0)}; expected JSON lines")
            return True
        return False

    def _parquet_rows(self, piece: Piece) -> Iterator[Document]:
        src = piece.file.url
        try:
            for where, value, doc_id in parquet_texts(piece.file, piece.start, piece.stop, self.text_field,
                                                      self.storage_options):
                if not isinstance(value, str):
                    self._skip(where, f"column {self.text_field!r} holds {_json_type(value)}, expected a string")
                    continue
                if _utf8_over(value, self.max_document_bytes):
                    self._skip(where, self._too_large(f"a value of {len(value.encode('utf-8', 'replace')):,} bytes"))
                    continue
                value, fixed = self._fix_surrogates(value, where)
                if value is None:
                    continue
                doc = self._document(str(doc_id) if isinstance(doc_id, (str, int)) else where, value, where, fixed)
                if doc is not None:
                    yield doc
        except KeyError as e:
            self._skip(src, str(e.args[0]))
        except Exception as e:  # noqa: BLE001 - pyarrow raises its own types for a damaged file
            if type(e).__module__.split(".")[0] not in ("pyarrow", "builtins"):
                raise
            self._skip(src, f"unreadable Parquet file: {type(e).__name__}: {e}")

    def _jsonl_lines(self, f: BinaryIO, src: str, used: _Progress | None = None) -> Iterator[Document]:
        if self._binary(f, src):
            return
        lines = enumerate(bounded_lines(f, self.max_document_bytes), start=1)
        yield from self._jsonl_records(((f"{src}:{n}", raw) for n, raw in lines), used)

    def _jsonl_records(self, lines: Iterable[tuple[str, bytes | LongLine]], used: _Progress | None = None
                       ) -> Iterator[Document]:
        used = used if used is not None else _Progress()
        for where, raw in lines:
            used.lines += 1
            if isinstance(raw, LongLine):
                self._skip(where, self._too_large(f"a line of {len(raw):,} bytes"))
                continue
            if not raw.strip():
                continue
            line = self._decode(raw, where)
            if line is None:
                continue
            text, replaced = line
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                self._skip(where, f"invalid JSON: {e.msg} at column {e.colno}")
                continue
            except RecursionError:
                self._skip(where, f"invalid JSON: nested deeper than Python's limit ({sys.getrecursionlimit():,})")
                continue
            except ValueError as e:  # an integer of more digits than int() converts (sys.get_int_max_str_digits)
                self._skip(where, f"invalid JSON: {e}")
                continue
            if not isinstance(obj, dict):
                self._skip(where, f"not a JSON object: got {_json_type(obj)}; expected {{\"{self.text_field}\": ...}}")
                continue
            if self.text_field not in obj:
                fields = ", ".join(sorted(map(str, obj))[:8]) or "none"
                self._skip(
                    where, f"no {self.text_field!r} field: the object has {fields}; choose the field with --text-field"
                )
                continue
            value = obj[self.text_field]
            if not isinstance(value, str):
                self._skip(where, f"field {self.text_field!r} holds {_json_type(value)}, expected a string")
                continue
            value, fixed = self._fix_surrogates(value, where)
            if value is None:
                continue
            doc_id = obj.get("id")
            doc = self._document(
                str(doc_id) if isinstance(doc_id, (str, int)) else where, value, where, replaced or fixed
            )
            if doc is not None:
                used.documents += 1
                used.nbytes += len(raw)
                yield doc

    # ---------------------------------------------------------------------------------------- helpers
    def _read_text(self, f: Any, src: str) -> bytes | None:
        """A whole-file document, read only after its first _BINARY_PROBE bytes passed the binary check and only
        up to max_document_bytes (None, recorded in ``skipped``, when it fails either)."""
        data = _read_upto(f, _BINARY_PROBE)
        nul = data.find(b"\x00")
        if nul >= 0:
            self._skip(src, f"binary file: NUL byte at offset {nul}; expected UTF-8 text")
            return None
        if len(data) == _BINARY_PROBE:
            data += _read_upto(f, self.max_document_bytes + 1 - len(data))
        if len(data) > self.max_document_bytes:
            self._skip(src, self._too_large(f"more than {self.max_document_bytes:,} bytes"))
            return None
        return data

    def _too_large(self, what: str) -> str:
        return (f"document too large: {what}; documents are at most {self.max_document_bytes:,} bytes "
                "(max_document_bytes), so it was left out. Split it into smaller documents, or raise the bound")

    def _text_document(self, data: bytes, doc_id: str, src: str) -> Document | None:
        decoded = self._decode(data, src)
        if decoded is None:
            return None
        return self._document(doc_id, decoded[0], src, decoded[1])

    def _document(self, doc_id: str, text: str, src: str, replaced: bool) -> Document | None:
        if not text:
            self._skip(src, "empty document: no text")
            return None
        if replaced:
            self.replaced += 1
        return Document(id=doc_id, text=text, source=src, replaced=replaced)

    def _decode(self, data: bytes, src: str) -> tuple[str, bool] | None:
        try:
            return data.decode("utf-8"), False
        except UnicodeDecodeError as e:
            if self.invalid_utf8 == "skip":
                self._skip(src, f"invalid UTF-8: byte {e.start} ({data[e.start:e.start + 1]!r}); "
                                "use invalid_utf8='replace' to keep it with U+FFFD")
                return None
            return data.decode("utf-8", errors="replace"), True

    def _fix_surrogates(self, text: str, src: str) -> tuple[str | None, bool]:
        """JSON may carry lone surrogates ("\\ud800") that have no UTF-8; treat them like invalid UTF-8."""
        try:
            text.encode("utf-8")
            return text, False
        except UnicodeEncodeError as e:
            if self.invalid_utf8 == "skip":
                self._skip(src, f"invalid UTF-8: lone surrogate U+{ord(text[e.start]):04X} at character {e.start}")
                return None, False
            return text.encode("utf-8", errors="replace").decode("utf-8"), True

    def _skip(self, source: str, reason: str) -> None:
        self.skipped.append(Skipped(source=source, reason=reason))


def iter_documents(
    paths: Sequence[str | os.PathLike[str]] | str | os.PathLike[str],
    *,
    text_field: str = "text",
    invalid_utf8: str = "replace",
    skipped: list[Skipped] | None = None,
) -> Iterator[Document]:
    """Yield the documents under `paths` (see :class:`Corpus`); append what was skipped to `skipped`."""
    corpus = Corpus(paths if not isinstance(paths, (str, os.PathLike)) else [paths], text_field=text_field,
                    invalid_utf8=invalid_utf8)
    try:
        yield from corpus
    finally:
        if skipped is not None:
            skipped.extend(corpus.skipped)


def as_documents(texts: Iterable[str | Document]) -> Iterator[Document]:
    """Wrap plain strings as Documents ("doc 0", "doc 1", ...); pass Documents through."""
    for i, t in enumerate(texts):
        if isinstance(t, Document):
            yield t
        elif isinstance(t, str):
            yield Document(id=f"doc {i}", text=t, source=f"doc {i}")
        else:
            raise PolymemError(
                f"text {i} is a {type(t).__name__}, expected str or polymem.corpus.Document; decode bytes first"
            )


@dataclass
class _Progress:
    """How far a file was read: lines seen, documents yielded and their raw bytes (to report a partial file)."""

    lines: int = 0
    documents: int = 0
    nbytes: int = 0


def _read_upto(f: Any, n: int) -> bytes:
    """Up to ``n`` bytes of ``f``: fewer only at its end (a stream's read() may return less)."""
    parts, got = [], 0
    while got < n and (chunk := f.read(n - got)):
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def _utf8_over(text: str, limit: int) -> bool:
    """Whether ``text`` has more than ``limit`` UTF-8 bytes (1 to 4 per character: encode only when in doubt)."""
    return len(text) > limit or (4 * len(text) > limit and len(text.encode("utf-8", "replace")) > limit)


def _json_type(value: object) -> str:
    names = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number",
             bool: "a boolean", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _zstd_errors() -> tuple[type[BaseException], ...]:
    try:
        import zstandard
    except ImportError:
        return ()
    return (zstandard.ZstdError,)


def _read_errors() -> tuple[type[BaseException], ...]:
    """What a damaged or truncated file raises while it is read and decompressed (gzip.BadGzipFile is an OSError)."""
    return (OSError, EOFError, zlib.error) + _zstd_errors()


class FilePartition:
    """Part of a corpus (pieces of files) that any process can read: ``read(skipped)`` yields its documents and
    appends what it left out to ``skipped``; ``replaced`` then counts its documents with invalid UTF-8."""

    def __init__(self, pieces: tuple[Piece, ...], text_field: str, invalid_utf8: str,
                 storage_options: dict[str, Any] | None, token: str | None = None,
                 max_document_bytes: int = MAX_DOCUMENT_BYTES) -> None:
        self.pieces, self.text_field, self.invalid_utf8 = pieces, text_field, invalid_utf8
        self.storage_options, self.max_document_bytes = storage_options, max_document_bytes
        self.token = token
        self.replaced = 0

    def __repr__(self) -> str:
        what = ", ".join(f"{p.file.url}[{p.start}:{'' if p.stop is None else p.stop}]" for p in self.pieces[:3])
        return f"FilePartition({what}{', ...' if len(self.pieces) > 3 else ''})"

    def est_bytes(self) -> float:
        """About how many bytes of text the partition holds (compressed files: estimated)."""
        return sum(p.est_bytes() for p in self.pieces)

    def read(self, skipped: list[Skipped]) -> Iterator[Document]:
        reader = Corpus(["-"], text_field=self.text_field, invalid_utf8=self.invalid_utf8,
                        storage_options=self.storage_options, max_document_bytes=self.max_document_bytes)
        try:
            for piece in self.pieces:
                yield from reader._read_piece(piece, self.token)
        finally:
            skipped.extend(reader.skipped)
            self.replaced = reader.replaced
