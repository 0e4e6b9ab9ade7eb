"""Cross-tokenizer n-gram coverage (Tokenizer-Agnostic Engram Module, Table 2 / Fig. 2): how many of a target tokenizer's
n-grams a donor (reference) tokenizer's table was ever written with, compared by bytes.

    >>> report = polymem.coverage("mistral-v1", "cl100k_base", texts, max_n=7)
    >>> report.per_doc_mean, report.occurrence_weighted, report.xor_baseline

Modules: ``run`` (the :func:`coverage` driver and its runners: in this process, on threads, on Dask), ``dist``
(the partition tasks and the occurrence pass), ``counter`` (hash and exact-bytes counters), ``report``
(:class:`CoverageReport`, JSON/CSV/PNG), ``_results`` (a partition's result, byte fidelity), ``_job`` (counting in
one process), and the numba kernels: ``_sets`` (the per-document scan), ``_buckets`` (the occurrence pass's
bucketed key sets), ``_fidelity`` (byte fidelity).
"""

from polymem.analysis.coverage.counter import ExactCounter, HashCounter, Tally
from polymem.analysis.coverage.report import REPORT_FORMAT, REPORT_VERSION, CoverageReport, TokenizerInfo
from polymem.analysis.coverage.run import check_max_n, coverage

__all__ = [
    "REPORT_FORMAT", "REPORT_VERSION", "CoverageReport", "ExactCounter", "HashCounter", "Tally", "TokenizerInfo",
    "check_max_n", "coverage",
]

