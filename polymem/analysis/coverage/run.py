"""`coverage()`: tokenise each document with the target and the reference tokenizer, count, report.

Streaming: documents are read one at a time (see :mod:`polymem.corpus`) and, with ``workers > 1``, sent in
small batches through a bounded queue to worker processes (fork), each with its own counter; their partial
results are merged at the end. Memory: the largest document (times max_n, per worker) plus the corpus-wide
reference n-gram set of the occurrence-weighted metric (see :mod:`polymem.analysis.coverage.counter`).

Byte fidelity of both tokenizers is checked on every document as it goes (token bytes vs the text's UTF-8,
the definitions of :func:`polymem.check_fidelity`), without tokenising twice.

Document-initial n-grams are taken as the tokenizer produces them: a SentencePiece dummy prefix
(Mistral: "Hello" -> "▁Hello" = b" Hello") stays in the target's first token, as a model with that
tokenizer would see it, so those n-grams rarely match a reference without the prefix. The effect is at most
n n-grams per order per document; docs/coverage.md quantifies it.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
import traceback
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from polymem.hash.token_hashes import TokenHashes
from polymem.corpus import Corpus, Document, Skipped, as_documents
from polymem.analysis.coverage import _sets as _kernels
from polymem.analysis.coverage.counter import ExactCounter, HashCounter, HashPartial
from polymem.analysis.coverage.report import CoverageReport, TokenizerInfo
from polymem.errors import PolymemError, TokenizerError
from polymem.hash.spec import HashSpec
from polymem.tokenizers.base import pack_token_bytes
from polymem.hash.spec import check_max_n as _check_max_n

ProgressFn = Callable[[int, int], None]  # (documents done, UTF-8 bytes done), cumulative
_BATCH_BYTES = 1 << 18


def check_max_n(max_n: Any) -> int:
    """The target orders measured are 1..max_n (seed 002 uses 7)."""
    return _check_max_n(max_n, hint="seed 002 uses 7; pass e.g. --max-n 7")


class _Fidelity:
    """Byte fidelity of one tokenizer, accumulated per document (same definitions as check_fidelity)."""

    def __init__(self, tok: Any) -> None:
        self.dummy = bool(tok.dummy_prefix)
        tb = tok.all_token_bytes()
        self.buf, self.offsets = pack_token_bytes(tb)
        self.tok = tok
        self.docs = self.exact = self.prefixed = self.mismatched = 0
        self.first: str | None = None

    def add(self, doc: Document, ids: np.ndarray, data: bytes) -> None:
        self.docs += 1
        status, _ = _kernels.compare_token_bytes(ids, self.buf, self.offsets, np.frombuffer(data, dtype=np.uint8))
        if status == 0:
            self.exact += 1
        elif status == 1 and self.dummy:
            self.prefixed += 1
        else:
            self.mismatched += 1
            if self.first is None:
                from polymem.tokenizers.fidelity import describe_mismatch

                got = self.tok.decode_bytes(ids)
                want = b" " + data if self.dummy and got.startswith(b" ") else data
                self.first = f"{doc.id}: " + describe_mismatch(0, want, got).split(", ", 1)[1]

    def state(self) -> dict[str, Any]:
        return {"docs": self.docs, "exact": self.exact, "dummy_prefix": self.prefixed,
                "mismatched": self.mismatched, "first_mismatch": self.first}


def _merge_fidelity(states: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"docs": 0, "exact": 0, "dummy_prefix": 0, "mismatched": 0, "first_mismatch": None}
    for s in states:
        for k in ("docs", "exact", "dummy_prefix", "mismatched"):
            out[k] += s[k]
        out["first_mismatch"] = out["first_mismatch"] or s["first_mismatch"]
    out["faithful"] = out["mismatched"] == 0
    return out


class _Job:
    """Everything one process needs to count documents: tokenizers, caches, a counter, fidelity checks."""

    def __init__(self, target: Any, reference: Any, tcache: TokenHashes, rcache: TokenHashes, max_n: int,
                 exact: bool, occurrence: bool) -> None:
        self.target, self.reference = target, reference
        if exact:
            self.counter: Any = ExactCounter(target.all_token_bytes(), reference.all_token_bytes(), max_n,
                                             occurrence=occurrence)
        else:
            self.counter = HashCounter(tcache, rcache, max_n, occurrence=occurrence)
        self.fid_t, self.fid_r = _Fidelity(target), _Fidelity(reference)
        self.skipped: list[Skipped] = []
        self.nbytes = 0
        self.encode_s = self.count_s = 0.0

    def run(self, doc: Document) -> int:
        """Count one document; return its UTF-8 size (0 when skipped)."""
        if not doc.text:
            self.skipped.append(Skipped(doc.source, "empty document: no text"))
            return 0
        t0 = time.perf_counter()
        try:
            ti = self.target.encode(doc.text)
            ri = self.reference.encode(doc.text)
        except TokenizerError as e:
            self.skipped.append(Skipped(doc.source, f"tokenizer error: {e}"))
            return 0
        t1 = time.perf_counter()
        data = doc.text.encode("utf-8")
        self.counter.add(ti, ri)
        self.fid_t.add(doc, ti, data)
        self.fid_r.add(doc, ri, data)
        self.count_s += time.perf_counter() - t1
        self.encode_s += t1 - t0
        self.nbytes += len(data)
        return len(data)

    def result(self, *, in_process: bool = False, keys: bool = True) -> dict[str, Any]:
        return {"partial": self.counter.partial(in_process=in_process, keys=keys), "fid_t": self.fid_t.state(), "fid_r": self.fid_r.state(),
                "skipped": self.skipped, "bytes": self.nbytes, "encode_s": self.encode_s, "count_s": self.count_s}


def coverage(
    target: Any,
    reference: Any,
    texts: Iterable[str | Document] | Corpus,
    max_n: int = 7,
    *,
    exact_bytes: bool = False,
    occurrence: bool = True,
    workers: int = 1,
    spec: HashSpec | None = None,
    progress: ProgressFn | None = None,
) -> CoverageReport:
    """How much of ``target``'s n-gram memory a table written with ``reference`` can serve (docs/coverage.md).

    target, reference: anything :func:`polymem.load_tokenizer` accepts ("mistral-v1", "cl100k_base", a path,
    a Tokenizer). texts: strings, :class:`polymem.corpus.Document` objects, or a :class:`polymem.corpus.Corpus`
    (whose skipped inputs then appear in the report). max_n: target (and reference) orders 1..max_n.
    exact_bytes: compare byte strings instead of 64-bit hashes (slow; the reference path).
    occurrence: also compute the corpus-level occurrence-weighted coverage (keeps the corpus's distinct
    reference n-gram hashes in memory). workers: processes counting in parallel (fork; 1 = in this process).
    """
    from polymem.tokenizers import load_tokenizer

    t_start = time.perf_counter()
    max_n = check_max_n(max_n)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise PolymemError(f"workers={workers!r} must be an integer ≥ 1 (processes counting in parallel)")
    if isinstance(texts, (str, bytes)):
        raise PolymemError(
            "texts should be an iterable of documents but got one str; wrap it in a list: coverage(t, r, [text])"
        )
    spec = spec or HashSpec()
    tok_t, tok_r = load_tokenizer(target), load_tokenizer(reference)
    tcache = TokenHashes.build(tok_t, spec) if not exact_bytes else None
    rcache = TokenHashes.build(tok_r, spec) if not exact_bytes else None
    docs_iter = iter(texts) if isinstance(texts, Corpus) else as_documents(texts)
    read_s = [0.0]

    def timed_docs() -> Iterable[Document]:
        while True:
            t0 = time.perf_counter()
            try:
                doc = next(docs_iter)
            except StopIteration:
                return
            finally:
                read_s[0] += time.perf_counter() - t0
            yield doc

    args = (tok_t, tok_r, tcache, rcache, max_n, exact_bytes, occurrence)
    if workers == 1 or not _can_fork():
        results = [_run_inline(_Job(*args), timed_docs(), progress)]
        workers = 1
    else:
        results = _run_pool(args, timed_docs(), progress, workers)

    skipped = [s for r in results for s in r["skipped"]]
    if isinstance(texts, Corpus):
        skipped = list(texts.skipped) + skipped
    counter_cls = ExactCounter if exact_bytes else HashCounter
    tally = counter_cls.finish([r["partial"] for r in results])
    if tally.docs == 0:
        reasons = "; ".join(f"{s.source}: {s.reason}" for s in skipped[:3]) or "the input was empty"
        raise PolymemError(
            f"empty corpus: no documents to measure ({len(skipped)} skipped: {reasons}). Pass text files, "
            "directories of .txt/.md/.jsonl(.gz) files, or JSONL with a text field (--text-field)"
        )

    def info(tok: Any) -> TokenizerInfo:
        return TokenizerInfo(name=tok.name, fingerprint=tok.fingerprint, vocab_size=int(tok.vocab_size),
                             dummy_prefix=bool(tok.dummy_prefix), lossy=bool(tok.lossy))

    return CoverageReport.from_tally(
        tally, occurrence=occurrence,
        target=info(tok_t), reference=info(tok_r),
        method="exact-bytes" if exact_bytes else "hash",
        bytes=sum(r["bytes"] for r in results),
        fidelity={"target": _merge_fidelity([r["fid_t"] for r in results]),
                  "reference": _merge_fidelity([r["fid_r"] for r in results])},
        skipped=[{"source": s.source, "reason": s.reason} for s in skipped],
        replaced_utf8=texts.replaced if isinstance(texts, Corpus) else 0,
        elapsed_s=time.perf_counter() - t_start, workers=workers,
        timing={"encode_s": sum(r["encode_s"] for r in results), "count_s": sum(r["count_s"] for r in results),
                "read_s": read_s[0]},
        hash_spec="" if exact_bytes else spec.spec_id,
    )


def _run_inline(job: _Job, docs: Iterable[Document], progress: ProgressFn | None) -> dict[str, Any]:
    n = b = 0
    for doc in docs:
        b += job.run(doc)
        n += 1
        if progress is not None:
            progress(n, b)
    return job.result(in_process=True)


# ------------------------------------------------------------------------------------------- worker pool
def _can_fork() -> bool:
    return "fork" in mp.get_all_start_methods()


def _worker(args: tuple[Any, ...], wid: int, tasks: Any, inbox: Any, results: Any) -> None:  # pragma: no cover
    """Count batches from `tasks` until None; send the result. A hash counter then stays to answer lookups of
    the other workers' unresolved n-grams in its reference set (arrays on `inbox`) until None."""
    try:
        job = _Job(*args)
        while True:
            batch = tasks.get()
            if batch is None:
                break
            b = sum(job.run(doc) for doc in batch)
            results.put(("progress", len(batch), b))
        two_phase = isinstance(job.counter, HashCounter)
        results.put(("done", wid, job.result(keys=not two_phase)))
        while two_phase:
            keys = inbox.get()
            if keys is None:
                break
            results.put(("found", wid, job.counter.lookup(keys)))
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises
        results.put(("error", traceback.format_exc()))


def _run_pool(args: tuple[Any, ...], docs: Iterable[Document], progress: ProgressFn | None,
              workers: int) -> list[dict[str, Any]]:
    """Fork `workers` processes (they inherit the loaded tokenizers and caches), feed them batches of
    documents through a bounded queue, and collect their partial results.

    Hash counters settle the occurrence-weighted pass without shipping their reference sets: each worker
    first resolves its own pending n-grams, then the parent sends every worker the others' unresolved ones to
    look up in parallel; an entry is a hit if any worker holds it.
    """
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    ctx = mp.get_context("fork")
    tasks = ctx.Queue(maxsize=2 * workers)
    inboxes = [ctx.Queue() for _ in range(workers)]
    results = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(args, w, tasks, inboxes[w], results), daemon=True)
             for w in range(workers)]
    for p in procs:
        p.start()
    done: dict[int, dict[str, Any]] = {}
    found: dict[int, np.ndarray] = {}
    state = {"n": 0, "b": 0}

    def drain(block: bool) -> None:
        while True:
            try:
                msg = results.get(timeout=0.2) if block else results.get_nowait()
            except queue.Empty:
                if block and any(p.exitcode not in (None, 0) for p in procs):
                    raise RuntimeError("a coverage worker process died (exit codes "
                                       f"{[p.exitcode for p in procs]}); rerun with --workers 1") from None
                return
            if msg[0] == "progress":
                state["n"] += msg[1]
                state["b"] += msg[2]
                if progress is not None:
                    progress(state["n"], state["b"])
            elif msg[0] == "done":
                done[msg[1]] = msg[2]
            elif msg[0] == "found":
                found[msg[1]] = msg[2]
            else:
                raise RuntimeError(f"a coverage worker failed:\n{msg[1]}")
            if block:
                return

    def put(item: Any) -> None:
        while True:
            try:
                tasks.put(item, timeout=0.2)
                return
            except queue.Full:
                drain(block=False)
                if any(p.exitcode not in (None, 0) for p in procs):
                    drain(block=False)
                    raise RuntimeError(f"a coverage worker process died (exit codes {[p.exitcode for p in procs]})")

    try:
        batch: list[Document] = []
        size = 0
        for doc in docs:
            batch.append(doc)
            size += len(doc.text)
            if size >= _BATCH_BYTES:
                put(batch)
                batch, size = [], 0
                drain(block=False)
        if batch:
            put(batch)
        for _ in procs:
            put(None)
        while len(done) < workers:
            drain(block=True)
        partials = [done[w]["partial"] for w in range(workers)]
        if all(isinstance(p, HashPartial) for p in partials):
            # worker w looks up everyone else's unresolved n-grams
            for w in range(workers):
                others = [partials[v].pend_h for v in range(workers) if v != w]
                inboxes[w].put(np.concatenate(others) if others else np.empty(0, np.uint64))
            while len(found) < workers:
                drain(block=True)
            sizes = [p.pend_h.shape[0] for p in partials]
            hit = [np.zeros(k, dtype=bool) for k in sizes]
            for w in range(workers):
                off = 0
                for v in range(workers):
                    if v != w:
                        hit[v] |= found[w][off:off + sizes[v]]
                        off += sizes[v]
            for p, h in zip(partials, hit):
                HashCounter.settle(p, h)
        for q in inboxes:
            q.put(None)
    finally:
        for p in procs:
            p.join(timeout=5 if len(done) == workers else 0.1)
            if p.is_alive():
                p.terminate()
                p.join()
    return [done[w] for w in range(workers)]
