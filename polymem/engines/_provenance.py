"""The record export writes from: an imported table's ``engine_source`` provenance, checked whole before a byte
is written.

``polymem import`` records, per source file, its name, metadata and tensors in data order, each as ``[name, dtype,
shape, layer index, first row in the layer, byte column in the asset row]`` (a constant: layer −1 and its bytes
as hex). The record sits in the asset's header, which anyone can edit and re-checksum, so export trusts none of
it: every file is named once, as one plain name; every tensor once across the files; every table tensor lies
inside its layer's rows and the asset row's bytes; a constant's hex is its size. Any other record is one
FormatError naming the value, and nothing is written.
"""

from __future__ import annotations

from typing import Any

from polymem.asset import _fs
from polymem.engines import _gguf
from polymem.engines import _safetensors as st
from polymem.errors import FormatError

GGML_TYPE = {"I8": _gguf.TYPE_I8}  # the tensor dtypes export writes to a GGUF file
_FIX = "The asset was edited: import the checkpoint again"


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _file_name(a: Any, f: Any) -> str:
    if not isinstance(f, dict) or not isinstance(f.get("name"), str):
        raise FormatError(f"{a.path}: provenance engine_source.files holds {_short(f)}, not a file record with a "
                          f"name; {_FIX}")
    name = _fs.check_key(f["name"], f"{a.path}: provenance engine_source.files[].name")
    if "/" in name:  # names come from the header: one plain file name each, nothing outside the output
        raise FormatError(f"{a.path}: provenance names the file {name!r}; an exported file is a plain name "
                          f"in the output directory. {_FIX}")
    return name


def _check_metadata(a: Any, f: dict[str, Any], fmt: str) -> None:
    meta, where = f.get("metadata"), f"{a.path}: provenance engine_source of {f['name']!r}"
    if fmt == "safetensors":
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            raise FormatError(f"{where} has metadata {_short(meta)}; a safetensors file's metadata is an object of "
                              f"strings. {_FIX}")
        return
    keys = [m[0] for m in meta if isinstance(m, list) and len(m) == 3 and isinstance(m[0], str)] \
        if isinstance(meta, list) else []
    if not isinstance(meta, list) or len(keys) != len(meta) or len(set(keys)) != len(keys):
        raise FormatError(f"{where} has metadata {_short(meta)}; a GGUF file's metadata is a list of [key, type, "
                          f"value] with each key once. {_FIX}")
    align = f.get("alignment")
    if not isinstance(align, int) or isinstance(align, bool) or align <= 0 or align % 8:
        raise FormatError(f"{where} has alignment {_short(align)}; GGUF requires a positive multiple of 8. {_FIX}")


def _check_tensor(a: Any, e: Any, fmt: str, where: str) -> str:
    """The name of the tensor record ``e``, after checking it (see the module docstring)."""
    dtypes = st.ITEMSIZE if fmt == "safetensors" else GGML_TYPE
    ok = isinstance(e, list) and len(e) == 6 and isinstance(e[0], str) and e[0] != "" and isinstance(e[1], str) \
        and e[1] in dtypes and isinstance(e[2], list) and all(_is_int(v) and v >= 0 for v in e[2]) \
        and _is_int(e[3]) and _is_int(e[4])
    if not ok:
        raise FormatError(f"{where}: tensor record {_short(e)} is not [name, dtype, shape, layer, first row, column] "
                          f"with a dtype in {sorted(dtypes)}; {_FIX}")
    name, dtype, shape, layer, row, col = e
    t = st.Tensor(name, a.path, dtype, tuple(shape), 0)
    n_layers = len(a.spec.row_base)
    if layer == -1:  # a constant recorded at import: its bytes as hex
        if not isinstance(col, str) or len(col) != 2 * t.nbytes or not _is_hex(col):
            raise FormatError(f"{where}: provenance records {name!r} as {_short(col)}, not {t.nbytes} bytes of "
                              f"hex; {_FIX}")
        return name
    if not 0 <= layer < n_layers:
        raise FormatError(f"{where}: tensor {name!r} is recorded for layer index {layer}; this table has layer "
                          f"indices 0..{n_layers - 1} (and -1 for a constant). {_FIX}")
    stored, width = a.spec.addressing.layers[layer].stored_rows, a.geometry.row_bytes
    if not (shape and _is_int(col) and row >= 0 and row + t.rows <= stored and 0 <= col
            and col + t.row_bytes <= width):
        raise FormatError(f"{where}: tensor {name!r} ({dtype} {shape}) is recorded at rows {row}..{row + t.rows} "
                          f"and byte column {_short(col)} of layer index {layer}, which has {stored} rows of "
                          f"{width} bytes. {_FIX}")
    return name


def _is_hex(text: str) -> bool:
    try:
        bytes.fromhex(text)
    except ValueError:
        return False
    return True


def check_engine_source(a: Any, src: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """(format, file records) of the ``engine_source`` provenance ``src`` of the engine-table asset ``a``, every
    value export uses checked; a FormatError names the first bad one."""
    fmt = src.get("format", "safetensors")
    if fmt not in ("safetensors", "gguf"):
        raise FormatError(f"{a.path}: provenance engine_source.format is {fmt!r}; accepted: safetensors, gguf")
    files = src.get("files")
    if not isinstance(files, list) or not files or not isinstance(src.get("index", False), bool):
        raise FormatError(f"{a.path}: provenance engine_source has files {_short(files)} and index "
                          f"{_short(src.get('index'))}; expected a non-empty list of file records and true/false. "
                          f"{_FIX}")
    where_of: dict[str, str] = {}  # tensor name -> its file
    seen: set[str] = set()
    for f in files:
        name = _file_name(a, f)
        if name in seen:
            raise FormatError(f"{a.path}: provenance engine_source names the file {name!r} twice; each exported file "
                              f"is written once (the second would replace the first). {_FIX}")
        seen.add(name)
        entries = f.get("tensors")
        if not isinstance(entries, list) or not entries:
            raise FormatError(f"{a.path}: provenance engine_source of {name!r} has tensors {_short(entries)}; "
                              f"expected a non-empty list of tensor records. {_FIX}")
        for e in entries:
            t = _check_tensor(a, e, fmt, f"{a.path}: provenance engine_source of {name!r}")
            if t in where_of:
                both = f"twice in {name!r}" if where_of[t] == name else f"in both {where_of[t]!r} and {name!r}"
                raise FormatError(f"{a.path}: provenance engine_source records tensor {t!r} {both}; a checkpoint "
                                  f"holds each tensor once. {_FIX}")
            where_of[t] = name
        _check_metadata(a, f, fmt)
    return fmt, files


__all__ = ["GGML_TYPE", "check_engine_source"]
