"""Training a table sharded by rows across processes (polymem.torch.sharded, train_loop(distributed=True)): two
processes under torchrun (gloo, 127.0.0.1) give the table and the held-out score one process gives, each rank
holding only its own rows."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

HERE = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(corpus: Path, out: Path, steps: int, nproc: int | None, batch: int = 4) -> dict:
    script = [str(HERE / "dist_train.py"), str(corpus), str(out), str(steps), str(batch)]
    if nproc is None:
        cmd = [sys.executable, *script]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-addr",
               "127.0.0.1", "--master-port", str(_free_port()), *script]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
    return {"ranks": sorted(lines, key=lambda d: d["rank"]), **lines[0]}


def _rows(path: Path) -> np.ndarray:
    from polymem.torch.tablefile import open_table

    return np.asarray(open_table(path).to_numpy(), np.float32)


@pytest.mark.parametrize("nproc", [2, 3])
def test_processes_train_the_table_one_process_trains(corpus, tmp_path, nproc):
    """N processes (61 pages: N does not divide the rows) against one, same seed and global batch, 20 steps."""
    from polymem import MemoryAsset

    one = _run(corpus, tmp_path / "one.pmem", 20, None)
    two = _run(corpus, tmp_path / "two.pmem", 20, nproc)
    shares = [r["local_rows"] for r in two["ranks"]]
    assert len(shares) == nproc and sum(shares) == two["rows"] and max(shares) - min(shares) <= two["rows"] // 10
    assert MemoryAsset.open(tmp_path / "two.pmem").problems() == []
    ca, cb = (MemoryAsset.open(tmp_path / f"{n}.pmem").row_counts() for n in ("one", "two"))
    assert ca is not None and np.array_equal(ca, cb)  # each row's update count, written by its own process
    a, b = _rows(tmp_path / "one.pmem"), _rows(tmp_path / "two.pmem")
    assert a.shape == b.shape and one["rows_touched"] == two["rows_touched"] > 0
    norm = np.linalg.norm(a, axis=1)
    live = norm > 0
    assert not np.any(b[~live])  # rows one process never wrote stay zero
    rel = np.linalg.norm(a - b, axis=1)[live] / norm[live]
    assert rel.max() <= 1e-4, rel.max()
    assert abs(one["heldout_bpb"] - two["heldout_bpb"]) <= 1e-3


def test_processes_started_with_different_runs_all_stop_with_one_line():
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(_free_port()), str(HERE / "dist_train.py"), "--check", "docs"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    said = [json.loads(ln)["error"] for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert len(said) == 2 and said[0] == said[1]
    assert said[0] == ("the processes were started with different runs: rank 0 has --corpus = 'docs-0.jsonl.gz', rank 1 "
                       "has 'docs-1.jsonl.gz'; start every process with the same flags and files")
