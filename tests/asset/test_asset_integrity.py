"""Assets under hostile conditions: every page read verified, no building on corrupt shards, writers locked, readers that
survive shards changed under them, bounded headers, repair. Each test reproduces a failure the old code had."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from polymem import FormatError, HashSpec, Layout, MemoryAsset, PolymemError

SPEC = HashSpec()
DTYPES = ["float32", "float16", "bfloat16", "nf4"]
LAYOUT = Layout(pages=11, heads=4, slots=2, head_dim=8)  # 8 rows x 8 per page


def _table(layout: Layout = LAYOUT, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((layout.num_rows, layout.head_dim)).astype(np.float32)


def _flip(path: Path, offset: int, mask: int = 0x01) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))


def _backends() -> list[str]:
    out = ["fast", "zarr"]
    try:
        import tensorstore  # noqa: F401

        out.append("tensorstore")
    except ImportError:
        pass
    return out


# ------------------------------------------------------------------------------------ verified reads
@pytest.mark.parametrize("dtype", DTYPES)
def test_flipped_data_byte_fails_the_read_that_meets_it(tmp_path, dtype):
    a = MemoryAsset.from_array(tmp_path / "a", _table(), SPEC, LAYOUT, orders=(1, 2), dtype=dtype, chunks_per_shard=3)
    g = a.geometry
    want = a.to_numpy()
    page = 4 if dtype != "nf4" else 0  # nf4: 8 rows x 6 B = 48 B pages, all 11 in block 0 of shard 0
    s, i = g.shard_of_page(page)
    key = g.shard_key(s)
    _flip(tmp_path / "a" / key, i * g.stride + (page % g.pages_per_chunk) * g.page_bytes + 5)
    named = rf"shard '{key}' (page {page}|pages 0\.\.10 \(block 0\)) fails its crc32c check"
    for be in _backends():
        b = MemoryAsset.open(tmp_path / "a", backend=be)  # the cheap checks pass: only page bytes changed
        for ids in ([page], [page, 0, 10] if page else [0, 3], np.arange(11)):
            with pytest.raises(FormatError, match=named):
                b.read_pages(ids)
        with pytest.raises(FormatError, match=named):
            b.to_numpy()
        rows = np.arange(page * 8, page * 8 + 8)
        with pytest.raises(FormatError, match=named):
            b.read_rows(rows)
        if dtype != "nf4":  # pages in other shards still read, and read right
            assert np.array_equal(b.read_pages([10]).reshape(-1, 8), want[80:88])
            assert np.array_equal(b.read_rows(np.array([0, 87])), want[[0, 87]])
    with pytest.raises(FormatError, match=rf"shard '{key}' checksum mismatch"):
        a.verify()


def test_flipped_crc_byte_is_caught_too(tmp_path):
    a = MemoryAsset.from_array(tmp_path / "a", _table(), SPEC, LAYOUT, orders=(1,), chunks_per_shard=4)
    g = a.geometry
    _flip(tmp_path / "a" / g.shard_key(0), 2 * g.stride - 1)  # last crc byte of chunk 1 = page 1
    with pytest.raises(FormatError, match=r"shard 'pages/c/0/0/0' page 1 fails its crc32c check"):
        MemoryAsset.open(tmp_path / "a").read_pages([1])
    assert MemoryAsset.open(tmp_path / "a").read_pages([2]).shape == (1, 8, 8)


@pytest.mark.parametrize("dtype", ["float16", "nf4"])
def test_write_pages_and_quantize_refuse_a_corrupt_shard(tmp_path, dtype):
    """A flipped byte used to survive a later write_pages/quantize, after which verify said OK."""
    t = _table()
    a = MemoryAsset.from_array(tmp_path / "a", t, SPEC, LAYOUT, orders=(1,), dtype=dtype, chunks_per_shard=6)
    g = a.geometry
    key = g.shard_key(0)
    before = {str(p.relative_to(tmp_path / "a")): p.read_bytes() for p in (tmp_path / "a").rglob("*") if p.is_file()}
    _flip(tmp_path / "a" / key, 7)  # page 0's bytes
    with pytest.raises(FormatError, match=rf"shard '{key}' (page 0|pages 0\.\.\d+ \(block 0\)) fails its crc32c"):
        a.write_pages([1], np.ones((1, 8, 8), np.float32))  # another page of the same shard
    with pytest.raises(FormatError, match=rf"shard '{key}'"):
        a.quantize(tmp_path / "q", to="float32")
    assert not (tmp_path / "q").exists()
    with pytest.raises(FormatError, match=rf"shard '{key}' checksum mismatch"):
        MemoryAsset.open(tmp_path / "a").verify()  # still reported: nothing re-checksummed the damage
    if g.num_shards > 1:  # pages in another shard can still be written; the damaged shard is left as it was
        a.write_pages([8], np.ones((1, 8, 8), np.float32))
        with pytest.raises(FormatError, match=rf"shard '{key}' checksum mismatch"):
            MemoryAsset.open(tmp_path / "a").verify()
    _flip(tmp_path / "a" / key, 7)  # undo: the asset is sound again, with page 8 written
    assert MemoryAsset.open(tmp_path / "a").problems() == []
    assert before[key] == (tmp_path / "a" / key).read_bytes()


def test_write_pages_refuses_a_shard_changed_without_crc(tmp_path):
    """A shard rewritten with valid crc32cs but different bytes (e.g. another asset's shard copied in) is
    caught by its shard id (asset-format.md §13) and, with this asset's footer pasted in, by its sha256 before
    write_pages builds on it."""
    a = MemoryAsset.from_array(tmp_path / "a", _table(seed=0), SPEC, LAYOUT, orders=(1,), chunks_per_shard=4)
    MemoryAsset.from_array(tmp_path / "b", _table(seed=1), SPEC, LAYOUT, orders=(1,), chunks_per_shard=4)
    g = a.geometry
    key = g.shard_key(1)
    own = (tmp_path / "a" / key).read_bytes()
    other = (tmp_path / "b" / key).read_bytes()
    (tmp_path / "a" / key).write_bytes(other)
    with pytest.raises(FormatError, match=rf"shard '{key}' is from another write of the asset"):
        a.write_pages([5], np.zeros((1, 8, 8), np.float32))
    n = g.chunks_in_shard(1) * g.stride
    (tmp_path / "a" / key).write_bytes(other[:n] + own[n:])
    with pytest.raises(FormatError, match=rf"shard '{key}' checksum mismatch .* will not build on it"):
        a.write_pages([5], np.zeros((1, 8, 8), np.float32))


# ------------------------------------------------------------------------------------ bounded header
def _rewrite_header(path: Path, fn) -> None:
    """Edit attributes.polymem and re-seal its attributes checksum (what a crafted file would do)."""
    from polymem.asset._format import canonical_json, sha256_hex

    doc = json.loads((path / "zarr.json").read_text())
    h = doc["attributes"]["polymem"]
    fn(h)
    body = {k: v for k, v in h.items() if k != "checksums"}
    h["checksums"]["attributes"] = sha256_hex(canonical_json(body))
    (path / "zarr.json").write_text(json.dumps(doc))


def test_huge_chunks_per_shard_is_refused_before_allocating(tmp_path):
    layout = Layout(pages=1 << 31, heads=1, slots=1, head_dim=2)  # 8-byte float32 pages
    path = tmp_path / "a"
    MemoryAsset.create(tmp_path / "small", SPEC, Layout(pages=4, heads=1, slots=1, head_dim=2))
    (tmp_path / "small").rename(path)

    def craft(h):
        h["layout"].update(pages=layout.pages)
        h["storage"].update(shape=[layout.pages, 1, 2], chunks_per_shard=layout.pages, num_shards=1)

    _rewrite_header(path, craft)
    meta = json.loads((path / "pages/zarr.json").read_text())
    meta["shape"] = [layout.pages, 1, 2]
    (path / "pages/zarr.json").write_text(json.dumps(meta))
    with open(path / "pages/c/0/0/0", "r+b") as f:  # a sparse shard of the size the crafted header implies
        f.truncate(layout.pages * 12 + 16 * layout.pages + 4)
    import tracemalloc

    tracemalloc.start()
    with pytest.raises(FormatError, match=r"chunks_per_shard 2,147,483,648 exceeds the format's bound 4,194,304"):
        MemoryAsset.open(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 16 << 20, peak


def test_too_many_shards_and_oversized_metadata_are_refused(tmp_path):
    path = tmp_path / "a"
    MemoryAsset.create(path, SPEC, Layout(pages=4, heads=1, slots=1, head_dim=2))

    def craft(h):
        h["layout"].update(pages=1 << 31)
        h["storage"].update(shape=[1 << 31, 1, 2], chunks_per_shard=1, num_shards=1 << 31)

    _rewrite_header(path, craft)
    with pytest.raises(FormatError, match=r"need 2,147,483,648 shards, more than the format's bound 1,048,576"):
        MemoryAsset.open(path)
    with open(path / "zarr.json", "r+b") as f:
        f.truncate(1 << 30)  # sparse 1 GiB zarr.json
    with pytest.raises(FormatError, match=r"'zarr.json' is 1,073,741,824 bytes; asset metadata is at most"):
        MemoryAsset.open(path)


# ------------------------------------------------------------------------------------ no SIGBUS
_TRUNCATE_UNDER_READER = textwrap.dedent(
    """
    import os, sys, numpy as np
    from polymem import MemoryAsset, FormatError
    a = MemoryAsset.open(sys.argv[1])
    first = a.read_pages([0, 300, 700]).copy()           # the shards are open (mapped, where maps are used)
    assert any(a._reader._maps) == (os.environ.get("POLYMEM_NO_MMAP") != "1" and os.environ.get("GUARD") == "1")
    key = a.geometry.shard_key(0)
    mode = sys.argv[2]
    if mode == "truncate":                                # in place: the inode the reader holds shrinks
        os.truncate(os.path.join(sys.argv[1], key), 100)
    else:                                                 # rewritten in place with other bytes
        with open(os.path.join(sys.argv[1], key), "r+b") as f:
            f.seek(8192 * 5 + 100); f.write(b"xxxx")
    out = []
    for ids in ([5], [5, 6, 7], list(range(0, 256)), [300]):
        try:
            a.read_pages(ids)
            out.append("ok")
        except FormatError as e:
            out.append("FormatError: " + str(e))
    try:
        a.read_rows(np.arange(5 * 32, 6 * 32))
        out.append("ok")
    except FormatError as e:
        out.append("FormatError: " + str(e))
    print("\\n".join(out))
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("reader", ["map", "pread"])
@pytest.mark.parametrize("mode", ["truncate", "rewrite"])
def test_shard_changed_under_an_open_reader_is_an_error_not_a_signal(tmp_path, mode, reader):
    """Readers used to memory-map shards and die with SIGBUS when one was truncated. Today's readers
    map shards again (from the first read here), under the SIGBUS guard, or read with pread: both survive."""
    from polymem.asset import _sigbus

    layout = Layout(pages=1024, heads=8, slots=4, head_dim=64)  # float32 8 KiB pages, 256 per shard
    MemoryAsset.from_array(tmp_path / "a", _table(layout), SPEC, layout, orders=(1,), chunks_per_shard=256)
    env = {**os.environ, "POLYMEM_MAP_AFTER": "0", "GUARD": "1" if _sigbus.available() else "0"}
    env.update({"POLYMEM_NO_MMAP": "1"} if reader == "pread" else {})
    env.pop("POLYMEM_NO_MMAP", None) if reader == "map" else None
    r = subprocess.run([sys.executable, "-c", _TRUNCATE_UNDER_READER, str(tmp_path / "a"), mode],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])  # -7 = SIGBUS before
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 5
    what = "is truncated" if mode == "truncate" else "page 5 fails its crc32c check"
    for line in lines[:3] + lines[4:]:
        assert line.startswith("FormatError") and "pages/c/0/0/0" in line and what in line, line
    assert lines[3] == "ok"  # page 300 lives in shard 1, untouched


def test_shard_replaced_by_rename_under_a_reader_gives_old_bytes(tmp_path):
    a = MemoryAsset.from_array(tmp_path / "a", _table(seed=0), SPEC, LAYOUT, orders=(1,), chunks_per_shard=4)
    old = a.read_pages(np.arange(11))
    b = MemoryAsset.open(tmp_path / "a")
    b.read_pages([0])  # opens shard 0
    a.write_pages([0, 1], np.full((2, 8, 8), 3.0, np.float32))
    assert np.array_equal(b.read_pages([0, 1]), old[[0, 1]])  # the old, consistent bytes
    assert (MemoryAsset.open(tmp_path / "a").read_pages([0, 1]) == 3.0).all()


# ------------------------------------------------------------------------------------ writers locked
_WRITER = textwrap.dedent(
    """
    import sys, numpy as np
    from polymem import MemoryAsset
    a = MemoryAsset.open(sys.argv[1])
    pages = [int(x) for x in sys.argv[2].split(",")]
    value = float(sys.argv[3])
    print("ready", flush=True)
    sys.stdin.readline()
    for k in range(int(sys.argv[4])):
        a.write_pages(pages, np.full((len(pages), a.layout.rows_per_page, a.layout.head_dim), value + k, np.float32))
    print("done", flush=True)
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("pages_a, pages_b", [("0,1", "40,41"), ("0,1", "1,2")])
def test_two_writer_processes_never_lose_a_write(tmp_path, pages_a, pages_b):
    """Concurrent writers used to leave checksums that did not match shards, and lose writes."""
    layout = Layout(pages=64, heads=4, slots=2, head_dim=8)
    path = tmp_path / "a"
    MemoryAsset.create(path, SPEC, layout, chunks_per_shard=16)
    rounds = 8
    procs = []
    for pages, value in ((pages_a, 100.0), (pages_b, 200.0)):
        p = subprocess.Popen([sys.executable, "-c", _WRITER, str(path), pages, str(value), str(rounds)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "ready"
        procs.append(p)
    for p in procs:  # release both at once
        p.stdin.write("go\n")
        p.stdin.flush()
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0 and out.strip() == "done", err[-2000:]
    a = MemoryAsset.open(path)
    assert a.problems() == []
    got = a.read_pages(np.arange(64))[:, 0, 0]
    a_ids = [int(x) for x in pages_a.split(",")]
    b_ids = [int(x) for x in pages_b.split(",")]
    last_a, last_b = 100.0 + rounds - 1, 200.0 + rounds - 1
    for p in set(a_ids) - set(b_ids):
        assert got[p] == last_a
    for p in set(b_ids) - set(a_ids):
        assert got[p] == last_b
    for p in set(a_ids) & set(b_ids):
        assert got[p] in (last_a, last_b)  # whichever writer committed last
    others = sorted(set(range(64)) - set(a_ids) - set(b_ids))
    assert not got[others].any()
    assert not list(path.glob(".polymem-writing*")) and not list((path / "pages").rglob("*.new"))


def test_second_writer_waits_then_gets_a_clear_error(tmp_path):
    path = tmp_path / "a"
    a = MemoryAsset.create(path, SPEC, LAYOUT, chunks_per_shard=4)
    fd = os.open(path / ".polymem-lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another writer (flock locks are per open file, so this conflicts)
        os.write(fd, b"pid 12345")
        before = (path / "zarr.json").read_bytes()
        with pytest.raises(PolymemError, match=r"another writer holds the asset lock \(pid 12345\); waited 0.2 s"):
            a.write_pages([0], np.ones((1, 8, 8), np.float32), lock_timeout=0.2)
        assert (path / "zarr.json").read_bytes() == before  # the failed write has not landed
        with pytest.raises(PolymemError, match="another writer holds the asset lock"):
            MemoryAsset.from_array(path, _table(), SPEC, LAYOUT, orders=(1,), overwrite=True, lock_timeout=0)
    finally:
        os.close(fd)
    a.write_pages([0], np.ones((1, 8, 8), np.float32), lock_timeout=0)
    assert (MemoryAsset.open(path).read_pages([0]) == 1).all()


def test_writer_that_waited_on_a_replaced_asset_says_so(tmp_path):
    path = tmp_path / "a"
    a = MemoryAsset.create(path, SPEC, LAYOUT, chunks_per_shard=4)
    MemoryAsset.from_array(path, _table(), SPEC, LAYOUT, orders=(1,), overwrite=True)  # replaced underneath
    with pytest.raises(PolymemError, match="asset was re-created|replaced"):
        a.write_pages([0], np.ones((1, 8, 8), np.float32))
    assert np.array_equal(MemoryAsset.open(path).to_numpy(), _table())


# ------------------------------------------------------------------------------ repair
def test_repair_rolls_back_an_interrupted_swap_and_removes_stale_files(tmp_path):
    from polymem.asset import _commit

    path = tmp_path / "a"
    a = MemoryAsset.from_array(path, _table(), SPEC, LAYOUT, orders=(1,), chunks_per_shard=4)
    old = {str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file()}
    g = a.geometry
    # a writer killed after swapping one of two shards: marker, one .old, one .new, the old zarr.json
    k0, k1 = g.shard_key(0), g.shard_key(1)
    for k in (k0, k1):
        (path / (k + ".new")).write_bytes(b"new bytes")
    _commit.write_marker(path, [k0, k1], "0" * 64)
    os.link(path / k0, path / (k0 + ".old"))
    os.replace(path / (k0 + ".new"), path / k0)
    (path / ".zarr.json.tmp").write_bytes(b"{")
    (path.parent / f".{path.name}.tmp-abc").mkdir()
    with pytest.raises(FormatError, match="interrupted"):
        MemoryAsset.open(path)
    done = MemoryAsset.repair(path)
    assert done[0] == "rolled back an interrupted page write (1 of 2 shard(s) restored)"
    assert any(".zarr.json.tmp" in d for d in done) and any(".a.tmp-abc" in d for d in done)
    now = {str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file()}
    now.pop(".polymem-lock", None)
    assert now == old  # exactly the old committed bytes
    assert MemoryAsset.open(path).problems() == [] and MemoryAsset.repair(path) == []


def test_repair_finishes_a_write_killed_after_its_commit_point(tmp_path):
    from polymem.asset import _commit

    path = tmp_path / "a"
    a = MemoryAsset.from_array(path, _table(), SPEC, LAYOUT, orders=(1,), chunks_per_shard=4)
    new = np.full((1, 8, 8), 7.0, np.float32)
    a.write_pages([0], new)
    committed = (path / "zarr.json").read_bytes()
    key = a.geometry.shard_key(0)
    os.link(path / key, path / (key + ".old"))  # what a writer killed between steps 3 and 4 leaves
    _commit.write_marker(path, [key], hashlib.sha256(committed).hexdigest())
    assert MemoryAsset.repair(path) == ["finished an interrupted page write that had committed (1 shard(s))"]
    b = MemoryAsset.open(path)
    assert b.problems() == [] and (b.read_pages([0]) == 7.0).all()


def test_repair_restores_an_asset_left_aside_by_an_interrupted_overwrite(tmp_path):
    path = tmp_path / "a"
    MemoryAsset.from_array(path, _table(), SPEC, LAYOUT, orders=(1,))
    aside = tmp_path / ".a.old-xyz"
    aside.mkdir()
    os.replace(path, aside / "asset")
    with pytest.raises(FormatError, match="no asset directory"):
        MemoryAsset.open(path)
    done = MemoryAsset.repair(path)
    assert done == ["restored 'a' from '.a.old-xyz' (an overwrite was interrupted between its renames)"]
    assert np.array_equal(MemoryAsset.open(path).to_numpy(), _table()) and not aside.exists()
    with pytest.raises(PolymemError, match="no asset directory here, and nothing left aside"):
        MemoryAsset.repair(tmp_path / "nothing")


def test_page_service_reads_are_verified_too(tmp_path):
    """The page service (polymem.serve) preads stored chunks itself: it checks their crc32c."""
    from polymem.serve.reader import ChunkReader

    a = MemoryAsset.from_array(tmp_path / "a", _table(), SPEC, LAYOUT, orders=(1,), dtype="float16", chunks_per_shard=4)
    g = a.geometry
    r = ChunkReader(a)
    good = r.read([0, 5, 10])
    assert [c.nbytes for c in good] == [g.chunk_bytes] * 3
    assert good[1].tobytes() == a.read_stored([5]).tobytes()
    _flip(tmp_path / "a" / g.shard_key(1), g.stride + 9)  # page 5
    r.close()
    with pytest.raises(FormatError, match=r"shard 'pages/c/1/0/0' page 5 fails its crc32c check"):
        ChunkReader(a).read([4, 5])
