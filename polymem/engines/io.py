"""Import and export of the released engines' tables: DeepSeek-V4.1's Engram safetensors, Qwen3.8's PLE shards.

    asset = import_table("DeepSeek-V4.1-Flash/", "ds-engram.pmem", addressing=addressing("deepseek-v4.1"))
    export_table("ds-engram.pmem", "ds-out/")   # the table's tensors again, byte for byte

* **DeepSeek** (``model.safetensors.index.json``, or the files themselves): per layer L,
  ``layers.{L}.engram.embed.weight`` F8_E4M3 [rows, D] and ``layers.{L}.engram.embed.scale`` F8_E8M0
  [rows, D/32] become one asset row of ``D + D/32`` bytes (weight ‖ scale: 264 B for D = 256), dtype
  ``fp8-e4m3-e8m0``.
* **Qwen** PLE: ``…ple_embedding.ngram_embedding.shard_{i}.weight`` BF16 [rows_per_shard, D], shards end to
  end, dtype ``bfloat16``.

One asset holds every table layer of the engine (:class:`polymem.engines.table.EngineTableSpec`: layer i starts
at asset row ``row_base[i]``, on a page boundary); pages hold as many rows as fit in 4 KiB. Import copies bytes
(every row checked to decode to finite values) one shard at a time, reading tensors by byte ranges, so memory
stays bounded whatever the table's size; export writes the tensors back the same way, in the files, order and
``__metadata__`` they came from (recorded in the asset's provenance as ``engine_source``), with an index when
the source had one. Not here: GGUF, Qwen's FP8 variant, tensors other than the table's.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from polymem.asset import _codec, _commit, _fs
from polymem.asset._format import BLOCK_BYTES, CRC_BYTES, Geometry, geometry
from polymem.engines import _safetensors as st
from polymem.engines.addressing import EngineAddressing
from polymem.engines.table import EngineTableSpec
from polymem.errors import FormatError, PolymemError
from polymem.hash.layout import Layout

_DEEPSEEK = re.compile(r"^(?:.*\.)?layers\.(\d+)\.engram\.embed\.(weight|scale)$")
_QWEN = re.compile(r"^.*ple_embedding\.ngram_embedding\.shard_(\d+)\.weight$")
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


def _deepseek(tensors: dict[str, st.Tensor], a: EngineAddressing) -> tuple[list[Piece], str]:
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
    return pieces, "fp8-e4m3-e8m0"


def _qwen(tensors: dict[str, st.Tensor], a: EngineAddressing) -> tuple[list[Piece], str]:
    shards = sorted((int(m[1]), t) for name, t in tensors.items() if (m := _QWEN.match(name)))
    if [i for i, _ in shards] != list(range(len(shards))) or not shards:
        raise FormatError(f"expected …ple_embedding.ngram_embedding.shard_0 … shard_{{n-1}}.weight; found shards "
                          f"{[i for i, _ in shards]}; fix: pass every file of the checkpoint")
    first = shards[0][1]
    for i, t in shards:
        if t.dtype != "BF16" or t.shape != first.shape or len(t.shape) != 2:
            raise FormatError(f"PLE shard {i} ({t.name}) is {t.dtype} {list(t.shape)}; expected BF16 "
                              f"{list(first.shape)} like shard 0")
    return [Piece(0, i * first.rows, (t,)) for i, t in shards], "bfloat16"


READERS = {"deepseek-v4.1": _deepseek, "qwen3.8-ple": _qwen}


def _rows_per_page(dtype: str, row_bytes: int) -> int:
    """Rows a page holds: as many as fit in one 4 KiB block (with its crc32c for the float dtypes)."""
    room = BLOCK_BYTES if dtype.startswith("fp8") else BLOCK_BYTES - CRC_BYTES
    return max(1, room // row_bytes)


def _plan(pieces: list[Piece], a: EngineAddressing, dtype: str) -> tuple[Layout, tuple[int, ...], int]:
    """(layout, first asset row of each layer, bytes per row) after checking each layer's rows."""
    rb = sum(t.row_bytes for t in pieces[0].tensors)
    head_dim = pieces[0].tensors[0].shape[1]
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
            self.fds[path] = os.open(path, os.O_RDONLY)
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
    """Import the table of ``addressing``'s engine from ``src`` (a checkpoint directory or safetensors file)
    into a new asset at ``out``; returns the opened asset."""
    from polymem.asset.core import MemoryAsset

    if addressing.name not in READERS:
        raise PolymemError(f"no importer for engine {addressing.name!r}; accepted: {', '.join(sorted(READERS))}")
    files, index = st.find_files(Path(src))
    metas, tensors = {}, {}
    for f in files:
        metas[f.name], found = st.read_header(f)
        tensors.update(found)
    pieces, dtype = READERS[addressing.name](tensors, addressing)
    layout, bases, rb = _plan(pieces, addressing, dtype)
    geom = geometry(layout, dtype, chunks_per_shard)
    spec = EngineTableSpec(addressing=addressing, row_base=bases)
    prov = {"engine_source": _record(pieces, metas, index, dtype), "created_by": "polymem import"}
    with _Rows(pieces, bases, rb) as rows:
        def chunk_source(s: int) -> np.ndarray:
            S, c0 = layout.slots, s * geom.chunks_per_shard * geom.pages_per_chunk
            c1 = min(layout.pages, c0 + geom.chunks_in_shard(s) * geom.pages_per_chunk)
            data = rows.read(c0 * S, c1 * S)  # [rows, row_bytes]
            _check_finite(data, geom, c0 * S, str(src))
            stored = data.reshape(c1 - c0, -1) if geom.packed else data.view("<u2").reshape(c1 - c0, S, -1)
            return _codec.pages_to_chunks(stored, geom)

        return MemoryAsset._write_new(out, spec, layout, None, dtype=dtype, orders=addressing.orders,
                                      provenance=prov, overwrite=overwrite, chunks_per_shard=chunks_per_shard,
                                      chunk_source=chunk_source)


def _record(pieces: list[Piece], metas: dict[str, Any], index: Any, dtype: str) -> dict[str, Any]:
    """What export needs to write the tensors back: per file its metadata and tensors in data order
    ([name, dtype, shape, layer, first row in the layer, byte column in the asset row])."""
    files: dict[str, list[Any]] = {}
    for p in pieces:
        col = 0
        for t in p.tensors:
            files.setdefault(t.path.name, []).append((t.start, [t.name, t.dtype, list(t.shape), p.layer, p.row, col]))
            col += t.row_bytes
    return {"dtype": dtype, "index": index is not None,
            "files": [{"name": f, "metadata": metas[f], "tensors": [e for _, e in sorted(ts, key=lambda x: x[0])]}
                      for f, ts in sorted(files.items())]}


def export_table(asset: Any, out_dir: str | os.PathLike[str], *, overwrite: bool = False) -> list[Path]:
    """Write the engine tensors of an imported ``asset`` (a MemoryAsset or its path) into ``out_dir``, in the
    files they came from; returns the files written. Atomic: a temp directory renamed into place."""
    from polymem.asset.core import MemoryAsset

    a = asset if isinstance(asset, MemoryAsset) else MemoryAsset.open(asset)
    src = a.provenance.get("engine_source")
    if not isinstance(a.spec, EngineTableSpec) or not isinstance(src, dict):
        raise PolymemError(f"{a.path} is not an imported engine table (no engine spec or provenance "
                           "'engine_source'); export takes assets written by `polymem import`")
    if a.dtype != src["dtype"]:
        raise PolymemError(f"{a.path} is stored as {a.dtype}; the engine's tensors need {src['dtype']}: export the "
                           f"imported asset, or `polymem quantize --to {src['dtype']}` it first")
    for f in src["files"]:  # names come from the header: one plain file name each, nothing outside the output
        name = _fs.check_key(str(f.get("name", "")), f"{a.path}: provenance engine_source.files[].name")
        if "/" in name:
            raise FormatError(f"{a.path}: provenance names the file {name!r}; an exported file is a plain name "
                              "in the output directory. The asset was edited: import the checkpoint again")
    dest = Path(out_dir)
    if dest.exists() and not overwrite:
        raise PolymemError(f"{str(dest)!r} already exists; pass overwrite=True (CLI: --overwrite) or pick another path")
    with _commit.building(dest) as tmp:
        written = [_write_file(a, tmp, f) for f in src["files"]]
        if src["index"]:
            _write_index(tmp, src["files"])
        _commit.install(tmp, dest, overwrite=overwrite, lock_timeout=None)
    return [dest / p.name for p in written]


def _write_file(a: Any, root: Path, f: dict[str, Any]) -> Path:
    entries = [(name, dtype, tuple(shape)) for name, dtype, shape, *_ in f["tensors"]]
    path = root / f["name"]
    with _fs.open_write(path) as out:
        out.write(st.header_bytes(f["metadata"], entries))
        for name, dtype, shape, layer, row, col in f["tensors"]:
            t = st.Tensor(name, path, dtype, tuple(shape), 0)
            base = a.spec.row_base[layer] + row
            for _, rows in _asset_rows(a, base, base + t.rows):
                out.write(np.ascontiguousarray(rows[:, col:col + t.row_bytes]).tobytes())
        out.flush()
        os.fsync(out.fileno())
    return path


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
