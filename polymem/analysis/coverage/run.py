"""`coverage()`: tokenise each document with the target and the reference tokenizer, count, report.

Streaming in partitions: documents are grouped into partitions (``partition_mb`` of text each) and counted one
at a time, partition by partition: in this process, on N threads of it (``workers=N``), or as tasks on a Dask
cluster (``client=``, or ``workers=N, processes=True`` for a local one); the corpus-wide occurrence-weighted metric is
settled by key bucket (:mod:`polymem.analysis.coverage.dist`). Memory per process: one partition's distinct n-gram keys
and one document's scratch, never the corpus's.

Byte fidelity of both tokenizers is checked on every document as it goes (token bytes vs the text's UTF-8,
the definitions of :func:`polymem.check_fidelity`), without tokenising twice.

Document-initial n-grams are taken as the tokenizer produces them: a SentencePiece dummy prefix
(Mistral: "Hello" -> "▁Hello" = b" Hello") stays in the target's first token, as a model with that
tokenizer would see it, so those n-grams rarely match a reference without the prefix. The effect is at most
n n-grams per order per document; docs/coverage.md quantifies it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from polymem.hash.token_hashes import TokenHashes
from polymem.corpus import Corpus, Document, as_documents
from polymem.analysis.coverage import dist
from polymem.analysis.coverage._job import _info, _Job
from polymem.analysis.coverage._results import Fidelity, PartitionResult
from polymem.analysis.coverage.counter import ExactCounter, Tally
from polymem.analysis.coverage.report import CoverageReport, TokenizerInfo
from polymem.errors import PolymemError, WorkerError
from polymem.hash.spec import HashSpec
from polymem.hash.spec import check_max_n as _check_max_n

ProgressFn = Callable[[int, int], None]  # (documents done, UTF-8 bytes done), cumulative
PARTITION_MB = 4.0  # default partition size in one process: MB of UTF-8 text per partition
DASK_PARTITION_MB = 2.0  # ...and on Dask, where every worker holds its own partition: a worker's peak memory is
# the tools (~210 MB) plus ~60 MB per MB of partition; 4 MB partitions gave workers ~1.4x the peak of the finer
# partitions a small corpus is cut into (measured on the 2-vCPU benchmark VM of docs/benchmarks/scaleout.md)
PARTS_PER_WORKER = 4  # on Dask, a corpus of files is cut finer when it would give fewer partitions than this...
FINEST = 16  # ...per worker, but not below partition_mb / FINEST (0.25 MB by default)
KEEP_MB = 128.0  # in one process, partitions' occurrence outputs stay in memory up to this many MB (then: files)
RAM_SCRATCH = "/dev/shm"  # the default scratch goes here (a RAM-backed tmpfs) when the key files fit well...
SCRATCH_PER_TEXT_BYTE = 18  # ...estimated at this many bytes of key files per byte of text (kerneldocs: 18)


def check_max_n(max_n: Any) -> int:
    """The target orders measured are 1..max_n (the Tokenizer-Agnostic Engram paper uses 7)."""
    return _check_max_n(max_n, hint="the Tokenizer-Agnostic Engram paper uses 7; pass e.g. --max-n 7")


_HASHES: "weakref.WeakKeyDictionary[Any, dict[str, TokenHashes]]" = weakref.WeakKeyDictionary()


def _hashes(tok: Any, spec: HashSpec) -> TokenHashes:
    """TokenHashes of a loaded tokenizer under ``spec``, built once per tokenizer object and process."""
    per_spec = _HASHES.setdefault(tok, {})
    got = per_spec.get(spec.spec_id)
    if got is None:
        got = per_spec[spec.spec_id] = TokenHashes.build(tok, spec)
    return got


def coverage(
    target: Any,
    reference: Any,
    texts: Iterable[str | Document] | Corpus,
    max_n: int = 7,
    *,
    exact_bytes: bool = False,
    occurrence: bool = True,
    workers: int = 1,
    processes: bool = False,
    client: Any = None,
    partition_mb: float | None = None,
    scratch: str | None = None,
    storage_options: dict[str, Any] | None = None,
    spec: HashSpec | None = None,
    progress: ProgressFn | None = None,
) -> CoverageReport:
    """How much of ``target``'s n-gram memory a table written with ``reference`` can serve (docs/coverage.md).

    target, reference: anything :func:`polymem.load_tokenizer` accepts ("mistral-v1", "cl100k_base", a path,
    a Tokenizer). texts: strings, :class:`polymem.corpus.Document` objects, or a :class:`polymem.corpus.Corpus`
    (whose skipped inputs then appear in the report). max_n: target (and reference) orders 1..max_n.
    exact_bytes: compare byte strings instead of 64-bit hashes (slow; the reference path; one process).
    occurrence: also compute the corpus-level occurrence-weighted coverage.
    client: a ``distributed.Client``: count the partitions as tasks on its cluster. workers: without a
    client, N > 1 counts the partitions on N threads of this process (the tokenizers and counting kernels
    release the GIL; one copy of the tokenizers; no Dask: a local Dask cluster of threads was measured ~1.1x
    slower, docs/coverage.md), or with ``processes=True`` on a local Dask cluster of N worker processes of one
    thread each, started for this call (no shared interpreter; ~3 s of start-up).
    partition_mb: MB of text per partition (the unit of work and of memory; default PARTITION_MB = 4 in one
    process, DASK_PARTITION_MB = 2 with workers or on Dask). scratch: directory or fsspec URL
    for the occurrence pass's key files (default: a temporary directory here; a cluster spanning machines
    needs a shared one, e.g. ``s3://bucket/tmp``), with fsspec ``storage_options``.
    progress: ``callback(docs_done, bytes_done)``, per document in one process, per partition with workers or
    on Dask (called from the thread that called coverage()).
    """
    t_start = time.perf_counter()
    max_n = check_max_n(max_n)
    partition_mb = _check_options(texts, workers, processes, client, partition_mb, exact_bytes)
    spec = spec or HashSpec()
    remote = client is not None or (workers > 1 and processes)  # the tasks run in other processes
    tok_t, tok_r, infos = _load_tools(target, reference, remote)
    if exact_bytes:
        exact, tally = _run_exact(tok_t, tok_r, max_n, occurrence, texts, progress)
        results, nproc = [exact], 1
    else:
        # on a cluster, send what the caller named (workers load it themselves) rather than loaded objects
        plan = dist.Plan(target=_portable(target) if remote else tok_t,
                         reference=_portable(reference) if remote else tok_r, max_n=max_n, occurrence=occurrence,
                         spec=spec, scratch=str(scratch) if scratch is not None else "",
                         storage_options=dict(storage_options or {}))
        run = _Run(plan, texts, partition_mb, progress, workers, processes, client, own_scratch=scratch is None)
        results, tally, nproc = _count_hashed(run, None if remote else (tok_t, tok_r))
    return _report(tally, results, texts, infos, occurrence=occurrence, exact_bytes=exact_bytes, spec=spec,
                   workers=nproc, elapsed_s=time.perf_counter() - t_start)


def _check_options(texts: Any, workers: Any, processes: Any, client: Any, partition_mb: Any,
                   exact_bytes: bool) -> float:
    """Refuse what coverage() cannot run, naming the value and the fix; returns partition_mb (its default filled
    in)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise PolymemError(f"workers={workers!r} must be an integer ≥ 1 (threads of this process, or "
                           "worker processes with processes=True; 1 = one after the other in this process)")
    if not isinstance(processes, bool):
        raise PolymemError(f"processes={processes!r} must be True (worker processes) or False (threads in this "
                           "process)")
    if processes and (client is not None or workers == 1):
        raise PolymemError("processes=True runs workers=N (N ≥ 2) as a local Dask cluster of N processes; "
                           + ("a client's cluster has the workers it has: drop processes" if client is not None
                              else "pass workers=N, or drop processes"))
    if partition_mb is None:
        partition_mb = DASK_PARTITION_MB if (client is not None or workers > 1) else PARTITION_MB
    if isinstance(partition_mb, bool) or not isinstance(partition_mb, (int, float)) or \
            not 0 < partition_mb < float("inf"):
        raise PolymemError(f"partition_mb={partition_mb!r} must be a positive, finite number of MB of text per "
                           f"partition (default {PARTITION_MB}; --partition-mb)")
    if isinstance(texts, (str, bytes)):
        raise PolymemError(
            "texts should be an iterable of documents but got one str; wrap it in a list: coverage(t, r, [text])"
        )
    if exact_bytes and (client is not None or workers > 1):
        raise PolymemError("exact_bytes runs in one process (it is the slow reference path that checks the hash "
                           "path); drop workers/client (--workers/--dask), or drop exact_bytes")
    return partition_mb


def _load_tools(target: Any, reference: Any, remote: bool) -> tuple[Any, Any, tuple[TokenizerInfo, TokenizerInfo] | None]:
    """(target, reference, their TokenizerInfo pair) loaded here; (None, None, None) when the tasks run in other
    processes and both specs are known good without loading them (the workers load them, and report what they
    loaded: the driver need not spend the time)."""
    from polymem.tokenizers import load_tokenizer

    if remote and _known_spec(target) and _known_spec(reference):
        return None, None, None
    tok_t, tok_r = load_tokenizer(target), load_tokenizer(reference)
    return tok_t, tok_r, (_info(tok_t), _info(tok_r))


@dataclass(frozen=True)
class _Run:
    """One hashed coverage run: what to count, in partitions of about ``partition_mb`` MB, and where."""

    plan: dist.Plan  # its scratch: "" for a temporary directory of the run's own (own_scratch)
    texts: Any
    partition_mb: float
    progress: ProgressFn | None
    workers: int
    processes: bool
    client: Any
    own_scratch: bool


def _count_hashed(run: _Run, tools: tuple[Any, Any] | None) -> tuple[list[PartitionResult], Tally, int]:
    """The hash path: the partitions counted by the runner the options choose (:func:`_dispatch`), with a
    scratch directory of the run's own unless the caller named one. ``tools``: the tokenizers loaded here (the
    tasks run in this process), else None. Returns (results, the merged tally, the number of workers)."""
    plan = run.plan
    if run.own_scratch:
        plan = replace(plan, scratch=tempfile.mkdtemp(prefix="polymem-coverage-",
                                                      dir=_scratch_parent(run.texts, plan.occurrence)))
    try:
        if tools is not None:  # the tasks run in this process (in line, or on its threads): its tools serve them
            spec = plan.spec
            dist.preload(plan, (*tools, _hashes(tools[0], spec), _hashes(tools[1], spec)))
        results, extra, nproc = _dispatch(replace(run, plan=plan))
    finally:
        dist.release(plan)
        if run.own_scratch:
            shutil.rmtree(plan.scratch, ignore_errors=True)
    tally = dist.merge_tallies(results, plan.max_n)
    tally.pos_hits += extra
    return results, tally, nproc


def _dispatch(run: _Run) -> tuple[list[PartitionResult], np.ndarray, int]:
    """The runner for the options: a Dask client's cluster, a local cluster of worker processes, threads of this
    process, or one after the other in this process. A scratch directory the caller named gets every key file;
    the run's own one only what KEEP_MB does not hold in memory."""
    args = (run.plan, run.texts, run.partition_mb, run.progress)
    if run.client is not None:
        return _run_dask(run.client, *args)
    if run.processes:
        with _local_cluster(run.workers) as local:
            return _run_dask(local, *args)
    keep_mb = None if run.own_scratch else 0.0
    if run.workers > 1:
        return _run_threads(*args, run.workers, keep_mb=keep_mb)
    return _run_inline(*args, keep_mb=keep_mb)


def _report(tally: Tally, results: list[PartitionResult], texts: Any,
            infos: tuple[TokenizerInfo, TokenizerInfo] | None, *, occurrence: bool, exact_bytes: bool,
            spec: HashSpec, workers: int, elapsed_s: float) -> CoverageReport:
    """The results added up into the report (an empty corpus is an error naming what was skipped)."""
    skipped = [s for r in results for s in r.skipped]
    if isinstance(texts, Corpus):
        skipped = list(texts.skipped) + skipped
    if tally.docs == 0:
        reasons = "; ".join(f"{s.source}: {s.reason}" for s in skipped[:3]) or "the input was empty"
        raise PolymemError(
            f"empty corpus: no documents to measure ({len(skipped)} skipped: {reasons}). Pass text files, "
            "directories of .txt/.md/.jsonl(.gz) files, or JSONL with a text field (--text-field)"
        )
    info_t, info_r = infos if infos is not None else next(r.info for r in results if r.info)
    replaced = sum(r.replaced for r in results) + (texts.replaced if isinstance(texts, Corpus) else 0)
    return CoverageReport.from_tally(
        tally, occurrence=occurrence,
        target=info_t, reference=info_r,
        method="exact-bytes" if exact_bytes else "hash",
        bytes=sum(r.bytes for r in results),
        fidelity={"target": Fidelity.merge(r.fid_t for r in results).as_dict(),
                  "reference": Fidelity.merge(r.fid_r for r in results).as_dict()},
        skipped=[{"source": s.source, "reason": s.reason} for s in skipped],
        replaced_utf8=replaced,
        elapsed_s=elapsed_s, workers=workers,
        timing={"encode_s": sum(r.encode_s for r in results), "count_s": sum(r.count_s for r in results),
                "read_s": sum(r.read_s for r in results)},
        hash_spec="" if exact_bytes else spec.spec_id,
    )


def _scratch_parent(texts: Any, occurrence: bool) -> str | None:
    """Where the default scratch directory goes: RAM_SCRATCH when the run's key files (estimated from the
    corpus size) take at most half its free space and an eighth of the available memory, else the system's
    temporary directory (None; also whenever TMPDIR is set, the size is unknown, or nothing is written).

    Files on a disk file system cost this process ~4-5 ms of CPU per MB the first time the kernel backs their page
    cache (measured on the benchmark VM; tmpfs: ~0.5 ms), and a coverage run writes ~13 MB of key files per MB
    of text, so for corpora up to a few hundred MB of text a RAM-backed directory is markedly faster; beyond that
    the files go to disk and memory stays bounded."""
    if not occurrence or os.environ.get("TMPDIR") or not os.path.isdir(RAM_SCRATCH):
        return None
    if not (isinstance(texts, Corpus) and texts.can_partition):
        return None
    try:
        text = sum(p.est_bytes() for p in texts.partitions(64.0))
        st = os.statvfs(RAM_SCRATCH)
        free = st.f_bavail * st.f_frsize
        with open("/proc/meminfo") as f:
            avail = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except Exception:  # a listing problem: the run itself will report it
        return None
    need = text * SCRATCH_PER_TEXT_BYTE
    return RAM_SCRATCH if need <= free / 2 and need <= avail / 8 else None


def _known_spec(spec: Any) -> bool:
    """A tokenizer spec that a worker can load and that is known good without loading it here: a builtin name or
    an existing file (a bad one still fails, on the worker, with the same error)."""
    from polymem.tokenizers.registry import MISTRAL_FILES
    from polymem.tokenizers.tiktoken_adapter import TIKTOKEN_ENCODINGS

    if isinstance(spec, str) and (spec in TIKTOKEN_ENCODINGS or spec in MISTRAL_FILES or spec == "bytes"):
        return True
    return isinstance(spec, (str, os.PathLike)) and os.path.isfile(spec)


def _portable(spec: Any) -> Any:
    """A tokenizer spec to send to workers: names and paths as they are (each worker loads them once), a
    loaded Tokenizer as the object itself (Dask serialises it)."""
    return os.fspath(spec) if isinstance(spec, os.PathLike) else spec


def _docs(texts: Iterable[str | Document] | Corpus) -> Iterator[Document]:
    return iter(texts) if isinstance(texts, Corpus) else as_documents(texts)


def _partitions(texts: Iterable[str | Document] | Corpus, partition_mb: float) -> Iterator[Any]:
    """The corpus as partitions of about ``partition_mb`` MB of text: pieces of files that the task reads itself
    (a Corpus of files and URLs), else documents grouped by this process (strings, stdin)."""
    if isinstance(texts, Corpus) and texts.can_partition:
        yield from texts.partitions(partition_mb)
        return
    limit = max(1, int(partition_mb * 1e6))
    batch: list[Document] = []
    size = 0
    for doc in _docs(texts):
        batch.append(doc)
        size += len(doc.text)
        if size >= limit:
            yield dist.DocsPartition(tuple(batch))
            batch, size = [], 0
    if batch:
        yield dist.DocsPartition(tuple(batch))


def _worker_partitions(texts: Iterable[str | Document] | Corpus, partition_mb: float, nworkers: int) -> Iterator[Any]:
    """:func:`_partitions` for N workers (threads, or a Dask cluster's task slots): a corpus of files that would
    give fewer than PARTS_PER_WORKER partitions per worker is cut finer (down to partition_mb / FINEST), so that
    every worker stays busy to the end and the last partition to finish is a small one. The numbers do not change: every sum in a tally is exact
    (:class:`~polymem.analysis.coverage.counter.Tally`), so any partitioning adds up to the same report."""
    if isinstance(texts, Corpus) and texts.can_partition:
        parts = texts.partitions(partition_mb)
        want = PARTS_PER_WORKER * nworkers
        if len(parts) < want:
            finer = max(partition_mb / FINEST, sum(p.est_bytes() for p in parts) / want / 1e6)
            if finer < partition_mb:
                parts = texts.partitions(finer)
        return iter(parts)
    return _partitions(texts, partition_mb)


def _timed(it: Iterator[Any], clock: list[float]) -> Iterator[Any]:
    while True:
        t0 = time.perf_counter()
        try:
            item = next(it)
        except StopIteration:
            return
        finally:
            clock[0] += time.perf_counter() - t0
        yield item


class _Progress:
    def __init__(self, progress: ProgressFn | None) -> None:
        self.fn, self.docs, self.bytes = progress, 0, 0

    def add(self, docs: int, nbytes: int) -> None:
        self.docs += docs
        self.bytes += nbytes
        if self.fn is not None:
            self.fn(self.docs, self.bytes)


def _run_inline(plan: dist.Plan, texts: Any, partition_mb: float, progress: ProgressFn | None,
                keep_mb: float | None = None) -> tuple[list[PartitionResult], np.ndarray, int]:
    """The same tasks as on Dask, one after the other in this process. The partitions' occurrence outputs stay
    in memory while they add up to at most ``keep_mb`` MB; the partitions after that write theirs to the
    scratch directory, as on Dask (so memory stays bounded, and a small corpus pays no file writes and reads)."""
    prog = _Progress(progress)
    read_s = [0.0]
    results = []
    held: dict[int, Any] = {}  # partition -> occurrence output kept in memory (KEEP_MB in all; the rest: files)
    held_mb = 0.0
    keep_mb = KEEP_MB if keep_mb is None else keep_mb
    for i, part in enumerate(_timed(_partitions(texts, partition_mb), read_s)):
        # an output that fits what is left of the budget stays here; the others are written by the task itself
        r = dist.count_partition(plan, i, part, on_doc=lambda nbytes: prog.add(1, nbytes),
                                 keep=max(0.0, keep_mb - held_mb))
        occ = r.take_occ()
        if occ is not None:
            held[i] = occ
            held_mb += dist.held_bytes(occ) / 1e6
        results.append(r)
    results[0:0] = [PartitionResult.driver(read_s[0])] if results else []
    extra = np.zeros(plan.max_n, dtype=np.int64)
    if plan.occurrence and results:
        parts = [r.index for r in results if r.index >= 0]
        for lo, hi in dist.bucket_ranges(sum(r.ref_keys for r in results)):
            extra += dist.resolve_buckets(plan, parts, lo, hi, held, dist.range_offsets(results, lo, hi))
    return results, extra, 1


def _run_threads(plan: dist.Plan, texts: Any, partition_mb: float, progress: ProgressFn | None, workers: int,
                 keep_mb: float | None = None) -> tuple[list[PartitionResult], np.ndarray, int]:
    """The same tasks as on Dask, on ``workers`` threads of this process: at most 2 partitions per thread in
    flight (as on Dask), then the reduce tasks side by side. As in line, the partitions' occurrence outputs stay
    in memory while they add up to at most ``keep_mb`` MB (each task claims its output's size from the shared
    :class:`~polymem.analysis.coverage.dist.Budget`), the others go to the scratch directory. Progress is
    reported per partition, from this thread."""
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, as_completed, wait

    prog = _Progress(progress)
    read_s = [0.0]
    results: dict[int, PartitionResult] = {}
    held: dict[int, Any] = {}  # partition -> occurrence output kept in memory
    budget = dist.Budget(KEEP_MB if keep_mb is None else keep_mb)
    inflight: set[Any] = set()

    def collect(fut: Any) -> None:
        inflight.discard(fut)
        r = fut.result()
        occ = r.take_occ()
        if occ is not None:
            held[r.index] = occ
        results[r.index] = r
        prog.add(r.tally.docs, r.bytes)

    pool = ThreadPoolExecutor(workers, thread_name_prefix="polymem-coverage")
    try:
        for i, part in enumerate(_timed(_worker_partitions(texts, partition_mb, workers), read_s)):
            inflight.add(pool.submit(dist.count_partition, plan, i, part, keep=budget))
            while len(inflight) >= 2 * workers:
                for fut in wait(inflight, return_when=FIRST_COMPLETED).done:
                    collect(fut)
        for fut in as_completed(list(inflight)):  # each as it ends (progress; a failed task's error at once)
            collect(fut)
        extra = np.zeros(plan.max_n, dtype=np.int64)
        if plan.occurrence and results:
            parts = sorted(results)
            ranges = dist.bucket_ranges(sum(r.ref_keys for r in results.values()), minimum=workers)
            futs = [pool.submit(dist.resolve_buckets, plan, parts, lo, hi, held,
                                dist.range_offsets(results.values(), lo, hi)) for lo, hi in ranges]
            for fut in futs:
                extra += fut.result()
    finally:  # on an error (a task's, or Ctrl-C here): the tasks not started are dropped, the running ones end
        pool.shutdown(wait=True, cancel_futures=True)
    return [PartitionResult.driver(read_s[0])] + [results[i] for i in sorted(results)], extra, workers


def _run_dask(client: Any, plan: dist.Plan, texts: Any, partition_mb: float,
              progress: ProgressFn | None) -> tuple[list[PartitionResult], np.ndarray, int]:
    """Partitions as Dask tasks (at most 2 per worker in flight, so the driver never holds more), then one
    reduce task per bucket range. A task lost with a worker is rerun by Dask."""
    from distributed import as_completed

    nworkers = max(1, sum(client.nthreads().values()))  # task slots: threads, over all workers
    prog = _Progress(progress)
    read_s = [0.0]
    results: dict[int, PartitionResult] = {}
    pending = as_completed()
    inflight = 0

    def collect(fut: Any) -> None:
        r = _task_result(fut, "partition {} of the corpus".format(fut.key.rsplit("-", 1)[-1]))
        fut.release()
        results[r.index] = r
        prog.add(r.tally.docs, r.bytes)

    for i, part in enumerate(_timed(_worker_partitions(texts, partition_mb, nworkers), read_s)):
        pending.add(client.submit(dist.count_partition, plan, i, part, key=f"polymem-count-{plan.token}-{i}",
                                  pure=False))
        inflight += 1
        while inflight >= 2 * nworkers:
            collect(next(pending))
            inflight -= 1
    for fut in pending:
        collect(fut)
    ordered = [PartitionResult.driver(read_s[0])] + [results[i] for i in sorted(results)]
    extra = np.zeros(plan.max_n, dtype=np.int64)
    if plan.occurrence and results:
        parts = sorted(results)
        ranges = dist.bucket_ranges(sum(r.ref_keys for r in results.values()), minimum=nworkers)
        futs = [client.submit(dist.resolve_buckets, plan, parts, lo, hi, None,
                              dist.range_offsets(results.values(), lo, hi), key=f"polymem-resolve-{plan.token}-{lo}",
                              pure=False) for lo, hi in ranges]
        for fut in futs:
            extra += _task_result(fut, "the occurrence pass")
            fut.release()
    return ordered, extra, nworkers


def _task_result(fut: Any, what: str) -> Any:
    """``fut.result()``; a task whose every worker died (Dask's KilledWorker, after its retries) becomes one line."""
    try:
        return fut.result()
    except Exception as e:
        if type(e).__name__ != "KilledWorker":
            raise  # the task's own exception, as in one process
        raise WorkerError(
            f"a coverage task ({what}) was lost with the worker process running it, on every retry (Dask "
            "KilledWorker: a worker died, often by the out-of-memory killer on a very large document); no report "
            "was made. Rerun with fewer --workers, a smaller --partition-mb, or --workers 1"
        ) from None


@contextlib.contextmanager
def _local_cluster(workers: int) -> Iterator[Any]:
    """A Dask LocalCluster for one call (``processes=True``): ``workers`` processes with one thread each."""
    import logging

    from polymem._optional import optional_import

    distributed = optional_import("distributed", extra="dask", purpose=f"coverage with workers={workers}, "
                                  "processes=True (a local Dask cluster; or drop processes: threads of this process)")
    Client, LocalCluster = distributed.Client, distributed.LocalCluster
    import dask

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with contextlib.ExitStack() as stack:
        with dask.config.set(QUIET_CLUSTER):  # read as the cluster starts (its worker processes get it too);
            # set only meanwhile, as dask.config is the whole process's
            cluster = stack.enter_context(LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                                       dashboard_address=":0", silence_logs=logging.ERROR))
            client = stack.enter_context(Client(cluster))
        yield client


# Dask settings of the local cluster a call starts (nobody watches its dashboard): no statistical profiler (it
# samples the stacks of the worker threads every 10 ms, holding the GIL), the event loop's health tick every
# second instead of every 20 ms, the system monitor every 5 s instead of 0.5 s. With Dask worker threads in this
# process, the thread running Dask's event loop used 0.35-0.50 CPU-s of a pydocs run with Dask's defaults,
# 0.15-0.17 with these (docs/benchmarks/scaleout.md#smaller-measurements)
QUIET_CLUSTER = {"distributed.worker.profile.enabled": False, "distributed.admin.tick.interval": "1s",
                 "distributed.admin.system-monitor.interval": "5s"}


def _run_exact(tok_t: Any, tok_r: Any, max_n: int, occurrence: bool, texts: Any,
               progress: ProgressFn | None) -> tuple[PartitionResult, Tally]:
    """The exact-bytes reference path: one process, Python sets of byte strings. Returns (its result, its
    tally)."""
    job = _Job(tok_t, tok_r, None, None, max_n, True, occurrence)  # type: ignore[arg-type]
    prog = _Progress(progress)
    read_s = [0.0]
    for doc in _timed(_docs(texts), read_s):
        prog.add(1, job.run(doc))
    tally = ExactCounter.finish([job.counter])
    return PartitionResult(tally=tally, fid_t=job.fid_t.state(), fid_r=job.fid_r.state(), skipped=job.skipped,
                           bytes=job.nbytes, encode_s=job.encode_s, count_s=job.count_s, read_s=read_s[0]), tally
