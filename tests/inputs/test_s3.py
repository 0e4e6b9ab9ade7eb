"""Corpora (and assets) in S3: a local S3 server (moto's ThreadedMotoServer on 127.0.0.1, a free port) reached
through s3fs over HTTP, with dummy credentials; nothing leaves the machine."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

import pytest

import polymem
from polymem.corpus import Corpus

from conftest import generated_text, sample_text
from s3server import BUCKET, endpoint, s3fs  # noqa: F401  (the local S3 server fixture)

zstandard = pytest.importorskip("zstandard")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

@pytest.fixture(scope="module")
def fs(endpoint: str) -> Any:
    s3fs.S3FileSystem.clear_instance_cache()
    return s3fs.S3FileSystem(endpoint_url=endpoint)


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory, fs: Any) -> Path:
    """The same corpus as local files and as S3 objects: .jsonl.zst, .jsonl.gz, .jsonl, .parquet, .txt."""
    text = sample_text() + "\n" + generated_text(3000, seed=11)
    lines = text.splitlines(keepends=True)
    docs = ["".join(lines[i:i + 4]) for i in range(0, len(lines), 4)]
    d = tmp_path_factory.mktemp("shards")
    q = len(docs) // 5

    def jl(part: list[str]) -> bytes:
        return "".join(json.dumps({"text": t}) + "\n" for t in part).encode()

    (d / "shard-0.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(jl(docs[:q])))
    (d / "shard-1.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(jl(docs[q:2 * q])))
    (d / "shard-2.jsonl.gz").write_bytes(gzip.compress(jl(docs[2 * q:3 * q]), mtime=0))
    (d / "shard-3.jsonl").write_bytes(jl(docs[3 * q:4 * q]) + b"not json\n")
    pq.write_table(pa.table({"text": docs[4 * q:]}), d / "shard-4.parquet", row_group_size=7)
    (d / "notes.txt").write_text(docs[0], encoding="utf-8")
    for f in sorted(d.iterdir()):
        fs.put(str(f), f"{BUCKET}/corpus/{f.name}")
    return d


def _same(a: Any, b: Any) -> None:
    da, db = a.to_dict(), b.to_dict()
    for d in (da, db):
        for k in ("elapsed_s", "timing"):
            d.pop(k)
        d["skipped"] = [(s["source"].rsplit("/", 1)[-1], s["reason"]) for s in d["skipped"]]
    assert da == db


def test_corpus_from_s3_reads_what_the_local_files_hold(endpoint: str, shards: Path) -> None:
    opts = {"endpoint_url": endpoint}
    local = Corpus([shards])
    remote = Corpus([f"s3://{BUCKET}/corpus/"], storage_options=opts)
    lt = [(d.text, d.id.rsplit("/", 1)[-1]) for d in local]
    rt = [(d.text, d.id.rsplit("/", 1)[-1]) for d in remote]
    assert rt == lt and len(lt) > 50
    assert [s.reason for s in remote.skipped] == [s.reason for s in local.skipped] == [
        "invalid JSON: Expecting value at column 1"]
    assert remote.skipped[0].source == f"s3://{BUCKET}/corpus/shard-3.jsonl:{sum(1 for _ in open(shards / 'shard-3.jsonl'))}"
    glob = Corpus([f"s3://{BUCKET}/corpus/shard-*.jsonl.zst"], storage_options=opts)
    assert [d.text for d in glob] == [d.text for d in Corpus(sorted(shards.glob("shard-*.jsonl.zst")))]


def test_coverage_over_s3_shards_equals_local(endpoint: str, shards: Path) -> None:
    kw = dict(max_n=4, partition_mb=0.004)
    local = polymem.coverage("bytes", "cl100k_base", Corpus([shards]), **kw)
    remote = polymem.coverage("bytes", "cl100k_base", Corpus([f"s3://{BUCKET}/corpus/"],
                                                            storage_options={"endpoint_url": endpoint}), **kw)
    _same(local, remote)
    assert local.docs > 50


@pytest.mark.slow
def test_aws_endpoint_url_is_honoured_and_scratch_can_be_s3(endpoint: str, shards: Path,
                                                            monkeypatch: pytest.MonkeyPatch, fs: Any) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    s3fs.S3FileSystem.clear_instance_cache()
    kw = dict(max_n=3, partition_mb=0.01)
    local = polymem.coverage("bytes", "cl100k_base", Corpus(sorted(shards.glob("shard-*.jsonl.zst"))), **kw)
    remote = polymem.coverage("bytes", "cl100k_base", Corpus([f"s3://{BUCKET}/corpus/shard-*.jsonl.zst"]),
                              scratch=f"s3://{BUCKET}/scratch/run1", **kw)
    _same(local, remote)
    assert fs.find(f"{BUCKET}/scratch/run1") and all(p.endswith(".npy") for p in fs.find(f"{BUCKET}/scratch/run1"))


@pytest.mark.parametrize("where", ["local", "s3"])
def test_scratch_slices_read_back_exactly_and_bad_files_are_clear_errors(where: str, fs: Any,
                                                                        tmp_path: Path) -> None:
    """The reduce's slice reads (on S3: a header request and one for exactly the slice) return the rows asked for;
    a truncated file or one of another dtype is an error that names the file and says to rerun."""
    import numpy as np
    import fsspec
    from polymem.analysis.coverage import dist

    arr = np.arange(10_000, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    if where == "s3":
        sfs, root = fs, f"{BUCKET}/slices"
    else:
        sfs, root = fsspec.filesystem("file"), str(tmp_path)
    dist._save(sfs, f"{root}/a.npy", arr)
    out = np.zeros(1234, dtype=np.uint64)
    dist._read_slice_into(sfs, f"{root}/a.npy", 4321, out)
    assert np.array_equal(out, arr[4321:4321 + 1234])
    with pytest.raises(ValueError, match=r"a\.npy' holds 10000 uint64 values, expected at least 10001 uint64"):
        dist._read_slice_into(sfs, f"{root}/a.npy", 8767, np.zeros(1234, dtype=np.uint64))
    with pytest.raises(ValueError, match=r"holds 10000 uint64 values, expected at least 1234 int64.*rerun"):
        dist._read_slice_into(sfs, f"{root}/a.npy", 0, np.zeros(1234, dtype=np.int64))
    whole = sfs.cat_file(f"{root}/a.npy")
    sfs.pipe_file(f"{root}/t.npy", whole[:len(whole) - 8 * 100])  # the header still says 10000 values
    with pytest.raises(ValueError, match=r"t\.npy' ends early: it was truncated; rerun"):
        dist._read_slice_into(sfs, f"{root}/t.npy", 9000, np.zeros(1000, dtype=np.uint64))


# ------------------------------------------------------------------------------------------- assets in S3
def _table(layout: Any, seed: int = 0) -> Any:
    import numpy as np

    return np.random.default_rng(seed).standard_normal((layout.num_rows, layout.head_dim), dtype=np.float32)


def _asset_kw() -> dict[str, Any]:
    from polymem import HashSpec

    return dict(spec=HashSpec(), orders=(1, 2), dtype="float16", chunks_per_shard=4)


@pytest.mark.slow
def test_an_asset_written_to_s3_verifies_and_reads_back_the_same_bytes(endpoint: str, fs: Any,
                                                                       tmp_path: Path) -> None:
    import numpy as np
    from typer.testing import CliRunner

    from polymem import Layout, MemoryAsset
    from polymem.cli.app import app

    layout = Layout(pages=48, heads=2, slots=4, head_dim=8)
    opts = {"endpoint_url": endpoint}
    url = f"s3://{BUCKET}/assets/a.pmem"
    local = MemoryAsset.from_array(tmp_path / "a.pmem", _table(layout), layout=layout, **_asset_kw())
    remote = MemoryAsset.from_array(url, _table(layout), layout=layout, storage_options=opts, **_asset_kw())
    remote.verify()
    files = sorted(p for p in (tmp_path / "a.pmem").rglob("*") if p.is_file() and not p.name.startswith("."))
    for p in files:  # the same bytes, object for object
        assert fs.cat_file(f"{BUCKET}/assets/a.pmem/{p.relative_to(tmp_path / 'a.pmem').as_posix()}") == p.read_bytes()
    again = MemoryAsset.open(url, storage_options=opts)
    ids = np.array([0, 5, 47, 12, 13, 5])
    assert np.array_equal(again.read_pages(ids), local.read_pages(ids))
    assert np.array_equal(again.to_numpy(), local.to_numpy())
    # writes: pages, then a quantized copy, both to S3; the same as the local asset
    new = np.full((2, layout.rows_per_page, layout.head_dim), 0.5, dtype=np.float32)
    again.write_pages([3, 40], new)
    local.write_pages([3, 40], new)
    reopened = MemoryAsset.open(url, storage_options=opts)
    reopened.verify()
    assert np.array_equal(reopened.to_numpy(), local.to_numpy())
    q, _ = reopened.quantize(f"s3://{BUCKET}/assets/a-nf4.pmem", to="nf4")
    ql, _ = local.quantize(tmp_path / "a-nf4.pmem", to="nf4")
    assert np.array_equal(MemoryAsset.open(f"s3://{BUCKET}/assets/a-nf4.pmem", storage_options=opts).to_numpy(),
                          ql.to_numpy())
    for cmd in ("verify", "inspect"):
        res = CliRunner().invoke(app, [cmd, url, "--storage-options", json.dumps(opts)])
        assert res.exit_code == 0, res.output


@pytest.mark.slow
def test_a_writer_stopped_before_its_metadata_leaves_nothing_open_accepts(endpoint: str, fs: Any) -> None:
    import subprocess
    import sys
    import time

    from typer.testing import CliRunner

    from polymem import FormatError, MemoryAsset
    from polymem.cli.app import app

    url = f"s3://{BUCKET}/assets/killed.pmem"
    prefix = f"{BUCKET}/assets/killed.pmem"
    code = (
        "import numpy as np, polymem\n"
        "from polymem import HashSpec, Layout, MemoryAsset\n"
        "layout = Layout(pages=4096, heads=2, slots=4, head_dim=64)\n"
        "t = np.random.default_rng(0).standard_normal((layout.num_rows, 64), dtype=np.float32)\n"
        f"MemoryAsset.from_array({url!r}, t, HashSpec(), layout, orders=(1, 2), dtype='float32',"
        " chunks_per_shard=8)\n"
    )
    env = dict(os.environ, AWS_ENDPOINT_URL=endpoint)
    proc = subprocess.Popen([sys.executable, "-c", code], env=env)
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            fs.invalidate_cache()
            seen = fs.find(prefix)
            if seen:
                proc.kill()  # SIGKILL: mid-upload, after some data objects landed
                break
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()
    assert seen, "the writer was stopped after its first objects landed"
    fs.invalidate_cache()
    left = fs.find(prefix)
    assert left and f"{prefix}/zarr.json" not in left
    opts = {"endpoint_url": endpoint}
    with pytest.raises(FormatError, match=r"not an asset: its group metadata \(zarr.json\) is missing.*orphan"):
        MemoryAsset.open(url, storage_options=opts)
    res = CliRunner().invoke(app, ["verify", url, "--storage-options", json.dumps(opts)])
    assert res.exit_code != 0 and "orphan objects" in res.output and "killed.pmem/pages/" in res.output
    # and writing it again (overwrite) replaces the orphans with a whole asset
    from polymem import HashSpec, Layout

    layout = Layout(pages=16, heads=2, slots=4, head_dim=8)
    MemoryAsset.from_array(url, _table(layout), HashSpec(), layout, orders=(1, 2), overwrite=True,
                           storage_options=opts).verify()
    fs.invalidate_cache()
    assert len(fs.find(prefix)) < len(left) + 2


def test_an_upload_stopped_before_its_metadata_is_named_by_verify(endpoint: str, fs: Any, tmp_path: Path) -> None:
    # the deterministic twin of the killed-writer test above: the same upload, stopped before the group metadata
    from polymem import FormatError, HashSpec, Layout, MemoryAsset
    from polymem.asset import _remote

    layout = Layout(pages=16, heads=2, slots=4, head_dim=8)
    MemoryAsset.from_array(tmp_path / "s.pmem", _table(layout), HashSpec(), layout, orders=(1,), chunks_per_shard=4)
    url = f"s3://{BUCKET}/assets/staged.pmem"
    opts = {"endpoint_url": endpoint}
    _remote.upload(tmp_path / "s.pmem", url, opts, overwrite=False, stop_before_metadata=True)
    left = _remote.orphans(url, opts)
    assert len(left) == 5 and all(k.startswith(f"s3://{BUCKET}/assets/staged.pmem/pages/") for k in left)
    with pytest.raises(FormatError, match=r"5 orphan objects"):
        MemoryAsset.open(url, storage_options=opts)
    _remote.upload(tmp_path / "s.pmem", url, opts, overwrite=False)  # orphans of ours are replaced, then committed
    MemoryAsset.open(url, storage_options=opts).verify()
    assert _remote.orphans(url, opts) == []


def test_an_existing_s3_asset_is_not_overwritten_by_default(endpoint: str) -> None:
    from polymem import HashSpec, Layout, MemoryAsset, PolymemError

    layout = Layout(pages=8, heads=2, slots=4, head_dim=8)
    opts = {"endpoint_url": endpoint}
    url = f"s3://{BUCKET}/assets/once.pmem"
    MemoryAsset.from_array(url, _table(layout), HashSpec(), layout, orders=(1,), storage_options=opts)
    with pytest.raises(PolymemError, match="already holds an asset; pass overwrite=True"):
        MemoryAsset.from_array(url, _table(layout, 1), HashSpec(), layout, orders=(1,), storage_options=opts)
