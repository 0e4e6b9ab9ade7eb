"""Benchmark: coverage in one process vs on a local Dask cluster, peak RSS per process, and S3 page reads.

    nice -n 10 python benchmarks/bench_scaleout.py --json docs/benchmarks/scaleout.json \
        pydocs=../shared/corpus/pydocs.jsonl.gz kerneldocs=../shared/corpus/kerneldocs.jsonl.gz \
        all=../shared/corpus/

For each corpus, back to back, each in a fresh subprocess (so its peak RSS is its own):
  tokenize   read the corpus and encode every document with both tokenizers (nothing else; one document at a
             time with `encode`, which runs on one thread: the baseline of the one-process target)
  tokenizeb  the same work in batches of documents (about polymem's BATCH_MB of text): the target tokenizer encodes
             the batch, then the reference tokenizer; coverage tokenizes this way (each tokenizer's tables stay in
             the CPU caches), so the one-process target is also quoted against this, the faster-or-equal baseline
  tokenize2  the same split over 2 processes at once (even / odd documents): what 2 processes can gain on this
             machine for the same work (the ceiling for the 2-worker target)
  inline     polymem.coverage(..., workers=1): the same partitions and tasks, one after the other
  threads    polymem.coverage(..., workers=2): the partitions counted on 2 threads of this process, the tokenizers
             loaded as for `inline`; peak RSS is the whole process's
  threads_old  (with --old-tree PATH) the `threads` mode run with the polymem of another checkout, e.g. one
             whose workers=2 started a Dask LocalCluster of one worker with 2 threads in
             this process inside the call (`threads_over_old_rounds`: this tree's time / the old one's)
  dask       polymem.coverage(..., client=LocalCluster(2 processes x 1 thread)): the cluster is started before the
             clock (its start is timed apart); the first run (cold workers: they import polymem and load the
             tokenizers) and a second run on the same cluster (warm workers); peak RSS of the driver and of each
             worker (ru_maxrss, asked from the workers after the runs)
  paired     (--modes paired) the one-process target measured so that the machine's drift cancels: in one
             process, partition by partition (4 MB, as a one-process run cuts them; its documents read once, not
             timed), the partition is tokenized with both tokenizers document by document (`tokenize`), in
             batches (`tokenizeb`), and counted by coverage's own map task (`dist.count_partition`: tokenizing,
             counting, key files), the three in a rotating order; then coverage's reduce; plus the fixed cost of a
             run (`polymem.coverage` of one short document with fresh tokenizer objects). Coverage = maps +
             reduce + fixed cost, compared with the sum of the tokenize passes (CPU and wall), with the
             per-partition ratios of the maps; the report's numbers are checked equal to a plain
             `polymem.coverage` run's.
  spin2      a pure-Python arithmetic loop (no memory traffic, nothing of polymem), one process alone (`spin`,
             timed in the same round) and 2 processes at once: what this machine gives 2 processes of perfectly
             parallel work right now (`alu_ceiling`); the 2-worker speed-ups are also quoted as a fraction of it
  cli        (--modes cli) the whole command as a user runs it, cold: `polymem coverage --workers 1`,
             `--workers 2` (2 threads) and `--workers 2 --processes` (2 worker processes), each a fresh process
             (imports, tokenizer loads, kernel loads and the cluster's start all inside the time), the order
             rotating round by round; with --old-tree also `--workers 2` of that checkout (`workers2_old`)
Every mode also reports the CPU seconds (user+sys) its timed region used: of the process, or for dask of the
driver (with the scheduler) + nannies + workers.
  fork       (--fork-tree PATH, first corpus only) the whole CLI, `polymem coverage --workers 2` and `--workers 1`,
             with the old hand-written fork pool (a checkout of the code before it was removed) and with Dask
Results (same-run ratios) as JSON; the page-read part: --s3-pages (a moto S3 server on 127.0.0.1).
--repeat K runs all the modes K times, interleaved round by round (this VM's speed drifts by ±10 % between runs of
the same work): each mode reports its median run and every round's times, each ratio the ratio of the medians
and the same-round ratios (``*_rounds``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def run_child(args: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    t0 = time.perf_counter()
    p = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=env)
    out = p.stdout.read() if p.stdout else ""
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    if status != 0:
        raise RuntimeError(f"{args} failed with status {status}")
    res = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
    res.update(wall_s=wall, peak_rss_mb=ru.ru_maxrss / 1024, cpu_s=ru.ru_utime + ru.ru_stime)
    return res


def _at_once(commands: list[list[str]]) -> list[dict[str, Any]]:
    """Children started together (the 2-process modes); each one's JSON line, once all have ended."""
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for cmd in commands]
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"{commands[0]} failed (status {[p.returncode for p in procs]})")
    return [json.loads(out.strip().splitlines()[-1]) for out in outs]


def _cpu_tree() -> float:
    """CPU seconds (user+sys) of this process and all its live descendants."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


SPIN = 8_000_000  # iterations of the spin loop (about 1 s of one core)


def spin() -> dict[str, Any]:
    """A pure-Python arithmetic loop (the `spin2` ceiling): L1-resident, nothing shared between processes."""
    t0, c0 = time.perf_counter(), time.process_time()
    x = 0
    for i in range(SPIN):
        x += i * i & 7
    return {"mode": "spin", "time_s": time.perf_counter() - t0, "cpu_s_timed": time.process_time() - c0, "x": x}


def one(mode: str, paths: list[str], partition_mb: float | None, max_n: int, share: str = "") -> dict[str, Any]:
    """Runs inside the child process."""
    if mode == "spin":
        return spin()
    import warnings

    warnings.simplefilter("ignore")
    import polymem
    from polymem.corpus import Corpus
    from polymem.tokenizers import load_tokenizer

    tok_t, tok_r = load_tokenizer("mistral-v1"), load_tokenizer("cl100k_base")
    # warm-up (load the compiled kernels) with other tokenizer objects, so that the timed run builds its token
    # hashes and byte maps as a fresh `polymem coverage` would (coverage caches them per tokenizer object)
    polymem.coverage(load_tokenizer("mistral-v1"), load_tokenizer("cl100k_base"), ["warm-up: compile the kernels"],
                     max_n=max_n)
    corpus = Corpus(paths)
    out: dict[str, Any] = {"mode": mode}
    if mode == "tokenize":
        k, of = (int(x) for x in share.split("/")) if share else (0, 1)  # this process's share of the documents
        t0, c0 = time.perf_counter(), time.process_time()
        n = b = 0
        for i, doc in enumerate(corpus):
            if i % of != k:
                continue
            tok_t.encode(doc.text)
            tok_r.encode(doc.text)
            n += 1
            b += len(doc.text.encode())
        out.update(time_s=time.perf_counter() - t0, cpu_s_timed=time.process_time() - c0, docs=n, bytes=b)
    elif mode == "tokenizeb":
        from polymem.analysis.coverage._job import BATCH_MB

        t0, c0 = time.perf_counter(), time.process_time()
        n = b = 0
        batch: list[str] = []
        size = 0

        def flush() -> None:
            for text in batch:
                tok_t.encode(text)
            for text in batch:
                tok_r.encode(text)

        for doc in corpus:
            batch.append(doc.text)
            size += len(doc.text)
            n += 1
            b += len(doc.text.encode())
            if size >= BATCH_MB * 1e6:
                flush()
                batch, size = [], 0
        flush()
        out.update(time_s=time.perf_counter() - t0, cpu_s_timed=time.process_time() - c0, docs=n, bytes=b)
    elif mode == "inline":
        t0, c0 = time.perf_counter(), time.process_time()
        r = polymem.coverage(tok_t, tok_r, corpus, max_n=max_n, partition_mb=partition_mb)
        out.update(time_s=time.perf_counter() - t0, cpu_s_timed=time.process_time() - c0, docs=r.docs,
                   bytes=r.bytes, partitions=len(corpus.partitions(partition_mb or 4.0)), report=_numbers(r))
    elif mode == "paired":
        out.update(_paired(tok_t, tok_r, corpus, max_n, partition_mb or 4.0))
    elif mode == "threads":
        t0, c0 = time.perf_counter(), time.process_time()
        parts: list[int] = []
        r = polymem.coverage(tok_t, tok_r, corpus, max_n=max_n, partition_mb=partition_mb, workers=2,
                             progress=lambda n, b: parts.append(n))
        out.update(time_s=time.perf_counter() - t0, cpu_s_timed=time.process_time() - c0, docs=r.docs,
                   bytes=r.bytes, partitions=len(parts), report=_numbers(r))
    elif mode == "dask":
        import logging

        from distributed import Client, LocalCluster

        t0 = time.perf_counter()
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                          silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
            t_start = time.perf_counter() - t0
            runs = []
            for _ in range(2):  # cold workers, then warm ones (tokenizers and kernels already loaded)
                t0, c0 = time.perf_counter(), _cpu_tree()
                parts: list[int] = []
                r = polymem.coverage("mistral-v1", "cl100k_base", corpus, max_n=max_n, partition_mb=partition_mb,
                                     client=client, progress=lambda n, b: parts.append(n))
                runs.append((time.perf_counter() - t0, _cpu_tree() - c0, len(parts), _numbers(r)))
            peaks = client.run(lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        assert runs[0][3] == runs[1][3], "a warm run changed the result"
        out.update(time_s=runs[0][0], cpu_s_timed=runs[0][1], warm_time_s=runs[1][0], warm_cpu_s_timed=runs[1][1],
                   cluster_start_s=t_start, docs=r.docs, bytes=r.bytes, partitions=runs[0][2],
                   worker_peak_rss_mb=sorted(peaks.values()), report=runs[0][3])
    return out


def _paired(tok_t: Any, tok_r: Any, corpus: Any, max_n: int, partition_mb: float) -> dict[str, Any]:
    """The one-process run's steps, each partition's interleaved with tokenize-only passes over the same
    documents (see the module docstring: mode ``paired``)."""
    import shutil
    import tempfile

    import numpy as np

    import polymem
    from polymem.analysis.coverage import dist
    from polymem.analysis.coverage import _job as J
    from polymem.analysis.coverage import run as R
    from polymem.analysis.coverage.report import CoverageReport
    from polymem.analysis.coverage._results import Fidelity
    from polymem.hash.spec import HashSpec
    from polymem.tokenizers import load_tokenizer

    def clock() -> tuple[float, float]:
        return time.perf_counter(), time.process_time()

    def tokenize(part: Any, batched: bool) -> None:
        docs = [d.text for d in part.docs]
        if batched:  # as coverage does: each tokenizer encodes a batch of about BATCH_MB of text
            lo, size = 0, 0
            for k, text in enumerate(docs + [None]):
                if text is None or size >= J.BATCH_MB * 1e6:
                    for t in docs[lo:k]:
                        tok_t.encode(t)
                    for t in docs[lo:k]:
                        tok_r.encode(t)
                    lo, size = k, 0
                if text is not None:
                    size += len(text)
        else:
            for text in docs:
                tok_t.encode(text)
                tok_r.encode(text)

    # the fixed cost of a run: fresh tokenizer objects (token hashes, byte maps, fingerprints), scratch, report
    fresh = load_tokenizer("mistral-v1"), load_tokenizer("cl100k_base")
    w0, c0 = clock()
    polymem.coverage(*fresh, ["a short document, the fixed cost of a run."], max_n=max_n)
    w1, c1 = clock()
    fixed = (w1 - w0, c1 - c0)
    spec = HashSpec()
    scratch = tempfile.mkdtemp(prefix="polymem-paired-", dir=R._scratch_parent(corpus, True))
    plan = dist.Plan(target=tok_t, reference=tok_r, max_n=max_n, occurrence=True, spec=spec, scratch=scratch)
    dist.preload(plan, (tok_t, tok_r, R._hashes(tok_t, spec), R._hashes(tok_r, spec)))
    steps: dict[str, list[tuple[float, float]]] = {"tokenize": [], "tokenizeb": [], "map": []}
    results, held, held_mb = [], {}, 0.0
    try:
        for i, file_part in enumerate(corpus.partitions(partition_mb)):
            # read once, not timed: a partition of a compressed file read a second time is decompressed again
            # from the file's start (only the next partition continues an open stream), which would add the
            # same growing time to every step
            part = dist.DocsPartition(tuple(file_part.read([])))
            order = ("tokenize", "tokenizeb", "map")
            for step in order[i % 3:] + order[:i % 3]:  # rotating: each step first, second and third in turn
                w0, c0 = clock()
                if step == "map":  # what R._run_inline does for partition i
                    r = dist.count_partition(plan, i, part, keep=max(0.0, R.KEEP_MB - held_mb))
                else:
                    tokenize(part, step == "tokenizeb")
                w1, c1 = clock()
                steps[step].append((w1 - w0, c1 - c0))
            occ = r.take_occ()
            if occ is not None:
                held[i] = occ
                held_mb += dist.held_bytes(occ) / 1e6
            results.append(r)
        w0, c0 = clock()
        extra = np.zeros(max_n, dtype=np.int64)
        for lo, hi in dist.bucket_ranges(sum(r.ref_keys for r in results)):
            extra += dist.resolve_buckets(plan, [r.index for r in results], lo, hi, held,
                                          dist.range_offsets(results, lo, hi))
        w1, c1 = clock()
        reduce = (w1 - w0, c1 - c0)
    finally:
        dist.release(plan)
        shutil.rmtree(scratch, ignore_errors=True)
    tally = dist.merge_tallies(results, max_n)
    tally.pos_hits += extra
    report = CoverageReport.from_tally(
        tally, occurrence=True, target=J._info(tok_t), reference=J._info(tok_r), method="hash",
        bytes=sum(r.bytes for r in results),
        fidelity={"target": Fidelity.merge(r.fid_t for r in results).as_dict(),
                  "reference": Fidelity.merge(r.fid_r for r in results).as_dict()},
        skipped=[{"source": s.source, "reason": s.reason} for r in results for s in r.skipped],
        replaced_utf8=sum(r.replaced for r in results), elapsed_s=0.0, workers=1,
        timing={"encode_s": 0.0, "count_s": 0.0, "read_s": 0.0}, hash_spec=spec.spec_id)
    want = polymem.coverage(tok_t, tok_r, corpus, max_n=max_n, partition_mb=partition_mb)
    assert _numbers(report) == _numbers(want), "the paired steps gave another report than polymem.coverage"
    out: dict[str, Any] = {"partitions": len(results), "fixed_s": fixed[0], "fixed_cpu_s": fixed[1],
                           "reduce_s": reduce[0], "reduce_cpu_s": reduce[1], "bytes": report.bytes}
    for k, j in (("wall", 0), ("cpu", 1)):  # j: the index of wall / CPU time in each (wall, cpu) pair
        tok = sum(x[j] for x in steps["tokenize"])
        tokb = sum(x[j] for x in steps["tokenizeb"])
        cov = sum(x[j] for x in steps["map"]) + reduce[j] + fixed[j]
        out[f"{k}_tokenize_s"], out[f"{k}_tokenizeb_s"], out[f"{k}_coverage_s"] = tok, tokb, cov
        out[f"{k}_over_tokenize"], out[f"{k}_over_tokenizeb"] = cov / tok, cov / tokb
        out[f"{k}_map_over_tokenize_parts"] = [m[j] / t[j] for m, t in zip(steps["map"], steps["tokenize"])]
    out["time_s"] = out["wall_coverage_s"]
    out["cpu_s_timed"] = out["cpu_coverage_s"]
    return out


def _numbers(r: Any) -> dict[str, Any]:
    """The report's numbers (what was measured, not how the run went)."""
    d = r.to_dict()
    for k in ("elapsed_s", "workers", "timing"):
        d.pop(k)
    return d


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median time_s (the lower middle one for an even count), with every run's times."""
    out = dict(sorted(runs, key=lambda r: r["time_s"])[(len(runs) - 1) // 2])
    if len(runs) > 1:
        for k in ("time_s", "cpu_s_timed", "warm_time_s", "warm_cpu_s_timed", "peak_rss_mb"):
            if k in out:
                out[k + "_runs"] = [r[k] for r in runs]
    return out


def _ratios(a: list[dict[str, Any]], b: list[dict[str, Any]], ka: str, kb: str) -> list[float]:
    """a[ka] / b[kb] round by round (the same round: measured back to back)."""
    return [x[ka] / y[kb] for x, y in zip(a, b)]


def s3_pages(n_pages: int, threads: int) -> dict[str, Any]:
    """pages/s reading an asset from a local moto S3 server: one read_pages call (parallel range requests) vs
    one page at a time."""
    import tempfile

    import numpy as np

    import polymem
    from _moto import local_s3

    with local_s3("bench") as (_, fs):
        with tempfile.TemporaryDirectory() as d:
            layout = polymem.Layout(pages=4096, heads=4, slots=4, head_dim=64)  # 2 KiB pages (float16)
            rng = np.random.default_rng(0)
            local = Path(d) / "t.pmem"
            table = rng.standard_normal((layout.num_rows, layout.head_dim), dtype=np.float32)
            polymem.MemoryAsset.from_array(local, table, polymem.HashSpec(), layout, orders=(1, 2), dtype="float16")
            fs.put(str(local), "bench/t.pmem", recursive=True)
        a = polymem.MemoryAsset.open("s3://bench/t.pmem")
        ids = rng.choice(layout.pages, size=min(n_pages, layout.pages), replace=False)
        a.read_pages(ids[:2])
        t0 = time.perf_counter()
        batch = a.read_pages(ids)
        t_par = time.perf_counter() - t0
        t0 = time.perf_counter()
        single = np.stack([a.read_pages([int(i)])[0] for i in ids])
        t_one = time.perf_counter() - t0
        assert np.array_equal(batch, single)
        return {"pages": len(ids), "page_bytes": int(batch[0].nbytes), "parallel_s": t_par, "one_at_a_time_s": t_one,
                "pages_per_s_parallel": len(ids) / t_par, "pages_per_s_one": len(ids) / t_one,
                "speedup": t_one / t_par}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("corpora", nargs="*", help="NAME=PATH[,PATH...]")
    ap.add_argument("--partition-mb", type=float, default=None,
                    help="MB of text per partition (default: polymem's, 4 in one process and 2 on Dask)")
    ap.add_argument("--max-n", type=int, default=7)
    ap.add_argument("--modes", default="tokenize,tokenizeb,tokenize2,inline,dask")
    ap.add_argument("--repeat", type=int, default=1, help="rounds of all modes, interleaved; each mode's median "
                    "run is reported, with every round's times and same-round ratios")
    ap.add_argument("--fork-tree", help="a checkout with the old fork pool (measured on the first corpus)")
    ap.add_argument("--old-tree", help="a checkout whose workers=2 the modes threads_old and cli also time")
    ap.add_argument("--s3-pages", type=int, default=0, help="also time this many page reads from a moto S3 server")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--one", nargs=2, metavar=("MODE", "PATHS"), help=argparse.SUPPRESS)
    ap.add_argument("--share", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    old_env = dict(os.environ, PYTHONPATH=os.path.abspath(args.old_tree)) if args.old_tree else None
    if args.one:
        print(json.dumps(one(args.one[0], args.one[1].split(","), args.partition_mb, args.max_n, args.share)))
        return
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    flags = next((ln.split(":", 1)[1].split() for ln in lscpu.splitlines() if ln.startswith("Flags")), [])
    report: dict[str, Any] = {"machine": {"cpu": next((ln.split(":", 1)[1].strip() for ln in lscpu.splitlines()
                                                        if ln.startswith("Model name")), "?"),
                                          "cores": os.cpu_count(),
                                          "simd": [f for f in flags if f.startswith(("avx", "sse4", "fma"))],
                                          "loadavg_start": os.getloadavg()},
                              "partition_mb": args.partition_mb, "max_n": args.max_n, "repeat": args.repeat,
                              "corpora": {}}
    for spec in args.corpora:
        name, paths = spec.split("=", 1)
        rounds: dict[str, list[dict[str, Any]]] = {}
        for rnd in range(args.repeat):  # the modes interleaved, round after round (the VM's speed drifts)
            for mode in args.modes.split(","):
                child = [sys.executable, __file__, "--one", mode, paths,
                         *(["--partition-mb", str(args.partition_mb)] if args.partition_mb else []),
                         "--max-n", str(args.max_n)]
                if mode == "cli":  # the whole command, one worker and two, cold; alternating order
                    got = {"mode": mode}
                    kinds = {"workers1": ["--workers", "1"], "workers2": ["--workers", "2"],
                             "processes2": ["--workers", "2", "--processes"]}
                    if args.old_tree:
                        kinds["workers2_old"] = ["--workers", "2"]
                    order = list(kinds)[rnd % len(kinds):] + list(kinds)[:rnd % len(kinds)]
                    for kind in order:
                        cmd = [sys.executable, "-c", "from polymem.cli.app import main; main()", "coverage", "-t",
                               "mistral-v1", "-r", "cl100k_base", *paths.split(","), "--max-n", str(args.max_n),
                               "-q", *kinds[kind]]
                        env = old_env if kind.endswith("_old") else None
                        t0 = time.perf_counter()
                        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
                        got[f"{kind}_s"] = time.perf_counter() - t0
                    got["time_s"] = got["workers1_s"]
                    got["speedup"] = got["workers1_s"] / got["workers2_s"]
                    got["speedup_processes"] = got["workers1_s"] / got["processes2_s"]
                    if args.old_tree:
                        got["speedup_old"] = got["workers1_s"] / got["workers2_old_s"]
                elif mode == "spin2":  # the loop alone, then two at once (each as much work as the one alone)
                    alone = run_child(child[:3] + ["spin"] + child[4:])
                    t0 = time.perf_counter()
                    both = _at_once([child[:3] + ["spin"] + child[4:]] * 2)
                    got = {"mode": mode, "alone_s": alone["time_s"], "time_s": max(b["time_s"] for b in both),
                           "wall_s": time.perf_counter() - t0}
                    got["alu_ceiling"] = 2 * got["alone_s"] / got["time_s"]
                elif mode == "tokenize2":  # two children at once, each with half of the documents
                    t0 = time.perf_counter()
                    halves = _at_once([child[:3] + ["tokenize"] + child[4:] + ["--share", f"{k}/2"] for k in range(2)])
                    got = {"mode": mode, "time_s": max(h["time_s"] for h in halves),
                           "cpu_s_timed": sum(h["cpu_s_timed"] for h in halves),
                           "docs": sum(h["docs"] for h in halves), "wall_s": time.perf_counter() - t0}
                elif mode == "threads_old":  # this script's `threads` mode on the other checkout's polymem
                    if not args.old_tree:
                        raise SystemExit("--modes threads_old needs --old-tree PATH")
                    got = run_child(child[:3] + ["threads"] + child[4:], env=old_env)
                    got["mode"] = mode
                else:
                    got = run_child(child)
                got["round"] = rnd
                rounds.setdefault(mode, []).append(got)
                print(name, mode, json.dumps({k: v for k, v in got.items() if k != "report"}), flush=True)
        res: dict[str, Any] = {mode: _median_run(runs) for mode, runs in rounds.items()}
        inline_report = rounds["inline"][0].get("report") if "inline" in rounds else None
        if "inline" in rounds and "dask" in rounds:
            want = rounds["inline"][0]["report"]
            assert all(r.pop("report") == want for r in rounds["inline"] + rounds["dask"]), "dask changed the result"
            res["dask_speedup"] = res["inline"]["time_s"] / res["dask"]["time_s"]
            res["dask_warm_speedup"] = res["inline"]["time_s"] / res["dask"]["warm_time_s"]
            res["dask_cpu_over_inline"] = res["dask"]["cpu_s_timed"] / res["inline"]["cpu_s_timed"]
            res["dask_speedup_rounds"] = _ratios(rounds["inline"], rounds["dask"], "time_s", "time_s")
            res["dask_warm_speedup_rounds"] = _ratios(rounds["inline"], rounds["dask"], "time_s", "warm_time_s")
        if "inline" in rounds and "tokenize" in rounds:
            res["inline_over_tokenize"] = res["inline"]["time_s"] / res["tokenize"]["time_s"]
            res["inline_over_tokenize_cpu"] = res["inline"]["cpu_s_timed"] / res["tokenize"]["cpu_s_timed"]
            res["inline_over_tokenize_rounds"] = _ratios(rounds["inline"], rounds["tokenize"], "time_s", "time_s")
            res["inline_over_tokenize_cpu_rounds"] = _ratios(rounds["inline"], rounds["tokenize"], "cpu_s_timed",
                                                             "cpu_s_timed")
        if "inline" in rounds and "tokenizeb" in rounds:
            res["inline_over_tokenizeb"] = res["inline"]["time_s"] / res["tokenizeb"]["time_s"]
            res["inline_over_tokenizeb_rounds"] = _ratios(rounds["inline"], rounds["tokenizeb"], "time_s", "time_s")
            res["inline_over_tokenizeb_cpu_rounds"] = _ratios(rounds["inline"], rounds["tokenizeb"], "cpu_s_timed",
                                                              "cpu_s_timed")
        if "cli" in rounds:
            res["cli_speedup_rounds"] = [r["speedup"] for r in rounds["cli"]]
            res["cli_speedup_processes_rounds"] = [r["speedup_processes"] for r in rounds["cli"]]
            if args.old_tree:
                res["cli_speedup_old_rounds"] = [r["speedup_old"] for r in rounds["cli"]]
        if "inline" in rounds and "threads" in rounds:
            assert all(r.pop("report") == inline_report for r in rounds["threads"]), "threads changed the result"
            res["threads_speedup"] = res["inline"]["time_s"] / res["threads"]["time_s"]
            res["threads_speedup_rounds"] = _ratios(rounds["inline"], rounds["threads"], "time_s", "time_s")
            res["threads_cpu_over_inline_rounds"] = _ratios(rounds["threads"], rounds["inline"], "cpu_s_timed",
                                                            "cpu_s_timed")
        if "threads_old" in rounds:
            want = inline_report or (rounds["threads"][0].get("report") if "threads" in rounds else None)
            if want is not None:  # nothing of this tree's to compare with when threads_old runs alone
                assert all(r.pop("report") == want for r in rounds["threads_old"]), "the old tree's threads differ"
            if "inline" in rounds:
                res["threads_old_speedup_rounds"] = _ratios(rounds["inline"], rounds["threads_old"], "time_s",
                                                            "time_s")
            if "threads" in rounds:
                res["threads_over_old_rounds"] = _ratios(rounds["threads"], rounds["threads_old"], "time_s", "time_s")
                res["threads_over_old_cpu_rounds"] = _ratios(rounds["threads"], rounds["threads_old"], "cpu_s_timed",
                                                             "cpu_s_timed")
        if "spin2" in rounds:
            res["alu_ceiling_rounds"] = [r["alu_ceiling"] for r in rounds["spin2"]]
            for k in ("threads", "threads_old", "dask"):
                if f"{k}_speedup_rounds" in res:  # the speed-up as a fraction of what the machine gave right then
                    res[f"{k}_of_alu_ceiling_rounds"] = [s / c for s, c in zip(res[f"{k}_speedup_rounds"],
                                                                              res["alu_ceiling_rounds"])]
        if "paired" in rounds:
            for k in ("wall_over_tokenize", "wall_over_tokenizeb", "cpu_over_tokenize", "cpu_over_tokenizeb"):
                res[f"paired_{k}_rounds"] = [r[k] for r in rounds["paired"]]
        if "tokenize" in rounds and "tokenizeb" in rounds:
            res["tokenizeb_over_tokenize_rounds"] = _ratios(rounds["tokenizeb"], rounds["tokenize"], "time_s",
                                                            "time_s")
        if "tokenize" in rounds and "tokenize2" in rounds:
            res["two_process_ceiling"] = res["tokenize"]["time_s"] / res["tokenize2"]["time_s"]
            res["two_process_ceiling_rounds"] = _ratios(rounds["tokenize"], rounds["tokenize2"], "time_s", "time_s")
        for r in res.values():
            if isinstance(r, dict):
                r.pop("report", None)
        if args.fork_tree and not report.get("fork"):
            fork = {}
            for tree, label in ((args.fork_tree, "fork"), (str(HERE.parent), "dask")):
                env = dict(os.environ, PYTHONPATH=tree)
                for w in (2, 1):
                    cmd = [sys.executable, "-c", "from polymem.cli.app import main; main()", "coverage", "-t",
                           "mistral-v1", "-r", "cl100k_base", *paths.split(","), "--max-n", str(args.max_n), "-q",
                           "--workers", str(w)]
                    t0 = time.perf_counter()
                    subprocess.run(cmd, env=env, check=True, stderr=subprocess.DEVNULL)
                    fork[f"{label}_cli_workers{w}_wall_s"] = time.perf_counter() - t0
            fork["corpus"] = name
            report["fork"] = fork
            print("fork", fork, flush=True)
        report["corpora"][name] = res
        report["machine"]["loadavg_end"] = os.getloadavg()
        if args.json:
            args.json.write_text(json.dumps(report, indent=2))
    if args.s3_pages:
        report["s3_pages"] = s3_pages(args.s3_pages, 8)
        print("s3", report["s3_pages"], flush=True)
    report["machine"]["loadavg_end"] = os.getloadavg()
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
