"""Experiment: how small is a subset of a trained table for one corpus?

Train a byte-hash donor (cl100k_base) on a sample of every corpus in a corpus folder (``--corpus-dir``, default
``corpus/``: pydocs, kerneldocs, debref-en and debref-de ``.jsonl.gz``), or take a trained one (``--asset``), then
`subset` it by slices of pydocs (1, 10, 100 documents, the whole training split) and report pages kept, bytes on
disk and the share of lookups served on the slice and on pydocs held-out documents. Also the pages pydocs would
touch in larger page-local layouts (computed from addresses only, no table written).

    nice -n 10 python benchmarks/assetops_subset.py --corpus-dir corpus --out docs/results/assetops
    python benchmarks/assetops_subset.py --asset donor-all.asset --corpus-dir corpus --work subset-work --out subset-all
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from polymem._io import atomic_path, atomic_write_text


def read_docs(path: str, limit: int | None = None) -> list[str]:
    """The first ``limit`` document texts of a corpus file (polymem's own corpus reader)."""
    from itertools import islice

    from polymem.corpus import Corpus

    return [d.text for d in islice(Corpus([path]), limit)]


def write_docs(texts, path: Path) -> Path:
    with atomic_path(path) as tmp, gzip.open(tmp, "wt", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--corpus-dir", "--shared", dest="corpus_dir", default="corpus",
                   help="folder holding pydocs.jsonl.gz (and, without --asset, kerneldocs, debref-en, debref-de)")
    p.add_argument("--kernel-docs", type=int, default=400)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--params", type=int, default=12_000_000)
    p.add_argument("--asset", default=None, help="subset this existing byte-addressed asset instead of training one")
    p.add_argument("--pydocs-docs", type=int, default=None, help="use only the first N pydocs documents")
    p.add_argument("--work", default="/tmp/assetops-subset")
    p.add_argument("--out", default="docs/results/assetops")
    a = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    from polymem import HashSpec, Layout, MemoryAsset, TokenHashes, load_tokenizer
    from polymem.ops.subset import subset
    from polymem.recipes.train import MemoryConfig, TrainConfig, split_documents, train_donor

    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    sh = Path(a.corpus_dir)
    needed = ["pydocs"] + ([] if a.asset else ["kerneldocs", "debref-en", "debref-de"])
    missing = [f"{n}.jsonl.gz" for n in needed if not (sh / f"{n}.jsonl.gz").is_file()]
    if missing:
        raise SystemExit(f"error: --corpus-dir {str(sh)!r} has no {', '.join(missing)}: pass the folder that holds "
                         f"{', '.join(n + '.jsonl.gz' for n in needed)}")
    py = read_docs(str(sh / "pydocs.jsonl.gz"), a.pydocs_docs)
    py_train, py_held = split_documents(py, 10)
    mix = [] if a.asset else py + read_docs(str(sh / "kerneldocs.jsonl.gz"), a.kernel_docs) + read_docs(str(sh / "debref-en.jsonl.gz")) \
        + read_docs(str(sh / "debref-de.jsonl.gz"))
    rng = np.random.default_rng(0)
    mix = [mix[i] for i in rng.permutation(len(mix))]
    t0 = time.perf_counter()
    cfg = TrainConfig(steps=a.steps, batch_size=8, block_size=128, n_layer=2, n_head=4, d_model=128)
    mem = MemoryConfig(params=a.params, heads=8, slots=4, head_dim=32)
    asset_path = Path(a.asset) if a.asset else work / "mix.pmem"
    if not asset_path.exists():
        corpus = write_docs(mix, work / "mix.jsonl.gz")
        s = train_donor("cl100k_base", [corpus], asset_path, cfg=cfg, mem=mem, overwrite=True, max_eval_tokens=20_000,
                        on_step=lambda i, l: print(f"step {i + 1} loss {l:.3f}", flush=True) if (i + 1) % 50 == 0 else None)
        print("donor", s["heldout_bpb"], s["heldout_bpb_memory_off"], s["rows_touched"], flush=True)
    full = MemoryAsset.open(asset_path)
    held = write_docs(py_held, work / "py-held.jsonl.gz")
    trained_here = {"corpus_docs": len(mix), "kerneldocs_docs": a.kernel_docs, "train": asdict(cfg),
                    "memory": asdict(mem)} if not a.asset else {"provenance": full.provenance}
    res = {"donor": {"asset": str(asset_path), "provenance_corpus": full.provenance.get("corpus"), **trained_here,
                     "layout": full.layout.to_dict(),
                     "rows_trained": int((full.row_counts() > 0).sum()) if full.row_counts() is not None else None,
                     "pages_nonzero": full.nonzero_pages()},
           "subsets": []}
    for n in sorted({1, 10, min(100, len(py_train)), len(py_train)}):
        sl = write_docs(py_train[:n], work / f"py-{n}.jsonl.gz")
        t1 = time.perf_counter()
        rep = subset(full, work / f"sub-{n}.pmem", tokenizer="cl100k_base", corpus=[sl], heldout=[held], overwrite=True)
        row = {"pydocs_train_docs": n, "bytes_text": sum(len(t.encode()) for t in py_train[:n]), **rep.to_dict(),
               "seconds": time.perf_counter() - t1}
        res["subsets"].append(row)
        print(json.dumps(row), flush=True)
    rep = subset(full, work / "sub-mincount.pmem", min_count=5, overwrite=True)
    res["min_count_5"] = rep.to_dict()
    # pages pydocs (training split) would touch in larger page-local layouts (addresses only)
    tok = load_tokenizer("cl100k_base")
    cache = TokenHashes.build(tok, HashSpec())
    hs = []
    for t in py_train:
        h, v = cache.ngram_hashes(tok.encode(t), max_n=3)
        hs.append(h[v])
    allh = np.unique(np.concatenate(hs))
    res["unique_ngrams_pydocs_train"] = int(allh.size)
    res["hypothetical"] = []
    for params in (12e6, 200e6, 2e9, 20e9):
        lay = Layout.for_params(int(params), heads=8, slots=4, head_dim=32)
        pages = np.unique(lay.rows(allh)[:, 0] // lay.rows_per_page).size
        res["hypothetical"].append({"params": int(params), "pages": lay.pages, "pages_touched": int(pages),
                                    "share": pages / lay.pages, "bytes_fp16": int(pages) * lay.rows_per_page * 32 * 2,
                                    "full_bytes_fp16": lay.pages * lay.rows_per_page * 32 * 2})
        print(json.dumps(res["hypothetical"][-1]), flush=True)
    res["elapsed_s"] = time.perf_counter() - t0
    res["command"] = "python benchmarks/assetops_subset.py " + " ".join(sys.argv[1:])
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "subset.json", json.dumps(res, indent=1) + "\n")
    print("wrote", out / "subset.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
