"""safetensors files read and written by byte ranges: the header parsed here, tensors never loaded whole.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON (``{"__metadata__": {str: str},
name: {"dtype", "shape", "data_offsets": [begin, end]}}``, padded with spaces), then the tensors' bytes;
offsets count from the end of the header. The reader enforces what the format says (sizes match dtype × shape,
every tensor inside the file, no two sharing a byte, no key twice, header at most 100 MB), reads regular files
only and, in a folder, only the folder's own files (:mod:`polymem.engines._files`); the writer lays tensors
out in the order given, header padded to 8 bytes, as the safetensors library does. No numpy arrays of whole
tensors, no torch.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from polymem.engines._files import check_disjoint, in_folder, open_regular, parse_json, read_json
from polymem.errors import FormatError

ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "U16": 2, "I16": 2, "F16": 2,
            "BF16": 2, "U32": 4, "I32": 4, "F32": 4, "U64": 8, "I64": 8, "F64": 8}
MAX_HEADER = 100 << 20
INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class Tensor:
    """One tensor of a file (2-d for a table; a scalar is one row): its rows are ``row_bytes`` each, starting at byte ``start`` of ``path``."""

    name: str
    path: Path
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute offset of the first byte

    @property
    def rows(self) -> int:
        return self.shape[0] if self.shape else 1  # a scalar is one row of one value

    @property
    def row_bytes(self) -> int:
        return math.prod(self.shape[1:]) * ITEMSIZE[self.dtype]

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes


def read_header(path: Path) -> tuple[dict[str, str], dict[str, Tensor]]:
    """(metadata, name -> Tensor) of one safetensors file; FormatError names the file, field and fix. A file that
    is not a regular file is refused before it is opened; every entry's byte range lies inside the file and no
    two tensors share a byte."""
    with os.fdopen(open_regular(path, "safetensors file"), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if not 2 <= n <= min(MAX_HEADER, size - 8):
            raise FormatError(f"{str(path)!r} is not a safetensors file (header length {n}); pass the model's "
                              "*.safetensors files or its directory")
        doc = parse_json(f.read(n), f"{str(path)!r}: safetensors header")
    if not isinstance(doc, dict):
        raise FormatError(f"{str(path)!r}: safetensors header is a JSON {type(doc).__name__}, not an object of "
                          "tensors; the file is damaged or not a safetensors file, fetch it again")
    meta = doc.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise FormatError(f"{str(path)!r}: safetensors __metadata__ is {_short(meta)}; expected an object of "
                          "strings. The file is damaged, fetch it again")
    spans = [(*_offsets(path, name, d, size - 8 - n), name) for name, d in doc.items()]
    check_disjoint(path, spans, "safetensors")
    out = {name: _tensor(path, name, d, 8 + n) for name, d in doc.items()
           if d.get("dtype") in ITEMSIZE}  # others (sub-byte floats) are no table's
    return dict(meta), out


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _offsets(path: Path, name: str, d: Any, data_bytes: int) -> tuple[int, int]:
    """The [begin, end) of entry ``name`` in the data section (``data_bytes`` long)."""
    offsets = d.get("data_offsets") if isinstance(d, dict) else None
    if not isinstance(d, dict) or not isinstance(d.get("dtype"), str) or "shape" not in d or offsets is None:
        raise FormatError(f"{str(path)!r}: tensor {name!r} entry {_short(d)} lacks dtype, shape or data_offsets; "
                          "the file is damaged, fetch it again")
    ok = isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_int, offsets))
    if not ok or not 0 <= offsets[0] <= offsets[1] <= data_bytes:
        raise FormatError(f"{str(path)!r}: tensor {name!r} has data_offsets {_short(offsets)}; expected two "
                          f"integers [begin, end] with 0 <= begin <= end <= {data_bytes} (the bytes after the "
                          "header). The file is damaged or truncated, fetch it again")
    return offsets[0], offsets[1]


def _tensor(path: Path, name: str, d: dict[str, Any], base: int) -> Tensor:
    dtype, shape, (a, b) = d["dtype"], d["shape"], d["data_offsets"]
    if not isinstance(shape, list) or not all(_is_int(v) and v >= 0 for v in shape):
        raise FormatError(f"{str(path)!r}: tensor {name!r} has shape {_short(shape)}; expected a list of "
                          "integers >= 0. The file is damaged, fetch it again")
    want = math.prod(shape) * ITEMSIZE[dtype]
    if b - a != want:
        raise FormatError(f"{str(path)!r}: tensor {name!r} ({dtype}, {shape}) has data_offsets {[a, b]}; "
                          f"expected {want} bytes ({dtype} x {shape}). The file is damaged, fetch it again")
    return Tensor(name, path, dtype, tuple(shape), base + a)


def find_files(src: Path) -> tuple[list[Path], dict[str, Any] | None]:
    """The safetensors files of ``src`` (a file, a directory with ``model.safetensors.index.json``, or a
    directory of ``*.safetensors``) and the index (None without one). Every file of a directory is one of its
    own (:func:`polymem.engines._files.in_folder`); the index is JSON whose ``weight_map`` maps tensor names to
    such file names."""
    if not src.is_dir():
        return [src], None  # read_header refuses what is not a regular file
    index = src / INDEX
    if os.path.lexists(index):
        where = f"the index {str(index)!r}"
        doc = read_json(index, "checkpoint index")
        wm = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(wm, dict) or not wm or not all(isinstance(v, str) for v in wm.values()):
            raise FormatError(f"{where} has weight_map {_short(wm)}; expected an object mapping each tensor name to "
                              "its file name. Fetch the checkpoint's index again, or remove it to read every "
                              "*.safetensors file of the folder")
        return [in_folder(src, f, where) for f in sorted(set(wm.values()))], doc
    files = [in_folder(src, p.name, f"the folder {str(src)!r}") for p in sorted(src.glob("*.safetensors"))]
    if not files:
        raise FormatError(f"{str(src)!r} holds no {INDEX} and no *.safetensors files; pass the model directory")
    return files, None


def pread_rows(t: Tensor, fd: int, a: int, b: int) -> bytes:
    """Rows [a, b) of ``t`` as bytes, from an open descriptor of its file."""
    want = (b - a) * t.row_bytes
    data = os.pread(fd, want, t.start + a * t.row_bytes)
    if len(data) != want:
        raise FormatError(f"{str(t.path)!r}: tensor {t.name!r} is truncated (rows {a}..{b} read {len(data)} of "
                          f"{want} bytes); the file changed while it was read")
    return data


def header_bytes(metadata: dict[str, str], tensors: Iterable[tuple[str, str, tuple[int, ...]]]) -> bytes:
    """The header of a file holding ``tensors`` (name, dtype, shape) back to back in that order."""
    doc: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    pos = 0
    for name, dtype, shape in tensors:
        n = math.prod(shape) * ITEMSIZE[dtype]
        doc[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [pos, pos + n]}
        pos += n
    body = json.dumps(doc, separators=(",", ":")).encode()
    body += b" " * (-len(body) % 8)
    return struct.pack("<Q", len(body)) + body
