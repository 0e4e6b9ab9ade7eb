"""Cross-tokenizer n-gram coverage (Tokenizer-Agnostic Engram Module, Table 2 / Fig. 2): how many of a target tokenizer's
n-grams a donor (reference) tokenizer's table was ever written with, compared by bytes.

    >>> report = polymem.coverage("mistral-v1", "cl100k_base", texts, max_n=7)
    >>> report.per_doc_mean, report.occurrence_weighted, report.xor_baseline

Modules: ``run`` (the :func:`coverage` driver, workers, fidelity), ``counter`` (hash and exact-bytes counters),
``report`` (:class:`CoverageReport`, JSON/CSV/PNG), ``_sets`` (numba hash sets).
"""

from polymem.analysis.coverage.counter import ExactCounter, HashCounter, Tally
from polymem.analysis.coverage.report import REPORT_FORMAT, REPORT_VERSION, CoverageReport, TokenizerInfo
from polymem.analysis.coverage.run import check_max_n, coverage

__all__ = [
    "REPORT_FORMAT", "REPORT_VERSION", "CoverageReport", "ExactCounter", "HashCounter", "Tally", "TokenizerInfo",
    "check_max_n", "coverage",
]

