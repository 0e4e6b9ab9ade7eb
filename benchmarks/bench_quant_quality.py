"""What each storage type costs a real model: held-out bits per byte with a trained site over its float32 table and
over the table quantized to NF4, FP8 (E4M3, per-row E8M0 scales) and BF16.

    python benchmarks/bench_quant_quality.py --model smollm2-135m --asset runs/pays/smollm2-135m-pydocs.pmem \\
        --corpus pydocs.jsonl.gz --heldout-every 10 --docs 16 --out docs/benchmarks/quant-quality.json

The documents are the held-out split of `polymem train --model` (every k-th document); each copy is written to a
temporary folder and scored with the same site, documents and windows (polymem.models.quality).
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

from polymem import MemoryAsset
from polymem._io import atomic_write_json
from polymem.models import load_model
from polymem.models.quality import MAX_LOSS, quantization_loss
from polymem.recipes.data import read_named_documents

KINDS = ("nf4", "fp8-e4m3-e8m0", "bfloat16")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--asset", required=True, type=Path)
    p.add_argument("--site", type=Path, help="default: ASSET.site")
    p.add_argument("--corpus", required=True, type=Path)
    p.add_argument("--heldout-every", type=int, default=10)
    p.add_argument("--docs", type=int, default=16)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", required=True, type=Path)
    a = p.parse_args(argv)
    if a.threads:
        import torch

        torch.set_num_threads(a.threads)
    named = read_named_documents([a.corpus])
    texts = [t for i, (_, t) in enumerate(named) if i % a.heldout_every == a.heldout_every - 1][:a.docs]
    lm = load_model(a.model)
    src = MemoryAsset.open(a.asset)
    site = a.site or Path(f"{a.asset}.site")
    rows = {}
    with tempfile.TemporaryDirectory(dir=a.asset.parent) as d:
        for kind in KINDS:
            t0 = time.perf_counter()
            q, err = src.quantize(Path(d) / f"{kind}.pmem", to=kind)
            r = quantization_loss(lm, site, src, q, texts)
            r.update(limit=MAX_LOSS[kind], rel_row_error_mean=err.rel_mean, seconds=time.perf_counter() - t0,
                     stored_bytes=q.geometry.num_chunks * q.geometry.chunk_bytes)
            rows[kind] = r
            print(f"{kind:>14}: {r['bpb_reference']:.5f} -> {r['bpb_quantized']:.5f} bits per byte "
                  f"({100 * r['loss']:+.3f} %, limit {100 * MAX_LOSS[kind]:.1f} %), rows' relative error "
                  f"{err.rel_mean:.3g}, {r['stored_bytes'] / 2**20:,.1f} MiB", flush=True)
    out = {"model": a.model, "asset": str(a.asset), "dtype": src.dtype, "corpus": str(a.corpus),
           "heldout_every": a.heldout_every, "documents": len(texts), "kinds": rows,
           "machine": {"cpu": platform.processor() or platform.machine(), "python": platform.python_version()},
           "command": " ".join(["python", "benchmarks/bench_quant_quality.py", *(argv or sys.argv[1:])])}
    atomic_write_json(a.out, out, indent=1)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
