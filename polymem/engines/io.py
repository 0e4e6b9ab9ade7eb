"""Import and export of the released engines' tables: DeepSeek-V4.1's Engram (safetensors, or ds4's GGUF),
Qwen3.8's PLE shards (BF16, or the FP8 variant with its one global scale).

    asset = import_table("DeepSeek-V4.1-Flash/", "ds-engram.pmem", addressing=addressing("deepseek-v4.1"))
    export_table("ds-engram.pmem", "ds-out/")   # the table's tensors again, byte for byte

* **DeepSeek** (``model.safetensors.index.json``, or the files themselves): per layer L,
  ``layers.{L}.engram.embed.weight`` F8_E4M3 [rows, D] and ``layers.{L}.engram.embed.scale`` F8_E8M0
  [rows, D/32] become one asset row of ``D + D/32`` bytes (weight ‖ scale: 264 B for D = 256), dtype
  ``fp8-e4m3-e8m0``. **ds4's GGUF** holds the same rows already packed: ``blk.{L}.engram_embd.weight``, ggml
  I8, dims [264, rows] (``polymem/engines/_gguf.py`` reads the container).
* **Qwen** PLE: ``…ple_embedding.ngram_embedding.shard_{i}.weight`` BF16 [rows_per_shard, D], shards end to
  end, dtype ``bfloat16``; F8_E4M3 shards with the scalar ``…ngram_embedding.weight_scale`` (F32 or BF16)
  become ``fp8-e4m3`` with that scale.

One asset holds every table layer of the engine (:class:`polymem.asset.engine_table.EngineTableSpec`: layer i
starts at asset row ``row_base[i]``, on a page boundary); pages hold as many rows as fit in 4 KiB. Import copies
bytes (every row checked to decode to finite values) one shard at a time, reading tensors by byte ranges, so
memory stays bounded whatever the table's size; export writes the tensors back in one pass over the asset
(``pwrite`` of each tensor's columns at its offset), in the files, order and metadata they came from (recorded in
the asset's provenance as ``engine_source``), with an index when the source had one. Not here: tensors other
than the table's, GGUF encodings other than ds4's lossless rows.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from polymem._io import check_outputs_not_inputs
from polymem.asset import _codec, _commit, _fs
from polymem.asset._format import BLOCK_BYTES, CRC_BYTES, Geometry, geometry
from polymem.engines import _gguf
from polymem.engines._files import open_regular
from polymem.engines._provenance import GGML_TYPE, check_engine_source
from polymem.engines import _safetensors as st
from polymem.engines.addressing import EngineAddressing
from polymem.asset.engine_table import EngineTableSpec
from polymem.errors import FormatError, PolymemError
from polymem.hash.layout import Layout

_DEEPSEEK = re.compile(r"^(?:.*\.)?layers\.(\d+)\.engram\.embed\.(weight|scale)$")
_DS4_GGUF = re.compile(r"^blk\.(\d+)\.engram_embd\.weight$")  # ds4's gguf-tools/deepseek41_quantize.py
DS4_ENCODING = "e4m3_e8m0_32_row264"  # ds4's deepseek41.engram.encoding of the lossless rows
_QWEN = re.compile(r"^.*ple_embedding\.ngram_embedding\.shard_(\d+)\.weight$")
_QWEN_SCALE = re.compile(r"^.*ple_embedding\.ngram_embedding\.weight_scale$")
_BATCH_BYTES = 16 << 20  # asset bytes per read while exporting


@dataclass(frozen=True)
class Piece:
    """Rows ``row … row + rows − 1`` of table layer ``layer``: each asset row is its tensors' rows end to end."""

    layer: int  # index into the addressing's layers
    row: int
    tensors: tuple[st.Tensor, ...]

    @property
    def rows(self) -> int:
        return self.tensors[0].rows


@dataclass(frozen=True)
class Found:
    """What a reader found: the table's pieces, the asset dtype, fp8-e4m3's scale and the tensors export writes
    back as recorded bytes (Qwen's FP8 scale)."""

    pieces: list[Piece]
    dtype: str
    fp8_scale: float | None = None
    constants: tuple[tuple[st.Tensor, bytes], ...] = ()


def _deepseek(tensors: dict[str, st.Tensor], a: EngineAddressing) -> Found:
    found: dict[tuple[int, str], st.Tensor] = {}
    for name, t in tensors.items():
        m = _DEEPSEEK.match(name)
        if m:
            found[(int(m[1]), m[2])] = t
    pieces = []
    for i, layer in enumerate(a.layer_ids):
        w, s = found.get((layer, "weight")), found.get((layer, "scale"))
        if w is None or s is None:
            raise FormatError(f"no tensors layers.{layer}.engram.embed.weight/.scale in the source (found "
                              f"{sorted(found)}); fix: pass the model directory or an addressing of its layers")
        ok = (w.dtype, s.dtype) == ("F8_E4M3", "F8_E8M0") and len(w.shape) == len(s.shape) == 2 and \
            w.shape[1] % 32 == 0 and s.shape == (w.rows, w.shape[1] // 32)
        if not ok:
            raise FormatError(f"layer {layer}: weight {w.dtype} {list(w.shape)} and scale {s.dtype} {list(s.shape)}; "
                              "expected F8_E4M3 [rows, D] and F8_E8M0 [rows, D/32]")
        pieces.append(Piece(i, 0, (w, s)))
    return Found(pieces, "fp8-e4m3-e8m0")


def _qwen(tensors: dict[str, st.Tensor], a: EngineAddressing) -> Found:
    shards = sorted((int(m[1]), t) for name, t in tensors.items() if (m := _QWEN.match(name)))
    if [i for i, _ in shards] != list(range(len(shards))) or not shards:
        raise FormatError(f"expected …ple_embedding.ngram_embedding.shard_0 … shard_{{n-1}}.weight; found shards "
                          f"{[i for i, _ in shards]}; fix: pass every file of the checkpoint")
    first = shards[0][1]
    for i, t in shards:
        if t.dtype not in ("BF16", "F8_E4M3") or t.dtype != first.dtype or t.shape != first.shape or \
                len(t.shape) != 2:
            raise FormatError(f"PLE shard {i} ({t.name}) is {t.dtype} {list(t.shape)}; expected BF16 or F8_E4M3 "
                              f"{list(first.shape)} like shard 0")
    pieces = [Piece(0, i * first.rows, (t,)) for i, t in shards]
    if first.dtype == "BF16":
        return Found(pieces, "bfloat16")
    scales = [t for name, t in tensors.items() if _QWEN_SCALE.match(name)]
    if len(scales) != 1:
        raise FormatError(f"FP8 PLE shards need their one global scale …ple_embedding.ngram_embedding.weight_scale; "
                          f"found {[t.name for t in scales]}; fix: pass every file of the checkpoint")
    s = scales[0]
    if s.dtype not in ("F32", "BF16") or math.prod(s.shape) != 1:
        raise FormatError(f"{str(s.path)!r}: {s.name} is {s.dtype} {list(s.shape)}; expected one F32 or BF16 value")
    fd = open_regular(s.path, "safetensors file")
    try:
        raw = os.pread(fd, s.nbytes, s.start)
    finally:
        os.close(fd)
    bits = raw if s.dtype == "F32" else b"\0\0" + raw
    value = float(np.frombuffer(bits, "<f4")[0])
    if len(raw) != s.nbytes or not (np.isfinite(value) and value > 0):
        raise FormatError(f"{str(s.path)!r}: {s.name} holds {value!r} ({raw.hex()}); an FP8 PLE scale is a finite "
                          "value > 0")
    return Found(pieces, "fp8-e4m3", fp8_scale=value, constants=((s, raw),))


READERS = {"deepseek-v4.1": _deepseek, "qwen3.8-ple": _qwen}


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 80 else f"{text[:60]}… ({len(v)} values)"


def _check_ds4_metadata(h: _gguf.Header, a: EngineAddressing) -> None:
    """ds4's ``deepseek41.engram.*`` metadata, where the file has it, agrees with the addressing."""
    enc = h.get("deepseek41.engram.encoding")
    if enc is not None and enc != DS4_ENCODING:
        raise FormatError(f"{str(h.path)!r}: deepseek41.engram.encoding is {enc!r}; import reads ds4's lossless "
                          f"{DS4_ENCODING!r} rows (256 E4M3 bytes, 8 E8M0 scales), not a re-encoded table")
    want: dict[str, Any] = {
        "deepseek41.engram.layer_ids": list(a.layer_ids),
        "deepseek41.engram.rows": [t.stored_rows for t in a.layers],
        "deepseek41.engram.primes": [int(p) for t in a.layers for p in t.primes],
        "deepseek41.engram.multipliers": [int(m) for t in a.layers for m in t.multipliers],
        "deepseek41.engram.compressed_vocab_size": a.hashed_vocab,
        "deepseek41.engram.pad_id": a.fill_id,
        "deepseek41.engram.token_map": None if a.id_map is None else a.id_map.tolist(),
    }
    for key, expected in want.items():
        got = h.get(key)
        if got is not None and expected is not None and got != expected:
            raise FormatError(f"{str(h.path)!r}: {key} is {_short(got)}, the addressing {a.name!r} has "
                              f"{_short(expected)}; fix: pass the addressing of this file (--spec SPEC.json)")


def _read_gguf(src: Path, a: EngineAddressing) -> tuple[Found, dict[str, Any]]:
    """ds4's GGUF: per layer L the I8 tensor ``blk.{L}.engram_embd.weight`` [264, rows] of packed rows."""
    if a.name != "deepseek-v4.1":
        raise PolymemError(f"GGUF import reads DeepSeek-V4.1's Engram tables (ds4's lossless rows), not "
                           f"{a.name!r}: pass the checkpoint's *.safetensors")
    headers = [_gguf.read_header(f) for f in _gguf.find_files(src)]
    found: dict[int, tuple[_gguf.Header, _gguf.TensorInfo]] = {}
    for h in headers:
        for name, t in h.tensors.items():
            if (m := _DS4_GGUF.match(name)) and int(m[1]) in found:
                raise FormatError(f"{name} is in both {str(found[int(m[1])][0].path)!r} and {str(h.path)!r}")
            if m:
                found[int(m[1])] = (h, t)
    pieces, used = [], {}
    for i, layer in enumerate(a.layer_ids):
        if layer not in found:
            raise FormatError(f"{str(src)!r}: no tensor blk.{layer}.engram_embd.weight (found layers "
                              f"{sorted(found)}); fix: pass the GGUF holding DeepSeek-V4.1's Engram tables, or an "
                              "addressing of its layers (--spec)")
        h, t = found[layer]
        if t.ggml_type != _gguf.TYPE_I8 or len(t.dims) != 2 or t.dims[0] % 33 or not t.dims[0]:
            raise FormatError(f"{str(h.path)!r}: tensor {t.name} is ggml type {t.ggml_type} with dims {list(t.dims)}; "
                              f"expected I8 (type {_gguf.TYPE_I8}) [264, rows]: D E4M3 bytes then D/32 E8M0 scales "
                              "a row, D a multiple of 32")
        _gguf.check_tensor(h, t)
        pieces.append(Piece(i, 0, (st.Tensor(t.name, h.path, "I8", (t.dims[1], t.dims[0]), t.start),)))
        used[h.path.name] = h
    meta = {}
    for name, h in used.items():
        _check_ds4_metadata(h, a)
        kept, dropped = _gguf.recorded_metadata(h)
        meta[name] = {"alignment": h.alignment, "metadata": kept, "dropped_metadata": dropped}
    out = Found(pieces, "fp8-e4m3-e8m0")
    return out, _record(out, meta, "gguf", index=False)


def _rows_per_page(dtype: str, row_bytes: int) -> int:
    """Rows a page holds: as many as fit in one 4 KiB block (with its crc32c for the float dtypes)."""
    room = BLOCK_BYTES if dtype.startswith("fp8") else BLOCK_BYTES - CRC_BYTES
    return max(1, room // row_bytes)


def _plan(pieces: list[Piece], a: EngineAddressing, dtype: str) -> tuple[Layout, tuple[int, ...], int]:
    """(layout, first asset row of each layer, bytes per row) after checking each layer's rows."""
    rb = sum(t.row_bytes for t in pieces[0].tensors)
    for p in pieces:
        if sum(t.row_bytes for t in p.tensors) != rb:
            raise FormatError(f"{p.tensors[0].name} has rows of {sum(t.row_bytes for t in p.tensors)} bytes, "
                              f"{pieces[0].tensors[0].name} of {rb}; every layer of a table has one row width")
    head_dim = {"fp8-e4m3-e8m0": rb * 32 // 33, "bfloat16": rb // 2}.get(dtype, rb)
    for li, t in enumerate(a.layers):
        got = sum(p.rows for p in pieces if p.layer == li)
        if got != t.stored_rows:
            raise FormatError(f"layer {t.layer} holds {got} rows, the addressing {a.name!r} expects "
                              f"{t.stored_rows}; fix: pass the addressing of this checkpoint (--spec SPEC.json)")
    S = _rows_per_page(dtype, rb)
    bases, end = [], 0
    for t in a.layers:
        bases.append(end)
        end = -(-(end + t.stored_rows) // S) * S
    return Layout(pages=end // S, heads=1, slots=S, head_dim=head_dim, kind="flat"), tuple(bases), rb


class _Rows:
    """Asset rows [r0, r1) gathered from the source tensors (zeros between layers), by pread."""

    def __init__(self, pieces: list[Piece], bases: tuple[int, ...], row_bytes: int) -> None:
        self.pieces, self.bases, self.rb = pieces, bases, row_bytes
        self.fds = {t.path: -1 for p in pieces for t in p.tensors}

    def __enter__(self) -> "_Rows":
        for path in self.fds:
            self.fds[path] = open_regular(path, "checkpoint file")
        return self

    def __exit__(self, *exc: Any) -> None:
        for fd in self.fds.values():
            if fd >= 0:
                os.close(fd)

    def read(self, r0: int, r1: int) -> np.ndarray:
        out = np.zeros((r1 - r0, self.rb), dtype=np.uint8)
        for p in self.pieces:
            a = self.bases[p.layer] + p.row
            lo, hi = max(a, r0), min(a + p.rows, r1)
            col = 0
            for t in p.tensors if lo < hi else ():
                data = st.pread_rows(t, self.fds[t.path], lo - a, hi - a)
                out[lo - r0:hi - r0, col:col + t.row_bytes] = np.frombuffer(data, np.uint8).reshape(hi - lo, -1)
                col += t.row_bytes
        return out


def _check_finite(rows: np.ndarray, geom: Geometry, r0: int, where: str) -> None:
    """Every row decodes to finite values (an asset stores nothing else); names the first bad row. fp8 rows are
    decoded 4096 at a time (4 MB of float32), so the check adds no more than that to memory."""
    if geom.packed:
        for a in range(0, rows.shape[0], 4096):
            try:
                _codec.decode_rows(rows[a:a + 4096], geom)
            except _codec.Fp8ValueError as e:
                raise FormatError(f"{where}: asset row {r0 + a + e.row} decodes to {e.value!r}; the source holds "
                                  "NaN or inf values, which an asset does not store") from None
        return
    bad = (rows.view("<u2") & 0x7F80) == 0x7F80  # bfloat16 exponent all ones: inf or NaN
    if bad.any():
        raise FormatError(f"{where}: asset row {r0 + int(np.argwhere(bad)[0][0])} holds a BF16 inf or NaN, which an "
                          "asset does not store")


def import_table(src: str | os.PathLike[str], out: str | os.PathLike[str], *, addressing: EngineAddressing,
                 overwrite: bool = False, chunks_per_shard: int | None = None) -> Any:
    """Import the table of ``addressing``'s engine from ``src`` (a checkpoint directory, a safetensors file, or
    ds4's GGUF file or directory) into a new asset at ``out``; returns the opened asset."""
    from polymem.asset.core import MemoryAsset

    if addressing.name not in READERS:
        raise PolymemError(f"no importer for engine {addressing.name!r}; accepted: {', '.join(sorted(READERS))}")
    src = Path(src)
    check_outputs_not_inputs({"out": out}, [("source", src)])
    if _gguf.is_gguf(src):
        found, prov_source = _read_gguf(src, addressing)
    else:
        files, index = st.find_files(src)
        metas: dict[str, dict[str, Any]] = {}
        tensors: dict[str, st.Tensor] = {}
        for f in files:
            meta, got = st.read_header(f)
            metas[f.name] = {"metadata": meta}
            for name in got.keys() & tensors.keys():
                raise FormatError(f"tensor {name!r} is in both {str(tensors[name].path)!r} and {str(f)!r}; a "
                                  "checkpoint holds each tensor once, and which copy is the table's cannot be told. "
                                  "Remove the stale file (or pass the checkpoint's own files)")
            tensors.update(got)
        found = READERS[addressing.name](tensors, addressing)
        prov_source = _record(found, metas, "safetensors", index=index is not None)
    layout, bases, rb = _plan(found.pieces, addressing, found.dtype)
    geom = geometry(layout, found.dtype, chunks_per_shard, fp8_scale=found.fp8_scale)
    spec = EngineTableSpec(addressing=addressing, row_base=bases)
    prov = {"engine_source": prov_source, "created_by": "polymem import"}
    with _Rows(found.pieces, bases, rb) as rows:
        def chunk_source(s: int) -> np.ndarray:
            S, c0 = layout.slots, s * geom.chunks_per_shard * geom.pages_per_chunk
            c1 = min(layout.pages, c0 + geom.chunks_in_shard(s) * geom.pages_per_chunk)
            data = rows.read(c0 * S, c1 * S)  # [rows, row_bytes]
            _check_finite(data, geom, c0 * S, str(src))
            stored = data.reshape(c1 - c0, -1) if geom.packed else data.view("<u2").reshape(c1 - c0, S, -1)
            return _codec.pages_to_chunks(stored, geom)

        return MemoryAsset._write_new(out, spec, layout, None, dtype=found.dtype, orders=addressing.orders,
                                      provenance=prov, overwrite=overwrite, chunks_per_shard=chunks_per_shard,
                                      chunk_source=chunk_source, fp8_scale=found.fp8_scale)


def _record(found: Found, files_meta: dict[str, dict[str, Any]], fmt: str, *, index: bool) -> dict[str, Any]:
    """What export needs to write the tensors back: per file its metadata and tensors in data order
    ([name, dtype, shape, layer, first row in the layer, byte column in the asset row]; a constant tensor has
    layer −1 and its bytes as hex in place of the column)."""
    files: dict[str, list[Any]] = {}
    for p in found.pieces:
        col = 0
        for t in p.tensors:
            files.setdefault(t.path.name, []).append((t.start, [t.name, t.dtype, list(t.shape), p.layer, p.row, col]))
            col += t.row_bytes
    for t, raw in found.constants:
        files.setdefault(t.path.name, []).append((t.start, [t.name, t.dtype, list(t.shape), -1, 0, raw.hex()]))
    out: dict[str, Any] = {"dtype": found.dtype, "format": fmt, "index": index}
    if found.fp8_scale is not None:
        out["fp8_scale"] = found.fp8_scale
    out["files"] = [{"name": f, **files_meta[f], "tensors": [e for _, e in sorted(ts, key=lambda x: x[0])]}
                    for f, ts in sorted(files.items())]
    return out


def export_table(asset: Any, out_dir: str | os.PathLike[str], *, overwrite: bool = False) -> list[Path]:
    """Write the engine tensors of an imported ``asset`` (a MemoryAsset or its path) into ``out_dir``, in the
    files (safetensors or GGUF) they came from; returns the files written. Atomic: a temp directory renamed into
    place."""
    from polymem.asset.core import MemoryAsset

    a = asset if isinstance(asset, MemoryAsset) else MemoryAsset.open(asset)
    check_outputs_not_inputs({"out_dir": out_dir}, [("asset", a.path)])
    src = a.provenance.get("engine_source")
    if not isinstance(a.spec, EngineTableSpec) or not isinstance(src, dict):
        raise PolymemError(f"{a.path} is not an imported engine table (no engine spec or provenance "
                           "'engine_source'); export takes assets written by `polymem import`")
    if a.dtype != src.get("dtype"):
        raise PolymemError(f"{a.path} is stored as {a.dtype}; the engine's tensors need {src.get('dtype')}: export "
                           f"the imported asset, or `polymem quantize --to {src.get('dtype')}` it first")
    if a.dtype == "fp8-e4m3" and a.geometry.fp8_scale != src.get("fp8_scale"):
        raise PolymemError(f"{a.path}: its fp8 scale {a.geometry.fp8_scale!r} is not the imported one "
                           f"{src.get('fp8_scale')!r}, so its codes no longer match the engine's; export the imported "
                           "asset")
    fmt, files = check_engine_source(a, src)  # every value export uses, before anything is written
    dest = Path(out_dir)
    if dest.exists() and not overwrite:
        raise PolymemError(f"{str(dest)!r} already exists; pass overwrite=True (CLI: --overwrite) or pick another path")
    with _commit.building(dest) as tmp:
        written = _write_files(a, tmp, files, fmt)
        if fmt == "safetensors" and src.get("index"):
            _write_index(tmp, files)
        _commit.install(tmp, dest, overwrite=overwrite, lock_timeout=None)
    return [dest / p.name for p in written]


def _file_layout(f: dict[str, Any], fmt: str, where: str) -> tuple[bytes, list[int], int]:
    """(header bytes, absolute offset of each tensor, file size) of one exported file."""
    entries = f["tensors"]
    nbytes = [st.Tensor(e[0], Path(), e[1], tuple(e[2]), 0).nbytes for e in entries]
    try:
        if fmt == "safetensors":
            head = st.header_bytes(f["metadata"], [(e[0], e[1], tuple(e[2])) for e in entries])
            starts = [len(head) + sum(nbytes[:i]) for i in range(len(entries))]
            return head, starts, len(head) + sum(nbytes)
        align, offsets, pos = int(f["alignment"]), [], 0
        if align <= 0 or align % 8:
            raise ValueError(f"alignment {align} is not a positive multiple of 8")
        for n in nbytes:
            offsets.append(pos)
            pos = _gguf.aligned(pos + n, align)
        infos = [(e[0], tuple(reversed(e[2])), GGML_TYPE[e[1]], o) for e, o in zip(entries, offsets)]
        head = _gguf.header_bytes(f["metadata"], infos, align)
        return head, [len(head) + o for o in offsets], len(head) + pos
    except (KeyError, TypeError, ValueError, OverflowError, struct.error) as e:
        raise FormatError(f"{where}: provenance engine_source of {f.get('name')!r} is damaged ({e!r}); import the "
                          "checkpoint again") from None


def _pwrite(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _write_files(a: Any, root: Path, files: list[dict[str, Any]], fmt: str) -> list[Path]:
    """Every output file's header, then the tensors in one pass over the asset: the rows of each (layer, first
    row) are read once, a batch at a time, and each tensor's columns written at its offset."""
    fds, paths = [], []
    groups: dict[tuple[int, int, int], list[tuple[int, int, int, int]]] = {}
    try:
        for f in files:
            head, starts, size = _file_layout(f, fmt, str(a.path))
            path = root / f["name"]
            out = _fs.open_write(path)
            fds.append(out)
            paths.append(path)
            fd = out.fileno()
            _pwrite(fd, head, 0)
            os.ftruncate(fd, size)  # padding between GGUF tensors reads as zeros
            for (name, dtype, shape, layer, row, col), start in zip(f["tensors"], starts):
                t = st.Tensor(name, path, dtype, tuple(shape), start)
                if layer < 0:  # a constant recorded at import (its hex checked by check_engine_source)
                    _pwrite(fd, bytes.fromhex(col), start)
                else:
                    groups.setdefault((layer, row, t.rows), []).append((fd, start, col, t.row_bytes))
        for (layer, row, n), targets in groups.items():
            base = a.spec.row_base[layer] + row
            for lo, rows in _asset_rows(a, base, base + n):
                for fd, start, col, rb in targets:
                    _pwrite(fd, np.ascontiguousarray(rows[:, col:col + rb]).tobytes(), start + (lo - base) * rb)
        for out in fds:
            os.fsync(out.fileno())
    finally:
        for out in fds:
            out.close()
    return paths


def _asset_rows(a: Any, r0: int, r1: int) -> Any:
    """Yield (first row, stored row bytes uint8 [n, row_bytes]) over asset rows [r0, r1), a batch at a time."""
    S = a.layout.rows_per_page
    step = max(S, _BATCH_BYTES // a.geometry.page_bytes * S)
    for lo in range(r0, r1, step):
        hi = min(r1, lo + step)
        stored = a.read_stored(np.arange(lo // S, -(-hi // S)))
        rows = np.ascontiguousarray(stored).view(np.uint8).reshape(-1, a.geometry.row_bytes)
        yield lo, rows[lo - lo // S * S: hi - lo // S * S]


def _write_index(root: Path, files: list[dict[str, Any]]) -> None:
    weight_map = {e[0]: f["name"] for f in files for e in f["tensors"]}
    total = sum(st.Tensor(e[0], root, e[1], tuple(e[2]), 0).nbytes for f in files for e in f["tensors"])
    doc = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (root / st.INDEX).write_text(json.dumps(doc, indent=2) + "\n")


__all__ = ["READERS", "export_table", "import_table"]
