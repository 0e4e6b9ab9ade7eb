"""Verified reads on the fast path: the SIGBUS-guarded shard maps and the pread path give the same bytes,
both check every read (bytes changed in place after a first read are caught on the next one), the fused
``read_rows`` kernel equals page-by-page reads, and the crc32c residue check rejects any flipped bit."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import google_crc32c
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polymem import FormatError, HashSpec, Layout, MemoryAsset
from polymem.asset import _reader, _shards, _sigbus

SPEC = HashSpec()
DTYPES = ["float32", "float16", "bfloat16", "nf4"]
LAYOUT = Layout(pages=40, heads=4, slots=2, head_dim=8)  # 8 rows x 8 per page
MAPS = _sigbus.available()


def _table(layout: Layout = LAYOUT, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((layout.num_rows, layout.head_dim)).astype(np.float32)


@pytest.fixture(params=["map", "pread"])
def mode(request, monkeypatch):
    """Readers opened under this fixture use guarded maps from the first read ("map") or pread only ("pread")."""
    if request.param == "map":
        if not MAPS:
            pytest.skip("no SIGBUS guard on this platform: readers use pread only")
        monkeypatch.setattr(_reader, "MAP_AFTER", 0)
        monkeypatch.delenv("POLYMEM_NO_MMAP", raising=False)
    else:
        monkeypatch.setenv("POLYMEM_NO_MMAP", "1")
    return request.param


def _uses_maps(a: MemoryAsset) -> bool:
    return any(isinstance(m, _sigbus.GuardedMap) for m in a._reader._maps)


def _patch(path: Path, offset: int, mask: int = 0x01) -> None:
    """Flip bits of one byte in place (same inode, same size: what a reader's map sees at once)."""
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([b ^ mask]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_bytes_changed_in_place_after_a_read_fail_the_next_read(tmp_path, mode, dtype):
    """No verified-once cache: a reader that already read (and mapped) a page sees a later in-place change."""
    a = MemoryAsset.from_array(tmp_path / "a", _table(), SPEC, LAYOUT, orders=(1,), dtype=dtype, chunks_per_shard=8)
    g = a.geometry
    b = MemoryAsset.open(tmp_path / "a")
    want = b.to_numpy()
    page = 13 if dtype != "nf4" else 0
    s, i = g.shard_of_page(page)
    key = g.shard_key(s)
    rows = np.arange(page * 8, page * 8 + 8)
    np.testing.assert_array_equal(b.read_pages([page]).reshape(-1, 8), want[rows])  # read once: fine
    assert _uses_maps(b) == (mode == "map")
    named = rf"shard '{key}' (page {page}|pages 0\.\.39 \(block 0\)) fails its crc32c check"
    for where in (i * g.stride + (page % g.pages_per_chunk) * g.page_bytes + 3,  # a data byte
                  i * g.stride + g.chunk_bytes + 2):  # a byte of the stored crc32c
        _patch(tmp_path / "a" / key, where)
        for read in (lambda: b.read_stored([page]), lambda: b.read_pages([page]),
                     lambda: b.read_pages([page, 0, 39]), lambda: b.read_pages(np.arange(40)),
                     lambda: b.read_rows(rows), lambda: b.read_rows(np.concatenate([rows, rows[::-1], [0, 1]]))):
            with pytest.raises(FormatError, match=named):
                read()
        _patch(tmp_path / "a" / key, where)  # changed back: the same reader reads it right again
        np.testing.assert_array_equal(b.read_pages([page]).reshape(-1, 8), want[rows])
        np.testing.assert_array_equal(b.read_rows(rows), want[rows])


@pytest.mark.parametrize("dtype", DTYPES)
def test_map_and_pread_readers_return_the_same_pages_and_rows(tmp_path, monkeypatch, dtype):
    if not MAPS:
        pytest.skip("no SIGBUS guard on this platform")
    a = MemoryAsset.from_array(tmp_path / "a", _table(), SPEC, LAYOUT, orders=(1,), dtype=dtype, chunks_per_shard=8)
    del a
    monkeypatch.setattr(_reader, "MAP_AFTER", 0)
    mapped = MemoryAsset.open(tmp_path / "a")
    monkeypatch.setenv("POLYMEM_NO_MMAP", "1")
    plain = MemoryAsset.open(tmp_path / "a")
    rows = np.random.default_rng(1).integers(0, LAYOUT.num_rows, size=300)
    for p in range(LAYOUT.pages):  # the lean single-page path
        np.testing.assert_array_equal(mapped.read_stored([p]), plain.read_stored([p]))
    np.testing.assert_array_equal(mapped.read_stored(np.arange(40)), plain.read_stored(np.arange(40)))
    np.testing.assert_array_equal(mapped.read_rows(rows), plain.read_rows(rows))
    assert _uses_maps(mapped) and not _uses_maps(plain)
    out = mapped.read_stored([3])
    out[...] = 0  # results are the caller's own, writable arrays (never views of a map)
    np.testing.assert_array_equal(mapped.read_stored([3]), plain.read_stored([3]))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_read_rows_kernel_equals_page_by_page_reads(tmp_path_factory, data):
    dtype = data.draw(st.sampled_from(DTYPES))
    root = tmp_path_factory.getbasetemp() / f"rows-{dtype}"
    if not root.exists():
        MemoryAsset.from_array(root, _table(), SPEC, LAYOUT, orders=(1,), dtype=dtype, chunks_per_shard=8)
    a = MemoryAsset.open(root)
    r = a._reader
    n = data.draw(st.integers(3, 200))
    rows = np.array(data.draw(st.lists(st.integers(0, LAYOUT.num_rows - 1), min_size=n, max_size=n)), np.int64)
    if data.draw(st.booleans()):  # runs of rows in one page, as lookups give
        rows = np.repeat(rows // 8 * 8, 8) + np.tile(np.arange(8), n)
    np.testing.assert_array_equal(r.read_rows(rows), r._read_rows_by_page(rows))
    np.testing.assert_array_equal(a.read_rows(rows), a.to_numpy()[rows])


def test_adjacent_and_repeated_chunks_in_a_batch_equal_single_reads(tmp_path, mode):
    a = MemoryAsset.from_array(tmp_path / "a", _table(), SPEC, LAYOUT, orders=(1,), dtype="float16",
                               chunks_per_shard=8)
    ids = np.array([5, 6, 7, 8, 9, 9, 0, 39, 38, 5], np.int64)  # runs across a shard boundary, repeats
    one = np.concatenate([a.read_stored([int(p)]) for p in ids])
    np.testing.assert_array_equal(a.read_stored(ids), one)


@given(st.binary(min_size=0, max_size=5000), st.data())
@settings(max_examples=200, deadline=None)
def test_crc_residue_accepts_only_untouched_chunks(x, data):
    """crc32c(x ‖ crc32c(x) little-endian) is one constant for every x; any flipped bit in x or in the stored
    crc moves it (crc32c detects every 1-bit error), so one call over the stored chunk checks it."""
    stored = bytearray(x + google_crc32c.value(x).to_bytes(4, "little"))
    assert _shards.crc32c(bytes(stored)) == _shards.CRC_RESIDUE
    bit = data.draw(st.integers(0, 8 * len(stored) - 1))
    stored[bit // 8] ^= 1 << (bit % 8)
    assert _shards.crc32c(bytes(stored)) != _shards.CRC_RESIDUE


@given(st.binary(min_size=0, max_size=9000))
@settings(max_examples=200, deadline=None)
def test_buffer_crc_agrees_with_google_crc32c(x):
    """The optional crc32c-rs (any buffer, SIMD) gives google-crc32c's value on every input it is used for."""
    if _shards._crc_buffer is None:
        pytest.skip("crc32c-rs not installed: the lean path uses google-crc32c only")
    want = google_crc32c.value(x)
    assert _shards._crc_buffer(x) == want
    assert _shards._crc_buffer(bytearray(x)) == want
    assert _shards._crc_buffer(memoryview(np.frombuffer(x, np.uint8))) == want


def test_invalidate_releases_the_maps_and_their_guard_slots(tmp_path, mode):
    a = MemoryAsset.from_array(tmp_path / "a", _table(), SPEC, LAYOUT, orders=(1,), chunks_per_shard=8)
    a.read_stored(np.arange(40))
    if mode == "pread":
        assert not _uses_maps(a)
        return
    g = _sigbus.guard()
    slots = [m.slot for m in a._reader._maps if m]
    assert len(slots) == a.geometry.num_shards and all(int(g.reg[2 + 3 * k]) != 0 for k in slots)
    a.close()
    assert not _uses_maps(a) and all(int(g.reg[2 + 3 * k]) == 0 for k in slots)
    assert a.read_stored([7]).shape == (1, 8, 8)  # reopens after close, as before


_FOREIGN_SIGBUS = textwrap.dedent(
    """
    import mmap, os, sys, numpy as np
    from polymem import MemoryAsset
    from polymem.asset import _reader
    _reader.MAP_AFTER = 0
    a = MemoryAsset.open(sys.argv[1])
    a.read_stored(np.arange(4))                           # the SIGBUS guard is installed, shard 0 mapped
    assert any(a._reader._maps)
    path = sys.argv[2]
    with open(path, "wb") as f:
        f.write(b"x" * 65536)
    fd = os.open(path, os.O_RDONLY)
    mm = mmap.mmap(fd, 65536, access=mmap.ACCESS_READ)   # not polymem's map
    os.truncate(path, 10)
    print("before", flush=True)
    print(mm[60000:60001], flush=True)                    # SIGBUS here, as without polymem
    print("survived", flush=True)
    """
)


@pytest.mark.skipif(not MAPS, reason="no SIGBUS guard on this platform")
def test_a_sigbus_outside_polymem_maps_still_kills_as_before(tmp_path):
    MemoryAsset.from_array(tmp_path / "a", _table(), SPEC, LAYOUT, orders=(1,), chunks_per_shard=8)
    r = subprocess.run([sys.executable, "-c", _FOREIGN_SIGBUS, str(tmp_path / "a"), str(tmp_path / "other")],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONFAULTHANDLER": ""})
    assert r.returncode == -7 and r.stdout.split() == ["before"], (r.returncode, r.stdout, r.stderr[-2000:])


def test_concurrent_readers_and_invalidations_read_right(tmp_path, mode):
    """Maps are dropped (invalidate) while other threads read through them: every read still returns the right
    verified bytes — a reader keeps the map it is using mapped until it lets go."""
    import threading

    a = MemoryAsset.from_array(tmp_path / "a", _table(), SPEC, LAYOUT, orders=(1,), chunks_per_shard=8)
    want = a.read_stored(np.arange(40))
    rows_all = a.to_numpy()
    stop, errors = threading.Event(), []

    def reader(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            while not stop.is_set():
                p = int(rng.integers(0, 40))
                ids = rng.integers(0, 40, size=int(rng.integers(3, 30)))
                rows = rng.integers(0, LAYOUT.num_rows, size=24)
                assert np.array_equal(a.read_stored([p])[0], want[p])
                assert np.array_equal(a.read_stored(ids), want[ids])
                assert np.array_equal(a.read_rows(rows), rows_all[rows])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for _ in range(200):
        a._reader.invalidate()
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors[:3]


@pytest.mark.parametrize("chunk_bytes", [48 * 8, 4096, 8192, 4 * 8 * 64 * 4, 1 << 20])
def test_a_chunk_read_as_zeros_never_passes_its_check(chunk_bytes):
    """The SIGBUS guard turns a vanished page into zeros; zeros ‖ zero crc pass the residue check only if
    crc32c(zeros) were 0, which it is for no length up to the format's 1 GiB bound (scanned once by hand)."""
    assert _shards.crc32c(bytes(chunk_bytes + 4)) != _shards.CRC_RESIDUE
    assert google_crc32c.value(bytes(chunk_bytes)) != 0
