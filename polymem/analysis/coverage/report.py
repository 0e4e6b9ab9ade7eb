"""`CoverageReport`: the result of :func:`polymem.coverage`, its JSON form (format ``polymem.coverage-report``
v1, schema in docs/coverage.md), a CSV table and a Fig.-2-style PNG.

What this module does not do: tokenise or count (see :mod:`polymem.analysis.coverage.run` and ``.counter``).
"""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from polymem._io import atomic_write_text
from polymem.analysis.coverage.counter import Tally
from polymem.errors import FormatError

REPORT_FORMAT = "polymem.coverage-report"
REPORT_VERSION = 1


def _ink(rgba: tuple[float, ...]) -> str:
    """Black or white, whichever reads better on ``rgba`` (relative luminance, ITU-R BT.709 weights)."""
    r, g, b = rgba[:3]
    return "black" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.45 else "white"


@dataclass(frozen=True)
class TokenizerInfo:
    name: str
    fingerprint: str
    vocab_size: int
    dummy_prefix: bool
    lossy: bool


@dataclass(frozen=True)
class CoverageReport:
    """Coverage of a target tokenizer's n-grams by a reference (donor) tokenizer's, per target order n.

    Lists are indexed by n-1 (n = 1..max_n); ``by_reference_n[n-1][m-1]`` is the share of target n-grams whose
    smallest matching reference order is m (each row sums to ``per_doc_mean[n-1]``). A share is None where
    no document has a target n-gram of that order. Definitions: docs/coverage.md.
    """

    target: TokenizerInfo
    reference: TokenizerInfo
    max_n: int
    method: str  # "hash" (64-bit byte hashes) or "exact-bytes" (byte strings)
    docs: int
    bytes: int  # UTF-8 bytes of the documents counted
    tokens: dict[str, int]  # {"target": ..., "reference": ...}
    per_doc_mean: list[float | None]
    pooled: list[float | None]
    by_reference_n: list[list[float | None]]
    by_reference_n_pooled: list[list[float | None]]
    occurrence_weighted: list[float | None] | None  # None when the corpus-level pass was turned off
    xor_baseline: list[float | None]  # per_doc_mean under Engram's XOR token-id hash (same order only)
    xor_pooled: list[float | None]
    unique_target_ngrams: list[int]  # Σ over documents of |U_n(d)|
    target_positions: list[int]  # valid target n-gram occurrences
    docs_with_order: list[int]  # documents with at least one target n-gram of order n
    fidelity: dict[str, dict[str, Any]]  # {"target": FidelityReport fields, "reference": ...}
    skipped: list[dict[str, str]]  # [{"source", "reason"}]
    replaced_utf8: int  # documents whose invalid UTF-8 was replaced by U+FFFD
    elapsed_s: float
    workers: int
    timing: dict[str, float] = field(default_factory=dict)  # {"encode_s", "count_s", "read_s"} summed over workers
    hash_spec: str = ""
    format: str = REPORT_FORMAT
    version: int = REPORT_VERSION

    # -------------------------------------------------------------------------------------------- build
    @classmethod
    def from_tally(cls, tally: Tally, *, occurrence: bool, **kw: Any) -> "CoverageReport":
        def ratio(a: np.ndarray, b: np.ndarray) -> list[Any]:
            return [None if d == 0 else float(x) / float(d) for x, d in zip(np.ravel(a), np.ravel(b))]

        N = tally.max_n
        by_ref = [ratio(tally.share_by_ref[n], np.full(N, tally.docs_with[n])) for n in range(N)]
        by_ref_pooled = [ratio(tally.hits[n], np.full(N, tally.uniq[n])) for n in range(N)]
        return cls(
            max_n=N, docs=tally.docs,
            tokens={"target": int(tally.tokens_target), "reference": int(tally.tokens_reference)},
            per_doc_mean=ratio(tally.share, tally.docs_with),
            pooled=ratio(tally.hits.sum(axis=1), tally.uniq),
            by_reference_n=by_ref, by_reference_n_pooled=by_ref_pooled,
            occurrence_weighted=ratio(tally.pos_hits, tally.positions) if occurrence else None,
            xor_baseline=ratio(tally.xor_share, tally.xor_docs_with),
            xor_pooled=ratio(tally.xor_hits, tally.xor_uniq),
            unique_target_ngrams=[int(x) for x in tally.uniq],
            target_positions=[int(x) for x in tally.positions],
            docs_with_order=[int(x) for x in tally.docs_with],
            **kw,
        )

    # -------------------------------------------------------------------------------------------- JSON
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return {"format": d.pop("format"), "version": d.pop("version"), **d}

    def to_json(self, path: str | os.PathLike[str] | None = None) -> str:
        text = json.dumps(self.to_dict(), indent=2)
        if path is not None:
            atomic_write_text(path, text)
        return text

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CoverageReport":
        if d.get("format") != REPORT_FORMAT or d.get("version") != REPORT_VERSION:
            raise FormatError(
                f"not a coverage report: format {d.get('format')!r} version {d.get('version')!r}; this polymem "
                f"reads {REPORT_FORMAT!r} version {REPORT_VERSION}"
            )
        d = dict(d)
        d["target"] = TokenizerInfo(**d["target"])
        d["reference"] = TokenizerInfo(**d["reference"])
        return cls(**d)

    # -------------------------------------------------------------------------------------------- CSV
    def csv_rows(self) -> list[dict[str, Any]]:
        """One row per target order n: the headline metrics and the by-reference-order breakdown."""
        rows = []
        for i in range(self.max_n):
            row: dict[str, Any] = {
                "n": i + 1,
                "per_doc_mean": self.per_doc_mean[i],
                "pooled": self.pooled[i],
                "occurrence_weighted": None if self.occurrence_weighted is None else self.occurrence_weighted[i],
                "xor_baseline": self.xor_baseline[i],
                "xor_pooled": self.xor_pooled[i],
                "unique_target_ngrams": self.unique_target_ngrams[i],
                "target_positions": self.target_positions[i],
                "docs_with_order": self.docs_with_order[i],
            }
            for m in range(self.max_n):
                row[f"by_reference_n{m + 1}"] = self.by_reference_n[i][m]
            rows.append(row)
        return rows

    def to_csv(self, path: str | os.PathLike[str] | None = None) -> str:
        buf = io.StringIO()
        rows = self.csv_rows()
        w = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({k: "" if v is None else (f"{v:.6f}" if isinstance(v, float) else v) for k, v in r.items()})
        if path is not None:
            atomic_write_text(path, buf.getvalue())
        return buf.getvalue()

    # -------------------------------------------------------------------------------------------- plot
    def plot(self, path: str | os.PathLike[str]) -> Path:
        """A PNG like Fig. 2 of the Tokenizer-Agnostic Engram paper: one stacked bar per target order n, stacked by the smallest reference
        order m at which the n-gram was found (per-document mean), with the XOR baseline and the
        occurrence-weighted coverage as markers."""
        from polymem._optional import pyplot

        plt = pyplot("coverage --plot")

        N = self.max_n
        xs = np.arange(1, N + 1)
        fig, ax = plt.subplots(figsize=(0.8 * N + 4.5, 4.2), dpi=120)
        bottom = np.zeros(N)
        cmap = plt.get_cmap("viridis", N)
        stack = np.array([[self.by_reference_n[n][m] or 0.0 for n in range(N)] for m in range(N)])  # [m, n]
        for m in range(N):
            if stack[m].sum() == 0:
                continue
            ax.bar(xs, stack[m], bottom=bottom, color=cmap(m), label=f"ref n={m + 1}", edgecolor="white",
                   linewidth=0.5)
            bottom += stack[m]
        starts = np.cumsum(stack, axis=0) - stack  # [m, n] where each segment begins
        for n in range(N):
            if self.per_doc_mean[n] is not None:  # the label sits in the segment under y = top - 0.03
                under = int(np.flatnonzero((starts[:, n] <= bottom[n] - 0.03) & (stack[:, n] > 0))[-1:].sum())
                ax.text(xs[n], bottom[n] - 0.01, f"{self.per_doc_mean[n]:.2f}", ha="center", va="top", fontsize=8,
                        color=_ink(cmap(under)), fontweight="bold")
        if self.occurrence_weighted is not None:
            ax.plot(xs, [np.nan if v is None else v for v in self.occurrence_weighted], "k^--", ms=5,
                    lw=0.8, label="occurrence-weighted")
        ax.plot(xs, [np.nan if v is None else v for v in self.xor_baseline], "rx:", ms=6, lw=0.8,
                label="XOR id hash")
        ax.set_xticks(xs)
        ax.set_xlabel(f"target n ({self.target.name})")
        ax.set_ylabel("share of unique target n-grams")
        ax.set_ylim(0, 1.08)
        ax.set_title(f"{self.target.name} n-grams found in {self.reference.name} n-grams ({self.docs} docs)",
                     fontsize=10)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        fig.tight_layout()
        from polymem._optional import save_figure

        return save_figure(fig, path)

