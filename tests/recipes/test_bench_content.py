"""benchmarks/bench_content.py: the study's corpus and the tables it prints from a content-transfer record."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_content", ROOT / "benchmarks" / "bench_content.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_heads_corpus_cuts_each_document_at_a_line_end(tmp_path):
    from polymem.samples import sample_path

    b = _bench()
    out = b.heads_corpus(Path(sample_path("pydocs.jsonl.gz")), tmp_path / "heads.jsonl.gz")
    with gzip.open(sample_path("pydocs.jsonl.gz"), "rt", encoding="utf-8") as f:
        full = [json.loads(x)["text"] for x in f if x.strip()]
    with gzip.open(out, "rt", encoding="utf-8") as f:
        heads = [json.loads(x)["text"] for x in f if x.strip()]
    assert len(heads) == len(full) == 43
    for h, t in zip(heads, full):
        assert t.startswith(h) and len(h) <= 1500
        if len(t) > 1500 and "\n" in t[200:1500]:
            assert t[len(h)] == "\n"  # cut at a line end
    assert not list(tmp_path.glob("*.tmp"))


def test_tables_give_every_arm_its_seeds_mean_and_range():
    b = _bench()
    rec = {"directions": [{"donor": "smollm2-135m", "recipient": "gemma3-270m", "seeds": [0, 1],
                           "donor_own": {"read": [-0.3, -0.2], "unseen": [-0.1, -0.1], "content": [-0.2, -0.1],
                                         "content_lo": [-0.25, -0.15], "content_hi": [-0.15, -0.05]},
                           "arms": {"x": {"read": [-0.12, -0.08], "unseen": [-0.02, -0.02], "content": [-0.1, -0.06],
                                          "content_lo": [-0.2, -0.1], "content_hi": [0.0, -0.02],
                                          "recovered": [0.5, 0.6], "method": "an arm"}}}]}
    md = b.tables(rec).splitlines()
    assert md[0].startswith("| SmolLM2-135M → Gemma 3 270M (seeds 0, 1)")
    assert md[2].startswith("| SmolLM2-135M + its own table and site") and "-25.0 (-30.0…-20.0)" in md[2]
    assert md[3] == ("| `x`: an arm | -10.0 (-12.0…-8.0) | -2.0 (-2.0…-2.0) | -8.0 (-10.0…-6.0) [-20.0, +0.0], "
                     "[-10.0, -2.0] | 55 (50…60) |")


def test_tables_read_the_shipped_record():
    b = _bench()
    md = b.tables(json.loads((ROOT / "docs" / "results" / "content-transfer.json").read_text(encoding="utf-8")))
    assert md.count("its own table and site (the ceiling)") == 4 and "| `none`: the model alone |" in md  # two studies
