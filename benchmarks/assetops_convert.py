"""Experiment: is a converted Engram-style table as good as the original under its own tokenizer?

Phase "gap": train a small GPT with an id-hashed (Engram XOR) table (`train_donor(hash="xor")`) on a corpus with
tokenizer T; evaluate held-out bits/byte (a) with the id table, (b) with the table converted to byte addressing
(`polymem.convert`, replaying the training split with T) read through byte hashes — same backbone, same site
weights, only the table and its addressing swapped — for target tables of 1× and 4× the source's rows, and
(c) with memory off. Phase "transfer": the converted table, frozen, in recipients with another tokenizer (the
transfer arms of polymem/recipes/transfer.py: none / random / donor) next to a native byte-hash donor trained with
the same budget. Phase "subset": subset size on disk.

    nice -n 10 python benchmarks/assetops_convert.py --phase gap --out docs/results/assetops
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path



def write_docs(texts, path: Path) -> Path:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    return path


def read_docs(path: str, limit: int | None = None) -> list[str]:
    """The first ``limit`` document texts of a corpus file (polymem's own corpus reader)."""
    from itertools import islice

    from polymem.corpus import Corpus

    return [d.text for d in islice(Corpus([path]), limit)]


def phase_gap(a) -> dict:
    import torch

    torch.set_num_threads(a.threads)
    from polymem import HashSpec, Layout, MemoryAsset, convert
    from polymem.torch.attach import attach
    from polymem.torch.tables import TrainableTable
    from polymem.recipes.train import MemoryConfig, TrainConfig, evaluate_bpb, split_documents, train_donor

    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    texts = read_docs(a.corpus, a.docs)
    corpus = write_docs(texts, work / "corpus.jsonl.gz")
    cfg = TrainConfig(steps=a.steps, batch_size=a.batch, block_size=a.block, n_layer=a.layers, n_head=4,
                      d_model=a.d_model, seed=0)
    mem = MemoryConfig(params=a.params, heads=a.heads, slots=4, head_dim=a.head_dim, max_n=3)
    t0 = time.perf_counter()
    s = train_donor(a.tokenizer, [corpus], work / "xor.pmem", cfg=cfg, mem=mem, hash="xor", overwrite=True,
                    max_eval_tokens=a.eval_tokens, return_model=True,
                    on_step=lambda i, l: print(f"step {i + 1} loss {l:.3f}", flush=True) if (i + 1) % 50 == 0 else None)
    model, handle, data = s.pop("model"), s.pop("handle"), s.pop("data")
    print("trained", {k: v for k, v in s.items() if k not in ("layout",)}, flush=True)
    res = {"config": {"train": asdict(cfg), "memory": asdict(mem), "docs": len(texts), "corpus": a.corpus,
                      "tokenizer": a.tokenizer, "eval_tokens": a.eval_tokens},
           "bpb_id_table": s["heldout_bpb"], "bpb_memory_off": s["heldout_bpb_memory_off"], "train_s": s["train_s"],
           "converted": []}
    site_state = {k: v.clone() for k, v in handle.sites.state_dict().items()}
    handle.detach()
    train_texts, _ = split_documents(texts, 10)
    conv_corpus = write_docs(train_texts, work / "train-split.jsonl.gz")
    src = MemoryAsset.open(work / "xor.pmem")
    for mult in a.mults:
        pages = max(1, int(src.layout.num_rows * mult) // (a.heads * 4))
        lay = Layout(pages=pages, heads=a.heads, slots=4, head_dim=a.head_dim)
        t1 = time.perf_counter()
        rep = convert(src, data.tokenizer, [conv_corpus], work / f"conv-{mult}x.pmem", layout=lay, overwrite=True)
        conv_s = time.perf_counter() - t1
        tab = TrainableTable(MemoryAsset.open(rep.path).to_numpy(), spec=HashSpec(), layout=lay, orders=(1, 2, 3),
                             trainable=False)
        h2 = attach(model, tab, data.cache, layers=list(mem.layers), train="projection", max_n=3, gate=mem.gate,
                    init_seed=cfg.seed + 1000)
        h2.sites.load_state_dict(site_state)
        bpb = evaluate_bpb(model, data, cfg, max_tokens=a.eval_tokens)
        h2.detach()
        row = {"target_rows_vs_source": mult, "layout": lay.to_dict(), "bpb_converted": bpb,
               "gap": bpb - res["bpb_id_table"], "convert_s": conv_s, **{k: v for k, v in rep.to_dict().items()
                                                                        if k not in ("path", "layout")}}
        res["converted"].append(row)
        print("converted", json.dumps(row), flush=True)
    res["elapsed_s"] = time.perf_counter() - t0
    return res


def phase_transfer(a) -> dict:
    """Transfer arms (none / random / converted donor, polymem.recipes.transfer.run_transfer_jobs) for a recipient
    with another tokenizer family, plus a native byte-hash donor (same corpus, steps and table layout as the
    converted one) attached the same way on the same seeds."""
    import torch

    torch.set_num_threads(a.threads)
    from polymem import MemoryAsset
    from polymem.torch.attach import attach
    from polymem.torch.tables import TrainableTable
    from polymem.recipes.train import (MemoryConfig, TokenData, TrainConfig, build_model, evaluate_bpb, read_documents,
                                     split_documents, train_donor, train_loop)
    from polymem.recipes.transfer import run_transfer_jobs

    work = Path(a.work)
    corpus = work / "corpus.jsonl.gz"
    conv = work / f"conv-{a.transfer_mult:g}x.pmem"
    if not conv.exists():
        conv = work / f"conv-{a.transfer_mult}x.pmem"
    lay = MemoryAsset.open(conv).layout
    cfg = TrainConfig(steps=a.steps, batch_size=a.batch, block_size=a.block, n_layer=a.layers, n_head=4,
                      d_model=a.d_model, seed=0)
    rcfg = TrainConfig(steps=a.transfer_steps, batch_size=a.batch, block_size=a.block, n_layer=a.layers, n_head=4,
                       d_model=a.d_model)
    seeds = tuple(range(a.seeds))
    t0 = time.perf_counter()
    r = run_transfer_jobs(str(conv), a.recipient, [str(corpus)], seeds=seeds, jobs=min(2, len(seeds)), threads=1,
                          cfg=rcfg, max_eval_tokens=a.eval_tokens)
    out = {"converted": {k: r[k] for k in ("arms", "seeds", "steps", "tokens", "coverage", "margins", "target_met") if k in r}}
    print("converted arms", json.dumps(out["converted"]["arms"]), flush=True)
    native = work / "native.pmem"
    mem = MemoryConfig(params=lay.params, heads=lay.heads, slots=lay.slots, head_dim=lay.head_dim, max_n=3)
    if not native.exists():
        s = train_donor(a.tokenizer, [corpus], native, cfg=cfg, mem=mem, overwrite=True, max_eval_tokens=a.eval_tokens)
        out["native_donor_train"] = {k: s[k] for k in ("heldout_bpb", "heldout_bpb_memory_off", "rows_touched", "train_s")}
    nat = MemoryAsset.open(native)
    train_texts, held_texts = split_documents(read_documents([corpus]), 10)
    data = TokenData.build(a.recipient, train_texts, held_texts)
    bpbs = []
    for seed in seeds:
        c = TrainConfig(**{**asdict(rcfg), "seed": int(seed)})
        model = build_model(data, c, seed=seed)
        table = TrainableTable(nat.to_numpy(), spec=nat.spec, layout=nat.layout, orders=tuple(nat.orders), trainable=False)
        h = attach(model, table, data.cache, layers=[1], train="projection", max_n=3, init_seed=1000 + int(seed),
                   freeze_model=False, value_init="zero")
        train_loop(model, h, data, c)
        bpbs.append(evaluate_bpb(model, data, c, max_tokens=a.eval_tokens))
        h.detach()
        print("native seed", seed, bpbs[-1], flush=True)
    out["native"] = {"bpb": bpbs}
    return {"recipient": a.recipient, "donor_tokenizer": a.tokenizer, "transfer_steps": a.transfer_steps,
            "elapsed_s": time.perf_counter() - t0, **out}


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--phase", choices=["gap", "transfer"], default="gap")
    p.add_argument("--corpus", default="/work/shared/corpus/pydocs.jsonl.gz")
    p.add_argument("--docs", type=int, default=None)
    p.add_argument("--tokenizer", default="cl100k_base")
    p.add_argument("--recipient", default="mistral-v1")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--transfer-steps", type=int, default=200)
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--block", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--params", type=int, default=2_000_000)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=16)
    p.add_argument("--mults", type=float, nargs="+", default=[1.0, 4.0])
    p.add_argument("--transfer-mult", type=float, default=4.0)
    p.add_argument("--eval-tokens", type=int, default=40_000)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--work", default="/tmp/assetops-exp")
    p.add_argument("--out", default="docs/results/assetops")
    a = p.parse_args(argv)
    res = phase_gap(a) if a.phase == "gap" else phase_transfer(a)
    res["command"] = "python benchmarks/assetops_convert.py " + " ".join(sys.argv[1:])
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"convert-{a.phase}.json").write_text(json.dumps(res, indent=1) + "\n")
    print("wrote", out / f"convert-{a.phase}.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
