"""GGUF files read and written by byte ranges: the header parsed here, tensor data never loaded whole.

GGUF version 3 (ggml ``docs/gguf.md``), little-endian: the magic ``GGUF``, u32 version, u64 tensor count, u64
metadata count; the metadata as (string key, u32 value type, value); the tensor infos as (string name, u32
n_dims, u64 dims innermost first, u32 ggml type, u64 offset into the data section); then the data section,
which starts at the next multiple of ``general.alignment`` (a u32, 32 when absent), each tensor's offset a
multiple of it. A string is a u64 byte length and UTF-8 bytes; an array a u32 element type, a u64 count and the
elements. The reader checks what it relies on (sizes inside the file, offsets aligned, no two tensors sharing a
byte, UTF-8), opens regular files only, and names the file and the value in every error; the writer pads the
header and every tensor to the alignment, as ggml's writer and ds4's quantiser do. Metadata values are kept as
plain JSON: integers as they are (a bool as 0/1), floats as the integer of their IEEE bits (so they round-trip
exactly), strings as str, an array as ``[element_type, [values]]``.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from polymem.engines._files import check_disjoint, in_folder, open_regular
from polymem.errors import FormatError

MAGIC = b"GGUF"
VERSION = 3
DEFAULT_ALIGNMENT = 32
TYPE_I8 = 24  # GGML_TYPE_I8: one byte an element
STRING, ARRAY = 8, 9
# value type -> numpy little-endian dtype of its bits (floats kept as their bits: u32 for f32, u64 for f64)
SCALAR = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<u4", 7: "<u1", 10: "<u8", 11: "<i8",
          12: "<u8"}
# ggml type -> (elements a block, bytes a block), as ggml's type traits (gguf-py GGML_QUANT_SIZES)
TYPE_SIZES = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 9: (32, 40),
              10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 15: (256, 292),
              16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18), 21: (256, 110),
              22: (256, 82), 23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8),
              29: (256, 56), 30: (1, 2), 34: (256, 54), 35: (256, 66), 39: (32, 17)}
MAX_DIMS = 4  # GGML_MAX_DIMS
KEEP_BYTES = 64 << 10  # metadata values above this (as JSON) are not recorded for export
MAX_VALUE_BYTES = 256 << 20  # one string or array of the header: a larger one is a damaged file, not read


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF file: ``dims`` innermost first, ``start`` the absolute offset of its data."""

    name: str
    dims: tuple[int, ...]
    ggml_type: int
    start: int


@dataclass(frozen=True)
class Header:
    path: Path
    version: int
    metadata: list[tuple[str, int, Any]]  # (key, value type, value) in file order
    alignment: int
    data_start: int
    size: int
    tensors: dict[str, TensorInfo]

    def get(self, key: str) -> Any:
        """The value of ``key`` (None when absent): an array's values as a list, a float's bits as an int."""
        for k, kind, v in self.metadata:
            if k == key:
                return v[1] if kind == ARRAY else v
        return None


class _Cursor:
    """Sequential reads of a GGUF header through a buffered file; every short read names the file and field."""

    def __init__(self, f: BinaryIO, path: Path, size: int) -> None:
        self.f, self.path, self.size, self.pos = f, path, size, 0

    def read(self, n: int, what: str) -> bytes:
        if n > MAX_VALUE_BYTES:
            raise FormatError(f"{str(self.path)!r}: GGUF header at byte {self.pos} claims {n} bytes for {what}, more "
                              f"than the {MAX_VALUE_BYTES} a header value may take here; the file is damaged")
        data = self.f.read(n) if n <= self.size - self.pos else b""
        if len(data) != n:
            raise FormatError(f"{str(self.path)!r}: GGUF header truncated at byte {self.pos} ({what}: {n} bytes, "
                              f"{self.size - self.pos} left in the file); the file is incomplete, fetch it again")
        self.pos += n
        return data

    def u32(self, what: str) -> int:
        return int(struct.unpack("<I", self.read(4, what))[0])

    def u64(self, what: str) -> int:
        return int(struct.unpack("<Q", self.read(8, what))[0])

    def string(self, what: str) -> str:
        n = self.u64(f"{what} length")
        raw = self.read(n, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise FormatError(f"{str(self.path)!r}: {what} {raw[:40]!r} is not UTF-8, which GGUF strings "
                              "are") from None

    def value(self, kind: int, key: str, depth: int = 0) -> Any:
        if kind == STRING:
            return self.string(f"metadata {key!r}")
        if kind in SCALAR:
            dt = np.dtype(SCALAR[kind])
            return int(np.frombuffer(self.read(dt.itemsize, f"metadata {key!r}"), dt)[0])
        if kind == ARRAY and depth < 2:
            elem, count = self.u32(f"metadata {key!r} element type"), self.u64(f"metadata {key!r} count")
            if elem in SCALAR:
                dt = np.dtype(SCALAR[elem])
                data = self.read(count * dt.itemsize, f"metadata {key!r} ({count} elements)")
                return [elem, np.frombuffer(data, dt).tolist()]
            if count > (self.size - self.pos) // 8:
                raise FormatError(f"{str(self.path)!r}: metadata {key!r} claims {count} elements, more than the "
                                  "file holds; the file is damaged")
            return [elem, [self.value(elem, key, depth + 1) for _ in range(count)]]
        raise FormatError(f"{str(self.path)!r}: metadata {key!r} has value type {kind}; GGUF defines 0-12 "
                          "(nested arrays at most two deep here)")


def read_header(path: Path) -> Header:
    """Parse the header of a GGUF file; FormatError names the file, the field and the value."""
    with os.fdopen(open_regular(path, "GGUF file"), "rb", buffering=1 << 20) as f:
        size = os.fstat(f.fileno()).st_size
        c = _Cursor(f, path, size)
        magic = c.read(4, "magic") if size >= 4 else b""
        if magic != MAGIC:
            raise FormatError(f"{str(path)!r} is not a GGUF file (starts with {magic!r}, not {MAGIC!r}); pass a "
                              ".gguf file or the checkpoint's *.safetensors")
        version = c.u32("version")
        if version != VERSION:
            raise FormatError(f"{str(path)!r}: GGUF version {version}; this reader takes version {VERSION} "
                              "(convert older files with llama.cpp's gguf tools)")
        n_tensors, n_kv = c.u64("tensor count"), c.u64("metadata count")
        if max(n_tensors, n_kv) > size // 8:
            raise FormatError(f"{str(path)!r}: GGUF header claims {n_tensors} tensors and {n_kv} metadata "
                              "entries, more than the file can hold; the file is damaged")
        metadata, seen = [], set()
        for _ in range(n_kv):
            key = c.string("metadata key")
            if key in seen:
                raise FormatError(f"{str(path)!r}: metadata key {key!r} appears twice; GGUF keys are unique")
            seen.add(key)
            kind = c.u32(f"metadata {key!r} type")
            metadata.append((key, kind, c.value(kind, key)))
        align = next((v for k, kind, v in metadata if k == "general.alignment"), DEFAULT_ALIGNMENT)
        if not (isinstance(align, int) and align > 0 and align % 8 == 0):
            raise FormatError(f"{str(path)!r}: general.alignment is {align!r}; GGUF requires a positive multiple "
                              "of 8")
        infos = []
        for _ in range(n_tensors):
            name = c.string("tensor name")
            nd = c.u32(f"tensor {name!r} n_dims")
            if not 1 <= nd <= MAX_DIMS:
                raise FormatError(f"{str(path)!r}: tensor {name!r} has {nd} dimensions; GGUF allows 1-{MAX_DIMS}")
            dims = tuple(c.u64(f"tensor {name!r} dims") for _ in range(nd))
            kind, offset = c.u32(f"tensor {name!r} type"), c.u64(f"tensor {name!r} offset")
            infos.append((name, dims, kind, offset))
        data_start = -(-c.pos // align) * align
    tensors: dict[str, TensorInfo] = {}
    for name, dims, kind, offset in infos:
        if name in tensors:
            raise FormatError(f"{str(path)!r}: tensor {name!r} appears twice; GGUF tensor names are unique")
        if offset % align:
            raise FormatError(f"{str(path)!r}: tensor {name!r} starts at data offset {offset}, not a multiple of "
                              f"the alignment {align}; the file is damaged")
        tensors[name] = TensorInfo(name, dims, kind, data_start + offset)
    _check_disjoint(path, list(tensors.values()))
    return Header(path, version, metadata, align, data_start, size, tensors)


def nbytes(t: TensorInfo) -> int | None:
    """Bytes of ``t``'s data for the ggml types of :data:`TYPE_SIZES`; None for another type."""
    if t.ggml_type not in TYPE_SIZES:
        return None
    block, size = TYPE_SIZES[t.ggml_type]
    return -(-math.prod(t.dims) // block) * size


def _check_disjoint(path: Path, tensors: list[TensorInfo]) -> None:
    """No two tensors share a byte: two layers at one offset would import one table twice. A tensor of a type
    whose size is not known here counts as its first byte (so two at one offset are still caught)."""
    spans = []
    for t in tensors:
        n = nbytes(t)
        spans.append((t.start, t.start + (n if n is not None else int(math.prod(t.dims) > 0)), t.name))
    check_disjoint(path, spans, "GGUF")


def check_tensor(h: Header, t: TensorInfo) -> None:
    """An I8 tensor's data lies inside the file (a truncated file is named, with the bytes missing)."""
    end = t.start + math.prod(t.dims)
    if end > h.size:
        raise FormatError(f"{str(h.path)!r}: tensor {t.name!r} {list(t.dims)} ends at byte {end}, past the end of "
                          f"the file ({h.size} bytes); the file is truncated, fetch it again")


def recorded_metadata(h: Header) -> tuple[list[list[Any]], list[str]]:
    """The metadata to record for export (as JSON lists), and the keys left out for their size (tokenizer
    vocabularies and the like, each above 64 KiB as JSON)."""
    kept, dropped = [], []
    for key, kind, value in h.metadata:
        if len(json.dumps(value)) > KEEP_BYTES:
            dropped.append(key)
        else:
            kept.append([key, kind, value])
    return kept, dropped


def _value_bytes(kind: int, value: Any, key: str) -> bytes:
    if kind == STRING:
        raw = str(value).encode("utf-8")
        return struct.pack("<Q", len(raw)) + raw
    if kind in SCALAR:
        return np.array([value], dtype=SCALAR[kind]).tobytes()
    if kind == ARRAY:
        elem, values = value
        head = struct.pack("<IQ", elem, len(values))
        if elem in SCALAR:
            return head + np.asarray(values, dtype=SCALAR[elem]).tobytes()
        return head + b"".join(_value_bytes(elem, v, key) for v in values)
    raise FormatError(f"metadata {key!r} has value type {kind}; GGUF defines 0-12")


def header_bytes(metadata: list[list[Any]], tensors: list[tuple[str, tuple[int, ...], int, int]],
                 alignment: int) -> bytes:
    """A GGUF v3 header for ``metadata`` ([key, type, value]) and ``tensors`` (name, dims innermost first, ggml
    type, data offset), zero-padded to ``alignment``: the data section starts right after it."""
    out = [MAGIC, struct.pack("<IQQ", VERSION, len(tensors), len(metadata))]
    for key, kind, value in metadata:
        out += [_value_bytes(STRING, key, key), struct.pack("<I", kind), _value_bytes(kind, value, key)]
    for name, dims, kind, offset in tensors:
        out += [_value_bytes(STRING, name, name), struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, kind, offset)]
    body = b"".join(out)
    return body + bytes(-len(body) % alignment)


def aligned(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def find_files(src: Path) -> list[Path]:
    """The GGUF files of ``src`` (a .gguf file, or a directory of them: each one of its own files,
    :func:`polymem.engines._files.in_folder`; read_header refuses one that is not a regular file)."""
    if not src.is_dir():
        return [src]
    files = [in_folder(src, p.name, f"the folder {str(src)!r}") for p in sorted(src.glob("*.gguf"))]
    if not files:
        raise FormatError(f"{str(src)!r} holds no *.gguf files; pass the GGUF file or its directory")
    return files


def is_gguf(src: Path) -> bool:
    """Whether ``src`` is read as GGUF: a ``.gguf`` file or one that starts with the magic, or a directory with
    *.gguf files and no safetensors."""
    if src.is_file():  # a regular file (or a link to one): opening it cannot block
        if src.suffix == ".gguf":
            return True
        with os.fdopen(open_regular(src, "model file"), "rb") as f:
            return f.read(4) == MAGIC
    return src.is_dir() and any(src.glob("*.gguf")) and not any(src.glob("*.safetensors"))


__all__ = ["TYPE_SIZES", "Header", "TensorInfo", "aligned", "check_tensor", "find_files", "header_bytes", "is_gguf",
           "nbytes", "read_header", "recorded_metadata"]

