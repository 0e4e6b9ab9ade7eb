"""What counting hands back, typed: one tokenizer's byte fidelity over the documents counted (:class:`Fidelity`)
and one partition's result (:class:`PartitionResult`: its tally, fidelity, skips, sizes and times, and where
its occurrence-pass keys are). :mod:`polymem.analysis.coverage.dist` makes them on a worker (or a thread),
:mod:`polymem.analysis.coverage.run` adds them up into a :class:`~polymem.analysis.coverage.report.CoverageReport`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polymem.analysis.coverage.counter import OccurrenceOutput, Tally
from polymem.analysis.coverage.report import TokenizerInfo
from polymem.corpus import Skipped


@dataclass
class Fidelity:
    """Byte fidelity of one tokenizer's ids (the definitions of :func:`polymem.check_fidelity`): documents
    checked, how many spell the text exactly, with a dummy-prefix space, or otherwise (the first such one
    described)."""

    docs: int = 0
    exact: int = 0
    dummy_prefix: int = 0
    mismatched: int = 0
    first_mismatch: str | None = None

    @property
    def faithful(self) -> bool:
        return self.mismatched == 0

    @classmethod
    def merge(cls, parts: Iterable[Fidelity | None]) -> Fidelity:
        """The sum of ``parts`` (None: a result with nothing counted), the first mismatch of the first part
        that has one."""
        out = cls()
        for p in parts:
            if p is None:
                continue
            out.docs += p.docs
            out.exact += p.exact
            out.dummy_prefix += p.dummy_prefix
            out.mismatched += p.mismatched
            out.first_mismatch = out.first_mismatch or p.first_mismatch
        return out

    def as_dict(self) -> dict[str, Any]:
        """The report's form (``CoverageReport.fidelity[side]``, JSON ``fidelity.target``): these keys, in this
        order."""
        return {"docs": self.docs, "exact": self.exact, "dummy_prefix": self.dummy_prefix,
                "mismatched": self.mismatched, "first_mismatch": self.first_mismatch, "faithful": self.faithful}


@dataclass
class PartitionResult:
    """One counting task's summary (small: it travels back from a Dask worker). The driver's own reading time
    comes as a result with nothing counted (``tally`` None, ``index`` -1)."""

    tally: Tally | None
    fid_t: Fidelity | None  # the target's byte fidelity over the partition's documents
    fid_r: Fidelity | None  # ... and the reference's
    skipped: list[Skipped]
    bytes: int  # UTF-8 bytes of the documents counted
    encode_s: float
    count_s: float
    read_s: float
    index: int = -1  # the partition's number; -1: no partition (the driver's reading, the exact-bytes path)
    replaced: int = 0  # documents whose invalid UTF-8 was replaced (read by the task itself)
    ref_keys: int = 0  # distinct-per-document reference keys handed to the occurrence pass
    pending: int = 0  # target entries its own documents' references did not hold
    pid: int = 0  # the process that counted it
    info: tuple[TokenizerInfo, TokenizerInfo] | None = None  # what the task loaded (target, reference)
    occ: OccurrenceOutput | None = field(default=None, repr=False)  # kept in memory (in-process runners)...
    off: np.ndarray | None = field(default=None, repr=False)  # ...or written to files: int64 [2, buckets + 1]

    @classmethod
    def driver(cls, read_s: float) -> PartitionResult:
        """Driver-side time (reading documents into partitions), as a result with nothing counted."""
        return cls(tally=None, fid_t=None, fid_r=None, skipped=[], bytes=0, encode_s=0.0, count_s=0.0,
                   read_s=read_s)

    def take_occ(self) -> OccurrenceOutput | None:
        """The occurrence output kept in memory, handed over once (the result no longer holds it)."""
        occ, self.occ = self.occ, None
        return occ
