"""Benchmark: tiktoken ids for polymem's int64 arrays, as a Python list converted by numpy (the adapter's
earlier way) vs tiktoken's numpy buffer (`encode_to_numpy`, what `TiktokenTokenizer.encode` takes now).

    python benchmarks/bench_tiktoken_ids.py ../shared/corpus/pydocs.jsonl.gz --repeat 4 [--json out.json]

cl100k_base; per document, the two ways back to back in alternating order (so that a load change on a shared
machine hits both alike), CPU time (time.process_time) summed per round; every document's ids are checked equal.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("corpus", nargs="+")
    ap.add_argument("--repeat", type=int, default=4)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    from polymem.corpus import Corpus
    from polymem.tokenizers import load_tokenizer

    tok = load_tokenizer("cl100k_base")
    texts = [d.text for d in Corpus(args.corpus)]
    as_list = lambda t: np.asarray(tok.encoding.encode_ordinary(t), dtype=np.int64)  # noqa: E731
    assert all(np.array_equal(as_list(t), tok.encode(t)) for t in texts), "the two ways gave other ids"
    rounds = []
    for _ in range(args.repeat):
        spent = {"list": 0.0, "buffer": 0.0}
        for i, text in enumerate(texts):
            for way in (("list", "buffer") if i % 2 else ("buffer", "list")):
                c0 = time.process_time()
                as_list(text) if way == "list" else tok.encode(text)
                spent[way] += time.process_time() - c0
        rounds.append({**spent, "buffer_over_list": spent["buffer"] / spent["list"]})
        print(json.dumps(rounds[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"corpus": args.corpus, "docs": len(texts), "rounds": rounds}, indent=2))


if __name__ == "__main__":
    main()
