"""The scale-out benchmark against the library as it is: its drift-cancelling `paired` mode calls coverage's own map
and reduce steps one by one, so a change of their signatures would otherwise break it unnoticed (it did once: the
bucket offsets moved into the map tasks' summaries). On a small corpus cut into several partitions whose
occurrence outputs all go through key files, the mode's report must equal `polymem.coverage`'s (it checks that
itself) and its ratios must be what its own timings give."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from conftest import generated_text, sample_text

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_scaleout.py"


def _bench() -> Any:
    spec = importlib.util.spec_from_file_location("bench_scaleout", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_paired_mode_runs_on_coverage_steps_as_they_are(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from polymem.analysis.coverage import run as R

    text = sample_text() + "\n" + generated_text(3000, seed=11)
    lines = text.splitlines(keepends=True)
    docs = ["".join(lines[i:i + 6]) for i in range(0, len(lines), 6)]
    path = tmp_path / "c.jsonl.gz"
    path.write_bytes(gzip.compress("".join(json.dumps({"text": d}) + "\n" for d in docs).encode(), mtime=0))
    monkeypatch.setattr(R, "KEEP_MB", 0.0)  # every partition's occurrence output through the key files
    mb = sum(len(d) for d in docs) / 1e6 / 4
    out = _bench().one("paired", [str(path)], mb, 4)
    assert out["partitions"] >= 3 and out["bytes"] == sum(len(d.encode()) for d in docs)
    for k in ("wall", "cpu"):
        assert out[f"{k}_over_tokenize"] == pytest.approx(out[f"{k}_coverage_s"] / out[f"{k}_tokenize_s"])
        assert len(out[f"{k}_map_over_tokenize_parts"]) == out["partitions"]
