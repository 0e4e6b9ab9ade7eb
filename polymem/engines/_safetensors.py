"""safetensors files read and written by byte ranges: the header parsed here, tensors never loaded whole.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON (``{"__metadata__": {str: str},
name: {"dtype", "shape", "data_offsets": [begin, end]}}``, padded with spaces), then the tensors' bytes;
offsets count from the end of the header. The reader enforces what the format says (sizes match dtype × shape,
every tensor inside the file, header at most 100 MB); the writer lays tensors out in the order given, header
padded to 8 bytes, as the safetensors library does. No numpy arrays of whole tensors, no torch.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

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
    """(metadata, name -> Tensor) of one safetensors file; FormatError names the file, field and fix."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if not 2 <= n <= min(MAX_HEADER, size - 8):
            raise FormatError(f"{str(path)!r} is not a safetensors file (header length {n}); pass the model's "
                              "*.safetensors files or its directory")
        try:
            doc = json.loads(f.read(n))
        except ValueError as e:
            raise FormatError(f"{str(path)!r}: safetensors header is not JSON ({e})") from None
    meta = doc.pop("__metadata__", None) or {}
    out = {name: _tensor(path, name, d, 8 + n, size) for name, d in doc.items()
           if not isinstance(d, dict) or d.get("dtype") in ITEMSIZE}  # others (sub-byte floats) are no table's
    return dict(meta), out


def _tensor(path: Path, name: str, d: Any, base: int, size: int) -> Tensor:
    try:
        dtype, shape, (a, b) = d["dtype"], tuple(int(v) for v in d["shape"]), d["data_offsets"]
    except (KeyError, TypeError, ValueError):
        raise FormatError(f"{str(path)!r}: tensor {name!r} entry {d!r} lacks dtype, shape or data_offsets") from None
    want = math.prod(shape) * ITEMSIZE.get(dtype, 0)
    if dtype not in ITEMSIZE or not 0 <= a <= b <= size - base or b - a != want:
        raise FormatError(f"{str(path)!r}: tensor {name!r} ({dtype}, {list(shape)}) has data_offsets {[a, b]}; "
                          f"expected {want} bytes inside the file of a dtype in {sorted(ITEMSIZE)}")
    return Tensor(name, path, dtype, shape, base + a)


def find_files(src: Path) -> tuple[list[Path], dict[str, Any] | None]:
    """The safetensors files of ``src`` (a file, a directory with ``model.safetensors.index.json``, or a
    directory of ``*.safetensors``) and the index (None without one)."""
    if src.is_file():
        return [src], None
    index = src / INDEX
    if index.is_file():
        doc = json.loads(index.read_text())
        files = sorted(set(doc.get("weight_map", {}).values()))
        return [src / f for f in files], doc
    files = sorted(src.glob("*.safetensors"))
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
