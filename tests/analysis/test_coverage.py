"""polymem.coverage: hand-checked cases, hash path == exact-bytes path, real tokenizers, workers, errors, CLI."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import polymem
from polymem.cli.app import app
from polymem.corpus import Corpus, Document
from polymem.analysis.coverage import CoverageReport, ExactCounter, HashCounter
from polymem.errors import PolymemError
from polymem.hash.spec import GOLDEN
from polymem.tokenizers import Tokenizer, load_tokenizer

from conftest import generated_text, sample_text

REPO = Path(__file__).resolve().parents[2]
METRICS = ("per_doc_mean", "pooled", "occurrence_weighted", "xor_baseline", "xor_pooled")


class Greedy(Tokenizer):
    """A toy tokenizer: greedy longest match over a small vocabulary of strings (ids = list positions)."""

    def __init__(self, vocab: Sequence[str], name: str = "toy") -> None:
        self.vocab = list(vocab)
        self.longest = max(len(v) for v in self.vocab)
        super().__init__(name=name, family="bytes", vocab_size=len(self.vocab), dummy_prefix=False, lossy=False)

    def _encode(self, text: str) -> list[int]:
        ids, i = [], 0
        index = {v: k for k, v in enumerate(self.vocab)}
        while i < len(text):
            for L in range(min(self.longest, len(text) - i), 0, -1):
                if text[i:i + L] in index:
                    ids.append(index[text[i:i + L]])
                    i += L
                    break
            else:
                raise ValueError(f"{text[i]!r} is not in the toy vocabulary")
        return ids

    def _compute_all_token_bytes(self) -> list[bytes | None]:
        return [v.encode() for v in self.vocab]


def rounded(values: Sequence[float | None] | None, nd: int = 4) -> list[float | None] | None:
    return None if values is None else [None if v is None else round(v, nd) for v in values]


def close(a: CoverageReport, b: CoverageReport, nd: int = 4) -> None:
    for k in METRICS:
        assert rounded(getattr(a, k), nd) == rounded(getattr(b, k), nd), k
    for n in range(a.max_n):
        assert rounded(a.by_reference_n[n], nd) == rounded(b.by_reference_n[n], nd)
    assert a.unique_target_ngrams == b.unique_target_ngrams
    assert a.target_positions == b.target_positions
    assert a.tokens == b.tokens and a.docs == b.docs


# ------------------------------------------------------------------------------------------- hand-checked
# The Tokenizer-Agnostic Engram paper's example: T_A = {0:'aa', 1:'a', 2:'b'}, T_B = {0:'a', 1:'b'}; "aabb" -> A: (aa, b, b), B: (a, a, b, b).
#
# Target A, reference B, max_n = 4. Reference n-grams (any order): a b | aa ab bb | aab abb | aabb.
#   n=1: {aa, b}        aa = B 2-gram, b = B 1-gram                         -> 2/2 = 1.0; by m: [1/2, 1/2, 0, 0]
#   n=2: {aab, bb}      aab = B 3-gram, bb = B 2-gram                        -> 1.0;      by m: [0, 1/2, 1/2, 0]
#   n=3: {aabb}         B 4-gram (seed: "the 3-gram of T_A is the 4-gram of T_B") -> 1.0; by m: [0, 0, 0, 1]
#   n=4: none (3 tokens)                                                     -> None
#   XOR (ids, same order): A 1-grams {0, 2} vs B 1-grams {0, 1}: id 0 matches ('aa' vs 'a', an accident) -> 1/2;
#   A 2-grams (0,2), (2,2) vs B (0,0), (0,1), (1,1): none -> 0; n=3: 0.
# Target B, reference A. Reference n-grams: aa b | aab bb | aabb.
#   n=1: {a, b}         b only                        -> 1/2;  by m: [1/2, 0, 0, 0]
#   n=2: {aa, ab, bb}   aa (A 1-gram), bb (A 2-gram)  -> 2/3;  by m: [1/3, 1/3, 0, 0]
#   n=3: {aab, abb}     aab (A 2-gram)                -> 1/2;  by m: [0, 1/2, 0, 0]
#   n=4: {aabb}         A 3-gram                      -> 1.0;  by m: [0, 0, 1, 0]
#   occurrence-weighted, positions: n=1 a a b b -> 2/4; n=2 aa ab bb -> 2/3; n=3 aab abb -> 1/2; n=4 -> 1.
#   XOR: B 1-gram ids {0, 1} vs A {0, 2}: id 0 ('a' vs 'aa') -> 1/2; higher orders 0.
TA, TB = Greedy(["aa", "a", "b"], "T_A"), Greedy(["a", "b"], "T_B")


@pytest.mark.parametrize("exact", [False, True], ids=["hash", "exact-bytes"])
def test_seed_aabb_example(exact: bool) -> None:
    r = polymem.coverage(TA, TB, ["aabb"], max_n=4, exact_bytes=exact)
    assert r.per_doc_mean == [1.0, 1.0, 1.0, None]
    assert r.by_reference_n == [[0.5, 0.5, 0, 0], [0, 0.5, 0.5, 0], [0, 0, 0, 1.0], [None] * 4]
    assert r.occurrence_weighted == [1.0, 1.0, 1.0, None]
    assert r.xor_baseline == [0.5, 0.0, 0.0, None]
    assert r.tokens == {"target": 3, "reference": 4} and r.unique_target_ngrams == [2, 2, 1, 0]

    r = polymem.coverage(TB, TA, ["aabb"], max_n=4, exact_bytes=exact)
    assert rounded(r.per_doc_mean) == rounded([1 / 2, 2 / 3, 1 / 2, 1.0])
    assert rounded(r.pooled) == rounded([1 / 2, 2 / 3, 1 / 2, 1.0])
    assert [rounded(row) for row in r.by_reference_n] == [
        rounded(row) for row in ([0.5, 0, 0, 0], [1 / 3, 1 / 3, 0, 0], [0, 0.5, 0, 0], [0, 0, 1.0, 0])
    ]
    assert rounded(r.occurrence_weighted) == rounded([2 / 4, 2 / 3, 1 / 2, 1.0])
    assert r.xor_baseline == [0.5, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("exact", [False, True], ids=["hash", "exact-bytes"])
def test_occurrence_counts_matches_from_other_documents(exact: bool) -> None:
    # target T_A, reference C = {a, b, ab}.  doc "ab": A (a, b), C (ab) -> 1-grams a, b miss in-document, 2-gram ab
    # hits; doc "ba": A (b, a), C (b, a) -> all hit.  Unique-set: n=1 (0/2 + 2/2)/2 = 0.5; pooled 2/4.
    # Occurrence-weighted: doc 1's a and b occur in doc 2's reference stream -> 4/4 = 1.0.
    C = Greedy(["a", "b", "ab"], "C")
    r = polymem.coverage(TA, C, ["ab", "ba"], max_n=2, exact_bytes=exact)
    assert r.per_doc_mean == [0.5, 1.0] and r.pooled == [0.5, 1.0]
    assert r.occurrence_weighted == [1.0, 1.0]
    assert r.docs_with_order == [2, 2]


def test_same_tokenizer_covers_everything(bpe_json: Tokenizer) -> None:
    texts = [sample_text(), generated_text(400, seed=1)]
    r = polymem.coverage(bpe_json, bpe_json, texts, max_n=5)
    for k in METRICS:
        assert getattr(r, k) == [1.0] * 5, k  # same ids, so even the XOR hash matches
    # every n-gram is found at its own order n, so its smallest reference order is ≤ n (a 2-gram " "+" " can
    # also be the 1-gram "  " elsewhere)
    assert all(sum(row[n + 1:]) == 0 for n, row in enumerate(r.by_reference_n))


# ------------------------------------------------------------------------------------------- hash == exact
@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.text("ab ", min_size=1, max_size=60), min_size=1, max_size=4),
    st.lists(st.text("ab ", min_size=2, max_size=4), max_size=6),
    st.lists(st.text("ab ", min_size=2, max_size=4), max_size=6),
    st.integers(1, 6),
)
def test_hash_path_equals_exact_path_on_toy_tokenizers(
    docs: list[str], extra_t: list[str], extra_r: list[str], max_n: int
) -> None:
    T = Greedy(sorted({"a", "b", " ", *extra_t}), "t")
    R = Greedy(sorted({"a", "b", " ", *extra_r}), "r")
    close(polymem.coverage(T, R, docs, max_n), polymem.coverage(T, R, docs, max_n, exact_bytes=True), nd=12)


@pytest.mark.parametrize("exact", [False, True], ids=["hash", "exact-bytes"])
def test_the_largest_order_works(exact: bool) -> None:
    T, R = Greedy(["a", "b", " ", "ab"], "t"), Greedy(["a", "b", " ", "ba", "a b"], "r")
    docs = ["ab ba " * 12, "a b a b ab"]
    r32 = polymem.coverage(T, R, docs, max_n=32, exact_bytes=exact)
    r5 = polymem.coverage(T, R, docs, max_n=5, exact_bytes=exact)
    assert r32.unique_target_ngrams[:5] == r5.unique_target_ngrams and r32.unique_target_ngrams[31] > 0
    assert r32.by_reference_n[31][31] is not None and 0 < r32.per_doc_mean[31] <= 1


def test_texts_must_be_an_iterable_of_documents() -> None:
    with pytest.raises(PolymemError, match="got one str; wrap it in a list"):
        polymem.coverage(TA, TB, "aabb")


@pytest.fixture(scope="module")
def real_docs() -> list[str]:
    text = sample_text() + "\n" + generated_text(1500, seed=3)
    lines = text.splitlines(keepends=True)
    return ["".join(lines[i:i + 7]) for i in range(0, len(lines), 7)]


@pytest.fixture(scope="module")
def real_report(mistral_v1: Tokenizer, cl100k: Tokenizer, real_docs: list[str]) -> CoverageReport:
    return polymem.coverage(mistral_v1, cl100k, real_docs, max_n=7)


def test_hash_and_exact_bytes_agree_on_real_tokenizers(
    mistral_v1: Tokenizer, cl100k: Tokenizer, real_docs: list[str], real_report: CoverageReport
) -> None:
    exact = polymem.coverage(mistral_v1, cl100k, real_docs, max_n=7, exact_bytes=True)
    close(real_report, exact, nd=4)
    assert exact.method == "exact-bytes" and real_report.method == "hash"


def brute_force_coverage(target: Tokenizer, reference: Tokenizer, docs: list[str], N: int) -> dict:
    """docs/coverage.md's definitions computed directly, in plain Python: n-grams as byte strings (target and
    reference) and id tuples (XOR baseline), per document and corpus-wide. Independent of polymem's counters."""
    tb, rb = target.all_token_bytes(), reference.all_token_bytes()

    def grams(ids: list[int], table: list, n: int) -> list[tuple[bytes, tuple[int, ...]]]:
        out = []
        for i in range(n - 1, len(ids)):
            window = ids[i - n + 1 : i + 1]
            parts = [table[t] for t in window]
            if all(p is not None for p in parts):
                out.append((b"".join(parts), tuple(window)))
        return out

    share = [[] for _ in range(N)]
    by_ref = [[[] for _ in range(N)] for _ in range(N)]
    xshare = [[] for _ in range(N)]
    hit_sum, uniq_sum = [0] * N, [0] * N
    corpus_ref: set[bytes] = set()
    target_positions: list[list[bytes]] = [[] for _ in range(N)]
    for d in docs:
        t_ids, r_ids = target.encode(d).tolist(), reference.encode(d).tolist()
        smallest: dict[bytes, int] = {}
        ref_ids = []
        for m in range(1, N + 1):
            g = grams(r_ids, rb, m)
            ref_ids.append({x for _, x in g})
            for b, _ in g:
                smallest.setdefault(b, m)
        corpus_ref |= set(smallest)
        for n in range(1, N + 1):
            g = grams(t_ids, tb, n)
            target_positions[n - 1] += [b for b, _ in g]
            U = {b for b, _ in g}
            if U:
                hits = [b for b in U if b in smallest]
                share[n - 1].append(len(hits) / len(U))
                for m in range(1, N + 1):
                    by_ref[n - 1][m - 1].append(sum(smallest[b] == m for b in hits) / len(U))
                hit_sum[n - 1] += len(hits)
                uniq_sum[n - 1] += len(U)
            X = {x for _, x in g}
            if X:
                xshare[n - 1].append(len(X & ref_ids[n - 1]) / len(X))
    mean = lambda v: sum(v) / len(v) if v else None  # noqa: E731
    return {
        "per_doc_mean": [mean(v) for v in share],
        "pooled": [h / u if u else None for h, u in zip(hit_sum, uniq_sum)],
        "by_reference_n": [[mean(v) for v in row] for row in by_ref],
        "xor_baseline": [mean(v) for v in xshare],
        "occurrence_weighted": [sum(b in corpus_ref for b in pos) / len(pos) if pos else None
                                for pos in target_positions],
    }


def test_report_equals_the_definitions_computed_directly(
    mistral_v1: Tokenizer, cl100k: Tokenizer, real_report: CoverageReport, real_docs: list[str]
) -> None:
    """Every headline number of the (hash-path) report against docs/coverage.md's definitions, computed
    independently from the tokenizers' ids and bytes: no thresholds read off the sample."""
    expected = brute_force_coverage(mistral_v1, cl100k, real_docs, 7)
    for key, want in expected.items():
        got = getattr(real_report, key)
        np.testing.assert_allclose(np.array(got, dtype=float), np.array(want, dtype=float), rtol=0, atol=1e-12,
                                   err_msg=key)
    assert 0 < min(expected["per_doc_mean"]) and max(expected["xor_baseline"]) < min(expected["per_doc_mean"])


def test_report_invariants(real_report: CoverageReport, real_docs: list[str]) -> None:
    r = real_report
    assert r.docs == len(real_docs) and r.max_n == 7 and r.skipped == []
    assert r.bytes == sum(len(d.encode()) for d in real_docs)
    for n in range(7):
        assert abs(sum(r.by_reference_n[n]) - r.per_doc_mean[n]) < 1e-9
        assert abs(sum(r.by_reference_n_pooled[n]) - r.pooled[n]) < 1e-9
    assert r.target.name == "mistral-v1" and r.reference.name == "cl100k_base"
    assert r.target.fingerprint == load_tokenizer("mistral-v1").fingerprint


def test_fidelity_is_reported_and_dummy_prefix_kept(mistral_v1: Tokenizer, cl100k: Tokenizer) -> None:
    # Mistral: "Hello world" -> ["▁Hello", "▁world"] = b" Hello", b" world"; cl100k: b"Hello", b" world".
    # The dummy-prefix space stays in the target's first token, so b" Hello" finds no reference n-gram.
    r = polymem.coverage(mistral_v1, cl100k, ["Hello world"], max_n=2)
    assert r.per_doc_mean == [0.5, 0.0]
    assert r.fidelity["target"] == {"docs": 1, "exact": 0, "dummy_prefix": 1, "mismatched": 0,
                                    "first_mismatch": None, "faithful": True}
    assert r.fidelity["reference"]["exact"] == 1 and r.fidelity["reference"]["faithful"]
    # the JSON report is a user-facing format: its keys, in this order, at every level (docs/coverage.md)
    d = json.loads(r.to_json())
    assert list(d) == [
        "format", "version", "target", "reference", "max_n", "method", "docs", "bytes", "tokens", "per_doc_mean",
        "pooled", "by_reference_n", "by_reference_n_pooled", "occurrence_weighted", "xor_baseline", "xor_pooled",
        "unique_target_ngrams", "target_positions", "docs_with_order", "fidelity", "skipped", "replaced_utf8",
        "elapsed_s", "workers", "timing", "hash_spec"]
    assert [list(d["fidelity"][side]) for side in ("target", "reference")] == [
        ["docs", "exact", "dummy_prefix", "mismatched", "first_mismatch", "faithful"]] * 2
    assert list(d["timing"]) == ["encode_s", "count_s", "read_s"] and list(d["tokens"]) == ["target", "reference"]


def test_inline_fidelity_equals_check_fidelity(mistral_v1: Tokenizer, cl100k: Tokenizer, real_docs: list[str],
                                               real_report: CoverageReport) -> None:
    for side, tok in (("target", mistral_v1), ("reference", cl100k)):
        ref = polymem.check_fidelity(tok, real_docs)
        got = real_report.fidelity[side]
        assert (got["docs"], got["exact"], got["dummy_prefix"], got["mismatched"], got["faithful"]) == (
            ref.docs, ref.exact, ref.dummy_prefix, ref.mismatched, ref.faithful)


def test_progress_reports_cumulative_documents_and_bytes() -> None:
    docs = ["aab", "bba", "ab"]
    for partition_mb in (4.0, 1e-6):  # one partition, one per document
        seen: list[tuple[int, int]] = []
        polymem.coverage(TA, TB, docs, max_n=2, partition_mb=partition_mb, progress=lambda n, b: seen.append((n, b)))
        assert seen == [(1, 3), (2, 6), (3, 8)]


def test_a_lossy_tokenizer_is_reported_not_faithful(wordpiece_json_path: Path, cl100k: Tokenizer) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TokenHashes.build warns about the lossy tokenizer
        r = polymem.coverage(wordpiece_json_path, cl100k, ["Hello World, again.", "More text here."], max_n=3)
    fid = r.fidelity["target"]
    assert not fid["faithful"] and fid["mismatched"] == 2 and fid["first_mismatch"].startswith("doc 0: byte 1 of ")
    assert "got b' hello world , again .'" in fid["first_mismatch"]
    assert r.target.lossy


def test_partitions_give_identical_results(mistral_v1: Tokenizer, cl100k: Tokenizer, real_docs: list[str],
                                           real_report: CoverageReport) -> None:
    # the corpus spread over ~10 and ~3 partitions: the occurrence pass is settled by key bucket across them, and
    # every sum is exact (shares in integers of 2^-40), so every number is the same, bit for bit
    size = len("".join(real_docs))
    want = {k: v for k, v in real_report.to_dict().items() if k not in ("elapsed_s", "timing")}
    for parts in (10, 3):
        r = polymem.coverage(mistral_v1, cl100k, real_docs, max_n=7, partition_mb=size / parts / 1e6)
        assert {k: v for k, v in r.to_dict().items() if k not in ("elapsed_s", "timing")} == want


def test_batches_of_documents_give_identical_results(mistral_v1: Tokenizer, cl100k: Tokenizer, real_docs: list[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # documents are tokenized, then counted, a batch at a time: one document per batch or all of them in one
    # give the same report, skipped documents (empty, rejected by a tokenizer) listed in document order
    from polymem.analysis.coverage import _job

    docs = [*real_docs[:6], "", "lone \ud800 surrogate", *real_docs[6:12], "", "x \udfff"]
    reports = []
    for batch_mb in (1e-9, 1e9, 0.01):
        monkeypatch.setattr(_job, "BATCH_MB", batch_mb)
        r = polymem.coverage(mistral_v1, cl100k, docs, max_n=5)
        reports.append({k: v for k, v in r.to_dict().items() if k not in ("elapsed_s", "timing")})
    assert reports[0] == reports[1] == reports[2]
    assert [s["source"] for s in reports[0]["skipped"]] == ["doc 6", "doc 7", "doc 14", "doc 15"]
    assert reports[0]["docs"] == 12


def test_occurrence_outputs_in_memory_in_files_or_both_give_identical_results(
        mistral_v1: Tokenizer, cl100k: Tokenizer, real_docs: list[str], real_report: CoverageReport,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # one process keeps the partitions' occurrence outputs in memory up to KEEP_MB and writes the rest to the
    # scratch directory: all in memory, none, or the first few only, the numbers are the same
    from polymem.analysis.coverage import dist, run

    size = len("".join(real_docs))
    want = {k: v for k, v in real_report.to_dict().items() if k not in ("elapsed_s", "timing")}
    written: list[int] = []
    write = dist.write_buckets
    monkeypatch.setattr(dist, "write_buckets", lambda plan, i, occ: (written.append(i), write(plan, i, occ)))
    counts = []
    for keep_mb in (1e9, 0.0, 0.05):
        monkeypatch.setattr(run, "KEEP_MB", keep_mb)
        written.clear()
        r = polymem.coverage(mistral_v1, cl100k, real_docs, max_n=7, partition_mb=size / 6 / 1e6)
        assert {k: v for k, v in r.to_dict().items() if k not in ("elapsed_s", "timing")} == want
        counts.append(len(written))
    assert counts[0] == 0 and counts[1] >= 6 and 0 < counts[2] < counts[1]  # none, all, some written


def test_default_scratch_goes_to_ram_only_when_the_key_files_fit(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # the default scratch directory: RAM_SCRATCH when the estimated key files fit well in it, else the system's
    # temporary directory (None); a TMPDIR the user set, an unknown corpus size or no occurrence pass: None
    from polymem.analysis.coverage import run

    ram = tmp_path / "ram"
    ram.mkdir()
    doc = tmp_path / "docs.jsonl"
    doc.write_text("\n".join(json.dumps({"text": f"document {i} " * 50}) for i in range(40)) + "\n")
    monkeypatch.setattr(run, "RAM_SCRATCH", str(ram))
    monkeypatch.delenv("TMPDIR", raising=False)
    corpus = Corpus([doc])
    assert run._scratch_parent(corpus, True) == str(ram)
    assert run._scratch_parent(corpus, False) is None  # nothing is written
    assert run._scratch_parent(["a list of texts"], True) is None  # size unknown
    monkeypatch.setattr(run, "SCRATCH_PER_TEXT_BYTE", 1e15)  # "too big for RAM"
    assert run._scratch_parent(corpus, True) is None
    monkeypatch.setattr(run, "SCRATCH_PER_TEXT_BYTE", 16)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert run._scratch_parent(corpus, True) is None
    monkeypatch.delenv("TMPDIR")
    monkeypatch.setattr(run, "RAM_SCRATCH", str(tmp_path / "missing"))
    assert run._scratch_parent(corpus, True) is None


def test_small_pages_restores_numpys_setting_and_nests() -> None:
    from polymem.analysis.coverage import dist

    ma = np._core.multiarray
    before = ma._get_madvise_hugepage()
    try:
        for start in (True, False):
            ma._set_madvise_hugepage(start)
            with dist.small_pages():
                assert ma._get_madvise_hugepage() is False
                with dist.small_pages():
                    assert ma._get_madvise_hugepage() is False
                assert ma._get_madvise_hugepage() is False
            assert ma._get_madvise_hugepage() is start
    finally:
        ma._set_madvise_hugepage(before)


def test_share_sums_are_exact_in_any_grouping() -> None:
    from polymem.analysis.coverage.counter import Tally

    rng = np.random.default_rng(3)
    docs = [(rng.integers(0, 50, 4), rng.integers(0, 7, (4, 4)), rng.integers(0, 9, 4), rng.integers(0, 3, 4))
            for _ in range(200)]
    docs = [(u + h.sum(axis=1), h, xu + xh, xh) for u, h, xu, xh in docs]  # hits <= uniq
    one = Tally(4)
    for d in docs:
        one.add_doc(*d)
    grouped = Tally(4)
    for lo in range(0, 200, 37):  # partitions of 37 documents, merged in reverse
        part = Tally(4)
        for d in docs[lo:lo + 37][::-1]:
            part.add_doc(*d)
        part += Tally(4)
        grouped += part
    for name in ("share", "share_by_ref", "xor_share"):
        assert getattr(one, name).tolist() == getattr(grouped, name).tolist()
    # and they are the float sums of the per-document shares, to ~1e-12 per document
    assert np.allclose(one.share, sum(np.where(u > 0, h.sum(axis=1) / np.maximum(u, 1), 0) for u, h, _, _ in docs),
                       rtol=0, atol=1e-9)
    assert np.allclose(one.xor_share, sum(np.where(xu > 0, xh / np.maximum(xu, 1), 0) for _, _, xu, xh in docs),
                       rtol=0, atol=1e-9)


def test_occurrences_are_resolved_across_partitions() -> None:
    # one document per partition: doc "ab"'s 1-grams a and b are only in the reference stream of the "ba" documents
    C = Greedy(["a", "b", "ab"], "C")
    docs = ["ab", "ba"] * 4
    for exact in (False, True):
        r = polymem.coverage(TA, C, docs, max_n=2, partition_mb=1e-6, exact_bytes=exact)
        assert r.occurrence_weighted == [1.0, 1.0] and r.per_doc_mean == [0.5, 1.0] and r.docs == 8


def test_a_failing_tokenizer_error_propagates() -> None:
    # the toy tokenizer raises ValueError on a character outside its vocabulary (not a TokenizerError)
    with pytest.raises(ValueError, match="not in the toy vocabulary"):
        polymem.coverage(TA, TB, ["aabb", "abc"], max_n=2)


@settings(max_examples=10, deadline=None)
@given(st.randoms(use_true_random=False))
def test_document_order_does_not_matter(rnd: random.Random) -> None:
    docs = ["ab ba", "b a ab", "aab", "bb a", "a"]
    T, R = Greedy(["aa", "a", "b", " "], "t"), Greedy(["a", "b", " ", "ab", " a"], "r")
    base = polymem.coverage(T, R, docs, 3)
    shuffled = docs[:]
    rnd.shuffle(shuffled)
    close(base, polymem.coverage(T, R, shuffled, 3), nd=12)


def test_counters_directly_from_token_ids() -> None:
    # the low-level interface: caches and ids, no tokenizer
    ca = polymem.TokenHashes.from_token_bytes([b"aa", b"a", b"b"], name="A", fingerprint="a")
    cb = polymem.TokenHashes.from_token_bytes([b"a", b"b"], name="B", fingerprint="b")
    h = HashCounter(ca, cb, 4)
    e = ExactCounter([b"aa", b"a", b"b"], [b"a", b"b"], 4)
    for c in (h, e):
        c.add(np.array([0, 2, 2]), np.array([0, 0, 1, 1]))
    th, te = h.finish_one(), e.finish_one()
    assert th.hits.tolist() == te.hits.tolist() == [[1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 0, 1], [0, 0, 0, 0]]


@settings(max_examples=80, deadline=None)
@given(docs=st.lists(st.tuples(st.lists(st.integers(0, 6), max_size=70), st.lists(st.integers(0, 8), max_size=70)),
                     min_size=1, max_size=3),
       n=st.integers(1, 6), as_lists=st.booleans())
def test_hash_counter_equals_exact_counter_on_ids_with_resegmentations(docs: list[tuple[list[int], list[int]]],
                                                                       n: int, as_lists: bool) -> None:
    """Ids given directly, with vocabularies where several id n-grams spell the same bytes (a·b = ab, aba =
    ab·a = a·ba, and two ids for b"b"), special tokens (None) and reference ids beyond the target's vocabulary:
    every count agrees with the readable counter, the XOR baseline's distinct id n-grams and hits included.
    Both inputs of HashCounter.add: int64 arrays (straight to the fused kernel, doc_scan_ids) and lists (checked
    and converted first)."""
    tb: list[bytes | None] = [b"a", b"b", b"ab", b"ba", b"aba", None, b"b"]
    rb: list[bytes | None] = [b"a", b"b", b"ab", None, b"bab", b"ba", b"aba", b"aa", b"b"]
    ct = polymem.TokenHashes.from_token_bytes(tb, name="t", fingerprint="t")
    cr = polymem.TokenHashes.from_token_bytes(rb, name="r", fingerprint="r")
    h, e = HashCounter(ct, cr, n), ExactCounter(tb, rb, n)
    for t_ids, r_ids in docs:
        h.add(*((t_ids, r_ids) if as_lists else (np.array(t_ids, dtype=np.int64), np.array(r_ids, dtype=np.int64))))
        e.add(np.array(t_ids, dtype=np.int64), np.array(r_ids, dtype=np.int64))
    th, te = h.finish_one(), e.finish_one()
    for name in ("uniq", "hits", "positions", "pos_hits", "xor_uniq", "xor_hits", "docs_with", "xor_docs_with",
                 "share", "share_by_ref", "xor_share"):
        assert getattr(th, name).tolist() == getattr(te, name).tolist(), name


# ------------------------------------------------------------------------------------------- output formats
def test_json_round_trip_and_schema_documented(real_report: CoverageReport, tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    real_report.to_json(path)
    d = json.loads(path.read_text())
    assert d["format"] == "polymem.coverage-report" and d["version"] == 1
    assert CoverageReport.from_dict(d) == real_report
    schema = (REPO / "docs" / "coverage.md").read_text(encoding="utf-8")
    for key in d:
        assert f"`{key}`" in schema, f"report field {key!r} is not documented in docs/coverage.md"
    with pytest.raises(polymem.FormatError, match="not a coverage report"):
        CoverageReport.from_dict({**d, "version": 99})


def test_csv_and_plot(real_report: CoverageReport, tmp_path: Path) -> None:
    text = real_report.to_csv(tmp_path / "r.csv")
    rows = text.strip().splitlines()
    assert rows[0].startswith("n,per_doc_mean,pooled,occurrence_weighted,xor_baseline")
    assert len(rows) == 8 and rows[1].split(",")[1] == f"{real_report.per_doc_mean[0]:.6f}"
    png = real_report.plot(tmp_path / "fig2.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


# ------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("bad", [0, 50, -1, True, 7.0, "7"])
def test_max_n_out_of_range_is_a_clear_error(bad: object) -> None:
    with pytest.raises(PolymemError, match=r"max_n=.* is out of range.*from 1 to 32"):
        polymem.coverage(TA, TB, ["aabb"], max_n=bad)  # type: ignore[arg-type]


def test_empty_corpus_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(PolymemError, match=r"empty corpus: no documents to measure \(0 skipped"):
        polymem.coverage(TA, TB, [], max_n=2)
    (tmp_path / "bin.txt").write_bytes(b"\x00\x01")
    with pytest.raises(PolymemError, match=r"empty corpus.*1 skipped: .*bin.txt: binary file"):
        polymem.coverage(TA, TB, Corpus([tmp_path]), max_n=2)


def test_bad_documents_are_skipped_not_fatal(mistral_v1: Tokenizer, cl100k: Tokenizer) -> None:
    docs = ["fine text", "", "lone \ud800 surrogate", Document(id="d", text="more", source="src")]
    r = polymem.coverage(mistral_v1, cl100k, docs, max_n=2)
    assert r.docs == 2
    got = {s["source"]: s["reason"] for s in r.skipped}
    assert got["doc 1"] == "empty document: no text"
    assert got["doc 2"].startswith("tokenizer error: text has a lone surrogate")
    with pytest.raises(PolymemError, match="workers=0 must be an integer"):
        polymem.coverage(TA, TB, ["aabb"], workers=0)


# ------------------------------------------------------------------------------------------- CLI
@pytest.fixture()
def corpus_dir(tmp_path: Path) -> Path:
    d = tmp_path / "corpus"
    (d / "sub").mkdir(parents=True)
    (d / "a.txt").write_text(sample_text(), encoding="utf-8")
    (d / "sub" / "b.jsonl").write_text(
        "".join(json.dumps({"id": i, "text": generated_text(80, seed=i)}) + "\n" for i in range(3)) + "oops\n",
        encoding="utf-8",
    )
    (d / "c.md").write_bytes("na\xefve caf\xe9\n".encode("latin-1"))
    (d / "blob.txt").write_bytes(b"\x7fELF\x00\x00\x01")
    return d


def test_cli_end_to_end(corpus_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = CliRunner().invoke(app, [
        "coverage", "--target", "mistral-v1", "--reference", "cl100k_base", "--max-n", "4", str(corpus_dir),
        "--json", str(out / "r.json"), "--csv", str(out / "r.csv"), "--plot", str(out / "r.png"),
    ])
    assert res.exit_code == 0, res.output
    flat = " ".join(res.output.split())  # rich wraps long lines
    assert "coverage of mistral-v1 n-grams by cl100k_base (5 docs, hash)" in flat
    assert "1 document(s) had invalid UTF-8" in flat and "blob.txt: binary file" in flat
    r = json.loads((out / "r.json").read_text())
    assert r["docs"] == 5 and r["max_n"] == 4 and len(r["by_reference_n"]) == 4 and r["replaced_utf8"] == 1
    assert sorted(s["reason"].split(":")[0] for s in r["skipped"]) == ["binary file", "invalid JSON"]
    assert (out / "r.csv").read_text().count("\n") == 5 and (out / "r.png").stat().st_size > 0


def test_cli_stdin_json_to_stdout_and_jsonl_text_field(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["coverage", "-t", "bytes", "-r", "cl100k_base", "--max-n", "3", "-", "--json",
                                   "-", "-q"], input="hello hello world\n")
    assert res.exit_code == 0, res.output
    r = json.loads(res.stdout)
    assert r["docs"] == 1 and r["target"]["name"] == "bytes"
    p = tmp_path / "x.jsonl"
    p.write_text(json.dumps({"body": "some words"}) + "\n", encoding="utf-8")
    res = CliRunner().invoke(app, ["coverage", "-t", "bytes", "-r", "bytes", "--text-field", "body", str(p),
                                   "--json", "-", "-q", "--exact-bytes", "--no-occurrence"])
    r = json.loads(res.stdout)
    assert r["per_doc_mean"] == [1.0] * 7 and r["method"] == "exact-bytes" and r["occurrence_weighted"] is None


@pytest.mark.parametrize("args, message", [
    (["--max-n", "0"], "max_n=0 is out of range"),
    (["--max-n", "50"], "max_n=50 is out of range"),
])
def test_cli_errors(corpus_dir: Path, args: list[str], message: str) -> None:
    res = CliRunner().invoke(app, ["coverage", "-t", "bytes", "-r", "bytes", str(corpus_dir), *args])
    assert isinstance(res.exception, PolymemError) and message in str(res.exception)


@pytest.mark.slow
def test_cli_error_exit_code_and_message(tmp_path: Path) -> None:
    (tmp_path / "empty.txt").write_text("", encoding="utf-8")
    cmd = [sys.executable, "-c", "from polymem.cli.app import main; main()", "coverage", "-t", "bytes", "-r", "bytes"]
    res = subprocess.run([*cmd, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "error: empty corpus" in " ".join(res.stderr.split())
    res = subprocess.run([*cmd, str(tmp_path / "nope")], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "nope' does not exist" in " ".join(res.stderr.split())


# ------------------------------------------------------------------------ the bucketed occurrence kernels (_buckets)
_key_values = st.one_of(st.integers(0, 2**64 - 1), st.sampled_from([0, 1, 2**63, 2**64 - 1, GOLDEN]))


@settings(max_examples=60, deadline=None)
@given(ref=st.lists(_key_values, max_size=300), pend=st.lists(st.tuples(_key_values, st.integers(0, 6),
                                                                        st.integers(1, 9)), max_size=200),
       bits=st.sampled_from([1, 4, 10]), dup=st.integers(1, 3))
def test_bucket_kernels_equal_python_sets(ref: list[int], pend: list[tuple[int, int, int]], bits: int,
                                          dup: int) -> None:
    """bucket_unique == set(); bucket_group_into groups keys and entries by bucket, losing and adding nothing;
    resolve_range (the reduce) over two "partitions" == membership in the set, for keys that include 0 (stored
    as ZERO_KEY, as the per-document tables store it) and ZERO_KEY itself."""
    from polymem.analysis.coverage import _buckets

    stored = lambda k: k if k else GOLDEN  # noqa: E731 - _sets.ZERO_KEY
    keys = np.array(ref * dup, dtype=np.uint64)
    uniq, off = _buckets.bucket_unique(keys, keys.shape[0], bits)
    assert sorted(uniq.tolist()) == sorted({stored(k) for k in ref})
    assert off[0] == 0 and off[-1] == uniq.shape[0] and np.all(np.diff(off) >= 0)
    for b in range(1 << bits):  # every key sits in the bucket of its top bits
        assert all(int(k) >> (64 - bits) == b for k in uniq[off[b]:off[b + 1]])
    ph = np.array([h for h, _, _ in pend], dtype=np.uint64)
    pn = np.array([n for _, n, _ in pend], dtype=np.int8)
    pc = np.array([c for _, _, c in pend], dtype=np.int64)
    # scratch larger than needed and dirty, as when it is reused across partitions
    grouped = np.full(keys.shape[0] + 5, 7, dtype=np.uint64)
    gh, gn, gc = (np.full(ph.shape[0] + 3, 7, dtype=dt) for dt in (np.uint64, np.int8, np.int64))
    goff, gpoff = _buckets.bucket_group_into(keys, keys.shape[0], ph, pn, pc, ph.shape[0], bits, grouped, gh, gn, gc)
    assert goff[-1] == keys.shape[0] and gpoff[-1] == ph.shape[0]
    assert sorted(grouped[:keys.shape[0]].tolist()) == sorted(stored(k) for k in ref * dup)
    assert sorted(zip(gh[:ph.shape[0]].tolist(), gn[:ph.shape[0]].tolist(), gc[:ph.shape[0]].tolist())) == sorted(
        (stored(h), n, c) for h, n, c in pend)
    for b in range(1 << bits):
        assert all(int(k) >> (64 - bits) == b for k in grouped[goff[b]:goff[b + 1]])
        assert all(int(k) >> (64 - bits) == b for k in gh[gpoff[b]:gpoff[b + 1]])
    refset = {stored(k) for k in ref}
    want = np.zeros(7, dtype=np.int64)
    for h, n, c in pend:
        if stored(h) in refset:
            want[n] += c
    # the reduce over two "partitions" (the keys split in halves, grouped but not deduplicated; all the
    # pending entries in the first) finds what one set finds
    half = keys.shape[0] // 2
    parts = [_buckets._group_keys(x, x.shape[0], bits) for x in (keys[:half], keys[half:])]
    hits = np.zeros(7, dtype=np.int64)
    cat = np.concatenate([parts[0][0], parts[1][0]])
    ref_off = np.stack([parts[0][1], parts[1][1] + parts[0][0].shape[0]])
    n_p = ph.shape[0]
    empty_off = np.full_like(gpoff, n_p)  # the second partition has no pending entries
    _buckets.resolve_range(cat, ref_off, gh[:n_p], gn[:n_p], gc[:n_p], np.stack([gpoff, empty_off]), bits, hits)
    assert hits.tolist() == want.tolist()


def test_compacting_the_buffers_changes_nothing(mistral_v1: Tokenizer, cl100k: Tokenizer,
                                                real_docs: list[str]) -> None:
    # a counter whose reference-key buffer is deduplicated in place every few documents counts the same
    from polymem.analysis.coverage.run import _hashes

    spec = polymem.HashSpec()
    tc, rc = _hashes(mistral_v1, spec), _hashes(cl100k, spec)
    tallies = []
    for compact in (1 << 30, 1000):
        h = HashCounter(tc, rc, 5, compact_keys=compact)
        for d in real_docs[:30]:
            h.add(mistral_v1.encode(d), cl100k.encode(d))
        tallies.append(h.finish_one())
    a, b = tallies
    assert a.pos_hits.tolist() == b.pos_hits.tolist() and a.positions.tolist() == b.positions.tolist()
    assert a.hits.tolist() == b.hits.tolist() and a.pos_hits.sum() > 0


def test_counters_in_one_process_reuse_the_buffers(mistral_v1: Tokenizer, cl100k: Tokenizer) -> None:
    from polymem.analysis.coverage import counter
    from polymem.analysis.coverage.run import _hashes

    spec = polymem.HashSpec()
    counter.release_buffers()
    h = HashCounter(_hashes(mistral_v1, spec), _hashes(cl100k, spec), 3)
    h.add(mistral_v1.encode("one two three"), cl100k.encode("one two three"))
    first = h._ref
    h.finish_one()
    h2 = HashCounter(h.target, h.reference, 3)
    assert h2._ref is first  # the next counter took them over
    counter.release_buffers()
    assert HashCounter(h.target, h.reference, 3)._ref.shape[0] == 0


def test_occurrence_output_views_of_reused_scratch_equal_the_copies(mistral_v1: Tokenizer, cl100k: Tokenizer,
                                                                   real_docs: list[str]) -> None:
    # the grouping runs in scratch reused across partitions: views of it (released after use, as when they are
    # written out) hold the same as the copies, and the next partition's grouping reuses the released scratch
    from polymem.analysis.coverage import counter
    from polymem.analysis.coverage.run import _hashes

    spec = polymem.HashSpec()
    tc, rc = _hashes(mistral_v1, spec), _hashes(cl100k, spec)
    ids = [(mistral_v1.encode(d), cl100k.encode(d)) for d in real_docs[:12]]
    counter.release_buffers()
    outs = []
    for views in (False, True, True, False):
        h = HashCounter(tc, rc, 4)
        for a, b in ids:
            h.add(a, b)
        occ = h.occurrence_output(views=views)
        outs.append(([x.copy() for x in (occ.ref, occ.ref_off, occ.pend_h, occ.pend_n, occ.pend_c, occ.pend_off)],
                     h.tally.pos_hits.tolist(), occ.scratch is not None, occ.ref.base))
        occ.release()
    for arrays, hits, _, _ in outs[1:]:
        assert all(np.array_equal(x, y) for x, y in zip(arrays, outs[0][0])) and hits == outs[0][1]
    assert [o[2] for o in outs] == [False, True, True, False]
    assert outs[1][3] is outs[2][3]  # the second view is of the same (released, reused) scratch
    assert outs[0][0][0].shape[0] > 0 and outs[0][0][2].shape[0] > 0
    counter.release_buffers()


def _compare_by_definition(stream: bytes, text: bytes) -> tuple[int, int]:
    """compare_token_bytes' contract: 0 exact, 1 == b" " + text, else 2 and the first differing byte of the
    stream against the text (against b" " + text when the stream is one byte longer), or the shorter length."""
    shift = 1 if len(stream) == len(text) + 1 else 0
    want = b" " * shift + text
    if stream == want:
        return shift, 0
    return 2, next((i for i, (a, b) in enumerate(zip(stream, want)) if a != b), min(len(stream), len(want)))


_FID_VOCAB = [b"", b" ", b"a", b"bc", " é".encode(), "漢字".encode(), b"0123456789abcdefXYZ", b"  x", b"12345678",
              b"\x00", "😀".encode()[:2], "😀".encode()[2:]]


@settings(max_examples=300, deadline=None)
@given(ids=st.lists(st.integers(0, len(_FID_VOCAB) - 1), max_size=40),
       edit=st.sampled_from(["none", "prefix", "drop-first", "flip", "append", "truncate", "other"]),
       where=st.integers(0, 10_000), other=st.binary(max_size=30), dummy=st.booleans())
def test_byte_fidelity_compares_equal_the_definition(ids: list[int], edit: str, where: int, other: bytes,
                                                     dummy: bool) -> None:
    """compare_token_bytes and the 8-bytes-at-a-time compare_token_words (either shift guess) answer exactly the
    definition: empty documents and tokens, a dummy prefix, multi-byte UTF-8 and tokens longer than a word, and
    a mismatch at any offset (a flipped byte, a missing or extra byte at either end, unrelated text)."""
    from polymem.analysis.coverage import _fidelity
    from polymem.tokenizers.base import pack_token_bytes

    stream = b"".join(_FID_VOCAB[i] for i in ids)
    text = {"none": stream, "prefix": stream[1:] if stream[:1] == b" " else stream, "drop-first": stream[1:],
            "append": stream + b"!", "truncate": stream[:-1], "other": other}.get(edit, stream)
    if edit == "flip" and stream:
        k = where % len(stream)
        text = stream[:k] + bytes([stream[k] ^ 0x40]) + stream[k + 1:]
    want = _compare_by_definition(stream, text)
    buf, offsets = pack_token_bytes(_FID_VOCAB)
    arr = np.array(ids, dtype=np.int64)
    assert tuple(_fidelity.compare_token_bytes(arr, buf, offsets, np.frombuffer(text, np.uint8))) == want
    padded_buf = np.concatenate([buf, np.full(_fidelity.PAD, 0x20, np.uint8)])  # padding bytes of any value
    padded = np.frombuffer(text + b" " * _fidelity.PAD, np.uint8)
    assert tuple(_fidelity.compare_token_words(arr, padded_buf, offsets, padded, len(text), int(dummy))) == want


@settings(max_examples=300, deadline=None)
@given(ids=st.lists(st.integers(0, len(_FID_VOCAB)), max_size=40),
       edit=st.sampled_from(["none", "prefix", "drop-first", "flip", "append", "truncate", "other", "space"]),
       where=st.integers(0, 10_000), other=st.binary(max_size=30), seed=st.integers(0, 3))
def test_byte_fidelity_by_hash_answers_as_the_bytes(ids: list[int], edit: str, where: int, other: bytes,
                                                    seed: int) -> None:
    """stream_fidelity (the token stream's hash and length against the text's) gives 0 / 1 exactly where the
    byte compare does, and -1 (compare the bytes) wherever the bytes differ; a special token (no bytes) counts
    as nothing, as in compare_token_bytes."""
    from polymem.analysis.coverage import _fidelity

    vocab = [*_FID_VOCAB, None]  # the last id is a special token
    stream = b"".join(vocab[i] or b"" for i in ids)
    text = {"none": stream, "prefix": stream[1:] if stream[:1] == b" " else stream, "drop-first": stream[1:],
            "append": stream + b"!", "truncate": stream[:-1], "other": other, "space": b" " + stream}.get(edit, stream)
    if edit == "flip" and stream:
        k = where % len(stream)
        text = stream[:k] + bytes([stream[k] ^ 0x40]) + stream[k + 1:]
    want = _compare_by_definition(stream, text)[0]
    spec = polymem.HashSpec(byte_seed=seed)
    cache = polymem.TokenHashes.from_token_bytes(vocab, name="t", fingerprint="t", spec=spec)
    arr = np.array(ids, dtype=np.int64)
    table = np.asarray(spec.effective_byte_table, dtype=np.uint64)
    got = _fidelity.stream_fidelity(arr, cache.C, cache.P, arr[::-1].copy(), cache.C, cache.P,
                                np.frombuffer(text, np.uint8), table, np.uint64(spec.base))
    assert got[0] == (want if want < 2 else -1)
    rev = b"".join(vocab[i] or b"" for i in ids[::-1])
    want_rev = _compare_by_definition(rev, text)[0]
    assert got[1] == (want_rev if want_rev < 2 else -1)


def test_any_integer_ids_give_what_the_tokenizers_own_arrays_give(mistral_v1: Tokenizer, cl100k: Tokenizer,
                                                                   real_docs: list[str]) -> None:
    """HashCounter.add from a tokenizer's own int64 arrays and from the same ids as Python lists / int32 arrays
    (checked and converted, then the same fused kernel): the same tally and the same occurrence output."""
    from polymem.analysis.coverage.run import _hashes

    spec = polymem.HashSpec()
    tc, rc = _hashes(mistral_v1, spec), _hashes(cl100k, spec)
    own, other = HashCounter(tc, rc, 7), HashCounter(tc, rc, 7)
    for k, text in enumerate(real_docs[:40] + ["", "x"]):
        ti, ri = mistral_v1.encode(text), cl100k.encode(text)
        assert ti.dtype == np.int64 and ri.dtype == np.int64  # the tokenizers' own arrays
        own.add(ti, ri)
        other.add(ti.tolist(), ri.astype(np.int32)) if k % 2 else other.add(ti.astype(np.int32), ri.tolist())
    a, b = own.occurrence_output(), other.occurrence_output()
    assert a.ref.shape[0] > 1000 and a.pend_h.shape[0] > 1000
    for x, y in zip((a.ref, a.ref_off, a.pend_h, a.pend_n, a.pend_c, a.pend_off),
                    (b.ref, b.ref_off, b.pend_h, b.pend_n, b.pend_c, b.pend_off)):
        assert np.array_equal(x, y)
    for name in ("uniq", "hits", "positions", "pos_hits", "xor_uniq", "xor_hits", "share", "xor_share"):
        assert getattr(own.tally, name).tolist() == getattr(other.tally, name).tolist(), name


@pytest.mark.parametrize("side, bad, match", [
    ("target", [[1, 2], [3, 4]], r"target ids of one document must be 1-D .*shape \(2, 2\)"),
    ("reference", "beyond", r"token id \d+ is out of range for tokenizer .*cl100k.*another tokenizer"),
    ("target", [-1, 2], r"token id -1 is out of range"),
    ("target", [0.5, 1.0], r"token ids must be integers, got dtype float64"),
])
def test_bad_ids_are_a_clear_error(mistral_v1: Tokenizer, cl100k: Tokenizer, side: str, bad: list, match: str) -> None:
    """Ids that are not one document's in-range integers: an error naming the value and what is accepted, and the
    counter is unchanged (nothing was counted)."""
    from polymem.analysis.coverage.run import _hashes

    spec = polymem.HashSpec()
    tc, rc = _hashes(mistral_v1, spec), _hashes(cl100k, spec)
    c = HashCounter(tc, rc, 3)
    if bad == "beyond":
        bad = [0, rc.vocab_size]
    good = [1, 2, 3]
    with pytest.raises(PolymemError, match=match):
        c.add(bad, good) if side == "target" else c.add(good, bad)
    assert c.tally.docs == 0 and c.tally.tokens_target == 0
    assert c.occurrence_bytes() == HashCounter(tc, rc, 3).occurrence_bytes()  # no keys buffered


def test_reduce_reads_only_data_slices_with_the_offsets_from_the_map(mistral_v1: Tokenizer, cl100k: Tokenizer,
                                                                     real_docs: list[str], tmp_path: Path) -> None:
    """Written partitions leave only their data files; the bucket offsets come back in the map's summary, and a
    reduce task given them finds what it finds with the outputs held in memory. A data file the task cannot see
    (a scratch directory that is not shared) is an error naming the file and the fix."""
    from polymem.analysis.coverage import dist
    from polymem.analysis.coverage.run import _hashes

    spec = polymem.HashSpec()
    plan = dist.Plan(target=mistral_v1, reference=cl100k, max_n=7, occurrence=True, spec=spec,
                     scratch=str(tmp_path / "scratch"))
    dist.preload(plan, (mistral_v1, cl100k, _hashes(mistral_v1, spec), _hashes(cl100k, spec)))
    try:
        half = len(real_docs) // 2
        halves = [dist.DocsPartition(tuple(polymem.corpus.as_documents(docs)))
                  for docs in (real_docs[:half], real_docs[half:])]
        written = [dist.count_partition(plan, i, part) for i, part in enumerate(halves)]
        kept = [dist.count_partition(plan, i, part, keep=1e6) for i, part in enumerate(halves)]
        held = {r.index: r.occ for r in kept}
        assert all(r.off is not None and r.off.shape == (2, (1 << 10) + 1) and r.occ is None for r in written)
        assert sorted(p.name for p in (tmp_path / "scratch").iterdir()) == [
            f"p{i:07d}.{name}.npy" for i in (0, 1) for name in ("pc", "ph", "pn", "ref")]
        ranges = dist.bucket_ranges(sum(r.ref_keys for r in written), minimum=4)
        from_files = [dist.resolve_buckets(plan, [0, 1], lo, hi, None, dist.range_offsets(written, lo, hi))
                      for lo, hi in ranges]
        in_memory = [dist.resolve_buckets(plan, [0, 1], lo, hi, held) for lo, hi in ranges]
        assert [h.tolist() for h in from_files] == [h.tolist() for h in in_memory]
        assert sum(int(h.sum()) for h in from_files) > 0
        (tmp_path / "scratch" / "p0000001.ref.npy").unlink()
        with pytest.raises(FileNotFoundError, match=r"p0000001\.ref\.npy is missing: the scratch directory must be "
                                                    r"shared by every Dask worker \(pass scratch= / --scratch"):
            for lo, hi in ranges:
                dist.resolve_buckets(plan, [0, 1], lo, hi, None, dist.range_offsets(written, lo, hi))
    finally:
        dist.release()
