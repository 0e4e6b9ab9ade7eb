"""Counting documents in one process: the two tokenizers, their token hashes, a counter and the byte-fidelity
checks (:class:`_Job`). :mod:`polymem.analysis.coverage.run` runs one in this process (or one per thread);
:mod:`polymem.analysis.coverage.dist` runs one per partition task on a worker.
"""

from __future__ import annotations

import sys
import time
import weakref
from typing import Any

import numpy as np

from polymem.analysis.coverage import _fidelity as _kernels
from polymem.analysis.coverage._results import Fidelity
from polymem.analysis.coverage.counter import ExactCounter, HashCounter
from polymem.analysis.coverage.report import TokenizerInfo
from polymem.corpus import Document, Skipped
from polymem.errors import TokenizerError
from polymem.hash.token_hashes import TokenHashes
from polymem.tokenizers.base import pack_token_bytes

BATCH_MB = 1.0  # documents are tokenized, then counted, in batches of about this many MB of text (_Job.run_batch)


class _Fidelity:
    """Byte fidelity of one tokenizer, accumulated per document (same definitions as check_fidelity)."""

    def __init__(self, tok: Any) -> None:
        self.dummy = bool(tok.dummy_prefix)
        self.tok = tok
        self.docs = self.exact = self.prefixed = self.mismatched = 0
        self.first: str | None = None

    def add(self, doc: Document, ids: np.ndarray, data: bytes, padded: np.ndarray | None = None,
            status: int = -1) -> None:
        """One document's ids against its UTF-8 ``data``; ``padded`` (optional): uint8 of data followed by
        _kernels.PAD bytes, for the 8-bytes-at-a-time compare (the same answer, ~3x faster). ``status``: 0 or 1
        when already known from the hashes (:func:`_fidelity.stream_fidelity`); else the bytes are compared."""
        self.docs += 1
        if status < 0:  # the token bytes themselves (packed once per tokenizer, only when needed)
            buf, offsets = _packed(self.tok)  # buf ends with _kernels.PAD bytes beyond the token bytes
            if padded is not None and _LITTLE:
                status, _ = _kernels.compare_token_words(ids, buf, offsets, padded, len(data), int(self.dummy))
            else:
                status, _ = _kernels.compare_token_bytes(ids, buf, offsets, np.frombuffer(data, dtype=np.uint8))
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

    def state(self) -> Fidelity:
        return Fidelity(docs=self.docs, exact=self.exact, dummy_prefix=self.prefixed, mismatched=self.mismatched,
                        first_mismatch=self.first)


_PACKED: "weakref.WeakKeyDictionary[Any, tuple[np.ndarray, np.ndarray]]" = weakref.WeakKeyDictionary()


def _packed(tok: Any) -> tuple[np.ndarray, np.ndarray]:
    """The tokenizer's byte map packed for the kernels, once per tokenizer object and process (not per
    partition: packing a 100k vocabulary costs ~0.1 s)."""
    got = _PACKED.get(tok)
    if got is None:
        buf, offsets = pack_token_bytes(tok.all_token_bytes())
        got = _PACKED[tok] = (np.concatenate([buf, np.zeros(_kernels.PAD, dtype=np.uint8)]), offsets)
    return got


_LITTLE = sys.byteorder == "little"  # compare_token_words' masks assume little-endian words
_PADDING = bytes(_kernels.PAD)


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
        # byte fidelity from the token hashes the counting has just used, when they hash bytes as they are
        # (no normalizer) and the ids are the tokenizers' own (checked by the counter: in range)
        self.hashed_fidelity = None
        if not exact and tcache.spec == rcache.spec and tcache.spec.normalizer == "none":
            spec = tcache.spec
            self.hashed_fidelity = (tcache, rcache, np.asarray(spec.effective_byte_table, dtype=np.uint64),
                                    np.uint64(spec.base))
        self.skipped: list[Skipped] = []
        self.nbytes = 0
        self.encode_s = self.count_s = 0.0

    def run(self, doc: Document) -> int:
        """Count one document; return its UTF-8 size (0 when skipped)."""
        return self.run_batch([doc])[0]

    def run_batch(self, docs: list[Document]) -> list[int]:
        """Count a batch of documents; return their UTF-8 sizes (0 for those skipped). Each tokenizer encodes
        the whole batch, then the documents are counted one after the other: each stage runs with its own
        tables in the CPU caches rather than evicting the other's at every document (measured on kerneldocs:
        the counting besides tokenizing ~-0.5 CPU-s on the benchmark VM of docs/benchmarks/scaleout.md). A document a
        tokenizer rejects is skipped, as in a document-by-document loop."""
        t0 = time.perf_counter()
        skips: dict[int, Skipped] = {}  # by position in the batch, so they are listed in document order
        ids: list[Any] = []
        for k, doc in enumerate(docs):
            if not doc.text:
                skips[k] = Skipped(doc.source, "empty document: no text")
                ids.append(None)
                continue
            try:
                ids.append(self.target.encode(doc.text))
            except TokenizerError as e:
                skips[k] = Skipped(doc.source, f"tokenizer error: {e}")
                ids.append(None)
        pairs: list[Any] = []
        for k, (doc, ti) in enumerate(zip(docs, ids)):
            if ti is None:
                pairs.append(None)
                continue
            try:
                pairs.append((ti, self.reference.encode(doc.text)))
            except TokenizerError as e:
                skips[k] = Skipped(doc.source, f"tokenizer error: {e}")
                pairs.append(None)
        self.encode_s += time.perf_counter() - t0
        self.skipped.extend(skips[k] for k in sorted(skips))
        return [0 if p is None else self._count(doc, *p) for doc, p in zip(docs, pairs)]

    def _count(self, doc: Document, ti: Any, ri: Any) -> int:
        t1 = time.perf_counter()
        data = doc.text.encode("utf-8")
        self.counter.add(ti, ri)
        st_t = st_r = -1
        if (self.hashed_fidelity is not None and isinstance(ti, np.ndarray) and isinstance(ri, np.ndarray)
                and ti.dtype == np.int64 and ri.dtype == np.int64):  # in range: the counter checked them
            tc, rc, table, base = self.hashed_fidelity
            st_t, st_r = _kernels.stream_fidelity(ti, tc.C, tc.P, ri, rc.C, rc.P, np.frombuffer(data, np.uint8),
                                                  table, base)
        padded = np.frombuffer(data + _PADDING, dtype=np.uint8) if st_t < 0 or st_r < 0 else None
        self.fid_t.add(doc, ti, data, padded, st_t)
        self.fid_r.add(doc, ri, data, padded, st_r)
        self.count_s += time.perf_counter() - t1
        self.nbytes += len(data)
        return len(data)


def _info(tok: Any) -> TokenizerInfo:
    return TokenizerInfo(name=tok.name, fingerprint=tok.fingerprint, vocab_size=int(tok.vocab_size),
                         dummy_prefix=bool(tok.dummy_prefix), lossy=bool(tok.lossy))
