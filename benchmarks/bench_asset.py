"""Benchmark: asset page reads (fast path vs os.pread vs zarr-python vs tensorstore), shard writes, NF4, and
the cost of verifying every page read (format v2's per-page crc32c; SIGBUS-guarded maps, or pread) side by side
with the previous fast path (format v1, memory-mapped shards, no per-read check — its reader is copied below).

    python benchmarks/bench_asset.py --size-mib 1024 --json docs/benchmarks/asset.json

Reads are timed on a warm page cache (the file fits in RAM; this measures the CPU cost per read, the part a
library controls) and, with --cold, after evicting the shard files from the page cache with
posix_fadvise(DONTNEED) (only our own files; nothing global is dropped). Baselines run in the same process on
the same files. Prints a markdown table; numbers are medians of --repeat runs.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def timed(fn, repeat: int) -> float:
    """Median seconds of ``repeat`` calls of fn()."""
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def evict(paths: list[Path]) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _groups(keys: np.ndarray) -> "list[tuple[int, np.ndarray]]":
    """[(key, positions of that key)] (as in the legacy reader)."""
    if keys.shape[0] == 0:
        return []
    k0 = int(keys[0])
    if keys.shape[0] == 1 or (keys == k0).all():
        return [(k0, np.arange(keys.shape[0]))]
    order = np.argsort(keys, kind="stable")
    bounds = np.flatnonzero(np.diff(keys[order])) + 1
    return [(int(keys[grp[0]]), grp) for grp in np.split(order, bounds)]


class LegacyMmapReader:
    """The fast reader before verified reads (commit 8229a40, format v1): one mmap per shard, MADV_RANDOM, no
    per-read check. Copied verbatim (minus the shard writer) so the new reader can be timed against it."""

    def __init__(self, root: Path, geom) -> None:
        import mmap

        self._mmap = mmap
        self._root = root
        self._geom = geom
        self._views = [None] * geom.num_shards
        self._maps = [None] * geom.num_shards
        self._dtype = np.dtype(geom.data_type).newbyteorder("<")
        self._chunk_shape = geom.chunk_shape[1:]

    def _view(self, s: int) -> np.ndarray:
        v = self._views[s]
        if v is None:
            g, mmap = self._geom, self._mmap
            with open(self._root / g.shard_key(s), "rb") as f:
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            if hasattr(mmap, "MADV_RANDOM"):
                mm.madvise(mmap.MADV_RANDOM)
            n = g.chunks_in_shard(s)
            v = np.frombuffer(mm, dtype=self._dtype, count=n * g.chunk_bytes // self._dtype.itemsize)
            v = v.reshape((n,) + self._chunk_shape)
            self._maps[s], self._views[s] = mm, v
        return v

    def read_page(self, p: int) -> np.ndarray:
        g = self._geom
        c, j = divmod(p, g.pages_per_chunk)
        s, i = divmod(c, g.chunks_per_shard)
        v = self._views[s]
        if v is None:
            v = self._view(s)
        if g.pages_per_chunk == 1 and g.dtype != "nf4":
            return v[i : i + 1].copy()
        return v[i : i + 1, j * g.page_bytes : (j + 1) * g.page_bytes].copy()

    def read_chunks(self, ids: np.ndarray) -> np.ndarray:
        cps = self._geom.chunks_per_shard
        if ids.shape[0] == 1:
            c = int(ids[0])
            return self._view(c // cps)[c % cps : c % cps + 1].copy()
        if self._geom.num_shards == 1:
            return self._view(0)[ids]
        out = np.empty((ids.shape[0],) + self._chunk_shape, dtype=self._dtype)
        for s, sel in _groups(ids // cps):
            out[sel] = self._view(s)[ids[sel] - s * cps]
        return out

    def read_rows(self, rows: np.ndarray) -> np.ndarray:
        g = self._geom
        KS, cps = g.rows_per_page, g.chunks_per_shard
        out = np.empty((rows.shape[0], g.head_dim), dtype=self._dtype)
        rows_per_shard = cps * KS
        for s, sel in _groups(rows // rows_per_shard):
            v = self._view(s)
            out[sel] = v.reshape(-1, g.head_dim)[rows[sel] - s * rows_per_shard]
        return out

    def invalidate(self, shards=None) -> None:
        self._views = [None] * self._geom.num_shards
        self._maps = [None] * self._geom.num_shards

    def close(self) -> None:
        self.invalidate()


def legacy_asset(path: Path):
    """A MemoryAsset on a format-v1 directory whose reader is today's-before-issue-9 mmap reader."""
    from polymem import MemoryAsset
    from polymem.asset import _reader

    a = MemoryAsset.open(path)
    assert a.version == 1
    old = LegacyMmapReader(path, a.geometry)
    old.__class__ = type("LegacyFast", (LegacyMmapReader, _reader.FastReader), {})  # take the same code paths
    a._reader, a._lean = old, old.read_page
    return a


def verify_cost(a_new, a_old, P: int, rng, args, a_pread=None) -> dict:
    """Verified (v2: crc32c checked on every read) vs legacy (v1 mmap, unchecked) reads of the same pages,
    interleaved runs. a_new reads through SIGBUS-guarded maps (where available), a_pread (optional) through
    pread only (POLYMEM_NO_MMAP=1: the fallback path)."""
    singles = rng.integers(0, P, size=args.single).tolist()
    batches = [rng.integers(0, P, size=1024) for _ in range(args.batches)]
    hashes = rng.integers(0, 2**63, size=(1024, 3), dtype=np.uint64)

    def one(a, fn):
        return lambda: [fn(a, [p]) for p in singles]

    def batch(a, fn):
        return lambda: [fn(a, ids) for ids in batches]

    cases = {
        "single page, read_stored": (one, lambda a, i: a.read_stored(i), len(singles)),
        "single page, read_pages (float32)": (one, lambda a, i: a.read_pages(i), len(singles)),
        "1024-page batch, read_stored": (batch, lambda a, i: a.read_stored(i), len(batches) * 1024),
        "1024-page batch, read_pages (float32)": (batch, lambda a, i: a.read_pages(i), len(batches) * 1024),
        "lookup, 1024 tokens x 3 orders (24,576 rows)": (None, None, hashes.size),
    }
    arms = [a_new, a_old] + ([a_pread] if a_pread is not None else [])
    for a in arms:  # warm: open shards / map them, page cache
        a.read_stored(np.arange(P))
        assert np.array_equal(a.read_stored(batches[0]), a_old.read_stored(batches[0]))
        assert np.array_equal(a.lookup(hashes), a_old.lookup(hashes))
    out = {}
    for name, (mk, fn, n) in cases.items():
        if mk is None:
            fs = [(lambda a=a: a.lookup(hashes)) for a in arms]
            reps = args.repeat * 5
        else:
            fs = [mk(a, fn) for a in arms]
            reps = args.repeat
        ts = [[] for _ in arms]
        for rep in range(reps):  # interleaved, so load changes hit every arm; the order rotates every round
            for k in range(len(arms)):
                j = (k + rep) % len(arms)
                ts[j].append(timed(fs[j], 1))
        med = [statistics.median(t) for t in ts]
        out[name] = {"units": n, "legacy_us": med[1] / n * 1e6, "verified_us": med[0] / n * 1e6,
                     "ratio_of_rates": med[1] / med[0]}
        if a_pread is not None:
            out[name].update(verified_pread_us=med[2] / n * 1e6, ratio_of_rates_pread=med[1] / med[2])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=1024, help="table size on disk (float16, K=8 S=4 r=64: 4 KiB pages)")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temp dir, removed at the end)")
    ap.add_argument("--single", type=int, default=20000, help="random single-page reads per run")
    ap.add_argument("--batches", type=int, default=50, help="batches of 1024 random pages per run")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cold", action="store_true", help="also time reads after evicting the files from the page cache")
    ap.add_argument("--nf4-rows", type=int, default=1_000_000)
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--verify-only", action="store_true", help="only the verified-vs-legacy read comparison")
    ap.add_argument("--no-pread-arm", action="store_true",
                    help="verified-vs-legacy: leave out the third arm (verified reads by pread only, POLYMEM_NO_MMAP=1)")
    args = ap.parse_args()

    import zarr

    from polymem import HashSpec, Layout, MemoryAsset
    from polymem.asset import nf4
    from polymem.asset import _codec, _zarr

    r = {"machine": {"python": platform.python_version(), "numpy": np.__version__, "zarr": zarr.__version__,
                     "cpu_count": os.cpu_count(), "platform": platform.platform()}}
    try:
        import tensorstore as ts
    except ImportError:
        ts = None
    scratch = Path(args.dir or tempfile.mkdtemp(prefix="polymem-bench-"))
    scratch.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    try:
        # ------------------------------------------------------------------ write: our shards vs zarr-python
        itemsize = {"float32": 4, "float16": 2, "bfloat16": 2}[args.dtype]
        page_bytes = 8 * 4 * 64 * itemsize
        P = (args.size_mib << 20) // page_bytes
        layout = Layout(pages=P, heads=8, slots=4, head_dim=64)
        table = rng.standard_normal((layout.num_rows, 64), dtype=np.float32)
        t0 = time.perf_counter()
        a = MemoryAsset.from_array(scratch / "t", table, HashSpec(), layout, orders=(1, 2, 3), dtype=args.dtype)
        t_ours = time.perf_counter() - t0
        g = a.geometry
        stored = _codec.encode_pages(table.reshape(P, 32, 64), g)
        t0 = time.perf_counter()
        _codec.encode_pages(table.reshape(P, 32, 64), g)
        t_encode = time.perf_counter() - t0
        ref = scratch / "zref"
        if args.verify_only:  # skip the (slow) zarr-python write
            ref.mkdir()
        _zarr.create_array_metadata(ref, g)
        t0 = time.perf_counter()
        if not args.verify_only:
            _zarr.write_with_zarr(ref, g, stored)
        t_zarr = time.perf_counter() - t0
        same = not args.verify_only and all(
            (ref / g.shard_key(s)).read_bytes() == (scratch / "t" / g.shard_key(s)).read_bytes()
            for s in range(g.num_shards))
        shutil.rmtree(ref)
        del stored
        r["write"] = {"table_mib": args.size_mib, "dtype": args.dtype, "pages": P, "shards": g.num_shards,
                      "polymem_s": t_ours, "encode_s": t_encode, "zarr_python_s": t_zarr,
                      "speedup": t_zarr / t_ours, "byte_identical": same}
        zarr_part = ("zarr-python write skipped (--verify-only)" if args.verify_only else
                     f"zarr-python {t_zarr:.2f} s -> {t_zarr / t_ours:.1f}x, byte-identical: {same}")
        print(f"write {args.size_mib} MiB ({g.num_shards} shards): polymem {t_ours:.2f} s (of which encode "
              f"{t_encode:.2f} s), {zarr_part}")
        # ------------------------------------------------------------------ verified reads vs the legacy fast path
        MemoryAsset._write_new(scratch / "v1", HashSpec(), layout, lambda a_, b_: table.reshape(P, 32, 64)[a_:b_],
                               dtype=args.dtype, orders=(1, 2, 3), provenance=None, overwrite=False,
                               chunks_per_shard=None, format_version=1)
        del table
        from polymem.asset import _shards, _sigbus

        a_new = MemoryAsset.open(scratch / "t")
        a_pread = None
        if not args.no_pread_arm:
            os.environ["POLYMEM_NO_MMAP"] = "1"
            a_pread = MemoryAsset.open(scratch / "t")
            del os.environ["POLYMEM_NO_MMAP"]
        vc = verify_cost(a_new, legacy_asset(scratch / "v1"), P, rng, args, a_pread)
        r["verify_cost"] = vc
        r["verify_reader"] = {"guarded_maps": _sigbus.available() and any(a_new._reader._maps),
                              "crc_single_page": "crc32c-rs" if _shards._crc_buffer is not None else "google-crc32c",
                              "crc_kernels": "google-crc32c (libcrc32c via ctypes)"}
        print(f"\nverified reads (format v2: crc32c checked on every read; {r['verify_reader']}) vs the legacy "
              "fast path (v1: mmap, unchecked)")
        for name, v in vc.items():
            pr = (f"  | pread-only {v['verified_pread_us']:7.2f} us  ratio {v['ratio_of_rates_pread']:.2f}"
                  if a_pread is not None else "")
            print(f"  {name:46s} legacy {v['legacy_us']:7.2f} us  verified {v['verified_us']:7.2f} us  "
                  f"ratio {v['ratio_of_rates']:.2f}{pr}")
        shutil.rmtree(scratch / "v1")
        if args.verify_only:
            if args.json:
                from polymem._io import atomic_write_json

                atomic_write_json(args.json, r)
            return

        # ------------------------------------------------------------------ reads
        shard_paths = [scratch / "t" / g.shard_key(s) for s in range(g.num_shards)]
        fds = [os.open(p, os.O_RDONLY) for p in shard_paths]
        cps, cb, st = g.chunks_per_shard, g.chunk_bytes, g.stride
        zarr_arr = zarr.open_array(str(scratch / "t" / "pages"), mode="r")
        ts_arr = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(scratch / "t" / "pages")}},
                         read=True).result() if ts else None
        fast = MemoryAsset.open(scratch / "t")
        singles = rng.integers(0, P, size=args.single).tolist()
        batches = [rng.integers(0, P, size=1024) for _ in range(args.batches)]

        ftype = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}[args.dtype]

        def decode(buf):  # what a pread user must do to get float32 pages (same decoder as polymem)
            return _codec.decode_chunks(np.frombuffer(buf, ftype).reshape(-1, 32, 64), g)

        def pread_one():
            for p in singles:
                os.pread(fds[p // cps], cb, (p % cps) * st)

        def pread_one_dec():
            for p in singles:
                decode(os.pread(fds[p // cps], cb, (p % cps) * st))

        def fast_one():
            for p in singles:
                fast.read_stored([p])

        def fast_one_dec():
            for p in singles:
                fast.read_pages([p])

        n_slow = max(200, args.single // 50)

        def zarr_one():
            for p in singles[:n_slow]:
                zarr_arr[p]

        def ts_one():
            for p in singles[:n_slow]:
                ts_arr[p].read().result()

        def pread_batch():
            for ids in batches:
                out = np.empty((1024, cb), np.uint8)
                for i, p in enumerate(ids.tolist()):
                    out[i] = np.frombuffer(os.pread(fds[p // cps], cb, (p % cps) * st), np.uint8)

        def pread_batch_dec():
            for ids in batches:
                out = bytearray(1024 * cb)
                mv = memoryview(out)
                for i, p in enumerate(ids.tolist()):
                    mv[i * cb : (i + 1) * cb] = os.pread(fds[p // cps], cb, (p % cps) * st)
                decode(out)

        def fast_batch():
            for ids in batches:
                fast.read_stored(ids)

        def fast_batch_dec():
            for ids in batches:
                fast.read_pages(ids)

        nb_slow = max(2, args.batches // 10)

        def zarr_batch():
            for ids in batches[:nb_slow]:
                zarr_arr.oindex[ids]

        def ts_batch():
            for ids in batches[:nb_slow]:
                ts_arr[ids].read().result()

        fast_one()  # map the shards, warm the page cache
        pread_one()
        res = {}
        SP, SF, BP, BF = ("single page, os.pread (baseline)", "single page, polymem read_stored",
                          "1024-page batch, os.pread loop (baseline)", "1024-page batch, polymem read_stored")
        rows = [(SP, pread_one, len(singles)), (SF, fast_one, len(singles)),
                ("single page, zarr-python", zarr_one, n_slow)]
        if ts_arr is not None:
            rows.append(("single page, tensorstore", ts_one, n_slow))
        rows += [("single page, os.pread + decode to float32", pread_one_dec, len(singles)),
                 ("single page, polymem read_pages (float32)", fast_one_dec, len(singles))]
        rows += [(BP, pread_batch, len(batches) * 1024), (BF, fast_batch, len(batches) * 1024),
                 ("1024-page batch, zarr-python oindex", zarr_batch, nb_slow * 1024)]
        if ts_arr is not None:
            rows.append(("1024-page batch, tensorstore", ts_batch, nb_slow * 1024))
        rows += [("1024-page batch, os.pread loop + decode to float32", pread_batch_dec, len(batches) * 1024),
                 ("1024-page batch, polymem read_pages (float32)", fast_batch_dec, len(batches) * 1024)]
        for name, fn, n in rows:
            s = timed(fn, args.repeat)
            res[name] = {"pages": n, "us_per_page": s / n * 1e6, "pages_per_s": n / s}
        r["reads_warm"] = res
        print(f"\nwarm page cache, {args.dtype} {cb} B pages, {P:,} pages, {g.num_shards} shards")
        for name, v in res.items():
            print(f"  {name:52s} {v['us_per_page']:9.2f} us/page  {v['pages_per_s']:12,.0f} pages/s")

        def rate(k):
            return res[k]["pages_per_s"]

        ratios = {
            "single: read_stored / pread": rate(SF) / rate(SP),
            "single: read_pages / (pread + decode)": rate("single page, polymem read_pages (float32)")
            / rate("single page, os.pread + decode to float32"),
            "single: read_stored / zarr-python": rate(SF) / rate("single page, zarr-python"),
            "batch: read_stored / pread": rate(BF) / rate(BP),
            "batch: read_pages / (pread + decode)": rate("1024-page batch, polymem read_pages (float32)")
            / rate("1024-page batch, os.pread loop + decode to float32"),
            "batch: read_stored / zarr-python": rate(BF) / rate("1024-page batch, zarr-python oindex"),
        }
        if ts_arr is not None:
            ratios["single: read_stored / tensorstore"] = rate(SF) / rate("single page, tensorstore")
            ratios["batch: read_stored / tensorstore"] = rate(BF) / rate("1024-page batch, tensorstore")
        r["ratios_warm"] = ratios
        for k, v in ratios.items():
            print(f"  {k:45s} {v:8.2f}x")

        # lookups: n-gram hashes -> [.., K, r]
        hashes = rng.integers(0, 2**63, size=(1024, 3), dtype=np.uint64)
        s = timed(lambda: fast.lookup(hashes), args.repeat * 3)
        r["lookup"] = {"ngrams": hashes.size, "s": s, "ngrams_per_s": hashes.size / s}
        print(f"  lookup of 1024x3 n-grams: {s * 1e3:.2f} ms ({hashes.size / s:,.0f} n-grams/s)")

        if args.cold:
            n_cold = min(2000, len(singles))
            cold = {}
            for name, fn in [("os.pread", lambda: [os.pread(fds[p // cps], cb, (p % cps) * st) for p in singles[:n_cold]]),
                             ("polymem read_stored (mmap, MADV_RANDOM)", lambda: [fast.read_stored([p]) for p in singles[:n_cold]])]:
                fast.close()
                evict(shard_paths)
                t0 = time.perf_counter()
                fn()
                dt = time.perf_counter() - t0
                cold[name] = {"pages": n_cold, "us_per_page": dt / n_cold * 1e6}
            r["reads_cold"] = cold
            print("cold (fadvise DONTNEED on the shard files first):")
            for name, v in cold.items():
                print(f"  {name:45s} {v['us_per_page']:9.2f} us/page")
        for fd in fds:
            os.close(fd)
        fast.close()

        # ------------------------------------------------------------------ NF4
        nrows = args.nf4_rows
        out = {}
        for dist, x in [("gaussian", rng.standard_normal((nrows, 64), dtype=np.float32)),
                        ("student-t(3)", rng.standard_t(3, size=(nrows, 64)).astype(np.float32))]:
            tq = timed(lambda: nf4.quantize(x), args.repeat)
            q = nf4.quantize(x)
            td = timed(lambda: nf4.dequantize(q, 64), args.repeat)
            e = nf4.reconstruction_error(x, nf4.dequantize(q, 64))
            out[dist] = {"rows": nrows, "quantize_rows_per_s": nrows / tq, "quantize_mib_per_s": x.nbytes / tq / 2**20,
                         "dequantize_rows_per_s": nrows / td, "rel_rms_mean": e.rel_mean, "rel_rms_max": e.rel_max,
                         "rms_mean": e.rms_mean, "rms_max": e.rms_max}
            print(f"nf4 {dist:13s}: quantize {nrows / tq:,.0f} rows/s ({x.nbytes / tq / 2**20:,.0f} MiB/s fp32 in), "
                  f"dequantize {nrows / td:,.0f} rows/s; per-row relative RMS error mean {e.rel_mean:.4f} max {e.rel_max:.4f}")
        r["nf4"] = out
    finally:
        if args.dir is None:
            shutil.rmtree(scratch, ignore_errors=True)
    if args.json:
        from polymem._io import atomic_write_json

        atomic_write_json(args.json, r)


if __name__ == "__main__":
    main()
