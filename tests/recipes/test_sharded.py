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
    return json.loads(r.stdout.strip().splitlines()[-1])


def _rows(path: Path) -> np.ndarray:
    from polymem.torch.tablefile import open_table

    return np.asarray(open_table(path).to_numpy(), np.float32)


def test_two_processes_train_the_table_one_process_trains(corpus, tmp_path):
    one = _run(corpus, tmp_path / "one.safetensors", 20, None)
    two = _run(corpus, tmp_path / "two.safetensors", 20, 2)
    a, b = _rows(tmp_path / "one.safetensors"), _rows(tmp_path / "two.safetensors")
    assert a.shape == b.shape and one["rows_touched"] == two["rows_touched"] > 0
    norm = np.linalg.norm(a, axis=1)
    live = norm > 0
    assert not np.any(b[~live])  # rows one process never wrote stay zero
    rel = np.linalg.norm(a - b, axis=1)[live] / norm[live]
    assert rel.max() <= 1e-4, rel.max()
    assert abs(one["heldout_bpb"] - two["heldout_bpb"]) <= 1e-3
