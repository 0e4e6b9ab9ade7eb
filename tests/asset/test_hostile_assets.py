"""Hostile and careless assets: values trusted after their checksum, allocations sized by asset files.

Every asset here is made through the API and then tampered with as an attacker (or a careless restore) would:
scales rewritten with every checksum recomputed, a shard put back from an older backup, a counts geometry asking
for billions of chunk files, a counts chunk replaced by a 1 TiB sparse file (``os.truncate``: nothing is written),
a table file whose header disagrees with its tensor, float row indices. Real zarr stores, no mocks.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from polymem import FormatError, HashSpec, Layout, MemoryAsset, PolymemError
from polymem.asset import _zarr
from polymem.asset._format import geometry
from polymem.asset._shards import crc32c
from polymem.ops.subset import subset

from assetedit import _edit_header, _strip_shard_ids

SPEC = HashSpec()
LAYOUT = Layout(pages=11, heads=4, slots=2, head_dim=8)  # 8 rows of r=8 a page; nf4: 48 B pages, one block


def _table(layout: Layout = LAYOUT, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((layout.num_rows, layout.head_dim)).astype(np.float32)


def _backends() -> list[str]:
    try:
        import tensorstore  # noqa: F401
    except ImportError:
        return ["fast", "zarr"]
    return ["fast", "zarr", "tensorstore"]


def _recompute_checksums(root: Path, g) -> None:
    """After shard bytes were edited: every chunk's crc32c, every shard id footer, and the sha256s and shard ids
    in zarr.json recomputed — all that an attacker who knows the format can do."""
    sums, ids = {}, {}
    for s in range(g.num_shards):
        key, n = g.shard_key(s), g.chunks_in_shard(s)
        data = bytearray((root / key).read_bytes())
        for i in range(n):
            a = i * g.stride
            data[a + g.chunk_bytes : a + g.stride] = crc32c(bytes(data[a : a + g.chunk_bytes])).to_bytes(4, "little")
        data[n * g.stride + 16 : n * g.stride + 32] = hashlib.sha256(bytes(data[: n * g.stride])).digest()[:16]
        (root / key).write_bytes(bytes(data))
        sums[key], ids[key] = hashlib.sha256(bytes(data)).hexdigest(), bytes(data[n * g.stride + 16 : n * g.stride + 32]).hex()

    def fn(h):
        h["checksums"]["shards"], h["checksums"]["shard_ids"] = sums, ids

    _edit_header(root, fn)


def _set_scale(root: Path, g, row: int, value: float) -> None:
    """Overwrite the float16 scale of table row ``row`` of an nf4 asset in its shard."""
    KS, rb = g.rows_per_page, g.page_bytes // g.rows_per_page
    page = row // KS
    c, j = divmod(page, g.pages_per_chunk)
    s, i = divmod(c, g.chunks_per_shard)
    off = i * g.stride + j * g.page_bytes + (row % KS) * rb + g.head_dim // 2
    path = root / g.shard_key(s)
    data = bytearray(path.read_bytes())
    data[off : off + 2] = np.array([value], "<f2").tobytes()
    path.write_bytes(bytes(data))


@contextlib.contextmanager
def _page_service_mode(svc, mode: str):
    """lane: the compiled lane; general: planning + cache copies + the compiled decoder; python: no numba."""
    from polymem.serve import _load
    from polymem.torch import pages as torch_pages

    saved = svc.lane, _load._IO, torch_pages.USE_HOST_KERNELS
    svc.lane = svc.lane and mode == "lane"
    if mode == "python":
        _load._IO, torch_pages.USE_HOST_KERNELS = False, False
    try:
        yield
    finally:
        svc.lane, _load._IO, torch_pages.USE_HOST_KERNELS = saved


# ------------------------------------------------------------------------------ nf4 scales
@pytest.mark.parametrize("value", [np.inf, np.nan, -np.inf, -2.0])
def test_nf4_scale_no_writer_makes_is_refused_where_it_is_decoded(tmp_path, value):
    root = tmp_path / "a"
    a = MemoryAsset.from_array(root, _table(), SPEC, LAYOUT, orders=(1, 2), dtype="nf4")
    g, good = a.geometry, a.read_pages([4])
    a.close()
    _set_scale(root, g, 5 * 8 + 3, value)  # page 5, row 43
    _recompute_checksums(root, g)
    shown = re.escape(repr(float(np.float16(value))))
    named = rf"shard 'pages/c/0/0' page 5 \(row 43\) has nf4 scale {shown}: a scale is the row's absolute maximum"
    for be in _backends():
        b = MemoryAsset.open(root, backend=be)  # every checksum matches: open passes
        for read in (lambda: b.read_pages([5]), lambda: b.read_pages(np.arange(11)), lambda: b.read_rows([43]),
                     lambda: b.read_rows(np.array([[0, 43], [-1, 2]])), b.to_numpy):
            with pytest.raises(FormatError, match=named):
                read()
        assert np.array_equal(b.read_pages([4]), good)  # rows not decoded are not refused
    with pytest.raises(FormatError, match=named):
        MemoryAsset.open(root).verify()
    with pytest.raises(FormatError, match=named):
        MemoryAsset.open(root).quantize(tmp_path / "q", to="float32")


@pytest.mark.parametrize("mode", ["lane", "general", "python"])
def test_nf4_bad_scale_is_refused_by_the_page_service_decoders(tmp_path, mode):
    torch = pytest.importorskip("torch")
    from polymem.serve.service import service_for
    from polymem.torch.pages import PagedRows

    root = tmp_path / "a"
    g = MemoryAsset.from_array(root, _table(), SPEC, LAYOUT, orders=(1, 2), dtype="nf4").geometry
    _set_scale(root, g, 43, np.inf)
    _recompute_checksums(root, g)
    a = MemoryAsset.open(root)
    svc = service_for(a, cache_mb=1)
    rows = PagedRows(a, svc)
    with _page_service_mode(svc, mode):
        good = rows.gather(torch.tensor([[0, 1, 40, -1]]))
        np.testing.assert_array_equal(good[0, :3].numpy(), a.read_rows([0, 1, 40]))
        with pytest.raises(FormatError, match=r"shard 'pages/c/0/0' page 5 \(row 43\) has nf4 scale inf"):
            rows.gather(torch.tensor([[0, 43, -1]]))


# ------------------------------------------------------------------------------ shard ids (generation binding)
def test_a_shard_restored_from_an_older_backup_is_refused_at_open(tmp_path):
    root = tmp_path / "a"
    a = MemoryAsset.from_array(root, _table(), SPEC, LAYOUT, orders=(1,), dtype="float16", chunks_per_shard=4)
    key = a.geometry.shard_key(1)
    old_shard, old_header = (root / key).read_bytes(), (root / "zarr.json").read_bytes()
    old_pages = a.read_pages(np.arange(4, 8))
    a.write_pages([5], np.ones((1, 8, 8), np.float32))
    new_shard = (root / key).read_bytes()
    (root / key).write_bytes(old_shard)  # valid pages, crc32cs and index: from the write before
    named = (rf"shard '{key}' is from another write of the asset \(shard id [0-9a-f]{{12}}…, the header names "
             r"[0-9a-f]{12}…\): restored from an older backup .* restore this shard together with its zarr.json")
    for be in _backends():
        with pytest.raises(FormatError, match=named):
            MemoryAsset.open(root, backend=be)
    with pytest.raises(FormatError, match=named):
        a.write_pages([6], np.ones((1, 8, 8), np.float32))  # re-validated under the writer lock
    assert a.problems() and re.search(named, a.problems()[0])
    (root / key).write_bytes(new_shard)
    (root / "zarr.json").write_bytes(old_header)  # the header restored instead: refused as well
    with pytest.raises(FormatError, match=named):
        MemoryAsset.open(root)
    (root / key).write_bytes(old_shard)  # header and shard of one backup: a consistent older asset
    assert np.array_equal(MemoryAsset.open(root).read_pages(np.arange(4, 8)), old_pages)


def test_a_shard_of_another_sparse_subset_is_refused_at_open(tmp_path):
    counts = np.ones(LAYOUT.num_rows, np.uint32)
    subs = []
    for name, seed in (("x", 0), ("y", 1)):
        full = MemoryAsset.from_array(tmp_path / name, _table(seed=seed), SPEC, LAYOUT, orders=(1,), chunks_per_shard=4,
                                      row_counts=counts)
        subs.append(MemoryAsset.open(subset(full, tmp_path / f"{name}-sub", min_count=1).path))
    key = subs[0].geometry.shard_key(0)
    assert subs[0].sparse and subs[0].header["checksums"]["shard_ids"][key] != subs[1].header["checksums"]["shard_ids"][key]
    shutil.copy(tmp_path / "y-sub" / key, tmp_path / "x-sub" / key)
    with pytest.raises(FormatError, match=rf"shard '{key}' is from another write of the asset"):
        MemoryAsset.open(tmp_path / "x-sub")


def test_assets_without_shard_ids_keep_working_are_flagged_and_upgrade(tmp_path):
    root = tmp_path / "a"
    want = MemoryAsset.from_array(root, _table(), SPEC, LAYOUT, orders=(1,), dtype="bfloat16", chunks_per_shard=4).to_numpy()
    _strip_shard_ids(root)
    a = MemoryAsset.open(root)
    assert not a.geometry.shard_id and a.problems() == [] and np.array_equal(a.to_numpy(), want)
    assert "no generation binding" in a.notes()[0] and "polymem upgrade" in a.notes()[0]
    with pytest.warns(UserWarning, match="no generation binding"):
        a.verify()
    a.write_pages([5], np.zeros((1, 8, 8), np.float32))  # still writable; its new shard has no footer either
    want[40:48] = 0
    b = MemoryAsset.open(root)
    assert not b.geometry.shard_id and b.problems() == [] and np.array_equal(b.to_numpy(), want)
    up = MemoryAsset.upgrade(root)
    assert up.geometry.shard_id and up.notes() == [] and up.problems() == [] and np.array_equal(up.to_numpy(), want)
    assert set(up.header["checksums"]["shard_ids"]) == set(up.header["checksums"]["shards"])


def test_shard_id_fields_that_disagree_are_refused(tmp_path):
    root = tmp_path / "a"
    MemoryAsset.from_array(root, _table(), SPEC, LAYOUT, orders=(1,), chunks_per_shard=4)
    _edit_header(root, lambda h: h["checksums"]["shard_ids"].popitem())
    with pytest.raises(FormatError, match=r"field 'checksums.shard_ids' must map every shard"):
        MemoryAsset.open(root)
    _edit_header(root, lambda h: h["storage"].pop("shard_id"))
    with pytest.raises(FormatError, match=r"field 'checksums.shard_ids' is set but 'storage.shard_id' is not"):
        MemoryAsset.open(root)


# ------------------------------------------------------------------------------ the counts array
def _with_counts(tmp_path: Path) -> Path:
    root = tmp_path / "a"
    counts = np.arange(LAYOUT.num_rows, dtype=np.uint32)
    MemoryAsset.from_array(root, _table(), SPEC, LAYOUT, orders=(1,), dtype="float16", row_counts=counts)
    return root


def _huge_counts_header(tmp_path: Path, root: Path, layout: Layout, chunk_rows: int | None) -> None:
    """A header (attributes checksum and pages/zarr.json recomputed) for a table of ``layout`` with a counts array
    of ``chunk_rows`` rows a chunk (None: the format's value) — no shard of it exists."""
    g = geometry(layout, "float16")
    scratch = tmp_path / "scratch"
    _zarr.create_array_metadata(scratch, g)
    shutil.copy(scratch / "pages" / "zarr.json", root / "pages" / "zarr.json")
    R = layout.num_rows

    def fn(h):
        h["layout"].update(layout.to_dict(), orders=h["layout"]["orders"], joint=True)
        h["storage"] = g.storage_dict()
        h["row_counts"].update(shape=[R], chunk_rows=chunk_rows or min(1 << 22, R))
        h["checksums"]["array_metadata"] = hashlib.sha256((root / "pages" / "zarr.json").read_bytes()).hexdigest()

    _edit_header(root, fn)


@pytest.mark.parametrize("layout, chunk_rows, error", [  # one key per row: 8.6e9 keys
    (Layout(pages=1 << 30, heads=4, slots=2, head_dim=8), 1, r"field 'row_counts' .* chunk_rows 4194304 \(min\(2\^22, rows\)\)"),
    (Layout(pages=1 << 22, heads=64, slots=1023, head_dim=2), None,  # the largest table a layout allows
     r"'checksums.row_counts' lists 2 files; the counts array \(274,609,471,488 rows in chunks of 4,194,304\) has 65,473"),
])
def test_a_counts_geometry_asking_for_billions_of_keys_is_refused_before_allocating(tmp_path, layout, chunk_rows, error):
    root = _with_counts(tmp_path)
    _huge_counts_header(tmp_path, root, layout, chunk_rows)
    tracemalloc.start()
    try:
        with pytest.raises(FormatError, match=error):
            MemoryAsset.open(root)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak  # the key list alone would be GiBs (one string per row) or ~100 MB


def test_a_counts_chunk_replaced_by_a_huge_sparse_file_is_never_read(tmp_path):
    root = _with_counts(tmp_path)
    a = MemoryAsset.open(root)
    want = a.row_counts()
    os.truncate(root / "counts/c/0", 1 << 40)  # 1 TiB, sparse: nothing written
    error = r"row counts file 'counts/c/0' is 1,099,511,627,776 bytes, expected 352; restore the asset"
    tracemalloc.start()
    try:
        with pytest.raises(FormatError, match=error):
            a.row_counts()  # opened before the swap: checked again (stat) before reading
        with pytest.raises(FormatError, match=error):
            MemoryAsset.open(root)
        assert re.search(error, a.problems()[0])  # verify never hashes the 1 TiB
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak
    os.truncate(root / "counts/c/0", 352)
    (root / "counts/c/0").write_bytes(want.astype("<u4").tobytes())
    assert np.array_equal(MemoryAsset.open(root).row_counts(), want)


# ------------------------------------------------------------------------------ table files
def _table_file(tmp_path: Path, tensors: dict[str, np.ndarray], header: str | None = None) -> Path:
    from safetensors.numpy import save_file

    from polymem.torch.tablefile import save_table

    good = save_table(tmp_path / "good.safetensors", _table(), SPEC, LAYOUT, orders=(1,), overwrite=True)
    from safetensors import safe_open

    with safe_open(str(good), framework="numpy") as f:
        meta = f.metadata()
    path = tmp_path / "bad.safetensors"
    path.unlink(missing_ok=True)
    save_file(tensors, str(path), metadata={"polymem": header if header is not None else meta["polymem"]})
    return path


@pytest.mark.parametrize("tensors, error", [
    ({"table": np.zeros((88, 4), np.float32)}, r"tensor 'table' is F32 \[88, 4\], but the header's layout needs F32 \[88, 8\]"),
    ({"table": np.zeros((88, 8), np.float64)}, r"tensor 'table' is F64 \[88, 8\], but the header's layout needs F32"),
    ({"table": np.zeros((88, 8), np.float32), "counts": np.zeros(87, np.uint32)},
     r"tensor 'counts' is U32 \[87\], but the header's layout needs U32 \[88\]"),
    ({"weights": np.zeros((88, 8), np.float32)}, r"has no tensor 'table'; it is not a table file"),
])
def test_a_table_file_whose_header_disagrees_with_its_tensors_is_refused_at_open(tmp_path, tensors, error):
    from polymem.torch.tablefile import open_table

    path = _table_file(tmp_path, tensors)
    with pytest.raises(FormatError, match=error) as e:
        open_table(path)
    assert "\n" not in str(e.value)


def test_a_table_file_with_a_broken_header_is_a_one_line_error(tmp_path):
    from polymem.torch.tablefile import open_table

    with pytest.raises(FormatError, match=r"its polymem header is not JSON"):
        open_table(_table_file(tmp_path, {"table": np.zeros((88, 8), np.float32)}, header="{not json"))
    header = json.dumps({"format": "polymem.table-file", "version": 1, "hash_spec": {}, "layout": {"pages": 3}})
    with pytest.raises(FormatError, match=r"its polymem header has a bad hash_spec or layout"):
        open_table(_table_file(tmp_path, {"table": np.zeros((88, 8), np.float32)}, header=header))


# ------------------------------------------------------------------------------ integral indices
@pytest.mark.parametrize("rows", [np.array([1.7]), np.array([1.0]), [0.5, 1], np.array([True])])
def test_non_integer_row_indices_are_refused_not_truncated(tmp_path, rows):
    a = MemoryAsset.from_array(tmp_path / "a", _table(), SPEC, LAYOUT, orders=(1,), dtype="float16")
    with pytest.raises(PolymemError, match=r"rows must be integers \(-1 = none\), got dtype (float64|bool)"):
        a.read_rows(rows)
    with pytest.raises(PolymemError, match=r"page ids must be integers, got dtype"):
        a.read_pages(rows)
    with pytest.raises(PolymemError, match=r"hashes must be uint64, got dtype"):
        a.lookup(rows)


@pytest.mark.parametrize("valid", [[0.5, 0.0], np.array([1.0, 0.0]), [1, 0], np.array([2, 0], np.int8)])
def test_a_validity_mask_must_be_boolean_everywhere(tmp_path, valid):
    """A float or integer mask is refused, not cast (0.5 would have read as valid): asset.lookup, Layout.rows and
    the torch path rows_torch; a boolean mask still reads."""
    import torch

    from polymem.torch.hash import rows_torch

    a = MemoryAsset.from_array(tmp_path / "a", _table(), SPEC, LAYOUT, orders=(1,))
    h = np.array([11, 22], np.uint64)
    with pytest.raises(PolymemError, match=r"valid must be a boolean mask, got dtype (float64|int64|int8)"):
        a.lookup(h, valid=valid)
    with pytest.raises(PolymemError, match=r"valid must be a boolean mask"):
        LAYOUT.rows(h, valid)
    with pytest.raises(PolymemError, match=r"valid must be a boolean mask"):
        rows_torch(LAYOUT, torch.from_numpy(h.view(np.int64)), torch.as_tensor(np.asarray(valid)))
    got = a.lookup(h, valid=[True, False])
    assert np.array_equal(got[0], a.lookup(h[:1])[0]) and not got[1].any()


def test_rows_out_of_range_are_refused_and_integers_still_read(tmp_path):
    t = _table()
    a = MemoryAsset.from_array(tmp_path / "a", t, SPEC, LAYOUT, orders=(1,))
    for bad, shown in (([-2], "-2"), (np.array([2**64 - 1], np.uint64), "18446744073709551615"), ([88], "88")):
        with pytest.raises(PolymemError, match=rf"row {shown} is out of range; this asset has rows 0\.\.87 \(and -1 = none\)"):
            a.read_rows(bad)
    got = a.read_rows(np.array([[3, -1], [87, 0]], np.int32))
    assert np.array_equal(got[0, 0], t[3]) and not got[0, 1].any() and np.array_equal(got[1], t[[87, 0]])
    assert a.read_rows([]).shape == (0, 8)


def test_table_file_page_ids_must_be_integers(tmp_path):
    from polymem.torch.tablefile import open_table, save_table

    tf = open_table(save_table(tmp_path / "t.safetensors", _table(), SPEC, LAYOUT, orders=(1,)))
    with pytest.raises(PolymemError, match=r"page ids must be integers, got dtype float64"):
        tf.read_pages([0.5])
    assert np.array_equal(tf.read_pages([1]), _table()[8:16].reshape(1, 8, 8))


def test_verify_names_an_asset_without_generation_binding(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from polymem.cli.app import app

    old = tmp_path / "v1"
    shutil.copytree(Path(__file__).resolve().parents[1] / "data" / "asset-v1-float32", old)
    r = CliRunner().invoke(app, ["verify", str(old)])
    assert r.exit_code == 0 and "no generation binding" in r.output and "polymem upgrade" in r.output, r.output
    assert CliRunner().invoke(app, ["upgrade", str(old)]).exit_code == 0
    r = CliRunner().invoke(app, ["verify", str(old)])
    assert r.exit_code == 0 and "OK" in r.output and "no generation binding" not in r.output, r.output
