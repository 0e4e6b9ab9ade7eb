"""Benchmark: how long a model takes to load, and a whole `polymem eval` command, with and without the model cache.

    python benchmarks/bench_model_load.py --models smollm2-135m,gemma3-270m --rounds 5 [--json out.json]

Every measurement is a fresh process (what a user pays per command), in one cache dir the script makes (the
assembled Gemma 3 GGUF is linked into it, so no case pays the one-time assembly). Per model, each round runs, in
this order:

* ``gguf`` — ``load_model(spec, cache=False)``: the GGUF de-quantised on every load (the path before the cache);
* ``first`` — ``load_model(spec)`` on an empty weights cache: de-quantise, then write the safetensors entry;
* ``cached`` — ``load_model(spec)`` again: the entry checked (sizes, sha256) and memory-mapped;
* ``cached_cold`` — the same with the entry's files and the GGUF dropped from the page cache (POSIX_FADV_DONTNEED);
* ``eval`` — ``polymem eval --model SPEC --window 1024`` on one document of about 1,024 tokens (the whole
  command: interpreter start, imports, load, scoring) with the entry in the cache.

Load times are the library's own ``lm.load["seconds"]``; ``eval`` is the command's wall time. Reported: the median
of each over the rounds, their spread, and the ratio gguf / cached. Machine and CPU flags go with the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_LOAD = r"""
import json, sys
from polymem.models import load_model
lm = load_model(sys.argv[1], cache=sys.argv[2] == "cache")
print(json.dumps(lm.load))
"""


def _cpu_flags() -> str:
    try:
        flags = next(ln for ln in open("/proc/cpuinfo") if ln.startswith("flags")).split(":")[1].split()
    except (OSError, StopIteration):
        return "unknown"
    return " ".join(sorted(f for f in flags if f.startswith(("avx", "amx", "fma"))))


def _drop(paths: list[Path]) -> None:
    """Drop files from the page cache (POSIX_FADV_DONTNEED after an fsync): the next read comes from disk."""
    for p in paths:
        for f in ([p] if p.is_file() else [q for q in p.rglob("*") if q.is_file()]):
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _load(spec: str, env: dict[str, str], cache: bool) -> dict:
    r = subprocess.run([sys.executable, "-c", _LOAD, spec, "cache" if cache else "nocache"], env=env,
                       capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise SystemExit(f"loading {spec} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _doc(path: Path) -> int:
    """One document of about 1,024 tokens: the English prose the tests ship, repeated to 4,600 bytes (the eval's
    JSON says how many tokens each model scored)."""
    text = (Path(__file__).resolve().parents[1] / "tests" / "data" / "english_prose.txt").read_text(encoding="utf-8")
    body = (text.strip() + "\n\n") * (4600 // len(text) + 1)
    body = body[:4600]
    path.write_text(json.dumps({"id": "prose", "text": body}) + "\n", encoding="utf-8")
    return len(body.encode())


def bench(spec: str, rounds: int, root: Path) -> dict:
    from polymem._paths import cache_root
    from polymem.models.registry import BUILTIN_MODELS, resolve_builtin

    cache = root / f"cache-{spec}"
    (cache / "models").mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "POLYMEM_CACHE_DIR": str(cache), "POLYMEM_OFFLINE": "1"}
    src = resolve_builtin(spec) if spec in BUILTIN_MODELS else Path(spec)
    if src.is_relative_to(cache_root()):  # assembled into the user's cache (Gemma 3): linked, not assembled again
        link = cache / "models" / src.name
        if not link.exists():
            link.symlink_to(src)
    corpus = root / "doc.jsonl"
    nbytes = _doc(corpus)
    times: dict[str, list[float]] = {k: [] for k in ("gguf", "first", "cached", "cached_cold", "eval")}
    weights = cache / "models" / "weights"
    _load(spec, env, cache=True)  # the tokenizer entry: every case below reads it
    for _ in range(rounds):
        times["gguf"].append(_load(spec, env, cache=False)["seconds"])
        shutil.rmtree(weights, ignore_errors=True)
        first = _load(spec, env, cache=True)
        assert first["weights"] == "gguf, cached", first
        times["first"].append(first["seconds"])
        hit = _load(spec, env, cache=True)
        assert hit["weights"] == "cache", hit
        times["cached"].append(hit["seconds"])
        _drop([weights, src.resolve()])
        times["cached_cold"].append(_load(spec, env, cache=True)["seconds"])
        t0 = time.perf_counter()
        r = subprocess.run([str(Path(sys.executable).with_name("polymem")), "eval", "--model", spec, "--corpus",
                            str(corpus), "--window", "1024", "--json", str(root / "eval.json")], env=env,
                           capture_output=True, text=True, check=False)
        if r.returncode != 0:
            raise SystemExit(f"polymem eval failed:\n{r.stderr[-3000:]}")
        times["eval"].append(time.perf_counter() - t0)
        scored = json.loads((root / "eval.json").read_text())["alone"]
        print(spec, {k: round(v[-1], 2) for k, v in times.items()}, flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"model": spec, "rounds": rounds, "eval_document_bytes": nbytes, "eval_tokens": scored.get("tokens"),
            "eval_bpb": scored.get("bpb"), "seconds": times,
            "median_s": {k: round(v, 2) for k, v in med.items()},
            "spread_s": {k: [round(min(v), 2), round(max(v), 2)] for k, v in times.items()},
            "gguf_over_cached": round(med["gguf"] / med["cached"], 2),
            "cache_entry_bytes": sum(p.stat().st_size for p in weights.rglob("*") if p.is_file())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="smollm2-135m,gemma3-270m")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-model-load-"))
    try:
        results = [bench(m, args.rounds, root) for m in args.models.split(",")]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    import torch
    import transformers

    out = {"results": results, "machine": {"cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                                           "cpu_flags": _cpu_flags(), "python": platform.python_version(),
                                           "torch": torch.__version__, "transformers": transformers.__version__}}
    for r in results:
        m = r["median_s"]
        print(f"{r['model']}: load gguf {m['gguf']:.1f} s, first (gguf + write) {m['first']:.1f} s, cached "
              f"{m['cached']:.1f} s ({r['gguf_over_cached']:.1f}x faster), cached cold {m['cached_cold']:.1f} s; "
              f"`polymem eval` whole command {m['eval']:.1f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.json.with_name(args.json.name + ".tmp")
        tmp.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
        tmp.replace(args.json)


if __name__ == "__main__":
    main()
