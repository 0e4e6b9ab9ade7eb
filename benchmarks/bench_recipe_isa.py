"""The transfer recipe's training speed with the host's kernels vs AVX2-only kernels (the recipe's
time on both kinds of CPU, without an AVX2-only machine at hand).

Each configuration runs `polymem train` for a few steps in a fresh child process. The AVX2-only arm restricts every
kernel library torch uses on CPU to AVX2 through their documented switches — ATen's dispatch
(``ATEN_CPU_CAPABILITY=avx2``), oneDNN (``ONEDNN_MAX_CPU_ISA=AVX2``, which also removes its native bf16 paths) and
MKL (``MKL_ENABLE_INSTRUCTIONS=AVX2``) — so it approximates an AVX2-only CPU of the same clock and cache (a real
AVX2-only part, e.g. an older EPYC, differs in more than the ISA). Arms alternate within each round; medians.

    python benchmarks/bench_recipe_isa.py --corpus ../shared/corpus/pydocs.jsonl.gz --steps 12 --rounds 2 \\
        --json docs/results/bench_recipe_isa.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

AVX2_ONLY = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "DNNL_MAX_CPU_ISA": "AVX2",
             "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
# the recipe's donor (cl100k_base, d=128) and recipient (mistral-v1, d=64) backbones (docs/transfer.md)
CONFIGS = {
    "donor": ["--tokenizer", "cl100k_base", "--batch-size", "8", "--block-size", "128", "--n-layer", "2",
              "--d-model", "128", "--n-head", "4"],
    "recipient": ["--tokenizer", "mistral-v1", "--batch-size", "8", "--block-size", "128", "--n-layer", "2",
                  "--d-model", "64", "--n-head", "2"],
}


def run(config: str, isa: str, precision: str, a, tmp: Path) -> float:
    env = dict(os.environ)
    if isa == "avx2":
        env.update(AVX2_ONLY)
    out = tmp / f"{config}-{isa}-{precision}"
    cmd = [sys.executable, "-m", "polymem.cli.app", "train", *CONFIGS[config], "--corpus", a.corpus,
           "--steps", str(a.steps), "--threads", str(a.threads), "--precision", precision, "--max-eval-tokens", "256",
           "--out", str(out) + ".safetensors", "--overwrite", "--json", str(out) + ".json"]
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return float(json.loads(Path(str(out) + ".json").read_text())["tokens_per_s"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", required=True)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--json")
    a = p.parse_args()
    arms = [(c, isa, prec) for c in CONFIGS for isa in ("host", "avx2") for prec in a.precisions.split(",")]
    speeds: dict[str, list[float]] = {"/".join(x): [] for x in arms}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for arm in arms:
                v = run(*arm, a, Path(tmp))
                speeds["/".join(arm)].append(v)
                print(f"round {r} {'/'.join(arm):24s} {v:8.0f} tok/s", flush=True)
    med = {k: statistics.median(v) for k, v in speeds.items()}
    ratios = {}
    for c in CONFIGS:
        for prec in a.precisions.split(","):
            ratios[f"{c}/{prec}: avx2 over host"] = med[f"{c}/avx2/{prec}"] / med[f"{c}/host/{prec}"]
        if "bf16" in a.precisions and "fp32" in a.precisions:
            for isa in ("host", "avx2"):
                ratios[f"{c}/{isa}: bf16 over fp32"] = med[f"{c}/{isa}/bf16"] / med[f"{c}/{isa}/fp32"]
    for k, v in ratios.items():
        print(f"{k:34s} {v:6.2f}x")
    flags = Path("/proc/cpuinfo").read_text().split("flags", 2)[1].split("\n", 1)[0] if Path("/proc/cpuinfo").exists() else ""
    res = {"tokens_per_s_median": med, "tokens_per_s_all": speeds, "ratios": ratios, "steps": a.steps,
           "rounds": a.rounds, "threads": a.threads, "avx2_only_env": AVX2_ONLY,
           "cpu_flags": sorted(f for f in flags.split() if f.startswith(("avx", "amx", "fma"))),
           "command": "python benchmarks/bench_recipe_isa.py " + " ".join(sys.argv[1:])}
    if a.json:
        from polymem._io import atomic_write_text
        atomic_write_text(a.json, json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
