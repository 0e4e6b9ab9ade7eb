"""The interpolated next-bytes reader (``ByteBias.mixed``): scoring only the rows the donor wrote, in place,
against the whole formula out of place (every position and order over the whole vocabulary, a new block for each
step: the reader as it was), side by side in one process.

    python benchmarks/bench_mixed_reader.py --out-dir runs/content/nb-s2g --corpus pydocs-heads.jsonl.gz \\
        --model gemma3-270m --json docs/benchmarks/mixed-reader.json

``--out-dir`` is a content-study folder (``polymem transfer --model ... --content-split ... --donor-byte-head 8``):
its donor table, the byte decoder beside the donor's site, and ``split.json`` say which documents the donor read.
The recipient ``--model`` reads windows of ``--tokens`` tokens from the donor-read and the unseen documents; each
round times the reader's forward on the same logits both ways (without gradients, as scoring and generation run
it, and with gradients, as training runs it), alternating which goes first, and checks that they agree. The
order weights are ``--weights`` (default: those a ``donor_next_bytes_mix`` seed learnt, all mixed).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch


def old_scores(d: torch.Tensor, bm: torch.Tensor) -> torch.Tensor:
    """``ByteBias.scores`` as it was: a new [P, V] block for each byte."""
    d = torch.cat([d, d.new_zeros(*d.shape[:-1], 1)], dim=-1)
    s = d[:, 0, :].index_select(1, bm[:, 0])
    for j in range(1, bm.shape[1]):
        s = s + d[:, j, :].index_select(1, bm[:, j])
    return s


def whole(bias, logits: torch.Tensor, lr: torch.Tensor, bm: torch.Tensor) -> torch.Tensor:
    """The mixture over every position and order, out of place (the reader before it skipped unwritten rows and
    updated its blocks in place)."""
    from polymem.torch.bytesite import CHUNK, MIX_CAP

    B, T, N = lr.shape[:3]
    V, P = logits.shape[-1], B * T
    w = bias.w
    lam = w + (w.clamp(0.0, MIX_CAP / N) - w).detach()
    x = logits.float().reshape(P, V)
    d = lr.reshape(P, N, bias.head.j, 256)
    step = P if torch.is_grad_enabled() and bias.w.requires_grad else CHUNK
    out = []
    for a in range(0, P, step):
        lp = torch.log_softmax(x[a:a + step], dim=-1)
        acc = torch.zeros_like(lp)
        for n in range(N):
            s = old_scores(d[a:a + step, n], bm)
            acc = acc + lam[n] * (torch.exp(s - torch.logsumexp(lp + s, dim=-1, keepdim=True)) - 1.0)
        out.append(lp + torch.log1p(acc))
    return torch.cat(out).view(B, T, V)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out-dir", type=Path, required=True, help="a content-study folder with a byte-decoder donor")
    p.add_argument("--corpus", type=Path, required=True, help="the corpus that study split")
    p.add_argument("--model", default="gemma3-270m")
    p.add_argument("--tokens", type=int, default=256, help="tokens per window (one window per set per round)")
    p.add_argument("--weights", default="0.106,0.007,0.018")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    from polymem.hash.token_hashes import TokenHashes
    from polymem.models import load_model
    from polymem.recipes.data import read_documents
    from polymem.recipes.nextbytes import ByteBias
    from polymem.torch.bytehead import load_byte_head
    from polymem.torch.tablefile import open_table

    split = json.loads((a.out_dir / "split.json").read_text())
    docs = read_documents([str(a.corpus)])
    lm = load_model(a.model, precision="bf16" if "avx512_bf16" in Path("/proc/cpuinfo").read_text() else "fp32")
    asset = open_table(a.out_dir / "donor.pmem")
    tab = torch.from_numpy(np.ascontiguousarray(asset.to_numpy(), dtype=np.float32))
    head = load_byte_head(a.out_dir / "donor.pmem.site", option="the benchmark")
    bias = ByteBias(lm, head, tab, asset.layout, TokenHashes.build(lm.tokenizer, asset.spec), head.orders, mix=True)
    with torch.no_grad():
        bias.w.copy_(torch.tensor([float(x) for x in a.weights.split(",")]))
    sets = {}
    for name, part in (("donor-read", "donor"), ("unseen", "unseen")):
        ids = [t for i in split["indices"][part] for t in lm.tokenizer.encode(docs[i])][:a.tokens]
        x = torch.tensor([ids], dtype=torch.long)
        with torch.no_grad():
            logits = lm.model(input_ids=x).logits.float()
        lr, _ = bias.log_ratio(x)
        written = (lr[0].abs().flatten(2).amax(-1) > 0).float().mean(0).tolist()
        sets[name] = (logits, lr, written)
    times: dict[str, dict[str, list[float]]] = {f"{s}/{g}": {"whole": [], "written": []} for s in sets
                                                for g in ("no_grad", "grad")}
    worst = 0.0
    for r in range(a.rounds):
        for s, (logits, lr, _) in sets.items():
            for g in ("no_grad", "grad"):
                order = ("whole", "written") if r % 2 == 0 else ("written", "whole")
                outs = {}
                for how in order:
                    with torch.set_grad_enabled(g == "grad"):
                        t0 = time.perf_counter()
                        out = whole(bias, logits, lr, bias.full) if how == "whole" else bias.mixed(logits, lr, bias.full)
                        if g == "grad":
                            out[0, :, 0].sum().backward()
                            bias.w.grad = None
                        times[f"{s}/{g}"][how].append(time.perf_counter() - t0)
                    outs[how] = out.detach()
                worst = max(worst, float((outs["whole"] - outs["written"]).abs().max()))
    rows = {}
    for k, v in times.items():
        ratios = [w / x for w, x in zip(v["whole"], v["written"])]
        rows[k] = {"whole_s": statistics.median(v["whole"]), "written_s": statistics.median(v["written"]),
                   "speedup_median": statistics.median(ratios), "speedup_min": min(ratios), "speedup_max": max(ratios)}
        print(f"{k:22s} whole {rows[k]['whole_s']:.3f} s, written rows only {rows[k]['written_s']:.3f} s: "
              f"{rows[k]['speedup_median']:.2f}x (median of {a.rounds}, {min(ratios):.2f}-{max(ratios):.2f})")
    for s, (_, _, w) in sets.items():
        print(f"{s}: share of positions whose row was written, orders 1..{len(w)}: " + " / ".join(f"{x:.0%}" for x in w))
    print(f"largest difference between the two outputs: {worst:.2e}")
    if a.json is not None:
        flags = [f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile")
                 if f in Path("/proc/cpuinfo").read_text().split()]
        a.json.write_text(json.dumps({"model": a.model, "tokens": a.tokens, "weights": a.weights, "rounds": a.rounds,
                                      "threads": a.threads, "cpu": platform.processor() or platform.machine(),
                                      "cpu_flags": flags, "written_share": {s: v[2] for s, v in sets.items()},
                                      "max_abs_diff": worst, "results": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
