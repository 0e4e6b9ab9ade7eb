"""MemoryAsset: round-trips for every dtype, page-locality, golden bytes, corruption errors, atomic writes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polymem import FormatError, HashSpec, Layout, MemoryAsset, MissingError, PolymemError
from polymem.asset import nf4
from polymem.asset._codec import bf16_decode, bf16_encode

DTYPES = ["float32", "float16", "bfloat16", "nf4"]
SPEC = HashSpec()


def expected(table: np.ndarray, dtype: str) -> np.ndarray:
    """What an asset of ``dtype`` must give back for a float32 table (independent of the asset code)."""
    if dtype == "float32":
        return table
    if dtype == "float16":
        return table.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        return bf16_reference(table)
    return nf4.dequantize(nf4.quantize(table), table.shape[-1])


def bf16_reference(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even to bfloat16 in plain Python (via the float32 bit pattern)."""
    out = []
    for v in np.asarray(x, np.float32).reshape(-1).tolist():
        u = int(np.float32(v).view(np.uint32))
        lower, upper = u & 0xFFFF, u >> 16
        if lower > 0x8000 or (lower == 0x8000 and upper & 1):
            upper += 1
        out.append(np.uint32(upper << 16).view(np.float32))
    return np.array(out, np.float32).reshape(np.shape(x))


def random_table(layout: Layout, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((layout.num_rows, layout.head_dim)).astype(np.float32)


LAYOUT = Layout(pages=11, heads=4, slots=2, head_dim=8)


# --------------------------------------------------------------------------------------- round trips
@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_every_dtype(tmp_path, dtype):
    t = random_table(LAYOUT)
    a = MemoryAsset.from_array(tmp_path / "a", t, SPEC, LAYOUT, orders=(1, 2, 3), dtype=dtype, chunks_per_shard=3,
                               provenance={"tokenizer": {"name": "toy", "fingerprint": "ab"}, "tokens_seen": 5})
    b = MemoryAsset.open(tmp_path / "a")
    assert (b.spec, b.layout, b.orders, b.dtype) == (SPEC, LAYOUT, (1, 2, 3), dtype)
    assert b.provenance == {"tokenizer": {"name": "toy", "fingerprint": "ab"}, "tokens_seen": 5}
    want = expected(t, dtype)
    assert np.array_equal(b.to_numpy(), want)
    assert np.array_equal(a.read_pages([10, 0, 3]), want.reshape(11, 8, 8)[[10, 0, 3]])
    assert b.read_pages(np.zeros(0, np.int64)).shape == (0, 8, 8)
    for p in range(11):  # the lean single-page path agrees with the batched one
        assert np.array_equal(b.read_pages([p])[0], want.reshape(11, 8, 8)[p])
    assert np.array_equal(b.read_pages(np.array([[1, 2], [3, 4]])), want.reshape(11, 8, 8)[[[1, 2], [3, 4]]])
    with pytest.raises(PolymemError, match="page id -1 is out of range"):
        b.read_pages([-1])
    assert b.problems() == []


def test_bf16_encode_is_round_to_nearest_even():
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.standard_normal(2000).astype(np.float32),
                        np.array([1.0 + 2**-8, 1.0 + 3 * 2**-8, -0.0, 3.0e38], np.float32)])
    assert np.array_equal(bf16_decode(bf16_encode(x)), bf16_reference(x))


@pytest.mark.parametrize("dtype", DTYPES)
def test_create_is_all_zero_and_verifies(tmp_path, dtype):
    a = MemoryAsset.create(tmp_path / "z", SPEC, LAYOUT, dtype=dtype, orders=(2, 3), chunks_per_shard=4)
    assert a.orders == (2, 3) and a.provenance == {}
    assert not a.to_numpy().any() and a.to_numpy().shape == (LAYOUT.num_rows, 8)
    assert a.nonzero_pages() == 0 and a.problems() == []


@pytest.mark.parametrize("dtype", DTYPES)
def test_write_pages_then_read(tmp_path, dtype):
    t = random_table(LAYOUT, 2)
    a = MemoryAsset.from_array(tmp_path / "a", t, SPEC, LAYOUT, orders=(1, 2), dtype=dtype, chunks_per_shard=2)
    new = random_table(LAYOUT, 3).reshape(11, 8, 8)[:3]
    a.write_pages([7, 1, 2], new)  # pages 1 and 2 share an nf4 block with page 0: it must survive
    want = expected(t, dtype).reshape(11, 8, 8).copy()
    want[[7, 1, 2]] = expected(new.reshape(-1, 8), dtype).reshape(3, 8, 8)
    assert np.array_equal(a.read_pages(np.arange(11)), want)
    b = MemoryAsset.open(tmp_path / "a")
    assert np.array_equal(b.read_pages(np.arange(11)), want)
    assert b.problems() == []
    assert b.nonzero_pages() == 11
    assert not any(p.name.endswith(".new") for p in (tmp_path / "a").rglob("*"))


@settings(max_examples=15, deadline=None)
@given(ids=st.lists(st.integers(0, 10), min_size=1, max_size=6, unique=True), seed=st.integers(0, 2**16))
def test_write_read_property(tmp_path_factory, ids, seed):
    path = tmp_path_factory.mktemp("p") / "a"
    a = MemoryAsset.create(path, SPEC, LAYOUT, dtype="float16", chunks_per_shard=3)
    data = np.random.default_rng(seed).standard_normal((len(ids), 8, 8)).astype(np.float32)
    a.write_pages(ids, data)
    got = a.read_pages(ids)
    assert np.array_equal(got, data.astype(np.float16).astype(np.float32))
    others = np.setdiff1d(np.arange(11), ids)
    assert not a.read_pages(others).any()


# --------------------------------------------------------------------------------------- page locality / lookup
@pytest.mark.parametrize("kind", ["page-local", "flat", "independent-heads"])
def test_lookup_matches_rows(tmp_path, kind):
    layout = Layout(pages=16, heads=4, slots=4, head_dim=8, kind=kind)
    t = random_table(layout, 4)
    a = MemoryAsset.from_array(tmp_path / "a", t, SPEC, layout, orders=(1, 2, 3), dtype="float32")
    hashes = np.random.default_rng(5).integers(0, 2**63, size=(3, 50), dtype=np.uint64)
    rows = layout.rows(hashes)  # [3, 50, K]
    got = a.lookup(hashes)
    assert got.shape == (3, 50, 4, 8)
    assert np.array_equal(got, t[rows])
    valid = np.ones(hashes.shape, bool)
    valid[0, :10] = False
    assert not a.lookup(hashes, valid)[0, :10].any()
    pages = layout.page_of(rows)
    if kind == "page-local":  # every n-gram's K head rows on one page
        assert (pages == pages[..., :1]).all()
        # and head k reads from its own S-row block of that page
        k = np.arange(4)
        assert ((rows % layout.rows_per_page) // layout.slots == k).all()
    elif kind == "independent-heads":
        assert (pages != pages[..., :1])[..., 1:].all()


def test_page_local_lookup_reads_one_page_per_ngram(tmp_path):
    layout = Layout(pages=64, heads=8, slots=4, head_dim=4)
    a = MemoryAsset.create(tmp_path / "a", SPEC, layout)
    pages = np.arange(layout.pages)
    a.write_pages(pages, np.broadcast_to(pages[:, None, None], (64, 32, 4)).astype(np.float32))  # page p holds p
    h = np.arange(1, 2001, dtype=np.uint64)
    page_of = layout.page_of(layout.rows(h))  # [2000, 8]
    assert (page_of == page_of[:, :1]).all()  # all K head rows of an n-gram on one page
    got = a.lookup(h)  # [2000, K, r]: every value read for an n-gram is its one page's id
    assert got.shape == (2000, 8, 4) and (got == page_of[:, :1, None]).all()
    assert len(np.unique(page_of[:, 0])) > 50  # and the n-grams spread over the pages


# --------------------------------------------------------------------------------------- golden bytes
GOLDEN_TABLE = np.arange(48, dtype=np.float32).reshape(12, 4) / 8 - 2.5
GOLDEN_LAYOUT = Layout(pages=3, heads=2, slots=2, head_dim=4)
GOLDEN = {  # format v2: every stored chunk is its bytes followed by their crc32c; then the shard-id footer
    "float32": {
        "attributes": "a60cc520ac973ea0383693979de9b6cc12ab625e3a8d3bef5cfbc730e2bba36b",
        "pages/c/0/0/0": (
            "000020c0000018c0000010c0000008c0000000c00000f0bf0000e0bf0000d0bf"
            "0000c0bf0000b0bf0000a0bf000090bf000080bf000060bf000040bf000020bf" "564180d0"
            "000000bf0000c0be000080be000000be000000000000003e0000803e0000c03e"
            "0000003f0000203f0000403f0000603f0000803f0000903f0000a03f0000b03f" "7f4ea721"
            "706f6c796d656d207368617264206964" "d85b69c588a3400c3cac16214512df08"  # "polymem shard id", the id
            "0000000000000000" "4400000000000000" "4400000000000000" "4400000000000000" "366a83d0"
        ),
        "pages/c/1/0/0": (
            "0000c03f0000d03f0000e03f0000f03f00000040000008400000104000001840"
            "0000204000002840000030400000384000004040000048400000504000005840" "c321149a"
            "706f6c796d656d207368617264206964" "9e8f4e629c5848be6cf17fea2d758712"
            "0000000000000000" "4400000000000000" "ffffffffffffffff" "ffffffffffffffff" "84fb5dd8"
        ),
    },
    "nf4": {
        "attributes": "d1aa9aabc9688e9de17379170b54217dbe0ab6ef55af65bf2ee8ee4e4afd2f25",
        "pages/c/0/0": (
            "00000041" "00100040" "0011003e" "0011003c" "10420038" "b7fe0036" "edfe003b" "eeff803d"
            "feff803f" "feffc040" "ffffc041" "ffffc042" + "00" * 4048 + "c5ca5ab7"
            + "706f6c796d656d207368617264206964" "42a66b2dba7aa2388bebb5ad8548af19" "0000000000000000" "0410000000000000" "21e236ff"
        ),
    },
}
# format v1 (no per-chunk crc32c): the same table, written by polymem before the version bump; committed as
# real assets under tests/data/asset-v1-*/ and still read (read-only)
GOLDEN_V1 = {
    "float32": {"attributes": "850b4b5ce01d9914a7726b84ab1419c5e376a8c2e93e53f2b5fed94877c990c9",
                "index_crcs": ("6aa37dd5", "5e1cba3a")},
    "nf4": {"attributes": "af200aaa0b2f1cf13dedf37a1e076583700b9bb759ecdca78c5440ce126211a3", "index_crcs": ("4c602bde",)},
}
DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.mark.parametrize("dtype", ["float32", "nf4"])
def test_golden_bytes(tmp_path, dtype):
    a = MemoryAsset.from_array(tmp_path / "g", GOLDEN_TABLE, SPEC, GOLDEN_LAYOUT, orders=(1, 2), dtype=dtype,
                               chunks_per_shard=2, provenance={"corpus": "golden", "tokens_seen": 0})
    g = GOLDEN[dtype]
    shard_keys = sorted(k for k in g if k.startswith("pages/"))
    assert sorted(a.header["checksums"]["shards"]) == shard_keys
    for key in shard_keys:
        data = (tmp_path / "g" / key).read_bytes()
        assert data.hex() == g[key]
        assert a.header["checksums"]["shards"][key] == hashlib.sha256(data).hexdigest()
    assert a.header["checksums"]["attributes"] == g["attributes"]
    group = json.loads((tmp_path / "g" / "zarr.json").read_text())
    assert group["node_type"] == "group" and group["attributes"]["polymem"]["hash_spec"] == SPEC.to_dict()
    assert group["attributes"]["polymem"]["layout"] == {
        "kind": "page-local", "heads": 2, "slots": 2, "pages": 3, "head_dim": 4, "orders": [1, 2], "joint": True,
    }


def test_golden_bytes_are_in_the_spec():
    doc = Path(__file__).resolve().parents[2] / "docs" / "asset-format.md"
    if not doc.exists():
        pytest.skip("docs/ not shipped with this install")
    text = doc.read_text().replace(" ", "").replace("\n", "")
    for dtype, g in GOLDEN.items():
        assert g["attributes"] in text
        for key in (k for k in g if k.startswith("pages/")):
            for word in g[key][:32], g[key][-8:]:
                assert word in text, (dtype, key, word)
    for word in ("564180d0", "7f4ea721", "366a83d0", "c321149a", "84fb5dd8", "c5ca5ab7", "21e236ff",
                 "d85b69c588a3400c3cac16214512df08", "9e8f4e629c5848be6cf17fea2d758712", "42a66b2dba7aa2388bebb5ad8548af19"):
        assert word in text
    for g in GOLDEN_V1.values():
        assert g["attributes"] in text


@pytest.mark.parametrize("dtype", ["float32", "nf4"])
def test_version_1_assets_open_read_only_and_upgrade(tmp_path, dtype):
    """A v1 asset written by the polymem before the bump: opens, reads the same pages, refuses page writes
    with the fix named; `upgrade` rewrites it as v2 with byte-identical pages to a fresh v2 asset."""
    import shutil

    src = DATA / f"asset-v1-{dtype}"
    g1 = GOLDEN_V1[dtype]
    old = MemoryAsset.open(src)
    assert old.version == 1 and old.header["version"] == 1
    assert old.header["checksums"]["attributes"] == g1["attributes"]
    want = MemoryAsset.from_array(tmp_path / "fresh", GOLDEN_TABLE, SPEC, GOLDEN_LAYOUT, orders=(1, 2), dtype=dtype,
                                  chunks_per_shard=2, provenance={"corpus": "golden", "tokens_seen": 0})
    assert np.array_equal(old.to_numpy(), want.to_numpy())
    assert np.array_equal(old.read_pages([1]), want.read_pages([1]))
    assert old.problems() == []
    path = tmp_path / "v1"
    shutil.copytree(src, path)
    with pytest.raises(PolymemError, match=r"format version 1 assets are read-only.*polymem upgrade"):
        MemoryAsset.open(path).write_pages([0], np.zeros((1, 4, 4), np.float32))
    up = MemoryAsset.upgrade(path)
    assert up.version == 2 and up.problems() == []
    assert up.header == want.header  # same spec, layout, provenance, checksums: the upgraded bytes are v2's
    for key in GOLDEN[dtype]:
        if key.startswith("pages/"):
            assert (path / key).read_bytes().hex() == GOLDEN[dtype][key]
    assert MemoryAsset.upgrade(path).header == up.header  # idempotent
    # a corrupt v1 shard is not upgraded (its bytes do not match the sha256)
    bad = tmp_path / "bad"
    shutil.copytree(src, bad)
    key = old.geometry.shard_key(0)
    data = bytearray((bad / key).read_bytes())
    data[5] ^= 1
    (bad / key).write_bytes(bytes(data))
    with pytest.raises(FormatError, match=rf"shard '{key}' checksum mismatch"):
        MemoryAsset.upgrade(bad)


# --------------------------------------------------------------------------------------- corruption
@pytest.fixture()
def asset(tmp_path):
    MemoryAsset.from_array(tmp_path / "a", random_table(LAYOUT), SPEC, LAYOUT, orders=(1, 2, 3), dtype="float16",
                           chunks_per_shard=4)
    return tmp_path / "a"


def _edit_attrs(path: Path, fn) -> None:
    doc = json.loads((path / "zarr.json").read_text())
    fn(doc["attributes"]["polymem"])
    (path / "zarr.json").write_text(json.dumps(doc, indent=2))


def test_flipped_byte_named_by_verify(asset):
    shard = asset / "pages/c/1/0/0"
    data = bytearray(shard.read_bytes())
    data[100] ^= 0x01
    shard.write_bytes(bytes(data))
    a = MemoryAsset.open(asset)  # the cheap checks pass: only the contents changed
    with pytest.raises(FormatError, match=r"shard 'pages/c/1/0/0' checksum mismatch"):
        a.verify()


def test_flipped_index_byte_refused_on_open(asset):
    shard = asset / "pages/c/2/0/0"
    data = bytearray(shard.read_bytes())
    data[-10] ^= 0x40
    shard.write_bytes(bytes(data))
    with pytest.raises(FormatError, match=r"shard 'pages/c/2/0/0' has a corrupt index"):
        MemoryAsset.open(asset)


def test_truncated_shard(asset):
    shard = asset / "pages/c/0/0/0"
    shard.write_bytes(shard.read_bytes()[:-7])
    with pytest.raises(FormatError, match=r"shard 'pages/c/0/0/0' is \d+ bytes, expected \d+ \(truncated"):
        MemoryAsset.open(asset)


def test_missing_shard(asset):
    (asset / "pages/c/2/0/0").unlink()
    with pytest.raises(FormatError, match=r"shard 'pages/c/2/0/0' is missing"):
        MemoryAsset.open(asset)


def test_edited_attributes(asset):
    _edit_attrs(asset, lambda h: h["provenance"].update(loss=0.1))
    with pytest.raises(FormatError, match=r"field 'attributes' checksum mismatch"):
        MemoryAsset.open(asset)


def test_edited_layout_is_caught(asset):
    _edit_attrs(asset, lambda h: h["layout"].update(slots=4))
    with pytest.raises(FormatError, match=r"checksum mismatch"):
        MemoryAsset.open(asset)


def test_unknown_format_version_names_supported(asset):
    _edit_attrs(asset, lambda h: h.update(version=3))
    with pytest.raises(FormatError, match=r"version 3 is not supported; this polymem reads versions \[1, 2\]"):
        MemoryAsset.open(asset)


def test_wrong_format_name(asset):
    _edit_attrs(asset, lambda h: h.update(format="engram"))
    with pytest.raises(FormatError, match=r"format is 'engram', expected 'polymem.asset'"):
        MemoryAsset.open(asset)


def test_edited_array_metadata(asset):
    meta = json.loads((asset / "pages/zarr.json").read_text())
    meta["codecs"][0]["configuration"]["codecs"].append({"name": "zstd", "configuration": {"level": 0}})
    (asset / "pages/zarr.json").write_text(json.dumps(meta))
    with pytest.raises(FormatError, match=r"pages/zarr.json field 'codecs\[0\].codecs'"):
        MemoryAsset.open(asset)


@pytest.mark.parametrize(
    "field, value",
    [("shape", [3, 8, 8]), ("data_type", "float32"), ("fill_value", 1.0), ("storage_transformers", [{"x": 1}])],
)
def test_edited_array_metadata_fields(asset, field, value):
    meta = json.loads((asset / "pages/zarr.json").read_text())
    meta[field] = value
    (asset / "pages/zarr.json").write_text(json.dumps(meta))
    with pytest.raises(FormatError, match=rf"pages/zarr.json field '{field}'"):
        MemoryAsset.open(asset)


def test_not_json(asset):
    (asset / "zarr.json").write_bytes(b"\x80garbage")
    with pytest.raises(FormatError, match=r"'zarr.json' is not valid JSON"):
        MemoryAsset.open(asset)


def test_not_an_asset(tmp_path):
    with pytest.raises(FormatError, match="no asset directory"):
        MemoryAsset.open(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FormatError, match="missing"):
        MemoryAsset.open(tmp_path / "empty")


def _missing(exc: BaseException, match: str) -> None:
    """A missing asset or file of one: a polymem error and a FileNotFoundError (ENOENT), one line."""
    import errno

    assert isinstance(exc, MissingError) and isinstance(exc, FormatError) and isinstance(exc, PolymemError)
    assert isinstance(exc, FileNotFoundError) and isinstance(exc, OSError) and exc.errno == errno.ENOENT
    assert match in str(exc) and "\n" not in str(exc) and not str(exc).startswith("[Errno")


def test_a_missing_asset_is_a_file_not_found_error(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        MemoryAsset.open(tmp_path / "nothing")
    _missing(e.value, "no asset directory here")
    assert e.value.filename == str(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError) as e:
        MemoryAsset.open(tmp_path / "empty")
    _missing(e.value, "group metadata 'zarr.json' is missing")
    with pytest.raises(FileNotFoundError) as e:
        MemoryAsset.repair(tmp_path / "nothing")
    _missing(e.value, "no asset directory here, and nothing left aside")


def test_a_missing_shard_is_a_file_not_found_error(asset):
    opened = MemoryAsset.open(asset)
    (asset / "pages/c/2/0/0").unlink()
    with pytest.raises(FileNotFoundError) as e:  # removed while the asset was open
        opened.read_pages(np.arange(opened.layout.pages))
    _missing(e.value, "shard 'pages/c/2/0/0' is missing")
    with pytest.raises(OSError) as e:  # on open
        MemoryAsset.open(asset)
    _missing(e.value, "shard 'pages/c/2/0/0' is missing")


def test_other_format_errors_are_not_file_not_found(asset):
    (asset / "zarr.json").write_bytes(b"\x80garbage")
    with pytest.raises(FormatError) as e:
        MemoryAsset.open(asset)
    assert not isinstance(e.value, OSError)


def test_writing_marker_refuses_open(asset):
    (asset / ".polymem-writing").write_text("{}")
    with pytest.raises(FormatError, match=r"page write was interrupted.*polymem verify --repair"):
        MemoryAsset.open(asset)
    assert MemoryAsset.repair(asset) == ["rolled back an interrupted page write (0 of 0 shard(s) restored)"]
    assert MemoryAsset.open(asset).problems() == []


def test_no_pickle_anywhere(asset):
    root = Path(__file__).resolve().parents[2] / "polymem"
    for p in [*root.joinpath("asset").glob("*.py"), root / "nf4.py", root / "iosim.py"]:
        if p.exists():
            assert "pickle" not in p.read_text().replace("allow_pickle=False", ""), p
    for p in asset.rglob("zarr.json"):
        json.loads(p.read_text())  # all metadata is JSON


# --------------------------------------------------------------------------------------- input errors
def test_input_errors(tmp_path, asset):
    a = MemoryAsset.open(asset)
    with pytest.raises(PolymemError, match="page id 11 is out of range"):
        a.read_pages([11])
    with pytest.raises(PolymemError, match="expected"):
        a.write_pages([0], np.zeros((1, 8, 7), np.float32))
    with pytest.raises(PolymemError, match="distinct"):
        a.write_pages([1, 1], np.zeros((2, 8, 8), np.float32))
    with pytest.raises(PolymemError, match="NaN or inf"):
        a.write_pages([1], np.full((1, 8, 8), np.nan, np.float32))
    with pytest.raises(PolymemError, match="already exists"):
        MemoryAsset.create(asset, SPEC, LAYOUT)
    with pytest.raises(PolymemError, match="dtype 'int8' is not supported"):
        MemoryAsset.create(tmp_path / "x", SPEC, LAYOUT, dtype="int8")
    with pytest.raises(PolymemError, match=r"needs \(88, 8\)"):
        MemoryAsset.from_array(tmp_path / "x", np.zeros((3, 8)), SPEC, LAYOUT, orders=(1,))
    with pytest.raises(PolymemError, match="orders"):
        MemoryAsset.create(tmp_path / "x", SPEC, LAYOUT, orders=())
    with pytest.raises(PolymemError, match="backend 'bogus' is unknown; accepted: auto, fast, zarr, tensorstore"):
        MemoryAsset.open(asset, backend="bogus")
    assert not (tmp_path / "x").exists()


def test_overwrite_replaces_atomically(tmp_path, asset):
    t = random_table(LAYOUT, 9)
    MemoryAsset.from_array(asset, t, SPEC, LAYOUT, orders=(1,), dtype="float32", overwrite=True)
    b = MemoryAsset.open(asset)
    assert b.dtype == "float32" and np.array_equal(b.to_numpy(), t)
    assert [p.name for p in asset.parent.iterdir() if p.name.startswith(".")] == []


# Killed writers: tests/asset/test_writer_faults.py kills (or fails) every writer at every file-system operation, in
# this process and, with a real SIGKILL at a chosen operation, in a child process; the former sleep-then-kill
# tests here passed whether or not the kill landed mid-write, so they are gone.


@pytest.mark.parametrize("dtype", DTYPES)
def test_read_stored_and_read_rows(tmp_path, dtype):
    t = random_table(LAYOUT, 11)
    a = MemoryAsset.from_array(tmp_path / "a", t, SPEC, LAYOUT, orders=(1,), dtype=dtype, chunks_per_shard=3)
    st = a.read_stored([4, 9])
    pages = t.reshape(11, 8, 8)[[4, 9]]
    if dtype == "nf4":
        assert st.dtype == np.uint8 and st.tobytes() == nf4.quantize(pages).tobytes()
    elif dtype == "bfloat16":
        assert st.dtype == np.uint16 and np.array_equal(st, bf16_encode(pages))
    else:
        assert np.array_equal(st, pages.astype(dtype))
    rows = np.array([[0, -1, 87], [40, 41, -1]])
    got = a.read_rows(rows)
    want = expected(t, dtype)
    assert got.shape == (2, 3, 8)
    assert np.array_equal(got[0, 0], want[0]) and np.array_equal(got[0, 2], want[87])
    assert np.array_equal(got[1, :2], want[[40, 41]]) and not got[0, 1].any() and not got[1, 2].any()
    with pytest.raises(PolymemError, match="row 88 is out of range"):
        a.read_rows([88])


def test_spec_check_and_token_cache_lookup(tmp_path):
    from polymem import SpecMismatchError, TokenHashes

    layout = Layout(pages=50, heads=2, slots=2, head_dim=4)
    t = random_table(layout, 12)
    a = MemoryAsset.from_array(tmp_path / "a", t, SPEC, layout, orders=(1, 2))
    a.check_spec(HashSpec())
    with pytest.raises(SpecMismatchError, match="differs from the asset's"):
        a.check_spec(HashSpec(normalizer="ascii-lower"))
    cache = TokenHashes.from_token_bytes([b"ab", b"c", b"abc"], a.spec, name="toy", fingerprint="f")
    h, v = cache.ngram_hashes(np.array([0, 1, 2]), max_n=2)
    # byte-equivalent: the bigram (ab, c) and the unigram (abc) read the same K rows
    assert h[1, 1] == h[2, 0]
    got = a.lookup(h, v)
    assert np.array_equal(got[1, 1], got[2, 0]) and got[1, 1].any()
    assert not got[0, 1].any()  # bigram before the start: invalid -> zeros


def test_stale_new_files_are_cleaned(tmp_path, asset):
    stale = asset / "pages/c/2/0/0.new"
    stale.write_bytes(b"junk")
    a = MemoryAsset.open(asset)  # ignored by readers
    assert a.problems() == []
    a.write_pages([0], np.zeros((1, 8, 8), np.float32))
    assert not stale.exists()


def _doc_schema():
    doc = Path(__file__).resolve().parents[2] / "docs" / "asset-format.md"
    if not doc.exists():
        pytest.skip("docs/ not shipped with this install")
    jsonschema = pytest.importorskip("jsonschema")
    text = doc.read_text()
    start = text.index("```json", text.index("## 8. JSON schema")) + len("```json")
    return jsonschema, json.loads(text[start : text.index("```", start)])


@pytest.mark.parametrize("dtype", DTYPES)
def test_headers_match_the_documented_json_schema(tmp_path, dtype):
    jsonschema, schema = _doc_schema()
    a = MemoryAsset.create(tmp_path / "a", SPEC, LAYOUT, dtype=dtype, provenance={"corpus": "x", "loss": 1.5})
    jsonschema.validate(a.header, schema)
    for bad in (a.header | {"version": 3}, a.header | {"version": 1}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
