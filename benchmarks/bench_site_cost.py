"""Benchmark: what a memory site itself costs in a training step of a pretrained model, backbone frozen.

    python benchmarks/bench_site_cost.py --models smollm2-135m,gemma3-270m --corpus pydocs.jsonl.gz --rounds 9 \
        [--json out.json]

Two steps, interleaved in every round (ABAB… so that a change of load on a shared machine hits both alike), on
the same batch (4 × 256 tokens from BOS: the corpus's first tokens, or text the script writes without
``--corpus``) with the same training loss (the corpus softmax of ``polymem train --model`` over the ids of the
whole corpus, or ``--softmax full``):

* ``bias`` — the least any trained site needs: a trainable vector added to the residual stream before block 2
  (a forward pre-hook), AdamW. The backward through the blocks above the site and the output layer is the same
  as with a memory site, so the difference between the two steps is the site's own work;
* ``site`` — ``polymem.attach`` with a 20M-scalar table (8 heads × 4 slots, r = 32, orders 1..3) before block 2,
  ``train="table"``: hashing the ids on the device, gathering 24 rows a token, the projection and gate, their
  backward, the sparse row-wise RMS step on the table and AdamW on the site.

Reported per model: median seconds of each step, and the site's cost as a share of the site step,
(site − bias) / site, per round and its median. With the corpus softmax (the default) each round also times
``site_full`` (the same site step on the exact loss over the whole vocabulary), and the script records how the
two losses' gradients of the site's parameters agree on the batch (cosine, norm ratio). Machine and CPU flags go
with the JSON.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch


def _text() -> str:
    words = ("the of and to in is was for on that with as by at from this be are or have an it not which "
             "memory table page row hash byte model token layer site").split()
    rng = np.random.default_rng(0)
    return " ".join(rng.choice(words, size=6000).tolist())


def _cpu_flags() -> str:
    try:
        flags = next(ln for ln in open("/proc/cpuinfo") if ln.startswith("flags")).split(":")[1].split()
    except (OSError, StopIteration):
        return "unknown"
    keep = [f for f in flags if f.startswith(("avx", "amx", "fma"))]
    return " ".join(sorted(keep))


def bench_model(name: str, rounds: int, softmax: str, layer: int, texts: list[str] | None) -> dict:
    from polymem.models import load_model
    from polymem.models.evaluate import token_nats
    from polymem.recipes.frozen import FrozenTrainConfig, restricted_head, site_optimizers
    from polymem.torch.attach import attach

    lm = load_model(name)
    docs = [lm.tokenizer.encode(t) for t in (texts or [_text()])]
    ids = np.concatenate(docs)
    T, B = 256, 4
    y = torch.from_numpy(np.stack([ids[i * T:(i + 1) * T] for i in range(B)]).astype(np.int64))
    x = torch.cat([torch.full((B, 1), lm.bos_id if lm.bos_id is not None else 0), y[:, :-1]], dim=1)
    vocab = np.unique(ids)  # as `polymem train --model` does: the ids of the whole training text
    cfg = FrozenTrainConfig(layers=(layer,))
    cut = restricted_head(lm.model, vocab)

    def loss_of(mode: str = softmax) -> torch.Tensor:
        if mode == "full":
            return token_nats(lm.model, x, y).mean()
        with cut as remap:
            return token_nats(lm.model, x, remap[y]).mean()

    # bias: a trainable vector before block `layer`
    bias = torch.nn.Parameter(torch.zeros(lm.model.config.hidden_size))
    block = lm.model.model.layers[layer]
    bopt = torch.optim.AdamW([bias], lr=1e-3)

    def add_bias(module, args, kwargs):
        if args:
            return (args[0] + bias, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": kwargs["hidden_states"] + bias}

    handle = attach(lm.model, cfg.layout(), lm.tokenizer, layers=[layer], train="table", max_n=3)
    opt, topt, _ = site_optimizers(handle, cfg)

    def step(mode: str) -> float:
        t0 = time.perf_counter()
        if mode == "bias":
            with handle.disabled():
                hook = block.register_forward_pre_hook(add_bias, with_kwargs=True)
                try:
                    loss_of().backward()
                finally:
                    hook.remove()
            bopt.step()
            bopt.zero_grad(set_to_none=True)
        else:
            loss_of("full" if mode == "site_full" else softmax).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            topt.step()
            topt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    modes = ("bias", "site", "site_full") if softmax == "corpus" else ("bias", "site")
    for m in modes:
        step(m)  # warm-up (allocator, first hashing; the table is no longer all zero)
    # the corpus softmax against the exact loss: the sites' gradient on this batch, after the warm-up steps
    grads = {}
    for m in ("full", "corpus"):
        loss_of(m).backward()
        grads[m] = torch.cat([p.grad.flatten() for p in handle.sites.parameters() if p.grad is not None])
        opt.zero_grad(set_to_none=True)
        topt.zero_grad(set_to_none=True)
    cosine = float(torch.nn.functional.cosine_similarity(grads["full"], grads["corpus"], dim=0))
    norm_ratio = float(grads["corpus"].norm() / grads["full"].norm())
    per: list[dict] = []
    for r in range(rounds):
        order = modes if r % 2 == 0 else modes[::-1]
        got = {m: step(m) for m in order}
        got["site_share"] = (got["site"] - got["bias"]) / got["site"]
        if "site_full" in got:
            got["full_over_corpus"] = got["site_full"] / got["site"]
        per.append(got)
        print(f"{name} round {r + 1}/{rounds}: bias {got['bias']:.3f} s, site {got['site']:.3f} s, "
              f"site share {got['site_share']:+.1%}", flush=True)
    handle.detach()
    return {"model": name, "batch": [B, T], "layer": layer, "softmax": softmax, "table_params": cfg.params,
            "rounds": per, "bias_s_median": statistics.median(p["bias"] for p in per),
            "site_s_median": statistics.median(p["site"] for p in per),
            "site_share_median": statistics.median(p["site_share"] for p in per),
            "site_share_min": min(p["site_share"] for p in per), "site_share_max": max(p["site_share"] for p in per),
            "corpus_ids": int(vocab.size), "vocab": int(lm.tokenizer.vocab_size),
            "softmax_gradient_cosine": cosine, "softmax_gradient_norm_ratio": norm_ratio,
            **({"site_full_s_median": statistics.median(p["site_full"] for p in per),
                "full_over_corpus_median": statistics.median(p["full_over_corpus"] for p in per)} if "site_full" in modes else {})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2-135m,gemma3-270m")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--softmax", choices=("corpus", "full"), default="corpus")
    ap.add_argument("--layer", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--corpus", nargs="*", help="corpus files (the batch and the corpus softmax's ids come from them)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    texts = None
    if args.corpus:
        from polymem.recipes.train import read_documents

        texts = read_documents(args.corpus)
    out = {"machine": {"cpu": platform.processor() or platform.machine(), "flags": _cpu_flags(),
                       "threads": args.threads, "torch": torch.__version__},
           "corpus": args.corpus or "(generated text)",
           "results": [bench_model(m, args.rounds, args.softmax, args.layer, texts) for m in args.models.split(",")]}
    for r in out["results"]:
        print(f"{r['model']}: bias step {r['bias_s_median']:.3f} s, site step {r['site_s_median']:.3f} s (medians); "
              f"site's share {r['site_share_median']:+.1%} (rounds {r['site_share_min']:+.1%} .. {r['site_share_max']:+.1%})")
    if args.json:
        from polymem._io import atomic_write_json

        atomic_write_json(args.json, out, indent=1)


if __name__ == "__main__":
    main()
