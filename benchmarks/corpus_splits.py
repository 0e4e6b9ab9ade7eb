"""Corpora made from the recipes' document split (document i is held out when i % 10 == 9, as `polymem train` and
`polymem transfer` split a corpus): one corpus's training split, or a mix of two corpora that keeps each one's
held-out documents held out (docs/benchmarks.md, "Asset operations").

    python benchmarks/corpus_splits.py train corpus/pydocs.jsonl.gz --out pydocs-train.jsonl.gz
    python benchmarks/corpus_splits.py mix corpus/pydocs.jsonl.gz corpus/kerneldocs.jsonl.gz --out mix.jsonl.gz

``train``: the documents a donor trained on that corpus saw (what `polymem convert` replays).
``mix``: documents alternate A / B; every held-out position of the mix (i % 10 == 9) holds a held-out document
of A or B (alternating), every other position a training document, so a recipient trained and scored on the mix
is scored only on text that neither a donor trained on A nor one trained on B saw. It stops after the last
complete group of ten: with 497 and 4,739 documents, 882 training and 98 held-out documents.
"""

from __future__ import annotations

import argparse
import gzip
import json

from polymem._io import atomic_path
from polymem.recipes.data import read_documents, split_documents


def alternate(a: list[str], b: list[str]) -> list[str]:
    """a[0], b[0], a[1], b[1], … up to the shorter list's end."""
    return [t for pair in zip(a, b) for t in pair]


def mix(a: list[str], b: list[str], heldout_every: int = 10) -> list[str]:
    """Documents of A and B whose split (every ``heldout_every``-th held out) holds out only held-out documents."""
    a_train, a_held = split_documents(a, heldout_every)
    b_train, b_held = split_documents(b, heldout_every)
    train, held = alternate(a_train, b_train), alternate(a_held, b_held)
    groups = min(len(held), len(train) // (heldout_every - 1))
    if groups == 0:
        raise SystemExit(f"error: {len(a)} and {len(b)} documents give {len(held)} held-out and {len(train)} training "
                         f"documents to alternate: each corpus needs at least {heldout_every} documents")
    out: list[str] = []
    for g in range(groups):
        out += train[g * (heldout_every - 1):(g + 1) * (heldout_every - 1)] + [held[g]]
    return out


def write_jsonl_gz(texts: list[str], path: str) -> None:
    """One ``{"text": …}`` line per document, gzip-compressed, written to a temporary file and renamed."""
    with atomic_path(path) as tmp, gzip.open(tmp, "wt", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["train", "mix"], help="train: one corpus's training split; mix: two corpora")
    p.add_argument("corpus", nargs="+", help="train: one corpus; mix: two (A and B)")
    p.add_argument("--out", required=True, help="the .jsonl.gz to write")
    p.add_argument("--heldout-every", type=int, default=10, help="the recipes' --heldout-every (default 10)")
    a = p.parse_args(argv)
    want = 1 if a.what == "train" else 2
    if len(a.corpus) != want:
        raise SystemExit(f"error: {a.what} takes {want} corpus file(s), got {len(a.corpus)}: {a.corpus}")
    if not a.out.endswith(".jsonl.gz"):
        raise SystemExit(f"error: --out {a.out!r}: name a .jsonl.gz file")
    docs = [read_documents([c]) for c in a.corpus]
    texts = split_documents(docs[0], a.heldout_every)[0] if a.what == "train" else mix(*docs, a.heldout_every)
    write_jsonl_gz(texts, a.out)
    print(f"wrote {a.out}: {len(texts)} documents ({', '.join(f'{c}: {len(d)}' for c, d in zip(a.corpus, docs))})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
