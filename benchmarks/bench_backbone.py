"""A frozen pretrained backbone in fp32 and in bf16 (what ``--precision auto`` picks on a CPU with native bf16):
scoring, training a site, and decoding, on both builtin models, fp32 and bf16 interleaved in every round.

    python benchmarks/bench_backbone.py --rounds 9 --threads 1 --json docs/benchmarks/backbone.json

Per model and round, each at fp32 and at bf16 (two loads of the model, both kept):

* **eval**: held-out bits per byte of pydocs (``--eval-tokens`` tokens of its held-out documents, windows of 512)
  with :class:`polymem.models.evaluate.Scorer`, tokens/s and the score (bf16 must stay within 0.3 % of fp32);
* **train --model**: ``--train-steps`` steps of :func:`polymem.recipes.frozen.train_site` (a 2M-scalar table and
  its site before block 2, batch 2 × 256 tokens, the corpus softmax): tokens/s;
* **generate**: greedy decoding of ``--new-tokens`` tokens from pydocs prompts of equal length at b = 1 and b = 8
  with :func:`polymem.models.generate.generate`, and transformers' own ``model.generate`` on the same model and
  prompts (tokens/s over the decoding steps for polymem; for transformers, new tokens over its whole call minus
  one prefill measured alone). Both must give the same tokens.

``--three-sites`` adds the end-to-end comparison the eval target names: ``polymem eval`` of three sites in one
call (this checkout) against three calls of the eval of ``--baseline-src`` (a checkout of the code before one
pass per score; its eval scores alone, with the table and table off in fp32), in subprocesses, interleaved.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from bench_precision import _model_name as cpu_model  # the CPU's model name from /proc/cpuinfo

MODELS = ("smollm2-135m", "gemma3-270m")


def cpu_flags() -> str:
    from polymem.torch.precision import host_cpu_flags

    flags = host_cpu_flags() or frozenset()
    return " ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags) or "?"


def pydocs() -> tuple[list[str], list[str]]:
    """(training, held-out) documents of the shipped sample, every 10th held out."""
    from polymem.recipes.data import read_documents, split_documents

    return split_documents(read_documents(["sample:pydocs"]), 10)


def prompts(lm, n: int, length: int = 12) -> list[str]:
    """``n`` prompts of exactly ``length`` tokens (pieces of pydocs lines), so that b = 8 is one batch."""
    from polymem.recipes.data import read_documents

    out = []
    for doc in read_documents(["sample:pydocs"]):
        for line in doc.splitlines():
            ids = lm.tokenizer.encode(line)
            if len(ids) >= length:
                text = lm.tokenizer.decode_bytes(ids[:length]).decode("utf-8", errors="ignore")
                if len(lm.tokenizer.encode(text)) == length:
                    out.append(text)
            if len(out) == n:
                return out
    raise SystemExit(f"pydocs gave only {len(out)} prompts of {length} tokens")


def bench_eval(lm, texts: list[str], tokens: int) -> dict:
    from polymem.models.evaluate import Scorer, scoring_set

    sc = Scorer(lm, [t for _, t in scoring_set(lm.tokenizer, texts, doc_tokens=512)], window=512)
    keep = []
    n = 0
    for w in sc.windows:  # the first windows up to the token budget
        keep.append(w)
        n += w.targets.size
        if n >= tokens:
            break
    sc.windows = keep
    t = time.perf_counter()
    got = sc.score()
    el = time.perf_counter() - t
    return {"tokens_per_s": got["tokens"] / el, "bpb": got["bpb"], "tokens": got["tokens"]}


def bench_train(lm, train: list[str], steps: int) -> dict:
    from polymem.recipes.frozen import FrozenTrainConfig, corpus_stream, train_site
    from polymem.torch.attach import attach

    cfg = FrozenTrainConfig(steps=steps, batch_size=2, block_size=256, layers=(2,), params=2_000_000, heads=4,
                            head_dim=16)
    data = corpus_stream(lm, texts=train[:20], heldout_every=10)
    h = attach(lm.model, cfg.layout(), lm.tokenizer, layers=[2], train="table", max_n=3, init_seed=1)
    try:
        res = train_site(lm, h, data.train, cfg)
    finally:
        h.detach()
    return {"tokens_per_s": res["tokens_per_s"], "loss": float(np.mean(res["losses"]))}


def bench_generate(lm, ps: list[str], new: int, b: int) -> dict:
    from polymem.models.generate import Decoding, generate

    res = generate(lm, ps[:b], Decoding(max_new_tokens=new), batch=b)
    ours = [r.new_ids for r in res["results"]]
    ids = torch.tensor([[lm.bos_id] + lm.tokenizer.encode(p).tolist() for p in ps[:b]])
    with torch.no_grad():
        t = time.perf_counter()
        lm.model(input_ids=ids)  # a prefill alone, to take out of transformers' total
        pre = time.perf_counter() - t
        t = time.perf_counter()
        out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                                do_sample=False, eos_token_id=None, pad_token_id=lm.eos_id)
        el = time.perf_counter() - t
    theirs = out[:, ids.shape[1]:].tolist()
    same = all(o[:len(t)] == t[:len(o)] for o, t in zip(ours, theirs))
    return {"tokens_per_s": res["tokens_per_s"], "hf_tokens_per_s": b * (new - 1) / max(el - pre, 1e-9),
            "same_tokens": same}


def three_sites(args) -> dict:
    """One `polymem eval` of three sites (this checkout) against three calls of the baseline's eval."""
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, POLYMEM_OFFLINE="1")
    sites = []
    for i in range(3):
        out = work / f"t{i}.pmem"
        if not (work / f"t{i}.pmem.site").exists():
            subprocess.run([sys.executable, "-m", "polymem", "train", "--model", "smollm2-135m", "--corpus",
                            "sample:pydocs", "--out", str(out), "--steps", "2", "--batch-size", "2", "--params", "2M",
                            "--eval-tokens", "256", "--seed", str(i), "--threads", str(args.threads), "--precision",
                            "fp32"], check=True, env=env, capture_output=True)
        sites.append(str(work / f"t{i}.pmem.site"))
    common = ["--model", "smollm2-135m", "--corpus", "sample:pydocs", "--heldout-every", str(args.heldout_every),
              "--max-docs", str(args.eval_docs), "--threads", str(args.threads)]  # 9: two short documents first
    # the baseline keeps a model cache of its own (the two versions' cache entries differ in format)
    old_env = dict(env, PYTHONPATH=str(Path(args.baseline_src).resolve()), POLYMEM_CACHE_DIR=str(work / "baseline-cache"))
    times: dict[str, list[float]] = {"three calls (baseline)": [], "one call": []}
    for e in (old_env, env):  # a first load fills each cache (not timed)
        subprocess.run([sys.executable, "-m", "polymem", "eval", *common, "--max-docs", "1"], check=True, env=e,
                       capture_output=True)
    for rnd in range(args.site_rounds):
        t = time.perf_counter()
        for s in sites:
            subprocess.run([sys.executable, "-m", "polymem", "eval", *common, "--site", s, "--table",
                            s[:-len(".site")]], check=True, env=old_env, capture_output=True)  # its sites name absolute paths
        times["three calls (baseline)"].append(time.perf_counter() - t)
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "polymem", "eval", *common, *[x for s in sites for x in ("--site", s)]],
                       check=True, env=env, capture_output=True)
        times["one call"].append(time.perf_counter() - t)
        print(f"three sites, round {rnd}: " + ", ".join(f"{k} {v[-1]:.1f} s" for k, v in times.items()), flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"seconds": times, "median_s": med, "speedup": med["three calls (baseline)"] / med["one call"],
            "documents": args.eval_docs, "heldout_every": args.heldout_every}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--eval-tokens", type=int, default=1024)
    ap.add_argument("--train-steps", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--three-sites", action="store_true")
    ap.add_argument("--baseline-src", help="a checkout of the code to compare the three-site eval with")
    ap.add_argument("--site-rounds", type=int, default=5)
    ap.add_argument("--eval-docs", type=int, default=2)
    ap.add_argument("--heldout-every", type=int, default=9, help="the three-site eval's split (9: 4 held-out "
                    "documents, the first two short: 3,045 bytes; 3: 14 documents)")
    ap.add_argument("--work", default="/tmp/bench-backbone")
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from polymem.models import load_model

    train, texts = pydocs()
    res: dict = {"cpu": cpu_model(), "cpu_flags": cpu_flags(), "threads": a.threads, "torch": torch.__version__,
                 "rounds": a.rounds, "models": {}}
    for name in [m for m in a.models.split(",") if m]:
        lms = {p: load_model(name, precision=p) for p in ("fp32", "bf16")}
        ps = prompts(lms["fp32"], 8)
        runs: dict[str, dict[str, list]] = {p: {} for p in lms}
        for rnd in range(a.rounds):
            for p, lm in lms.items():
                r = runs[p]
                e = bench_eval(lm, texts, a.eval_tokens)
                tr = bench_train(lm, train, a.train_steps)
                g1 = bench_generate(lm, ps, a.new_tokens, 1)
                g8 = bench_generate(lm, ps, a.new_tokens, 8)
                for k, v in (("eval", e["tokens_per_s"]), ("bpb", e["bpb"]), ("train", tr["tokens_per_s"]),
                             ("generate_b1", g1["tokens_per_s"]), ("hf_generate_b1", g1["hf_tokens_per_s"]),
                             ("generate_b8", g8["tokens_per_s"]), ("hf_generate_b8", g8["hf_tokens_per_s"]),
                             ("same_tokens", g1["same_tokens"] and g8["same_tokens"])):
                    r.setdefault(k, []).append(v)
                print(f"{name} round {rnd} {p}: eval {e['tokens_per_s']:.0f} tok/s (bpb {e['bpb']:.4f}), train "
                      f"{tr['tokens_per_s']:.0f} tok/s, generate b1 {g1['tokens_per_s']:.1f} (transformers "
                      f"{g1['hf_tokens_per_s']:.1f}), b8 {g8['tokens_per_s']:.1f} ({g8['hf_tokens_per_s']:.1f}) tok/s, "
                      f"same tokens {g1['same_tokens'] and g8['same_tokens']}", flush=True)
        med = {p: {k: statistics.median(v) for k, v in r.items() if k != "same_tokens"} for p, r in runs.items()}
        ratio = {k: med["bf16"][k] / med["fp32"][k] for k in med["fp32"] if k != "bpb"}
        # per-round ratios (fp32 and bf16 ran back to back), for the spread
        spread = {k: [b / f for f, b in zip(runs["fp32"][k], runs["bf16"][k])] for k in ratio}
        res["models"][name] = {
            "median": med, "bf16_over_fp32": ratio,
            "bf16_over_fp32_range": {k: [min(v), max(v)] for k, v in spread.items()},
            "bpb_change_bf16": med["bf16"]["bpb"] / med["fp32"]["bpb"] - 1,
            "ours_over_transformers_b1": {p: med[p]["generate_b1"] / med[p]["hf_generate_b1"] for p in med},
            "ours_over_transformers_b8": {p: med[p]["generate_b8"] / med[p]["hf_generate_b8"] for p in med},
            "same_tokens_every_round": {p: all(r["same_tokens"]) for p, r in runs.items()}, "runs": runs}
        print(json.dumps({k: v for k, v in res["models"][name].items() if k != "runs"}, indent=1), flush=True)
        del lms
    if a.three_sites:
        if not a.baseline_src:
            raise SystemExit("--three-sites needs --baseline-src DIR (e.g. a `git worktree add DIR 2f811cf`)")
        res["three_sites"] = three_sites(a)
        print(json.dumps({k: v for k, v in res["three_sites"].items() if k != "seconds"}, indent=1))
    if a.json:
        from polymem._io import atomic_write_json

        atomic_write_json(a.json, res, indent=1)


if __name__ == "__main__":
    main()
