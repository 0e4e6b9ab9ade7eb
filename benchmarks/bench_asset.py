"""Benchmark: asset page reads (fast path vs os.pread vs zarr-python vs tensorstore), shard writes, NF4.

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
        _zarr.create_array_metadata(ref, g)
        t0 = time.perf_counter()
        _zarr.write_with_zarr(ref, g, stored)
        t_zarr = time.perf_counter() - t0
        same = all((ref / g.shard_key(s)).read_bytes() == (scratch / "t" / g.shard_key(s)).read_bytes()
                   for s in range(g.num_shards))
        shutil.rmtree(ref)
        del stored
        r["write"] = {"table_mib": args.size_mib, "dtype": args.dtype, "pages": P, "shards": g.num_shards,
                      "polymem_s": t_ours, "encode_s": t_encode, "zarr_python_s": t_zarr,
                      "speedup": t_zarr / t_ours, "byte_identical": same}
        print(f"write {args.size_mib} MiB ({g.num_shards} shards): polymem {t_ours:.2f} s (of which encode "
              f"{t_encode:.2f} s), zarr-python {t_zarr:.2f} s -> {t_zarr / t_ours:.1f}x, byte-identical: {same}")
        del table

        # ------------------------------------------------------------------ reads
        shard_paths = [scratch / "t" / g.shard_key(s) for s in range(g.num_shards)]
        fds = [os.open(p, os.O_RDONLY) for p in shard_paths]
        cps, cb = g.chunks_per_shard, g.chunk_bytes
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
                os.pread(fds[p // cps], cb, (p % cps) * cb)

        def pread_one_dec():
            for p in singles:
                decode(os.pread(fds[p // cps], cb, (p % cps) * cb))

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
                    out[i] = np.frombuffer(os.pread(fds[p // cps], cb, (p % cps) * cb), np.uint8)

        def pread_batch_dec():
            for ids in batches:
                out = bytearray(1024 * cb)
                mv = memoryview(out)
                for i, p in enumerate(ids.tolist()):
                    mv[i * cb : (i + 1) * cb] = os.pread(fds[p // cps], cb, (p % cps) * cb)
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
            for name, fn in [("os.pread", lambda: [os.pread(fds[p // cps], cb, (p % cps) * cb) for p in singles[:n_cold]]),
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
