"""Benchmark: the per-document counting of `polymem coverage` on token ids made beforehand, and its byte-fidelity
check (byte loop vs 8-byte words).

    python benchmarks/bench_coverage_doc.py ../shared/corpus/kerneldocs.jsonl.gz --repeat 3 \
        [--partition-docs 600] [--json out.json]

The corpus is read and encoded once with both tokenizers (mistral-v1 target, cl100k_base reference; not timed).
Then, per round and interleaved partition by partition (so that a load change on a shared machine hits both
sides alike), CPU time (time.process_time) of:
  fused    HashCounter adds through doc_scan_ids (built from the ids; the path `polymem coverage` takes)
  bytes    byte fidelity of both tokenizers with compare_token_bytes (byte loop)
  words    the same with compare_token_words (8-byte words; what `polymem coverage` runs)
Counters see ``--partition-docs`` documents each (600 ≈ 4 MB of kerneldocs, a real run's partition); the
occurrence pass after the documents is not timed. Medians over rounds, and the fidelity ratio.

The "rows" path this benchmark used to time against the fused kernel (hash rows, then a per-document kernel)
was removed since: every input now goes through the fused kernel.
Its figures are reproduced by running this script from a checkout of commit aa56aa1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("corpus")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--partition-docs", type=int, default=600)
    ap.add_argument("--max-n", type=int, default=7)
    ap.add_argument("--json")
    a = ap.parse_args()
    warnings.simplefilter("ignore")
    from polymem.analysis.coverage import _sets
    from polymem.analysis.coverage import run as R
    from polymem.analysis.coverage.counter import HashCounter
    from polymem.corpus import Corpus
    from polymem.hash.spec import HashSpec
    from polymem.tokenizers import load_tokenizer

    tt, tr = load_tokenizer("mistral-v1"), load_tokenizer("cl100k_base")
    ct, cr = R._hashes(tt, HashSpec()), R._hashes(tr, HashSpec())
    docs = []
    for d in Corpus([a.corpus]):
        if d.text:
            data = d.text.encode("utf-8")
            docs.append((tt.encode(d.text), tr.encode(d.text), data))
    P = a.partition_docs
    parts = [docs[lo:lo + P] for lo in range(0, len(docs), P)]
    print(f"{len(docs)} documents, {sum(len(x[0]) for x in docs) / 1e6:.1f} M target / "
          f"{sum(len(x[1]) for x in docs) / 1e6:.1f} M reference tokens, {len(parts)} partitions", flush=True)

    def count(part: list, path: str) -> tuple[float, object]:
        c = HashCounter(ct, cr, a.max_n)
        c0 = time.process_time()
        for ti, ri, _ in part:
            c.add(ti, ri)
        dt = time.process_time() - c0
        return dt, c.finish_one()

    (pt, pr), pad = (R._packed(tt), R._packed(tr)), bytes(_sets.PAD)

    def fidelity(part: list, path: str) -> float:
        c0 = time.process_time()
        if path == "bytes":
            for ti, ri, data in part:
                text = np.frombuffer(data, np.uint8)
                _sets.compare_token_bytes(ti, *pt, text)
                _sets.compare_token_bytes(ri, *pr, text)
        else:
            for ti, ri, data in part:
                padded = np.frombuffer(data + pad, np.uint8)
                _sets.compare_token_words(ti, *pt, padded, len(data), 1)
                _sets.compare_token_words(ri, *pr, padded, len(data), 0)
        return time.process_time() - c0

    for part in parts:  # warm-up (loads the compiled kernels)
        count(part, "fused")
    fidelity(parts[0], "bytes"), fidelity(parts[0], "words")
    times: dict[str, list[float]] = {k: [] for k in ("fused", "bytes", "words")}
    for r in range(a.repeat):
        acc = dict.fromkeys(times, 0.0)
        for part in parts:
            acc["fused"] += count(part, "fused")[0]
            for path in (("bytes", "words") if r % 2 == 0 else ("words", "bytes")):
                acc[path] += fidelity(part, path)
        for k, v in acc.items():
            times[k].append(v)
        print(f"round {r + 1}: " + "  ".join(f"{k} {v:.2f}" for k, v in acc.items()), flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"medians (CPU-s): adds {med['fused']:.2f}; fidelity bytes {med['bytes']:.2f} -> words {med['words']:.2f} "
          f"({med['words'] / med['bytes']:.2f}x)")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"corpus": a.corpus, "argv": sys.argv, "rounds": times, "medians": med}, fh, indent=1)


if __name__ == "__main__":
    main()
