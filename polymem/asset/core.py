"""MemoryAsset: a hashed n-gram table as a portable zarr v3 group (docs/asset-format.md).

    asset = MemoryAsset.create("table.pmem", HashSpec(), Layout.for_params(200_000_000), dtype="float16")
    asset.write_pages([0, 7], pages)            # float32 [2, K*S, r]
    vecs = MemoryAsset.open("table.pmem").lookup(hashes)   # float32 [..., K, r]

Writes build a complete group in a sibling temp directory and rename it into place; page writes replace
whole shards behind a marker file (§7); both are :mod:`._write`. Reads go straight to memory-mapped shard files once the geometry was
validated (local paths), or through zarr-python (fsspec URLs) / tensorstore.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from polymem._paths import is_url
from polymem.asset import _codec, _commit, _fs, _remote, _write, nf4
from polymem.asset._format import ASSET_VERSION, LOCK_FILE, Geometry, Header, check_dtype, fp8_scale_for, geometry
from polymem.asset._reader import AssetReader, FastReader
from polymem.asset._shards import bad_scale, read_shard_checked
from polymem.asset._validate import Raw as _Raw
from polymem.asset._validate import validate as _validate
from polymem.asset._write import ChunkSource, PageSource
from polymem.asset.nf4 import QuantError, reconstruction_error
from polymem.errors import FormatError, MissingError, PolymemError, SpecMismatchError, TokenizerBoundError
from polymem.hash.layout import Layout
from polymem.hash.spec import HashSpec

BACKENDS = ("auto", "fast", "zarr", "tensorstore")


def row_ids(rows: Any, num_rows: int) -> np.ndarray:
    """Table rows (integers, -1 = none) -> int64 array of the same shape. Refuses other dtypes — a float row
    index would be truncated silently, even a whole one is refused, as page ids are — and rows out of range."""
    a = np.asarray(rows)
    if a.size and not np.issubdtype(a.dtype, np.integer):
        first = a.reshape(-1)[0].item()
        raise PolymemError(f"rows must be integers (-1 = none), got dtype {a.dtype} (first value {first!r}); "
                           "pass integer row ids, e.g. rows.astype(np.int64) after rounding")
    if a.size and (int(a.max()) >= num_rows or int(a.min()) < -1):
        bad = int(a.max()) if int(a.max()) >= num_rows else int(a.min())
        raise PolymemError(f"row {bad} is out of range; this asset has rows 0..{num_rows - 1} (and -1 = none)")
    return a.astype(np.int64, copy=False)


# ------------------------------------------------------------------------------------------ the asset
class MemoryAsset:
    """An opened asset. Build with :meth:`create`, :meth:`from_array`, :meth:`open`."""

    def __init__(self, raw: _Raw, header: Header, backend: str) -> None:
        self._raw = raw
        self._header = header
        self._version = header.geometry.version
        self._backend = backend
        self._reader: AssetReader = self._make_reader(backend)
        self._pages = header.layout.pages
        self._lean = self._reader.lean_reader() if isinstance(self._reader, FastReader) else None

    # ---- properties
    @property
    def spec(self) -> Any:
        """The hash spec: a :class:`HashSpec` (byte-addressed) or an ``IdHashSpec`` (tokenizer-bound)."""
        return self._header.spec

    @property
    def tokenizer_bound(self) -> bool:
        """True when rows are addressed by token ids of one tokenizer (header field ``tokenizer_bound``)."""
        return bool(getattr(self._header.spec, "tokenizer_bound", False))

    @property
    def sparse(self) -> bool:
        """True for a subset whose absent pages are not stored (they read as zeros)."""
        return self._header.sparse

    def require_byte_addressed(self, what: str = "this operation") -> None:
        """Raise TokenizerBoundError when the asset is addressed by token ids, not by bytes."""
        if self.tokenizer_bound:
            tb = self._header.extras.get("tokenizer_bound") or {}
            raise TokenizerBoundError(
                f"{self.path}: asset is tokenizer-bound (token-id XOR hash of tokenizer {tb.get('name')!r}, "
                f"fingerprint {str(tb.get('fingerprint'))[:16]}…), so {what} cannot address it by byte hashes; "
                f"re-address it first: `polymem convert {self.path} --tokenizer {tb.get('name')} --corpus TEXT -o OUT.pmem`"
            )

    def sparse_ranks(self) -> list[Any]:
        """Sparse subsets: per shard, the rank of each stored chunk (-1 = absent), or None for an absent shard."""
        from polymem.asset._sparse import validate_sparse

        if not self.sparse:
            raise PolymemError(f"{self.path} is not a sparse subset; every chunk is stored")
        return validate_sparse(self._raw, self._header, self.path)

    def row_counts(self) -> np.ndarray | None:
        """Per-row update counts, uint32 [num_rows] (the optional ``counts`` array), or None when absent."""
        f = self._header.extras.get("row_counts")
        if f is None:
            return None
        from polymem.asset._counts import read_counts

        return read_counts(self._raw, f, self.path)

    @property
    def layout(self) -> Layout:
        return self._header.layout

    @property
    def orders(self) -> tuple[int, ...]:
        return self._header.orders

    @property
    def dtype(self) -> str:
        return self._header.dtype

    @property
    def provenance(self) -> dict[str, Any]:
        return dict(self._header.provenance)

    @property
    def path(self) -> str:
        return self._raw.location

    @property
    def geometry(self) -> Geometry:
        return self._header.geometry

    @property
    def backend(self) -> str:
        return self._backend

    @property
    def version(self) -> int:
        """Format version of the stored asset (1 = legacy, read-only; see :meth:`upgrade`)."""
        return self._version

    @property
    def header(self) -> dict[str, Any]:
        """The stored ``attributes.polymem`` (JSON)."""
        return self._header.to_dict()

    def __repr__(self) -> str:
        L = self.layout
        return (
            f"MemoryAsset({self.path!r}, {L.kind}, P={L.pages} K={L.heads} S={L.slots} r={L.head_dim}, "
            f"orders={list(self.orders)}, dtype={self.dtype}, backend={self._backend})"
        )

    def _make_reader(self, backend: str) -> AssetReader:
        if backend not in BACKENDS:
            raise PolymemError(f"backend {backend!r} is unknown; accepted: {', '.join(BACKENDS)}")
        local = self._raw.local
        if backend == "auto":
            backend = "fast" if local is not None else "zarr"
        if backend in ("fast", "tensorstore") and local is None:
            raise PolymemError(f"backend {backend!r} reads local directories only; {self.path!r} is a URL — use 'zarr'")
        self._backend = backend
        from polymem.asset import _zarr

        if backend == "zarr" or local is None:  # (local is None only for 'zarr' here)
            return _zarr.ZarrReader(str(local) if local is not None else self._raw.location, geom=self.geometry,
                                    where=self.path, storage_options=self._raw.storage_options)
        if backend == "tensorstore":
            return _zarr.TensorstoreReader(local, self.geometry, self.path)
        if self._header.sparse:
            from polymem.asset._sparse import SparseReader, validate_sparse

            return SparseReader(local, self.geometry, validate_sparse(self._raw, self._header, self.path), self.path)
        return FastReader(local, self.geometry, self.path)

    # ---- constructors
    @classmethod
    def open(cls, path_or_url: str | os.PathLike[str], *, backend: str = "auto",
             storage_options: Mapping[str, Any] | None = None) -> "MemoryAsset":
        """Open and validate an asset (local directory or fsspec URL such as ``s3://bucket/table.pmem``, with
        fsspec ``storage_options``; credentials and endpoint otherwise from the environment)."""
        location = os.fspath(path_or_url)
        raw = _Raw(location, dict(storage_options or {}))
        if _remote.is_remote(location) and not raw.exists("zarr.json"):
            err = _remote.missing_asset_error(location, raw.storage_options)
            if err is not None:
                raise err
        header = _validate(raw, location)
        return cls(raw, header, backend)

    @classmethod
    def create(
        cls, path: str | os.PathLike[str], spec: HashSpec, layout: Layout, *, dtype: str = "float32",
        orders: "tuple[int, ...] | list[int]" = (1, 2, 3), provenance: Mapping[str, Any] | None = None,
        overwrite: bool = False, chunks_per_shard: int | None = None, lock_timeout: float | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> "MemoryAsset":
        """Create an all-zero table. Atomic; an overwrite takes the old asset's writer lock. A URL
        (``s3://…``, with fsspec ``storage_options``) is committed by order (polymem/asset/_remote.py)."""
        return cls._write_new(path, spec, layout, None, dtype=dtype, orders=orders, provenance=provenance,
                              overwrite=overwrite, chunks_per_shard=chunks_per_shard, lock_timeout=lock_timeout,
                              storage_options=storage_options)

    @classmethod
    def from_array(
        cls, path: str | os.PathLike[str], table: np.ndarray, spec: HashSpec, layout: Layout, *,
        orders: "tuple[int, ...] | list[int]", dtype: str = "float32", provenance: Mapping[str, Any] | None = None,
        overwrite: bool = False, chunks_per_shard: int | None = None, lock_timeout: float | None = None,
        storage_options: Mapping[str, Any] | None = None, row_counts: Any = None,
    ) -> "MemoryAsset":
        """Write ``table`` float [layout.num_rows, layout.head_dim] as a new asset. Atomic; an overwrite takes
        the old asset's writer lock. A URL is committed by order (polymem/asset/_remote.py). ``row_counts``
        (int [num_rows], optional): per-row update counts, stored as the ``counts`` array (asset-format.md §11)."""
        shape = tuple(np.shape(table))
        if shape != (layout.num_rows, layout.head_dim):
            raise PolymemError(
                f"table has shape {shape}, layout {layout.kind} P={layout.pages} K={layout.heads} S={layout.slots} "
                f"needs ({layout.num_rows}, {layout.head_dim}) = [P*K*S, r]"
            )
        KS, r = layout.rows_per_page, layout.head_dim

        def source(a: int, b: int) -> np.ndarray:
            return np.asarray(table[a * KS : b * KS], dtype=np.float32).reshape(b - a, KS, r)

        amax = float(np.abs(table).max()) if dtype == "fp8-e4m3" and table.size else 0.0
        return cls._write_new(path, spec, layout, source, dtype=dtype, orders=orders, provenance=provenance,
                              overwrite=overwrite, chunks_per_shard=chunks_per_shard, lock_timeout=lock_timeout,
                              storage_options=storage_options, row_counts=row_counts,
                              fp8_scale=fp8_scale_for(dtype, amax))

    @classmethod
    def _write_new(
        cls, path: str | os.PathLike[str], spec: Any, layout: Layout, source: PageSource | None, *,
        dtype: str, orders: Any, provenance: Mapping[str, Any] | None, overwrite: bool,
        chunks_per_shard: int | None, chunk_source: ChunkSource | None = None, lock_timeout: float | None = None,
        storage_options: Mapping[str, Any] | None = None, format_version: int = ASSET_VERSION,
        row_counts: Any = None, fp8_scale: float | None = None, based_on: "MemoryAsset | None" = None,
    ) -> "MemoryAsset":
        """A new asset from ``source`` (pages [a, b) -> float32 [b-a, K*S, r]), ``chunk_source`` (shard -> its
        stored chunks) or neither (zeros): :func:`polymem.asset._write.write_new`."""
        return _write.write_new(cls, path, spec, layout, source, dtype=dtype, orders=orders, provenance=provenance,
                                overwrite=overwrite, chunks_per_shard=chunks_per_shard, chunk_source=chunk_source,
                                lock_timeout=lock_timeout, storage_options=storage_options,
                                format_version=format_version, row_counts=row_counts, fp8_scale=fp8_scale,
                                based_on=based_on)

    # ---- reads
    def _check_ids(self, page_ids: Any) -> tuple[np.ndarray, tuple[int, ...]]:
        """Page ids -> (int64 [n], the input's shape); range-checked."""
        P = self.layout.pages
        if type(page_ids) is list and len(page_ids) == 1 and type(page_ids[0]) is int:  # lean single-page path
            p = page_ids[0]
            if not 0 <= p < P:
                raise PolymemError(f"page id {p} is out of range; this asset has pages 0..{P - 1}")
            return np.array(page_ids, dtype=np.int64), (1,)
        ids = np.asarray(page_ids)
        if ids.size and not np.issubdtype(ids.dtype, np.integer):
            raise PolymemError(f"page ids must be integers, got dtype {ids.dtype}; pass integer ids, e.g. "
                               "ids.astype(np.int64) after rounding (floats are refused, never truncated)")
        shape = ids.shape
        ids = ids.astype(np.int64, copy=False).reshape(-1)
        if ids.size:
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= P:
                raise PolymemError(f"page id {lo if lo < 0 else hi} is out of range; this asset has pages 0..{P - 1}")
        return ids, shape

    def read_stored(self, page_ids: Any) -> np.ndarray:
        """Pages as stored, not decoded: [..., K*S, r] float32/float16/uint16 (bfloat16 bits), or uint8
        [..., page_bytes] for the packed dtypes (nf4, fp8: rows of bytes, docs/asset-format.md §5)."""
        if type(page_ids) is list and len(page_ids) == 1 and type(page_ids[0]) is int and self._lean is not None:
            p = page_ids[0]  # the hot single-page path: no numpy id arrays, one slice of the mapped shard
            if 0 <= p < self._pages:
                return self._lean(p)
        ids, shape = self._check_ids(page_ids)
        g = self.geometry
        if not g.packed:
            return self._reader.read_chunks(ids).reshape(shape + (g.rows_per_page, g.head_dim))
        ppc = g.pages_per_chunk
        chunks = np.ascontiguousarray(self._reader.read_chunks(ids // ppc))  # [n, chunk_bytes]
        pages: np.ndarray = _codec.page_view(chunks, g)[np.arange(ids.shape[0]), ids % ppc].reshape(shape + (g.page_bytes,))
        return pages

    def read_pages(self, page_ids: Any) -> np.ndarray:
        """int page ids [n] -> float32 [n, K*S, r], dequantised."""
        g = self.geometry
        stored = self.read_stored(page_ids)
        if g.packed:
            lead = stored.shape[:-1]
            rows = stored.reshape(lead + (g.rows_per_page, g.row_bytes))
            KS = g.rows_per_page
            return self._unpack(rows, lambda i: int(np.asarray(page_ids).reshape(-1)[i // KS]) * KS + i % KS)
        return _codec.decode_chunks(stored, g)

    def _unpack(self, stored: np.ndarray, row_of: Callable[[int], int]) -> np.ndarray:
        """Decode stored rows of a packed dtype [..., row_bytes]; a bad scale (nf4) or a non-finite value (fp8)
        is a FormatError naming its shard, page and row (``row_of``: flat index of a decoded row -> its table row)."""
        try:
            return _codec.decode_rows(stored, self.geometry)
        except nf4.ScaleError as e:
            raise bad_scale(self.geometry, row_of(e.row), e.value, self.path) from None

    def iter_pages(self, batch_pages: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
        """Yield (first page, float32 pages [n, K*S, r]) over the whole table, one shard at a time."""
        g = self.geometry
        step = batch_pages or g.chunks_per_shard * g.pages_per_chunk
        for a in range(0, g.pages, step):
            yield a, self.read_pages(np.arange(a, min(g.pages, a + step)))

    def to_numpy(self) -> np.ndarray:
        """The whole table, float32 [num_rows, r] (dequantised)."""
        g = self.geometry
        out = np.empty((self.layout.num_rows, g.head_dim), dtype=np.float32)
        KS = g.rows_per_page
        for a, pages in self.iter_pages():
            out[a * KS : (a + pages.shape[0]) * KS] = pages.reshape(-1, g.head_dim)
        return out

    def lookup(self, hashes: Any, valid: Any = None) -> np.ndarray:
        """uint64 n-gram hashes [...] -> float32 [..., K, r] (zeros where ``valid`` is False)."""
        self.require_byte_addressed("lookup(hashes)")
        h = np.asarray(hashes)
        if h.size and h.dtype != np.uint64:
            if not np.issubdtype(h.dtype, np.integer):
                raise PolymemError(f"hashes must be uint64, got dtype {h.dtype}")
            h = h.astype(np.uint64)
        rows = self.layout.rows(h, valid)  # [..., K]
        return self.read_rows(rows)

    def read_rows(self, rows: Any) -> np.ndarray:
        """Table rows int [...] (-1 = none) -> float32 [..., r] (zeros for -1), dequantised."""
        rows = row_ids(rows, self.layout.num_rows)
        flat = rows.reshape(-1)
        g = self.geometry
        KS, r = g.rows_per_page, g.head_dim
        ok = flat >= 0
        all_ok = bool(ok.all())
        sel = flat if all_ok else flat[ok]
        if isinstance(self._reader, FastReader):
            stored = self._reader.read_rows(sel)  # [n, r] or packed [n, row_bytes]
        else:  # fallback readers fetch whole pages
            pages, inv = np.unique(sel // KS, return_inverse=True)
            st = self.read_stored(pages)
            if g.packed:
                st = st.reshape(pages.shape[0], KS, -1)
            stored = st[inv.reshape(-1), sel % KS]
        if g.packed:
            vec = self._unpack(stored, lambda i: int(sel[i]))
        else:
            vec = _codec.decode_chunks(stored, g)
        shape: tuple[int, ...] = rows.shape + (r,)
        if all_ok:
            return vec.reshape(shape)
        out = np.zeros((flat.shape[0], r), dtype=np.float32)
        out[ok] = vec
        return out.reshape(shape)

    def check_chunk_bytes(self, chunk_ids: np.ndarray, chunks: "list[np.ndarray]") -> None:
        """Raise FormatError unless ``chunks`` (uint8, each one stored chunk as it lies in its shard —
        ``geometry.stride`` bytes: chunk bytes + crc32c from format v2 — read straight from the shards by the
        page service, :mod:`polymem.serve`) are intact stored chunks ``chunk_ids`` of this asset.

        Format v2: the length and every chunk's crc32c. Format v1 keeps one sha256 per shard (checked by
        :meth:`verify` and ``polymem pull``), so a chunk on its own can only be checked for its length."""
        from polymem.asset._shards import CRC_RESIDUE, corrupt_chunk, crc32c

        g = self.geometry
        st = g.stride
        for c, a in zip(chunk_ids.tolist(), chunks):
            if a.nbytes != st:
                raise FormatError(f"{self.path}: chunk {c} has {a.nbytes} bytes, expected {st}; restore the asset")
            if g.crc and crc32c(a.tobytes()) != CRC_RESIDUE:
                raise corrupt_chunk(g, *divmod(int(c), g.chunks_per_shard), self.path)

    def nonzero_pages(self) -> int:
        """Number of pages holding any non-zero value (scans the table)."""
        return int(sum(int((p != 0).any(axis=(1, 2)).sum()) for _, p in self.iter_pages()))

    def check_spec(self, spec: HashSpec) -> None:
        """Raise SpecMismatchError unless hashes made with ``spec`` address this table."""
        if spec != self.spec and isinstance(spec, HashSpec):
            self.require_byte_addressed(f"hash spec {spec.spec_id}")
        if spec != self.spec:
            raise SpecMismatchError(
                f"hash spec {spec.spec_id} differs from the asset's {self.spec.spec_id} ({self.path}); hash with "
                "asset.spec, e.g. TokenHashes.build(tokenizer, asset.spec) or asset.token_cache(tokenizer)"
            )

    def token_cache(self, tokenizer: Any) -> Any:
        """A :class:`polymem.TokenHashes` for ``tokenizer`` under this asset's hash spec."""
        from polymem.hash.token_hashes import TokenHashes

        self.require_byte_addressed("token_cache (byte hashes)")
        return TokenHashes.build(tokenizer, self.spec)

    # ---- writes
    def write_pages(self, page_ids: Any, data: Any, *, lock_timeout: float | None = None) -> None:
        """Replace pages: ids [n] (distinct), data float32 [n, K*S, r]. Atomic (docs/asset-format.md §7).

        Takes the asset's writer lock (waits up to ``lock_timeout`` s, default 60, for another writer), refuses
        to build on a shard whose bytes do not match its checksums, and either lands completely or raises
        with the asset unchanged.
        """
        _write.write_pages(self, page_ids, data, lock_timeout=lock_timeout)

    # ---- integrity
    def problems(self) -> list[str]:
        """Every integrity problem found (validation, then every shard's sha256). Empty = the asset is sound."""
        try:
            header = _validate(self._raw, self.path)
        except FormatError as e:
            return [str(e)]
        out = []
        for key, want in sorted(header.checksums.get("row_counts", {}).items()):
            got = self._raw.sha256(key)
            if got != want:
                out.append(f"{self.path}: row counts file {key!r} checksum mismatch (stored {want[:12]}…, computed "
                           f"{got[:12]}…): its bytes changed; restore the asset")
        for s in range(header.geometry.num_shards):
            key = header.geometry.shard_key(s)
            if header.sparse and key not in header.checksums["shards"]:
                continue  # an absent shard of a subset: nothing stored, reads as zeros
            got = self._raw.sha256(key)
            if got != header.checksums["shards"][key]:
                out.append(
                    f"{self.path}: shard {key!r} checksum mismatch (stored {header.checksums['shards'][key][:12]}…, "
                    f"computed {got[:12]}…): its bytes changed; restore the asset"
                )
        if header.geometry.packed and not out:
            out += self._scale_problems()
        return out

    def _scale_problems(self) -> list[str]:
        """The first nf4 row scale that is not a finite number >= 0, or fp8 row that decodes to NaN or ±inf
        (its checksums may still match), one shard at a time."""
        g = self.geometry
        for s in range(g.num_shards):
            c0 = s * g.chunks_per_shard
            chunks = np.ascontiguousarray(self._reader.read_chunks(np.arange(c0, c0 + g.chunks_in_shard(s))))
            try:
                rows = _codec.page_view(chunks, g).reshape(-1, g.row_bytes)
                if g.dtype == "nf4":
                    nf4.check_scales(rows, g.head_dim)
                else:
                    _codec.decode_rows(rows, g)
            except nf4.ScaleError as e:
                return [str(bad_scale(g, c0 * g.pages_per_chunk * g.rows_per_page + e.row, e.value, self.path))]
        return []

    def verify(self) -> None:
        """Raise FormatError naming the first bad shard or field; warn with :meth:`notes` (UserWarning)."""
        self._verify_sound()
        for note in self.notes():
            warnings.warn(note, UserWarning, stacklevel=2)

    def _verify_sound(self) -> None:
        probs = self.problems()
        if probs:
            raise FormatError(probs[0] + (f" (and {len(probs) - 1} more problems)" if len(probs) > 1 else ""))

    def notes(self) -> list[str]:
        """Weaknesses that are not damage: an asset whose shards carry no shard id (format v1, or v2 written
        before shard ids, asset-format.md §13), so a shard restored from an older backup passes `open`."""
        if self.geometry.shard_id:
            return []
        return [f"{self.path}: no generation binding (its shards carry no shard id): a shard restored from an "
                f"older backup is caught only by a full verify; run `polymem upgrade {self.path}` to add it"]

    # ---- conversion
    def quantize(self, out: str | os.PathLike[str], *, to: str = "nf4", overwrite: bool = False,
                 lock_timeout: float | None = None,
                 storage_options: Mapping[str, Any] | None = None) -> tuple["MemoryAsset", QuantError]:
        """Write a copy stored as ``to`` (streamed shard by shard); returns it and the per-row reconstruction error."""
        to = check_dtype(to)
        self._verify_sound()  # never build on bytes that do not match their checksums
        errs: list[QuantError] = []
        amax = max((float(np.abs(p).max()) for _, p in self.iter_pages()), default=0.0) if to == "fp8-e4m3" else 0.0
        geom_to = geometry(self.layout, to, fp8_scale=fp8_scale_for(to, amax))

        def source(a: int, b: int) -> np.ndarray:
            x = self.read_pages(np.arange(a, b))
            if geom_to.packed:
                xq = _codec.decode_rows(_codec.encode_rows(x, geom_to), geom_to)
            else:
                xq = _codec.decode_chunks(_codec.encode_pages(x, geom_to), geom_to)
            errs.append(reconstruction_error(x, xq))
            return x

        prov = self.provenance
        prov["converted_from"] = {"dtype": self.dtype, "attributes_sha256": self._header.checksums["attributes"]}
        asset = MemoryAsset._write_new(out, self.spec, self.layout, source, dtype=to, orders=self.orders,
                                       provenance=prov, overwrite=overwrite, chunks_per_shard=None,
                                       lock_timeout=lock_timeout,
                                       storage_options=self._raw.storage_options if storage_options is None
                                       else storage_options, row_counts=self.row_counts(),
                                       fp8_scale=geom_to.fp8_scale, based_on=self)
        return asset, _merge_errors(errs)

    # ---- upgrade and repair
    @classmethod
    def upgrade(cls, path: str | os.PathLike[str], *, lock_timeout: float | None = None) -> "MemoryAsset":
        """Rewrite a format-version-1 asset, or a version-2 one without shard ids (§13), in place as the current
        version (same pages, spec, layout, provenance; a crc32c per page, a shard id per shard). Verifies every
        shard first; atomic. A current asset is returned as is."""
        old = cls.open(path)
        if old.version == ASSET_VERSION and old.geometry.shard_id:
            return old
        old._verify_sound()
        g_old = old.geometry
        g_new = geometry(old.layout, old.dtype, g_old.chunks_per_shard, fp8_scale=g_old.fp8_scale)
        assert (g_new.chunks_per_shard, g_new.num_shards) == (g_old.chunks_per_shard, g_old.num_shards)
        root = old._raw.local
        if root is None:
            raise PolymemError(f"cannot upgrade {old.path!r}: remote assets are read-only; upgrade a local copy")

        def chunks(s: int) -> np.ndarray:
            return read_shard_checked(root / g_old.shard_key(s), g_old, s, old._header.checksums["shards"][g_old.shard_key(s)],
                                      old.path)

        out = cls._write_new(root, old.spec, old.layout, None, dtype=old.dtype, orders=old.orders,
                             provenance=old.provenance, overwrite=True, chunks_per_shard=g_old.chunks_per_shard,
                             chunk_source=chunks, lock_timeout=lock_timeout, row_counts=old.row_counts(),
                             based_on=old)
        old.close()
        return out

    @staticmethod
    def repair(path: str | os.PathLike[str], *, lock_timeout: float | None = None) -> list[str]:
        """Roll back a page write that was interrupted mid-swap (the ``.polymem-writing`` marker), put back an
        asset an interrupted overwrite left aside, and remove stale temporary files. Returns what was done."""
        location = os.fspath(path)
        if is_url(location, remote=True):
            raise PolymemError(f"cannot repair {location!r}: repair works on local assets")
        root = Path(location.removeprefix("file://"))
        if not root.is_dir():
            done = _commit.recover_siblings(root)
            if not done:
                raise MissingError(f"{location}: no asset directory here, and nothing left aside by an interrupted write",
                                   root)
            return done
        with _fs.writer_lock(root, LOCK_FILE, lock_timeout, location):
            done = _commit.recover(root)
        return done + _commit.recover_siblings(root)

    def close(self) -> None:
        """Close the asset's reader (open shard files and maps); also done by ``with MemoryAsset.open(...) as a:``."""
        self._reader.close()

    def __enter__(self) -> "MemoryAsset":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _merge_errors(errs: list[QuantError]) -> QuantError:
    n = sum(e.rows for e in errs)
    if not n:
        return QuantError(0.0, 0.0, 0.0, 0.0, 0)
    return QuantError(
        rms_mean=sum(e.rms_mean * e.rows for e in errs) / n, rms_max=max(e.rms_max for e in errs),
        rel_mean=sum(e.rel_mean * e.rows for e in errs) / n, rel_max=max(e.rel_max for e in errs), rows=n,
    )


__all__ = ["BACKENDS", "MemoryAsset"]
