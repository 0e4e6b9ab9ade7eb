"""The asset header (``attributes.polymem``) and storage geometry: build, parse, validate (docs/asset-format.md).

Pure functions over JSON-able dicts; no files, no zarr. Every check raises :class:`FormatError` naming the
field, the value found, what is accepted and the fix.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from polymem.asset import nf4
from polymem.errors import FormatError, PolymemError
from polymem.hash.spec import HashSpec, check_orders
from polymem.hash.layout import Layout

ASSET_FORMAT = "polymem.asset"
ASSET_VERSION = 2  # v2: every inner chunk (page / nf4 block) carries a crc32c (zarr's `crc32c` codec)
SUPPORTED_ASSET_VERSIONS = (1, 2)  # v1 opens read-only; `polymem upgrade` / MemoryAsset.upgrade rewrites it as v2
CRC_BYTES = 4
DTYPES = ("float32", "float16", "bfloat16", "nf4", "fp8-e4m3-e8m0", "fp8-e4m3")
# packed dtypes: rows of bytes (row_bytes) packed into 4 KiB blocks of whole pages, stored as uint8
PACKED = ("nf4", "fp8-e4m3-e8m0", "fp8-e4m3")
_STORED = {"float32": "float32", "float16": "float16", "bfloat16": "uint16", **dict.fromkeys(PACKED, "uint8")}
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
FP8_BLOCK = 32  # fp8-e4m3-e8m0: values per E8M0 scale byte
BLOCK_BYTES = 4096  # flash / OS page: NF4 pages are packed into blocks of this size and never straddle one
SHARD_TARGET_BYTES = 64 << 20  # default shard size
ARRAY_NAME = "pages"
WRITING_MARKER = ".polymem-writing"
LOCK_FILE = ".polymem-lock"
# bounds checked on the header before anything is sized from it (a crafted header must not allocate GiBs)
MAX_CHUNK_BYTES = 1 << 30  # one page (float) or one nf4 block
MAX_CHUNKS_PER_SHARD = 1 << 22  # shard index <= 64 MiB
MAX_SHARDS = 1 << 20
MAX_JSON_BYTES = 16 << 20  # zarr.json / pages/zarr.json
# shard ids (asset-format.md §13): a footer between a shard's chunks and its index, the tag then the first 16
# bytes of the sha256 of the shard's stored chunks; the header's checksums.shard_ids names each shard's id
SHARD_ID = "sha256-128"
SHARD_ID_TAG = b"polymem shard id"
FOOTER_BYTES = len(SHARD_ID_TAG) + 16


def canonical_json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_dtype(dtype: Any) -> str:
    if dtype not in DTYPES:
        raise PolymemError(f"asset dtype {dtype!r} is not supported; accepted: {', '.join(DTYPES)}")
    return str(dtype)


def row_bytes(dtype: str, head_dim: int) -> int:
    """Bytes of one stored row of a packed dtype: nf4 r/2 + 2, fp8-e4m3-e8m0 r + r/32, fp8-e4m3 r."""
    if dtype == "nf4":
        return nf4.row_bytes(head_dim)
    if dtype == "fp8-e4m3-e8m0" and head_dim % FP8_BLOCK:
        raise PolymemError(f"fp8-e4m3-e8m0 needs a head_dim that is a multiple of {FP8_BLOCK} (one E8M0 scale per "
                           f"{FP8_BLOCK} values), got {head_dim}; use fp8-e4m3 or bfloat16 instead")
    return head_dim + (head_dim // FP8_BLOCK if dtype == "fp8-e4m3-e8m0" else 0)


def check_fp8_scale(dtype: str, scale: Any) -> float | None:
    """fp8-e4m3's global scale: a finite float32 > 0, 1.0 when not given (None for every other dtype)."""
    if dtype != "fp8-e4m3":
        if scale is not None:
            raise PolymemError(f"a global fp8 scale is for dtype fp8-e4m3 only, not {dtype}")
        return None
    if scale is None:
        return 1.0
    ok = isinstance(scale, (int, float)) and not isinstance(scale, bool) and math.isfinite(scale) and scale > 0
    if not ok or float(np.float32(scale)) != scale:
        raise PolymemError(f"fp8-e4m3 scale {scale!r} must be a finite float32 number > 0 (values are stored as "
                           "e4m3 × scale); pick one with float(np.float32(x))")
    return float(scale)


def fp8_scale_for(dtype: str, amax: float) -> float | None:
    """The global scale fp8-e4m3 stores values of absolute maximum ``amax`` with: the smallest float32 with
    ``amax / scale ≤ 448`` (1.0 for an all-zero table); None for other dtypes."""
    if dtype != "fp8-e4m3":
        return None
    if not amax > 0:
        return 1.0
    s = np.float32(amax / 448.0)
    while amax / float(s) > 448.0 or s == 0:
        s = np.nextafter(s, np.float32(np.inf))
    return float(s)


@dataclass(frozen=True, kw_only=True)
class Geometry:
    """Where every page lives: chunk = one page (float) or one 4 KiB block of pages (nf4); shards of chunks."""

    dtype: str
    data_type: str  # zarr data type of the stored array
    shape: tuple[int, ...]  # [P, K·S, r] or [B, block_bytes]
    chunk_bytes: int
    pages_per_chunk: int
    page_bytes: int
    chunks_per_shard: int
    num_shards: int
    pages: int  # P
    rows_per_page: int  # K·S
    head_dim: int  # r
    crc: bool = True  # v2: each stored chunk is chunk_bytes + a 4-byte crc32c (v1: none)
    shard_id: bool = False  # each shard carries its id in a footer before the index (v2 assets written since)
    fp8_scale: float | None = None  # fp8-e4m3: the global scale (value = e4m3 × scale); None for other dtypes

    @property
    def packed(self) -> bool:
        """Rows of bytes packed into blocks of whole pages (nf4, fp8): the array is uint8 [B, block_bytes]."""
        return self.dtype in PACKED

    @property
    def row_bytes(self) -> int:
        return self.page_bytes // self.rows_per_page

    @property
    def stride(self) -> int:
        """Bytes of one stored chunk in a shard (chunk bytes + crc32c in v2)."""
        return self.chunk_bytes + (CRC_BYTES if self.crc else 0)

    @property
    def version(self) -> int:
        return ASSET_VERSION if self.crc else 1

    @property
    def num_chunks(self) -> int:
        return self.shape[0]

    @property
    def chunk_shape(self) -> tuple[int, ...]:
        return (1,) + self.shape[1:]

    @property
    def shard_shape(self) -> tuple[int, ...]:
        return (self.chunks_per_shard,) + self.shape[1:]

    def shard_key(self, s: int) -> str:
        """Key of shard ``s`` relative to the group, e.g. ``pages/c/3/0/0``."""
        return "/".join([ARRAY_NAME, "c", str(s)] + ["0"] * (len(self.shape) - 1))

    def chunks_in_shard(self, s: int) -> int:
        return min(self.chunks_per_shard, self.num_chunks - s * self.chunks_per_shard)

    @property
    def tail_bytes(self) -> int:
        """Bytes at the end of every shard after its chunks: the shard-id footer (if any), index, crc32c."""
        return (FOOTER_BYTES if self.shard_id else 0) + 16 * self.chunks_per_shard + 4

    def shard_size(self, s: int) -> int:
        return self.chunks_in_shard(s) * self.stride + self.tail_bytes

    def shard_of_page(self, p: int) -> tuple[int, int]:
        """(shard, chunk index inside the shard) holding page ``p``."""
        return divmod(p // self.pages_per_chunk, self.chunks_per_shard)

    def storage_dict(self) -> dict[str, Any]:
        d = {
            "array": ARRAY_NAME, "data_type": self.data_type, "shape": list(self.shape),
            "chunk_bytes": self.chunk_bytes, "pages_per_chunk": self.pages_per_chunk, "page_bytes": self.page_bytes,
            "chunks_per_shard": self.chunks_per_shard, "num_shards": self.num_shards,
        }
        if self.crc:
            d["chunk_checksum"] = "crc32c"
        if self.shard_id:
            d["shard_id"] = SHARD_ID
        if self.fp8_scale is not None:
            d["fp8_scale"] = self.fp8_scale
        return d


def geometry(layout: Layout, dtype: str, chunks_per_shard: int | None = None, *, version: int = ASSET_VERSION,
             shard_id: bool = True, fp8_scale: float | None = None) -> Geometry:
    """Derive the storage geometry of ``layout`` stored as ``dtype`` (docs/asset-format.md §4-5); shard ids
    (§13) from version 2 when ``shard_id``; ``fp8_scale``: fp8-e4m3's global scale.

    Raises PolymemError when a page/block or a shard index would exceed the format's bounds.
    """
    dtype = check_dtype(dtype)
    fp8_scale = check_fp8_scale(dtype, fp8_scale)
    KS, r, P = layout.rows_per_page, layout.head_dim, layout.pages
    if dtype in PACKED:
        page_bytes = KS * row_bytes(dtype, r)
        if page_bytes <= BLOCK_BYTES:
            ppc, chunk_bytes = BLOCK_BYTES // page_bytes, BLOCK_BYTES
        else:
            ppc, chunk_bytes = 1, math.ceil(page_bytes / BLOCK_BYTES) * BLOCK_BYTES
        shape: tuple[int, ...] = (math.ceil(P / ppc), chunk_bytes)
    else:
        page_bytes = KS * r * _ITEMSIZE[dtype]
        ppc, chunk_bytes, shape = 1, page_bytes, (P, KS, r)
    if chunk_bytes > MAX_CHUNK_BYTES:
        raise PolymemError(
            f"one page would be {chunk_bytes:,} bytes (K*S={KS}, r={r}, {dtype}); the format allows at most "
            f"{MAX_CHUNK_BYTES:,}; use fewer slots/heads or a narrower head_dim"
        )
    if chunks_per_shard is None:
        chunks_per_shard = max(1, min(MAX_CHUNKS_PER_SHARD, SHARD_TARGET_BYTES // chunk_bytes))
    if not isinstance(chunks_per_shard, int) or isinstance(chunks_per_shard, bool) or chunks_per_shard < 1:
        raise PolymemError(f"chunks_per_shard {chunks_per_shard!r} must be a positive integer")
    if min(chunks_per_shard, shape[0]) > MAX_CHUNKS_PER_SHARD:
        raise PolymemError(
            f"chunks_per_shard {chunks_per_shard:,} exceeds the format's bound {MAX_CHUNKS_PER_SHARD:,} "
            "(a shard index of at most 64 MiB); pick a smaller value"
        )
    cps = max(1, min(chunks_per_shard, shape[0]))
    num_shards = math.ceil(shape[0] / cps)
    if num_shards > MAX_SHARDS:
        raise PolymemError(
            f"the table would need {num_shards:,} shards, more than the format's bound {MAX_SHARDS:,}; "
            "raise chunks_per_shard"
        )
    if version not in SUPPORTED_ASSET_VERSIONS:
        raise PolymemError(f"asset format version {version!r} is unknown; accepted: {list(SUPPORTED_ASSET_VERSIONS)}")
    return Geometry(
        dtype=dtype, data_type=_STORED[dtype], shape=shape, chunk_bytes=chunk_bytes, pages_per_chunk=ppc,
        page_bytes=page_bytes, chunks_per_shard=cps, num_shards=num_shards, pages=P,
        rows_per_page=KS, head_dim=r, crc=version >= 2, shard_id=shard_id and version >= 2, fp8_scale=fp8_scale,
    )


@dataclass(frozen=True, kw_only=True)
class Header:
    """The parsed ``attributes.polymem`` of an asset."""

    spec: HashSpec
    layout: Layout
    orders: tuple[int, ...]
    dtype: str
    geometry: Geometry
    provenance: dict[str, Any]
    checksums: dict[str, Any]
    extras: dict[str, Any] = field(default_factory=dict)  # optional fields: tokenizer_bound, row_counts, sparse

    def to_dict(self) -> dict[str, Any]:
        d = header_body(self.spec, self.layout, self.orders, self.dtype, self.geometry, self.provenance, self.extras)
        d["checksums"] = self.checksums
        return d

    @property
    def sparse(self) -> bool:
        return "sparse" in self.extras


OPTIONAL_FIELDS = ("tokenizer_bound", "row_counts", "sparse")  # docs/asset-format.md §3, §10-12
# the header's row_counts field (the counts array itself is read and written by _counts.py)
COUNTS_ARRAY = "counts"
COUNTS_CHUNK_ROWS = 1 << 22  # 16 MiB of uint32 per chunk file


def check_counts_field(f: Any, layout: Layout, where: str) -> None:
    c = min(COUNTS_CHUNK_ROWS, layout.num_rows)
    ok = (isinstance(f, Mapping) and f.get("array") == COUNTS_ARRAY and f.get("data_type") == "uint32"
          and f.get("shape") == [layout.num_rows] and type(f.get("chunk_rows")) is int and f["chunk_rows"] == c)
    if not ok:
        raise FormatError(
            f"{where}: field 'row_counts' is {str(f)[:200]}; expected array 'counts', data_type 'uint32', shape "
            f"[{layout.num_rows}] (the table's rows) and chunk_rows {c} (min(2^22, rows)); restore the asset")


def header_body(
    spec: Any, layout: Layout, orders: tuple[int, ...], dtype: str, geom: Geometry, provenance: Mapping[str, Any],
    extras: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The header without ``checksums`` (what the ``attributes`` checksum covers)."""
    lay = layout.to_dict()
    lay["orders"] = list(orders)
    lay["joint"] = True
    body = {
        "format": ASSET_FORMAT, "version": geom.version, "hash_spec": spec.to_dict(), "layout": lay, "dtype": dtype,
        "storage": geom.storage_dict(), "provenance": dict(provenance),
    }
    if getattr(spec, "tokenizer_bound", False):
        body["tokenizer_bound"] = {**dict(spec.tokenizer), "vocab_size": spec.vocab_size}
    for k, v in (extras or {}).items():
        if k in OPTIONAL_FIELDS and k != "tokenizer_bound":
            body[k] = v
    return body


def check_provenance(provenance: Mapping[str, Any] | None) -> dict[str, Any]:
    prov = dict(provenance or {})
    try:
        canonical_json(prov)
    except (TypeError, ValueError) as e:
        raise PolymemError(f"provenance must be plain JSON (str, int, float, bool, None, lists, dicts): {e}") from None
    tok = prov.get("tokenizer")
    if tok is not None and not (isinstance(tok, dict) and {"name", "fingerprint"} <= tok.keys()):
        raise PolymemError(f"provenance['tokenizer'] = {tok!r} must be a dict with 'name' and 'fingerprint'")
    if "tokens_seen" in prov and not (isinstance(prov["tokens_seen"], int) and prov["tokens_seen"] >= 0):
        raise PolymemError(f"provenance['tokens_seen'] = {prov['tokens_seen']!r} must be a non-negative integer")
    if "loss" in prov and not isinstance(prov["loss"], (int, float)):
        raise PolymemError(f"provenance['loss'] = {prov['loss']!r} must be a number")
    return prov


def parse_header(attrs: Mapping[str, Any], where: str) -> Header:
    """Validate ``attributes`` of the group zarr.json; ``where`` names the asset in errors."""
    d = attrs.get("polymem") if isinstance(attrs, Mapping) else None
    if not isinstance(d, Mapping):
        raise FormatError(
            f"{where}: zarr.json has no attributes.polymem object, so it is not a polymem asset; "
            "create one with `polymem init` or MemoryAsset.create"
        )
    fmt, ver = d.get("format"), d.get("version")
    if fmt != ASSET_FORMAT:
        raise FormatError(f"{where}: attribute format is {fmt!r}, expected {ASSET_FORMAT!r}")
    if type(ver) is not int or ver not in SUPPORTED_ASSET_VERSIONS:
        raise FormatError(
            f"{where}: asset format version {ver!r} is not supported; this polymem reads versions "
            f"{list(SUPPORTED_ASSET_VERSIONS)}. Upgrade polymem to read newer assets."
        )
    for key in ("hash_spec", "layout", "dtype", "storage", "provenance", "checksums"):
        if key not in d:
            raise FormatError(f"{where}: attributes.polymem lacks field {key!r}; the asset is incomplete or edited")
    checksums = d["checksums"]
    if not isinstance(checksums, Mapping) or checksums.get("algorithm") != "sha256" or not isinstance(
        checksums.get("shards"), Mapping
    ):
        raise FormatError(f"{where}: field 'checksums' is malformed (need algorithm 'sha256', attributes, shards)")
    for name in ("shards", "row_counts"):
        _check_sha_map(checksums, name, where)
    body = {k: v for k, v in d.items() if k != "checksums"}
    try:
        digest = sha256_hex(canonical_json(body))
    except (TypeError, ValueError) as e:
        raise FormatError(f"{where}: attributes are not plain JSON ({e})") from None
    if digest != checksums.get("attributes"):
        raise FormatError(
            f"{where}: field 'attributes' checksum mismatch (stored {str(checksums.get('attributes'))[:12]}…, "
            f"computed {digest[:12]}…): zarr.json attributes were edited or corrupted; restore the asset"
        )
    spec: Any
    try:
        spec = _parse_spec(d["hash_spec"])
    except PolymemError as e:
        raise FormatError(f"{where}: field 'hash_spec' is invalid: {e}") from None
    bound = getattr(spec, "tokenizer_bound", False)
    want_tb = {**dict(spec.tokenizer), "vocab_size": spec.vocab_size} if bound else None
    if d.get("tokenizer_bound") != want_tb:
        raise FormatError(
            f"{where}: field 'tokenizer_bound' is {d.get('tokenizer_bound')!r}, expected {want_tb!r}: a token-id "
            "hash_spec must come with it (naming the tokenizer), a byte hash_spec without it"
        )
    lay = d["layout"]
    if not isinstance(lay, Mapping):
        raise FormatError(f"{where}: field 'layout' must be an object, got {lay!r}")
    try:
        layout = Layout.from_dict(lay)
        orders = check_orders(lay.get("orders", ()))
    except PolymemError as e:
        raise FormatError(f"{where}: field 'layout' is invalid: {e}") from None
    if lay.get("joint") is not True:
        raise FormatError(f"{where}: field 'layout.joint' is {lay.get('joint')!r}; version {ver} supports only true")
    dtype = d["dtype"]
    if dtype not in DTYPES:
        raise FormatError(f"{where}: field 'dtype' is {dtype!r}; accepted: {', '.join(DTYPES)}")
    st = d["storage"]
    if not isinstance(st, Mapping):
        raise FormatError(f"{where}: field 'storage' must be an object, got {st!r}")
    cps = st.get("chunks_per_shard")
    try:
        geom = geometry(layout, dtype, cps, version=ver, shard_id="shard_id" in st, fp8_scale=st.get("fp8_scale"))
    except PolymemError as e:
        raise FormatError(f"{where}: field 'storage' is invalid: {e}") from None
    if dict(st) != geom.storage_dict():
        bad = sorted(k for k in set(st) | set(geom.storage_dict()) if st.get(k) != geom.storage_dict().get(k))
        raise FormatError(
            f"{where}: field 'storage' disagrees with layout and dtype at {bad}: stored "
            f"{ {k: st.get(k) for k in bad} }, expected { {k: geom.storage_dict().get(k) for k in bad} }"
        )
    prov = d["provenance"]
    if not isinstance(prov, Mapping):
        raise FormatError(f"{where}: field 'provenance' must be an object, got {prov!r}")
    if bound:
        try:
            spec.check_layout(layout)
        except FormatError as e:
            raise FormatError(f"{where}: {e}") from None
    _check_shard_ids(checksums, geom, where)
    extras = {k: d[k] for k in OPTIONAL_FIELDS if k in d}
    if "row_counts" in extras:
        check_counts_field(extras["row_counts"], layout, where)
    if "sparse" in extras and not (isinstance(extras["sparse"], Mapping) and isinstance(extras["sparse"].get("pages_kept"), int)):
        raise FormatError(f"{where}: field 'sparse' is {extras['sparse']!r}; expected an object with integer 'pages_kept'")
    return Header(
        spec=spec, layout=layout, orders=orders, dtype=dtype, geometry=geom, provenance=dict(prov),
        checksums=dict(checksums), extras=extras,
    )


def _is_sha256(v: Any) -> bool:
    return isinstance(v, str) and len(v) == 64 and set(v) <= set("0123456789abcdef")


def _check_sha_map(checksums: Mapping[str, Any], name: str, where: str) -> None:
    """``checksums[name]`` (when present) maps file keys to sha256 hex digests, as the writers record them."""
    m = checksums.get(name)
    if m is None and name != "shards":
        return
    bad = next(((k, v) for k, v in m.items() if not _is_sha256(v)), None) if isinstance(m, Mapping) else ("", m)
    if bad is not None:
        what = f"maps {bad[0]!r} to {str(bad[1])[:80]!r}" if bad[0] else f"is {str(bad[1])[:80]!r}"
        raise FormatError(f"{where}: field 'checksums.{name}' {what}; expected an object mapping each file to its "
                          "sha256 (64 lowercase hex digits). The asset was edited or damaged: restore it")


def _parse_spec(d: Any) -> Any:
    """hash_spec -> a HashSpec (byte hash), an IdHashSpec (``--hash xor``) or an EngineTableSpec (an engine's
    imported table, polymem/asset/engine_table.py)."""
    from polymem.asset.engine_table import EngineTableSpec, is_table_dict
    from polymem.hash.idhash import IdHashSpec, is_id_hash_dict

    if is_id_hash_dict(d):
        return IdHashSpec.from_dict(d)
    if is_table_dict(d):
        return EngineTableSpec.from_dict(d)
    return HashSpec.from_dict(d)


def _check_shard_ids(checksums: Mapping[str, Any], geom: Geometry, where: str) -> None:
    """``checksums.shard_ids`` (§13): present iff ``storage.shard_id``, one 32-hex-digit id per listed shard."""
    ids = checksums.get("shard_ids")
    if not geom.shard_id:
        if ids is not None:
            raise FormatError(f"{where}: field 'checksums.shard_ids' is set but 'storage.shard_id' is not; the asset was edited")
        return
    ok = isinstance(ids, Mapping) and set(ids) == set(checksums["shards"]) and all(
        isinstance(v, str) and len(v) == 32 and set(v) <= set("0123456789abcdef") for v in ids.values())
    if not ok:
        raise FormatError(f"{where}: field 'checksums.shard_ids' must map every shard of 'checksums.shards' to a "
                          "32-hex-digit shard id; the asset was edited, restore it")


# the fields of a zarr v3 array's metadata (zarr-python refuses others); pages/zarr.json holds no more
ARRAY_METADATA_FIELDS = ("zarr_format", "node_type", "shape", "data_type", "chunk_grid", "chunk_key_encoding",
                         "fill_value", "codecs", "attributes", "dimension_names", "storage_transformers")


def _obj(v: Any) -> Mapping[str, Any]:
    """``v`` if it is a JSON object, else an empty one (a field of the wrong type then fails its comparison)."""
    return v if isinstance(v, Mapping) else {}


def _seq(v: Any) -> list[Any] | None:
    """``v`` as a list if it is a JSON array, else None (never equal to a shape)."""
    return list(v) if isinstance(v, (list, tuple)) else None


def check_array_metadata(meta: Mapping[str, Any], geom: Geometry, where: str) -> None:
    """Check pages/zarr.json against the geometry: shape, data type, chunking, codec chain exactly `bytes`; every
    field of the type zarr v3 gives it, and no field zarr v3 does not define."""

    def bad(field: str, got: Any, want: Any) -> FormatError:
        got_text = repr(got) if len(repr(got)) <= 200 else repr(got)[:200] + "…"
        return FormatError(f"{where}: pages/zarr.json field {field!r} is {got_text}, expected {want!r}; restore the asset")

    if meta.get("node_type") != "array" or meta.get("zarr_format") != 3:
        raise bad("node_type/zarr_format", (meta.get("node_type"), meta.get("zarr_format")), ("array", 3))
    extra = sorted(str(k) for k in meta if k not in ARRAY_METADATA_FIELDS)
    if extra:
        raise bad(extra[0], meta[extra[0]], f"no such field (a zarr v3 array has {', '.join(ARRAY_METADATA_FIELDS)})")
    if _seq(meta.get("shape")) != list(geom.shape):
        raise bad("shape", meta.get("shape"), list(geom.shape))
    if meta.get("data_type") != geom.data_type:
        raise bad("data_type", meta.get("data_type"), geom.data_type)
    if type(meta.get("fill_value")) not in (int, float) or meta.get("fill_value") != 0:
        raise bad("fill_value", meta.get("fill_value"), 0)
    grid = _obj(meta.get("chunk_grid"))
    if grid.get("name") != "regular" or set(grid) - {"name", "configuration"} or \
            _seq(_obj(grid.get("configuration")).get("chunk_shape")) != list(geom.shard_shape):
        raise bad("chunk_grid", meta.get("chunk_grid"),
                  {"name": "regular", "configuration": {"chunk_shape": list(geom.shard_shape)}})
    kenc = meta.get("chunk_key_encoding")
    kcfg = _obj(kenc).get("configuration", {})
    if _obj(kenc).get("name") != "default" or not isinstance(kcfg, Mapping) or kcfg.get("separator", "/") != "/":
        raise bad("chunk_key_encoding", kenc, {"name": "default", "configuration": {"separator": "/"}})
    codecs = meta.get("codecs", [])
    if not isinstance(codecs, list) or len(codecs) != 1 or not isinstance(codecs[0], Mapping) or codecs[0].get("name") != "sharding_indexed":
        raise bad("codecs", codecs, "one sharding_indexed codec")
    cfg = codecs[0].get("configuration", {})
    if not isinstance(cfg, Mapping):
        raise bad("codecs[0].configuration", cfg, "an object")
    crc = [{"name": "crc32c"}] if geom.crc else []
    want_inner = [{"name": "bytes", "configuration": {"endian": "little"}}] + crc
    if geom.data_type == "uint8":  # zarr-python omits endian for one-byte types
        ok = [[{"name": "bytes"}] + crc, [{"name": "bytes", "configuration": {}}] + crc, want_inner]
        if cfg.get("codecs") not in ok:
            raise bad("codecs[0].codecs", cfg.get("codecs"), ok[0])
    elif cfg.get("codecs") != want_inner:
        raise bad("codecs[0].codecs", cfg.get("codecs"), want_inner)
    if _seq(cfg.get("chunk_shape", [])) != list(geom.chunk_shape):
        raise bad("codecs[0].chunk_shape", cfg.get("chunk_shape"), list(geom.chunk_shape))
    want_index = [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]
    if cfg.get("index_codecs") != want_index:
        raise bad("codecs[0].index_codecs", cfg.get("index_codecs"), want_index)
    if cfg.get("index_location", "end") != "end":
        raise bad("codecs[0].index_location", cfg.get("index_location"), "end")
    if meta.get("storage_transformers") not in (None, []):
        raise bad("storage_transformers", meta.get("storage_transformers"), [])
    if not isinstance(meta.get("attributes", {}), Mapping):
        raise bad("attributes", meta.get("attributes"), {})
    names = meta.get("dimension_names")
    if names is not None and (_seq(names) is None or len(names) != len(geom.shape)
                              or not all(n is None or isinstance(n, str) for n in names)):
        raise bad("dimension_names", names, f"null or {len(geom.shape)} names (strings or null)")
