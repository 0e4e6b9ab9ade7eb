"""The content study, both directions: what the donor read, does the recipient know?

    python benchmarks/bench_content.py --out-root runs/content --json content-transfer.json --markdown content.md
    python benchmarks/bench_content.py --tables-only docs/results/content-transfer.json

Builds the small corpus docs/real-models.md "Carrying content" uses (the first 1,500 characters of each page of
the shipped pydocs sample, cut at a line end, so that a short donor run reads its part more than twice), then runs
``polymem transfer --model --content-split`` once per direction (SmolLM2-135M → Gemma 3 270M and back), each into
its own ``--out-dir`` under ``--out-root``: every piece resumes (the donor, each arm and seed), so an interrupted
run is started again with the same command. Both directions write into one ``--json`` record (the shape of
docs/results/content-transfer.json), and ``--markdown`` writes one table per direction: per arm the change on
donor-read and unseen documents, the content part with its 95 % interval and the share of the donor's own content
part recovered, as the mean over seeds (min–max where there are several).
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

DIRECTIONS = {"s2g": ("smollm2-135m", "gemma3-270m"), "g2s": ("gemma3-270m", "smollm2-135m")}
NAMES = {"smollm2-135m": "SmolLM2-135M", "gemma3-270m": "Gemma 3 270M"}


def heads_corpus(src: Path, out: Path, chars: int = 1500) -> Path:
    """Each document's first ``chars`` characters, cut at its last line end past character 200 (written once)."""
    if out.is_file():
        return out
    tmp = out.with_name(out.name + ".tmp")
    with gzip.open(src, "rt", encoding="utf-8") as f, gzip.open(tmp, "wt", encoding="utf-8") as w:
        for line in filter(str.strip, f):
            doc = json.loads(line)
            head = doc["text"][:chars]
            head = head[:head.rfind("\n")] if "\n" in head[200:] else head
            w.write(json.dumps({"id": doc.get("id"), "text": head}) + "\n")
    tmp.replace(out)
    return out


def command(donor: str, recipient: str, corpus: Path, out_dir: Path, a: argparse.Namespace) -> list[str]:
    return [sys.executable, "-m", "polymem", "transfer", "--model", recipient, "--corpus", str(corpus),
            "--content-split", a.split, "--donor-model", donor, "--donor-steps", str(a.donor_steps),
            "--donor-params", a.donor_params, "--batch-size", "4", "--block-size", "64", "--steps", str(a.steps),
            "--site-lr", "3e-3", "--seeds", str(a.seeds), "--arms", a.arms, "--eval-tokens", str(a.eval_tokens),
            "--threads", str(a.threads), "--out-dir", str(out_dir), "--json", str(a.json), *a.extra]


def _cell(xs: list[float], scale: float = 100.0, sign: bool = True) -> str:
    fmt = (lambda v: f"{v * scale:+.1f}") if sign else (lambda v: f"{v * scale + 0.0:.0f}")
    m = fmt(statistics.fmean(xs))
    return m if len(xs) == 1 else f"{m} ({fmt(min(xs))}…{fmt(max(xs))})"


def tables(record: dict[str, Any]) -> str:
    """One markdown table per direction of a content-transfer record (changes in %, content parts in points)."""
    out = []
    for d in record["directions"]:
        donor, rec = NAMES.get(d["donor"], d["donor"]), NAMES.get(d["recipient"], d["recipient"])
        seeds = ", ".join(str(s) for s in d.get("seeds", []))
        out.append(f"| {donor} → {rec} (seeds {seeds}) | donor-read % | unseen % | content part [95 % interval] | "
                   f"recovered % |\n|---|---|---|---|---|")
        own = d["donor_own"]
        rows = [(f"{donor} + its own table and site (the ceiling)", own, False)]
        rows += [(f"`{arm}`: {v.get('method', '')}", v, True) for arm, v in d["arms"].items()]
        for name, v, recovered in rows:
            ci = ", ".join(f"[{lo * 100:+.1f}, {hi * 100:+.1f}]" for lo, hi in zip(v["content_lo"], v["content_hi"]))
            rec_cell = _cell(v["recovered"], sign=False) if recovered and v.get("recovered") else "—"
            out.append(f"| {name} | {_cell(v['read'])} | {_cell(v['unseen'])} | {_cell(v['content'])} {ci} | "
                       f"{rec_cell} |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out-root", type=Path, default=Path("runs/content"))
    p.add_argument("--json", type=Path, default=Path("runs/content/content-transfer.json"))
    p.add_argument("--markdown", type=Path)
    p.add_argument("--directions", default="s2g,g2s", help="s2g (SmolLM2 donor → Gemma 3), g2s (the other way)")
    p.add_argument("--arms", default="none,donor,in_place")
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--split", default="0.3,0.5,0.2")
    p.add_argument("--donor-steps", type=int, default=48)
    p.add_argument("--donor-params", default="4M")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--eval-tokens", type=int, default=2048)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--tables-only", type=Path, help="print the tables of this record and run nothing")
    p.add_argument("extra", nargs="*", help="more `polymem transfer` options, after --")
    a = p.parse_args(argv)
    if a.tables_only is not None:
        print(tables(json.loads(a.tables_only.read_text(encoding="utf-8"))))
        return 0
    from polymem.samples import sample_path

    dirs = [x for x in a.directions.split(",") if x]
    bad = [x for x in dirs if x not in DIRECTIONS]
    if bad or not dirs:
        p.error(f"--directions {a.directions!r}: accepted s2g, g2s or both, comma-separated")
    a.out_root.mkdir(parents=True, exist_ok=True)
    a.json.parent.mkdir(parents=True, exist_ok=True)
    corpus = heads_corpus(Path(sample_path("pydocs.jsonl.gz")), a.out_root / "pydocs-heads.jsonl.gz")
    for x in dirs:
        donor, recipient = DIRECTIONS[x]
        cmd = command(donor, recipient, corpus, a.out_root / x, a)
        print("+ " + " ".join(cmd), flush=True)
        if subprocess.run(cmd).returncode != 0:
            print(f"error: the {x} direction failed; run the same command again to resume it", file=sys.stderr)
            return 1
    md = tables(json.loads(a.json.read_text(encoding="utf-8")))
    print(md)
    if a.markdown is not None:
        a.markdown.write_text(md, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
