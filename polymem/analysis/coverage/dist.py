"""Partitioned coverage with bounded memory: count corpus partitions (map), then settle the corpus-wide
occurrence-weighted metric by key bucket (shuffle + reduce). Runs in this process or on a Dask cluster.

    partitions ──count_partition──▶ per-partition tally + key files ──resolve_buckets──▶ occurrence hits

* **map** (:func:`count_partition`, one task per corpus partition): documents are tokenized in batches of about
  ``_job.BATCH_MB`` of text and counted one at a time (per-document metrics need nothing else). For the occurrence-weighted metric each document's distinct
  reference n-gram keys, and the target n-grams that their own document's reference did not contain (key,
  order, count), are appended to flat buffers; at the end of the partition both are grouped by **key bucket**
  (the top ``BUCKET_BITS`` bits of the 64-bit byte hash; a counting sort,
  :func:`~polymem.analysis.coverage._buckets.bucket_group_into`) and written to the scratch directory (``.npy``
  files, fsspec URL); each bucket's offsets go back in the task's summary. Nothing is deduplicated across
  documents here: the reduce's table does that once. A task holds one partition's keys, never the corpus's.
* **reduce** (:func:`resolve_buckets`, one task per contiguous range of buckets): reads its buckets' slices of
  every partition's files (range reads, located by the bucket offsets each map task returned in its summary);
  then, bucket by bucket, puts the reference keys of every partition
  in one small table and looks up the unresolved target entries of the same bucket, summing the counts found
  per order (:func:`~polymem.analysis.coverage._buckets.resolve_range`). A key lives in exactly one bucket,
  so the union over tasks is exact: a position is a hit iff its n-gram is anywhere in the corpus's reference
  stream, as in the single-set computation. Each task holds ~1/R of the per-document reference keys.

Tasks are pure functions of their arguments (files are written under a temporary name and renamed), so a task
lost with a killed worker is simply run again by Dask; the result does not change.

A worker may run tasks in several threads (``workers=N`` runs N threads in one process): the kernels release
the GIL, and what a process keeps between tasks is either shared read-only (the tools), taken by one task at a
time (the spare buffers), or per thread (a compressed file's open stream, :class:`polymem.sources.OpenStreams`).
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polymem import _npy
from polymem.analysis.coverage import _buckets
from polymem.analysis.coverage._results import PartitionResult
from polymem.analysis.coverage.counter import BUCKET_BITS, OccurrenceOutput, Tally
from polymem.corpus import Document, Skipped
from polymem.hash.spec import HashSpec

REDUCE_KEYS = 1 << 22  # aim for about this many reference keys (summed over partitions) per reduce task
# a partition's files: distinct reference keys, the unresolved target entries (keys, orders, counts: three
# arrays written as they are, no repacking copy); their per-bucket offsets travel in the task's summary
_FILES = ("ref", "ph", "pn", "pc")


_PAGES_LOCK = threading.Lock()
_PAGES_DEPTH = [0]


@contextlib.contextmanager
def small_pages() -> Iterator[None]:
    """numpy's large arrays without transparent huge pages, for the duration (restored after; nestable).

    numpy asks the kernel for huge pages on every large array (``madvise(MADV_HUGEPAGE)``); with the common THP
    setting ``defrag=madvise`` the first touch of each 2 MiB page may then stall on memory compaction. The
    coverage buffers are large, written once and filled front to back, so huge pages buy them nothing, and on
    the benchmark VM those stalls cost 2-5 ms per MB of fresh memory against ~0.5-1 ms with ordinary pages
    (measured on the benchmark VM of docs/benchmarks/scaleout.md). Only the setting of numpy's allocator changes; no numbers."""
    setter = getattr(getattr(np, "_core", None), "multiarray", None)
    setter = getattr(setter, "_set_madvise_hugepage", None)
    if setter is None:  # another numpy: leave its allocator alone
        yield
        return
    with _PAGES_LOCK:
        if _PAGES_DEPTH[0] == 0:
            _PAGES_DEPTH.append(setter(False))  # returns the previous setting
        _PAGES_DEPTH[0] += 1
    try:
        yield
    finally:
        with _PAGES_LOCK:
            _PAGES_DEPTH[0] -= 1
            if _PAGES_DEPTH[0] == 0:
                setter(_PAGES_DEPTH.pop())


@dataclass(frozen=True)
class Plan:
    """What every task needs (small, sent with each task): tokenizers (specs, or Tokenizer objects), options,
    and where the shuffle files go."""

    target: Any
    reference: Any
    max_n: int
    occurrence: bool
    spec: HashSpec
    scratch: str  # directory (local path or fsspec URL) for the key files, shared by all workers
    storage_options: dict[str, Any] = field(default_factory=dict)
    token: str = field(default_factory=lambda: uuid.uuid4().hex)  # names this run's cached tools per process


@dataclass(frozen=True)
class DocsPartition:
    """A partition whose documents travel with the task (strings, stdin, or a Corpus read by the driver)."""

    docs: tuple[Document, ...]

    def read(self, skipped: list[Skipped]) -> Iterator[Document]:
        return iter(self.docs)

    @property
    def replaced(self) -> int:
        return 0


# ------------------------------------------------------------------------------------------- per process
# The tools of the latest run, kept by each process (a Dask worker) for the next tasks and the next runs: a
# worker loads its tokenizers and builds their token hashes once, not once per task (nor per run, while the
# specs stay the same). One entry at a time, so old tokenizers do not pile up.
_TOOLS: dict[Any, Any] = {}
LOADS = [0]  # how many times this process loaded tools (the tests read it on the workers)
_TOOLS_LOCK = threading.Lock()
# tools a run started in this process loaded itself (the in-process executor, worker threads), by run token:
# only that run adds and removes its entry, so runs going on at the same time in one process do not clear each other's
_PRELOADED: dict[str, Any] = {}


def _tools_key(plan: Plan) -> Any:
    """What identifies a run's tools across runs: the tokenizer specs when both are names or paths (a path with
    its size and modification time, so a rewritten file is loaded again) and the hash spec; else this run."""
    if not (isinstance(plan.target, str) and isinstance(plan.reference, str)):
        return plan.token

    def stamp(spec: str) -> Any:
        try:
            st = os.stat(spec)
        except (OSError, ValueError):
            return spec  # a builtin name
        return (spec, st.st_size, st.st_mtime_ns)

    return (stamp(plan.target), stamp(plan.reference), plan.spec.spec_id)


def _tools(plan: Plan) -> Any:
    """(target, reference, target hashes, reference hashes, their TokenizerInfo pair), loaded once per process
    while the specs stay the same."""
    got = _PRELOADED.get(plan.token)
    if got is not None:
        return got
    key = _tools_key(plan)
    got = _TOOLS.get(key)
    if got is not None:
        return got
    with _TOOLS_LOCK:  # a worker's threads: the first task loads them, the others wait for it
        return _load_tools(plan, key)


def _load_tools(plan: Plan, key: Any) -> Any:
    got = _TOOLS.get(key)
    if got is None:
        from polymem.hash.token_hashes import TokenHashes
        from polymem.tokenizers import load_tokenizer

        _TOOLS.clear()  # before loading: do not hold two sets of tokenizers at once
        tok_t, tok_r = load_tokenizer(plan.target), load_tokenizer(plan.reference)
        got = _with_info((tok_t, tok_r, TokenHashes.build(tok_t, plan.spec), TokenHashes.build(tok_r, plan.spec)))
        LOADS[0] += 1
        _TOOLS[key] = got
    return got


def _with_info(tools: Any) -> Any:
    from polymem.analysis.coverage._job import _info

    return (*tools[:4], (_info(tools[0]), _info(tools[1])))


def preload(plan: Plan, tools: Any) -> None:
    """Serve this run's tasks in this process with tools the caller already loaded (the in-process executor,
    worker threads); :func:`release` with the same plan forgets them."""
    _PRELOADED[plan.token] = _with_info(tools)


def release(plan: Plan | None = None) -> None:
    """The end of a run started in this process: forget its preloaded tools (``plan``), the tools cached by
    name, and the spare buffers (which a task still running takes or hands back as it likes: only the spares
    are dropped); close the compressed streams every thread kept open."""
    from polymem.analysis.coverage.counter import release_buffers
    from polymem.sources import OpenStreams

    if plan is not None:
        _PRELOADED.pop(plan.token, None)
    _TOOLS.clear()
    release_buffers()
    release_reduce_buffers()
    OpenStreams.close_all()


# ------------------------------------------------------------------------------------------------- map
class Budget:
    """Bytes of memory that the occurrence outputs of a run's tasks on threads of this process may keep in all:
    each task claims its output's size when it has counted its partition; what does not fit goes to files."""

    def __init__(self, mb: float) -> None:
        self.left = int(mb * 1e6)
        self._lock = threading.Lock()

    def claim(self, nbytes: int) -> bool:
        with self._lock:
            if self.left <= 0 or nbytes > self.left:
                return False
            self.left -= nbytes
            return True


def count_partition(plan: Plan, index: int, part: Any, on_doc: Any = None,
                    keep: float | Budget = 0.0) -> PartitionResult:
    """Count one corpus partition (see the module docstring); returns its small summary.
    ``on_doc(nbytes)`` is called after each document (in-process progress). keep: MB of memory the occurrence
    output may take in this process, or a :class:`Budget` shared by the tasks on its threads: if it fits, hand
    it back in the summary (``occ``, a copy) instead of writing it to the scratch directory (the in-process
    executors, within their budget); else it is written straight from the grouping scratch (no copy)."""
    from polymem.analysis.coverage import counter

    release_reduce_buffers()  # a worker's reduce buffers of an earlier run are not needed by a map task
    with _ACTIVE_LOCK:  # keep as many spare buffers as map tasks have run at once in this process (its threads)
        _ACTIVE[0] += 1
        counter.SPARES[0] = max(counter.SPARES[0], _ACTIVE[0])
    try:
        with small_pages():
            return _count_partition(plan, index, part, on_doc, keep)
    finally:
        with _ACTIVE_LOCK:
            _ACTIVE[0] -= 1


_ACTIVE = [0]  # map tasks running in this process now
_ACTIVE_LOCK = threading.Lock()


def _count_partition(plan: Plan, index: int, part: Any, on_doc: Any, keep: float | Budget) -> PartitionResult:
    from polymem.analysis.coverage._job import BATCH_MB, _Job

    tok_t, tok_r, tcache, rcache, info = _tools(plan)
    job = _Job(tok_t, tok_r, tcache, rcache, plan.max_n, False, plan.occurrence)
    skipped: list[Skipped] = []
    t_read = 0.0
    docs = part.read(skipped)
    limit = BATCH_MB * 1e6
    while True:  # a batch of documents (about BATCH_MB of text) at a time: tokenized, then counted
        t0 = time.perf_counter()
        batch: list[Document] = []
        size = 0
        for doc in docs:
            batch.append(doc)
            size += len(doc.text)
            if size >= limit:
                break
        t_read += time.perf_counter() - t0
        if not batch:
            break
        for nbytes in job.run_batch(batch):
            if on_doc is not None:
                on_doc(nbytes)
    # settles what the partition can; views of reused scratch when they are only written out
    if plan.occurrence:  # kept: a copy (the scratch serves the next partition); written: views of the scratch
        need = job.counter.occurrence_bytes()
        keep = keep.claim(need) if isinstance(keep, Budget) else keep > 0 and need <= keep * 1e6
        occ = job.counter.occurrence_output(views=not keep)
    else:
        occ = None
    out = PartitionResult(index=index, tally=job.counter.tally, fid_t=job.fid_t.state(), fid_r=job.fid_r.state(),
                          skipped=skipped + job.skipped, bytes=job.nbytes, replaced=part.replaced,
                          encode_s=job.encode_s, count_s=job.count_s, read_s=t_read, pid=os.getpid(), info=info)
    if occ is not None:
        out.ref_keys, out.pending = int(occ.ref.shape[0]), int(occ.pend_h.shape[0])
        if keep:
            out.occ = occ
        else:
            write_buckets(plan, index, occ)
            out.off = np.stack([occ.ref_off, occ.pend_off])  # the bucket offsets (16 KiB): range_offsets
            occ.release()
    return out


def held_bytes(occ: OccurrenceOutput) -> int:
    """Memory an occurrence output holds (what the in-process executor counts against its budget)."""
    return sum(int(a.nbytes) for a in (occ.ref, occ.ref_off, occ.pend_h, occ.pend_n, occ.pend_c, occ.pend_off))


def write_buckets(plan: Plan, index: int, occ: OccurrenceOutput) -> None:
    """The partition's key files (each renamed into place). Their bucket offsets are not written: they travel
    in the task's summary, which exists only once every file is in place."""
    fs, root = _fs(plan)
    fs.makedirs(root, exist_ok=True)
    for name, arr in zip(_FILES, (occ.ref, occ.pend_h, occ.pend_n, occ.pend_c)):
        _save(fs, f"{root}/p{index:07d}.{name}.npy", arr)


def _fs(plan: Plan) -> tuple[Any, str]:
    import fsspec

    fs, root = fsspec.core.url_to_fs(plan.scratch, **plan.storage_options)
    return fs, root.rstrip("/")


def _save(fs: Any, path: str, arr: np.ndarray) -> None:
    """``arr`` as a .npy file, written under a temporary name and renamed into place. The data goes out
    straight from the array (np.save copies it in 16 MiB pieces for a file object that is not a plain file, as
    fsspec's are)."""
    arr = np.ascontiguousarray(arr)
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    with fs.open(tmp, "wb") as f:
        np.lib.format.write_array_header_1_0(f, np.lib.format.header_data_from_array_1_0(arr))
        if arr.size:
            f.write(arr.reshape(-1).data.cast("B"))
    fs.mv(tmp, path)


_HEADER_PROBE = 4096  # bytes read for a .npy header on object storage (a 1-D array's header is ~128 bytes)


def _read_slice_into(fs: Any, path: str, lo: int, out: np.ndarray) -> None:
    """Rows lo:lo+len(out) of a 1-D .npy file read into ``out``. A local file: one read straight into ``out``. On
    object storage: two range requests (the header, then exactly the slice) — a file object opened there would
    first fetch a read-ahead block (s3fs: up to 50 MB from the file's start) for the header."""
    if out.shape[0] == 0:
        return
    protocol = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    if "file" not in protocol:
        head = io.BytesIO(fs.cat_file(path, start=0, end=_HEADER_PROBE))
        start = _check_header(path, head, lo, out) + lo * out.dtype.itemsize
        data = fs.cat_file(path, start=start, end=start + out.nbytes)
        if len(data) != out.nbytes:
            raise ValueError(f"coverage scratch file {path!r} ends early: it was truncated; rerun")
        out[...] = np.frombuffer(data, dtype=out.dtype)
        return
    with fs.open(path, "rb") as f:
        f.seek(_check_header(path, f, lo, out) + lo * out.dtype.itemsize)
        buf = out.data.cast("B")
        got = 0
        while got < len(buf):
            n = f.readinto(buf[got:])
            if not n:
                raise ValueError(f"coverage scratch file {path!r} ends early: it was truncated; rerun")
            got += n


def _check_header(path: str, f: Any, lo: int, out: np.ndarray) -> int:
    """Read a .npy header from ``f`` and check that it holds rows lo:lo+len(out) of out's dtype; returns where the
    data starts."""
    shape, _, dtype = _npy.read_header(f)
    if dtype != out.dtype or lo + out.shape[0] > shape[0]:
        raise ValueError(f"coverage scratch file {path!r} holds {shape[0]} {dtype} values, expected at least "
                         f"{lo + out.shape[0]} {out.dtype}: it was overwritten or truncated; rerun")
    return int(f.tell())


# ----------------------------------------------------------------------------------------------- reduce
def resolve_buckets(plan: Plan, parts: list[int], lo: int, hi: int,
                    held: dict[int, OccurrenceOutput] | None = None,
                    offsets: dict[int, np.ndarray] | None = None) -> np.ndarray:
    """Occurrence hits per order (int64 [max_n]) of the unresolved target entries in key buckets lo:hi,
    looked up in every listed partition's reference keys of the same buckets: from the scratch files, or for
    the partitions in ``held`` (the in-process executor) from their outputs in memory. ``offsets``: for each
    partition written to files, its bucket offsets lo..hi (int64 [2, hi - lo + 1], from the map's summary:
    :func:`range_offsets`)."""
    with small_pages():
        return _resolve_buckets(plan, parts, lo, hi, held, offsets or {})


def range_offsets(results: Iterable[PartitionResult], lo: int, hi: int) -> dict[int, np.ndarray]:
    """The bucket offsets lo..hi of every partition whose map summary carries them (see count_partition)."""
    return {r.index: r.off[:, lo:hi + 1] for r in results if r.off is not None}


def _missing(plan: Plan, p: int, name: str) -> FileNotFoundError:
    return FileNotFoundError(
        f"coverage scratch file {plan.scratch}/p{p:07d}.{name}.npy is missing: the scratch directory must be shared "
        "by every Dask worker (pass scratch= / --scratch with a shared path or an s3:// URL)")


def _resolve_buckets(plan: Plan, parts: list[int], lo: int, hi: int,
                     held: dict[int, OccurrenceOutput] | None, offsets: dict[int, np.ndarray]) -> np.ndarray:
    from polymem.analysis.coverage.counter import release_buffers

    release_buffers()  # the map's spare buffers are not needed here (and would add to this task's peak memory)
    held = held or {}
    fs, root = _fs(plan) if any(p not in held for p in parts) else (None, "")
    # where each partition's slices come from, and the offsets of its buckets in the concatenation
    srcs, ref_off, pend_off = [], [], []
    nr = npd = 0
    for p in parts:
        occ = held.get(p)
        if occ is not None:
            r0, r1, q0, q1 = (int(occ.ref_off[lo]), int(occ.ref_off[hi]), int(occ.pend_off[lo]),
                              int(occ.pend_off[hi]))
            ro, qo = occ.ref_off[lo:hi + 1] - r0, occ.pend_off[lo:hi + 1] - q0
        else:
            off = offsets[p]
            r0, r1, q0, q1 = int(off[0, 0]), int(off[0, -1]), int(off[1, 0]), int(off[1, -1])
            ro, qo = off[0] - r0, off[1] - q0
        srcs.append((p, occ, r0, r1, q0, q1, nr, npd))
        ref_off.append(ro + nr)  # absolute offsets in the concatenation
        pend_off.append(qo + npd)
        nr += r1 - r0
        npd += q1 - q0
    hits = np.zeros(plan.max_n, dtype=np.int64)
    if npd == 0:
        return hits
    # every slice read (or copied) straight into its place: no per-partition pieces to concatenate afterwards;
    # into buffers this process's next reduce task reuses (fresh memory costs more than the copies)
    bufs = _reduce_buffers(nr, npd)  # this task's alone until it hands them back (a worker may run tasks in threads)
    try:
        _fill_and_resolve(plan, fs, root, srcs, nr, npd, bufs, ref_off, pend_off, hits)
    finally:
        _REDUCE_SPARE.append(bufs)
    return hits


def _fill_and_resolve(plan: Plan, fs: Any, root: str, srcs: list[Any], nr: int, npd: int, bufs: Any,
                      ref_off: list[np.ndarray], pend_off: list[np.ndarray], hits: np.ndarray) -> None:
    """The reduce's slices read (or copied) into this task's buffers, then looked up."""
    ref, ph, pn, pc = bufs[0][:nr], bufs[1][:npd], bufs[2][:npd], bufs[3][:npd]
    for p, occ, r0, r1, q0, q1, at_r, at_q in srcs:
        if occ is not None:
            ref[at_r:at_r + r1 - r0] = occ.ref[r0:r1]
            for out, arr in ((ph, occ.pend_h), (pn, occ.pend_n), (pc, occ.pend_c)):
                out[at_q:at_q + q1 - q0] = arr[q0:q1]
        else:
            for name, lo_at, out in zip(_FILES, (r0, q0, q0, q0), (ref[at_r:at_r + r1 - r0], ph[at_q:at_q + q1 - q0],
                                                                   pn[at_q:at_q + q1 - q0], pc[at_q:at_q + q1 - q0])):
                try:
                    _read_slice_into(fs, f"{root}/p{p:07d}.{name}.npy", lo_at, out)
                except FileNotFoundError:
                    raise _missing(plan, p, name) from None
    _buckets.resolve_range(ref, np.stack(ref_off), ph, pn, pc, np.stack(pend_off), BUCKET_BITS, hits)


_REDUCE_SPARE: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []


def _reduce_buffers(nr: int, npd: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Buffers for a reduce task of nr reference keys and npd pending entries: (ref uint64, ph uint64, pn int8,
    pc int64), each at least that long, taken from those an earlier reduce task in this process handed back
    (grown when too small); the caller hands them back (``_REDUCE_SPARE.append``) when done. The first touch of
    fresh memory is what costs here: a new array per task page-faulted ~8 bytes per key of the corpus again
    (docs/benchmarks/scaleout.md). Taken, not shared: tasks running in threads of one worker each get their own."""
    try:
        got = _REDUCE_SPARE.pop()  # atomic: two threads never get the same buffers
    except IndexError:
        got = None
    if got is None or got[0].shape[0] < nr or got[1].shape[0] < npd:
        got = None  # drop the old ones before allocating bigger ones
        r = max(nr, int(nr * 1.25))
        q = max(npd, int(npd * 1.25))
        got = (np.empty(r, dtype=np.uint64), np.empty(q, dtype=np.uint64), np.empty(q, dtype=np.int8),
               np.empty(q, dtype=np.int64))
    return got


def release_reduce_buffers() -> None:
    """Drop the reduce's buffers kept for the next task in this process."""
    _REDUCE_SPARE.clear()


def bucket_ranges(total_keys: int, minimum: int = 1) -> list[tuple[int, int]]:
    """Split the 2^BUCKET_BITS buckets into a power of two of contiguous ranges, about REDUCE_KEYS keys each."""
    nb = 1 << BUCKET_BITS
    r = 1
    while r < nb and (r < minimum or total_keys > r * REDUCE_KEYS):
        r *= 2
    step = nb // r
    return [(i, i + step) for i in range(0, nb, step)]


def merge_tallies(results: list[PartitionResult], max_n: int) -> Tally:
    total = Tally(max_n)
    for r in results:
        if r.tally is not None:
            total += r.tally
    return total


# ------------------------------------------------------------------------------------------- the cluster
# What a scheduler's TCP comm sends first (distributed/comm/tcp.py, ``TCP.read``): the byte length of a message
# as an 8-byte unsigned integer, then the message; a scheduler greets every connection with its handshake (a few
# hundred bytes) before it reads anything. Anything else on the port is not a Dask scheduler.
_GREETING_MAX = 1 << 20


def connect(address: str, *, timeout: float = 30.0) -> Any:
    """A ``distributed.Client`` on the scheduler at ``address``, or a one-line PolymemError, within about
    ``timeout`` seconds of wall-clock time: Dask's own timeout does not cover a peer that accepts and says nothing
    (it waits for its handshake forever) or one that sends garbage (read as a message length, exabytes)."""
    from polymem._optional import optional_import

    distributed = optional_import("distributed", extra="dask", purpose="--dask")
    deadline = time.monotonic() + timeout
    _check_greeting(address, timeout)
    got: dict[str, Any] = {}

    def run() -> None:
        try:
            got["client"] = distributed.Client(address, timeout=max(deadline - time.monotonic(), 1.0))
        except BaseException as e:  # noqa: BLE001 - any failure of the peer is reported as one line below
            got["error"] = e

    thread = threading.Thread(target=run, name="polymem-dask-connect", daemon=True)
    thread.start()
    thread.join(max(deadline - time.monotonic(), 1.0))
    if thread.is_alive():
        raise _not_a_scheduler(address, f"no handshake within {timeout:g} s")
    if "error" in got:
        e = got["error"]
        raise _not_a_scheduler(address, f"{type(e).__name__}: {str(e)[:200]}") from None
    return got["client"]


def _check_greeting(address: str, timeout: float) -> None:
    """For a tcp:// scheduler: connect, and read the length of its greeting (never more) within ``timeout``."""
    import socket
    import struct

    from distributed.comm.addressing import parse_address, parse_host_port

    try:
        scheme, loc = parse_address(address)
        if scheme != "tcp":
            return  # tls://, inproc://, ucx://, …: left to Dask (and the wall-clock guard of connect)
        host, port = parse_host_port(loc)
    except (ValueError, TypeError) as e:
        raise _not_a_scheduler(address, f"not an address ({e})") from None
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(timeout)
            head = s.recv(8, socket.MSG_WAITALL)
    except TimeoutError:
        raise _not_a_scheduler(address, f"it accepted the connection but sent nothing within {timeout:g} s (a "
                                        "scheduler greets first)") from None
    except OSError as e:
        raise _not_a_scheduler(address, e.strerror or type(e).__name__) from None
    size = struct.unpack("Q", head)[0] if len(head) == 8 else 0
    if not 0 < size <= _GREETING_MAX:
        seen = f"its first bytes were {head!r}" if head else "it closed the connection without a word"
        raise _not_a_scheduler(address, f"{seen}, not Dask's protocol")


def _not_a_scheduler(address: str, why: str) -> Exception:
    from polymem.errors import PolymemError

    return PolymemError(f"cannot connect to a Dask scheduler at {address!r}: {why}; check the address "
                        "(tcp://HOST:8786) and that a Dask scheduler is running there")
