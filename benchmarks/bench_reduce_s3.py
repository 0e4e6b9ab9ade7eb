"""Benchmark: the occurrence pass's reduce over an ``s3://`` scratch (a moto S3 server on 127.0.0.1).

    python benchmarks/bench_reduce_s3.py ../shared/corpus/pydocs.jsonl.gz --partition-mb 1 --repeat 1

One process, `polymem.coverage(..., scratch="s3://…")`: every partition writes its key files to the server and the
reduce tasks read them back with range requests. Prints the whole run's wall time, the time spent in the
reduce tasks (`dist.resolve_buckets`), and the bytes they fetched from the server (s3fs's ranged reads, counted)
against the size of the key files. To compare two versions of polymem, run it from each checkout in turn
(``PYTHONPATH=<checkout>``), alternating; docs/benchmarks/scaleout.md#smaller-measurements has the figures.
"""

from __future__ import annotations

import argparse
import time
import warnings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("corpus")
    ap.add_argument("--docs", type=int, default=0, help="only the first N documents (0: all)")
    ap.add_argument("--partition-mb", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=1)
    a = ap.parse_args()
    warnings.simplefilter("ignore")
    import polymem
    from _moto import local_s3
    from polymem.analysis.coverage import dist
    from polymem.corpus import Corpus
    from polymem.tokenizers import load_tokenizer

    import s3fs

    fetched = {"bytes": 0, "reads": 0, "on": False}  # what s3fs fetches while a reduce task runs
    fetch_range = s3fs.core.S3File._fetch_range
    cat_file = s3fs.S3FileSystem._cat_file

    def counted_range(self, start, end):  # type: ignore[no-untyped-def]
        if fetched["on"]:
            fetched["bytes"] += end - start
            fetched["reads"] += 1
        return fetch_range(self, start, end)

    async def counted_cat(self, path, version_id=None, start=None, end=None):  # type: ignore[no-untyped-def]
        data = await cat_file(self, path, version_id=version_id, start=start, end=end)
        if fetched["on"]:
            fetched["bytes"] += len(data)
            fetched["reads"] += 1
        return data

    s3fs.core.S3File._fetch_range = counted_range
    s3fs.S3FileSystem._cat_file = counted_cat
    with local_s3("scratch") as (_, fs):
        tt, tr = load_tokenizer("mistral-v1"), load_tokenizer("cl100k_base")
        polymem.coverage(load_tokenizer("mistral-v1"), load_tokenizer("cl100k_base"), ["warm-up"], max_n=7)
        spent = [0.0, 0]
        resolve = dist.resolve_buckets

        def timed(*args, **kw):  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            fetched["on"] = True
            try:
                return resolve(*args, **kw)
            finally:
                fetched["on"] = False
                spent[0] += time.perf_counter() - t0
                spent[1] += 1

        dist.resolve_buckets = timed
        docs = [d.text for d in Corpus([a.corpus])]
        docs = docs[:a.docs] if a.docs else docs
        for rep in range(a.repeat):
            spent[:] = [0.0, 0]
            fetched.update(bytes=0, reads=0)
            t0 = time.perf_counter()
            polymem.coverage(tt, tr, docs, max_n=7, scratch=f"s3://scratch/run{rep}", partition_mb=a.partition_mb)
            wall = time.perf_counter() - t0
            held = sum(fs.info(f)["size"] for f in fs.find(f"scratch/run{rep}"))
            print(f"run {rep}: whole run {wall:.2f} s, reduce {spent[0]:.2f} s in {spent[1]} tasks, fetched "
                  f"{fetched['bytes'] / 1e6:.1f} MB in {fetched['reads']} ranged reads (key files: {held / 1e6:.1f} MB)",
                  flush=True)


if __name__ == "__main__":
    main()
