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


def _cmd(corpus: Path, out: Path, steps: int, nproc: int | None, batch: int = 4, every: int = 0,
         pause: float = 0.0, hash: str = "bytes") -> list[str]:
    script = [str(HERE / "dist_train.py"), str(corpus), str(out), str(steps), str(batch), str(every), str(pause), hash]
    if nproc is None:
        return [sys.executable, *script]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-addr",
            "127.0.0.1", "--master-port", str(_free_port()), *script]


def _run(corpus: Path, out: Path, steps: int, nproc: int | None, batch: int = 4, every: int = 0,
         hash: str = "bytes") -> dict:
    r = subprocess.run(_cmd(corpus, out, steps, nproc, batch, every, hash=hash), capture_output=True, text=True,
                       timeout=600)
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
    assert len(shares) == nproc and sum(shares) == two["rows"] and max(shares) - min(shares) <= two["rows"] // 10, shares
    assert MemoryAsset.open(tmp_path / "two.pmem").problems() == []
    ca, cb = (MemoryAsset.open(tmp_path / f"{n}.pmem").row_counts() for n in ("one", "two"))
    assert ca is not None and cb is not None, "row counts missing"
    # each row's update count, written by its own process
    assert np.array_equal(ca, cb), f"row counts differ at {np.flatnonzero(ca != cb)[:10].tolist()}"
    a, b = _rows(tmp_path / "one.pmem"), _rows(tmp_path / "two.pmem")
    assert a.shape == b.shape and one["rows_touched"] == two["rows_touched"] > 0, (a.shape, b.shape, one["rows_touched"],
                                                                                   two["rows_touched"])
    norm = np.linalg.norm(a, axis=1)
    live = norm > 0
    assert not np.any(b[~live]), "rows one process never wrote are not zero in the sharded table"
    rel = np.linalg.norm(a - b, axis=1)[live] / norm[live]
    assert rel.max() <= 1e-4, rel.max()
    assert abs(one["heldout_bpb"] - two["heldout_bpb"]) <= 1e-3, (one["heldout_bpb"], two["heldout_bpb"])


def test_processes_train_an_engram_xor_table_as_one_process_does(corpus, tmp_path):
    """``--hash xor`` (token-id rows, a prime modulus per head): two processes give one process's table."""
    from polymem import MemoryAsset

    one = _run(corpus, tmp_path / "one.pmem", 12, None, hash="xor")
    two = _run(corpus, tmp_path / "two.pmem", 12, 2, hash="xor")
    a, b = MemoryAsset.open(tmp_path / "one.pmem"), MemoryAsset.open(tmp_path / "two.pmem")
    assert b.problems() == [] and b.spec.to_dict() == a.spec.to_dict() and "xor" in json.dumps(a.spec.to_dict()).lower()
    assert _close_to(np.asarray(a.to_numpy()), np.asarray(b.to_numpy())) <= 1e-4
    assert np.array_equal(a.row_counts(), b.row_counts()) and one["rows_touched"] == two["rows_touched"] > 0
    assert abs(one["heldout_bpb"] - two["heldout_bpb"]) <= 1e-3


def test_two_launchers_join_as_two_machines_through_the_rendezvous(corpus, tmp_path):
    """``torchrun --nnodes 2 --rdzv-backend c10d --rdzv-endpoint HOST:PORT`` started twice (two machines, here both
    on 127.0.0.1, one process each): the processes find each other and train one process's table."""
    from polymem import MemoryAsset

    one = _run(corpus, tmp_path / "one.pmem", 12, None)
    script = _cmd(corpus, tmp_path / "two.pmem", 12, None)[1:]
    port = _free_port()
    launchers = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node",
                                   "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id",
                                   "polymem-test", "--node-rank", str(k), *script], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for k in range(2)]
    try:
        outs = [p.communicate(timeout=600) for p in launchers]
    finally:
        for p in launchers:
            p.kill()
    assert all(p.returncode == 0 for p in launchers), [e[-2000:] for _, e in outs]
    ranks = sorted((json.loads(ln) for o, _ in outs for ln in o.splitlines() if ln.startswith("{")), key=lambda d: d["rank"])
    assert [r["rank"] for r in ranks] == [0, 1] and sum(r["local_rows"] for r in ranks) == one["rows"]
    a, b = MemoryAsset.open(tmp_path / "one.pmem"), MemoryAsset.open(tmp_path / "two.pmem")
    assert b.problems() == [] and _close_to(np.asarray(a.to_numpy()), np.asarray(b.to_numpy())) <= 1e-4
    assert abs(one["heldout_bpb"] - ranks[0]["heldout_bpb"]) <= 1e-3


def _close_to(a: np.ndarray, b: np.ndarray) -> float:
    """Max per-row relative difference over the rows ``a`` wrote (rows it never wrote must be zero in ``b``)."""
    norm = np.linalg.norm(a, axis=1)
    live = norm > 0
    assert live.any() and not np.any(b[~live])
    return float((np.linalg.norm(a - b, axis=1)[live] / norm[live]).max())


@pytest.mark.parametrize("again", [1, 3])
def test_a_run_whose_process_is_killed_resumes_from_its_checkpoint_with_another_number(corpus, tmp_path, again):
    """Two processes checkpoint every 4 steps; one is killed (SIGKILL) mid-run: the last checkpoint is whole (an
    asset one process opens, written by both), and a run started again with ``again`` processes continues from it
    and ends with the table one uninterrupted process trains."""
    import os
    import signal
    import time

    from polymem import MemoryAsset

    one = _run(corpus, tmp_path / "one.pmem", 20, None)
    out, ckpt = tmp_path / "cut.pmem", tmp_path / "cut.pmem.ckpt"
    p = subprocess.Popen(_cmd(corpus, out, 20, 2, every=4, pause=0.4), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        deadline = time.monotonic() + 300
        while not (ckpt / "state.json").exists() or json.loads((ckpt / "state.json").read_text())["step"] < 8:
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()[1][-3000:]
            time.sleep(0.05)
        os.kill(int((tmp_path / "cut.pmem.pid1").read_text()), signal.SIGKILL)
        _, err = p.communicate(timeout=300)
    finally:
        p.kill()
    assert p.returncode != 0 and not out.exists(), err[-3000:]
    state = json.loads((ckpt / "state.json").read_text())
    assert state["world"] == 2 and state["step"] in (8, 12, 16) and len(state["losses"]) == state["step"]
    table = MemoryAsset.open(ckpt / "table")
    assert table.problems() == [] and table.layout.num_rows == one["rows"]
    assert sorted(f.name for f in ckpt.glob("rows-*")) and (ckpt / "dense.safetensors").is_file()

    resumed = _run(corpus, out, 20, None if again == 1 else again, every=4)
    assert resumed["resumed_at_step"] == state["step"] and not ckpt.exists()
    assert _close_to(_rows(tmp_path / "one.pmem"), _rows(out)) <= 1e-4
    assert abs(one["heldout_bpb"] - resumed["heldout_bpb"]) <= 1e-3
    ca, cb = (MemoryAsset.open(tmp_path / n).row_counts() for n in ("one.pmem", "cut.pmem"))
    assert np.array_equal(ca, cb)


def test_torchrun_restarts_a_killed_process_and_the_run_continues_from_its_checkpoint(corpus, tmp_path):
    """``torchrun --max-restarts 1``: one of two processes killed after a checkpoint, torchrun starts both again and
    they continue from it (no step is trained twice into the table) to the table one uninterrupted process trains.
    torchrun's default rendezvous keeps one store across restarts: the restarted group must not read the dead one's
    addresses."""
    import os
    import signal
    import time

    one = _run(corpus, tmp_path / "one.pmem", 20, None)
    out, ckpt = tmp_path / "cut.pmem", tmp_path / "cut.pmem.ckpt"
    cmd = _cmd(corpus, out, 20, 2, every=4, pause=0.4)
    cmd.insert(cmd.index("--nproc-per-node"), "--max-restarts=1")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not (ckpt / "state.json").exists():
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()[1][-3000:]
            time.sleep(0.05)
        os.kill(int((tmp_path / "cut.pmem.pid1").read_text()), signal.SIGKILL)
        stdout, err = p.communicate(timeout=600)
    finally:
        p.kill()
    assert p.returncode == 0, err[-3000:]
    ranks = [json.loads(ln) for ln in stdout.splitlines() if ln.startswith("{")]
    assert len(ranks) == 2 and all(r["resumed_at_step"] in (4, 8, 12, 16) for r in ranks), ranks
    assert not ckpt.exists() and _close_to(_rows(tmp_path / "one.pmem"), _rows(out)) <= 1e-4
    assert abs(one["heldout_bpb"] - ranks[0]["heldout_bpb"]) <= 1e-3


def test_processes_started_with_different_runs_all_stop_with_one_line():
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(_free_port()), str(HERE / "dist_train.py"), "--check", "docs"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    said = [json.loads(ln)["error"] for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert len(said) == 2 and said[0] == said[1]
    assert said[0] == ("the processes were started with different runs: rank 0 has --corpus = 'docs-0.jsonl.gz', rank 1 "
                       "has 'docs-1.jsonl.gz'; start every process with the same flags and files")


def _train(out: Path, params: str, nproc: int, limit: int | None, tmp: Path) -> subprocess.CompletedProcess:
    import resource

    def cap() -> None:  # an address-space limit (ulimit -v) for the launcher and every process it starts
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    args = ["-m", "polymem", "train", "--tokenizer", "bytes", "--corpus", "sample:pydocs", "--out", str(out),
            "--steps", "2", "--batch-size", "2", "--block-size", "32", "--n-layer", "2", "--d-model", "32",
            "--n-head", "2", "--params", params, "--precision", "fp32", "--threads", "1",
            "--json", str(out) + ".json"]
    cmd = [sys.executable, *args] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1",
        "--master-port", str(_free_port()), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, preexec_fn=cap, cwd=tmp)


@pytest.mark.slow
def test_a_table_twice_what_one_process_may_hold_trains_in_two(tmp_path):
    """Under an address-space limit that lets one process hold a 400M-scalar table (1.6 GB) but not an 800M one,
    one process trains the smaller, refuses the larger with one line, and two processes train the larger."""
    base = _train(tmp_path / "tiny.pmem", "2M", 2, None, tmp_path)
    assert base.returncode == 0, base.stderr[-3000:]
    peak = max(m["peak_vm_bytes"] for m in json.loads((tmp_path / "tiny.pmem.json").read_text())["process_memory"])
    big = 800_000_000 * 4  # fp32 rows of the larger table
    limit = peak + int(0.65 * big)
    small = _train(tmp_path / "small.pmem", "400M", 1, limit, tmp_path)
    assert small.returncode == 0, small.stderr[-3000:]
    one = _train(tmp_path / "one.pmem", "800M", 1, limit, tmp_path)
    assert one.returncode == 2 and "needs 3.2 GiB of memory" in one.stderr and "torchrun --nproc-per-node" in one.stderr
    assert not (tmp_path / "one.pmem").exists()
    two = _train(tmp_path / "two.pmem", "800M", 2, limit, tmp_path)
    assert two.returncode == 0, two.stderr[-3000:]
    from polymem import MemoryAsset

    a = MemoryAsset.open(tmp_path / "two.pmem")
    assert a.layout.num_rows * a.layout.head_dim >= 800_000_000 and a.problems() == []
    mem = json.loads((tmp_path / "two.pmem.json").read_text())["process_memory"]
    assert all(m["peak_vm_bytes"] <= limit for m in mem) and all(m["table_bytes"] <= big * 0.51 for m in mem)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    """A tiny Llama checkpoint folder (random weights; the tiny GGUF's tokenizer), as tests/models/test_generate.py."""
    pytest.importorskip("transformers")
    import torch
    from tinygguf import write_tiny_gguf

    from polymem.models import load_model

    d = tmp_path_factory.mktemp("tinymodel")
    src = load_model(write_tiny_gguf(d / "tiny.gguf", seed=3), cache=False)
    cfg = src.model.config
    cfg.vocab_size = len(src.hf_tokenizer)
    cfg.max_position_embeddings = 1024  # train --model scores windows of 512 tokens
    torch.manual_seed(3)
    type(src.model)(cfg).save_pretrained(d / "tiny")
    src.hf_tokenizer.save_pretrained(d / "tiny")
    return d / "tiny"


def test_processes_train_a_table_on_a_frozen_model_as_one_process_does(tiny_model, corpus, tmp_path):
    from polymem import MemoryAsset

    args = ["-m", "polymem", "train", "--model", str(tiny_model), "--corpus", str(corpus), "--steps", "12",
            "--batch-size", "4", "--block-size", "32", "--layers", "1", "--params", str(61 * 4 * 4 * 8), "--heads",
            "4", "--slots", "4", "--head-dim", "8", "--eval-tokens", "512", "--table-lr", "0.05", "--threads", "1",
            "--precision", "fp32"]  # one arithmetic for the comparison (bf16's rounding differs with the batch split)
    runs = {}
    for name, launch in (("one", [sys.executable]), ("two", [sys.executable, "-m", "torch.distributed.run",
                         "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(_free_port())])):
        out = tmp_path / f"{name}.pmem"
        r = subprocess.run([*launch, *args, "--out", str(out), "--json", str(out) + ".json"], capture_output=True,
                           text=True, timeout=600, cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-3000:]
        runs[name] = json.loads((tmp_path / f"{name}.pmem.json").read_text())
    a, b = (np.asarray(MemoryAsset.open(tmp_path / f"{n}.pmem").to_numpy()) for n in ("one", "two"))
    norm = np.linalg.norm(a, axis=1)
    live = norm > 0
    assert live.sum() == runs["two"]["rows_touched"] > 0 and not np.any(b[~live])
    assert (np.linalg.norm(a - b, axis=1)[live] / norm[live]).max() <= 1e-4
    assert abs(runs["one"]["heldout_bpb_after"] - runs["two"]["heldout_bpb_after"]) <= 1e-3
    assert len(runs["two"]["process_memory"]) == 2
    # the site process 0 wrote names the asset the processes wrote together: it attaches and scores the same
    r = subprocess.run([sys.executable, "-m", "polymem", "eval", "--model", str(tiny_model), "--site",
                        str(tmp_path / "two.pmem.site"), "--corpus", str(corpus), "--max-docs", "2", "--window", "256"],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]


def test_a_frozen_model_run_stopped_in_one_process_continues_in_two(tiny_model, corpus, tmp_path):
    """``train --model``: a run stopped at step 7 of 12 in one process (its checkpoint of step 6) is continued by
    two processes under torchrun, and ends with the table one uninterrupted process trains."""
    import torch

    from polymem import MemoryAsset
    from polymem.models import load_model
    from polymem.recipes.frozen import FrozenTrainConfig, train_table

    args = ["--steps", "12", "--batch-size", "4", "--block-size", "32", "--layers", "1", "--params",
            str(61 * 4 * 4 * 8), "--heads", "4", "--slots", "4", "--head-dim", "8", "--eval-tokens", "512",
            "--table-lr", "0.05", "--threads", "1", "--checkpoint-every", "3", "--precision", "fp32"]
    base = [sys.executable, "-m", "polymem", "train", "--model", str(tiny_model), "--corpus", str(corpus), *args]
    r = subprocess.run([*base, "--out", str(tmp_path / "one.pmem")], capture_output=True, text=True, timeout=600,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]

    def stop(i: int, loss: float) -> None:
        if i == 6:
            raise KeyboardInterrupt

    cfg = FrozenTrainConfig(steps=12, batch_size=4, block_size=32, layers=(1,), params=61 * 4 * 4 * 8, heads=4,
                            slots=4, head_dim=8, table_lr=0.05)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the processes: the same float order
    try:
        with pytest.raises(KeyboardInterrupt):
            train_table(load_model(str(tiny_model)), [corpus], tmp_path / "cut.pmem", cfg=cfg, eval_tokens=512,
                        checkpoint_every=3, on_step=stop)
    finally:
        torch.set_num_threads(threads)
    assert json.loads((tmp_path / "cut.pmem.ckpt" / "state.json").read_text())["step"] == 6
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                        "127.0.0.1", "--master-port", str(_free_port()), *base[1:], "--out", str(tmp_path / "cut.pmem"),
                        "--json", str(tmp_path / "cut.json")], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((tmp_path / "cut.json").read_text())
    assert summary["resumed_at_step"] == 6 and len(summary["process_memory"]) == 2
    assert "continued from" in r.stdout and not (tmp_path / "cut.pmem.ckpt").exists()
    a, b = (np.asarray(MemoryAsset.open(tmp_path / n).to_numpy()) for n in ("one.pmem", "cut.pmem"))
    assert _close_to(a, b) <= 1e-4
