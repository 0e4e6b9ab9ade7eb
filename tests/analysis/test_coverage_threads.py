"""polymem.coverage(workers=N): the partitions counted on N threads of this process (no Dask). Every number of
the JSON equals the one-process run; the occurrence outputs kept in memory stay within the budget; a task's error
ends the run as in one process; what a process keeps between tasks is safe with tasks in threads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import polymem
from polymem.analysis.coverage import run as R
from polymem.tokenizers.base import Tokenizer

from conftest import numbers
from conftest import text_mb as _mb


def test_worker_threads_equal_one_process(tmp_path: Path, docs: list[str]) -> None:
    """workers=2 (2 threads of this process): every number of the JSON equals
    the one-process run's, on files read by the tasks themselves (a compressed JSONL file cut into ranges that
    the two threads read at the same time, each going on from its own stream; a plain text file), with the
    occurrence pass's reduce tasks running side by side too."""
    import gzip

    from polymem.corpus import Corpus

    (tmp_path / "c.jsonl.gz").write_bytes(
        gzip.compress("".join(json.dumps({"text": d}) + "\n" for d in docs).encode(), mtime=0))
    (tmp_path / "t.txt").write_text(docs[0] * 3, encoding="utf-8")
    mb = _mb(docs) / 8
    parts: list[int] = []
    r = polymem.coverage("mistral-v1", "cl100k_base", Corpus([tmp_path]), max_n=5, partition_mb=mb, workers=2,
                         progress=lambda n, b: parts.append(n))
    one = polymem.coverage("mistral-v1", "cl100k_base", Corpus([tmp_path]), max_n=5, partition_mb=mb)
    assert len(parts) >= 6 and r.workers == 2 and one.workers == 1
    assert numbers(r) == numbers(one)



def test_reduce_tasks_in_threads_get_their_own_buffers() -> None:
    """Two reduce tasks in flight in one process (a worker's threads) never get the same buffers; a task's
    buffers handed back serve the next one."""
    import numpy as np

    from polymem.analysis.coverage import dist

    dist.release_reduce_buffers()
    a = dist._reduce_buffers(1000, 500)
    b = dist._reduce_buffers(800, 400)  # a is still in use
    assert all(not np.shares_memory(x, y) for x in a for y in b)
    assert a[0].shape[0] >= 1000 and a[1].shape[0] >= 500 and b[0].shape[0] >= 800 and b[3].shape[0] >= 400
    dist._REDUCE_SPARE.append(a)
    c = dist._reduce_buffers(900, 450)
    assert c[0] is a[0]  # reused: no fresh memory
    dist.release_reduce_buffers()



def test_worker_threads_load_the_tools_once() -> None:
    """The first tasks of a worker's threads, started together, load the tokenizers and token hashes once."""
    import threading

    from polymem.analysis.coverage import dist

    dist.release()
    plan = dist.Plan(target="bytes", reference="cl100k_base", max_n=2, occurrence=False, spec=polymem.HashSpec(),
                     scratch="unused")
    before = dist.LOADS[0]
    barrier = threading.Barrier(4)
    got: list[Any] = []

    def task() -> None:
        barrier.wait(timeout=60)
        got.append(dist._tools(plan))

    threads = [threading.Thread(target=task) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert dist.LOADS[0] - before == 1 and len(got) == 4 and all(g is got[0] for g in got)
    dist.release()



def test_runs_at_once_keep_their_own_preloaded_tools() -> None:
    """Two runs started in one process at the same time (threads of a notebook or a service): one ending does not
    take the other's tools away."""
    from polymem.analysis.coverage import dist
    from polymem.analysis.coverage.run import _hashes
    from polymem.tokenizers import load_tokenizer

    spec = polymem.HashSpec()
    tok = load_tokenizer("bytes")
    tools = (tok, tok, _hashes(tok, spec), _hashes(tok, spec))
    a, b = (dist.Plan(target=tok, reference=tok, max_n=2, occurrence=False, spec=spec, scratch="unused")
            for _ in range(2))
    dist.preload(a, tools)
    dist.preload(b, tools)
    dist.release(b)
    assert dist._tools(a)[2] is tools[2]  # a's own token hashes, not rebuilt
    dist.release(a)
    assert dist._tools(a)[2] is not tools[2]  # forgotten: built again



def test_a_reduce_task_holds_its_buffers_until_it_is_done(monkeypatch: pytest.MonkeyPatch) -> None:
    """While a reduce task looks its entries up, its buffers are not among the spares another task could take;
    afterwards they are (the next task reuses them)."""
    import numpy as np

    from polymem.analysis.coverage import counter as C
    from polymem.analysis.coverage import dist
    from polymem.analysis.coverage.run import _hashes
    from polymem.tokenizers import load_tokenizer

    spec = polymem.HashSpec()
    tt, tr = load_tokenizer("bytes"), load_tokenizer("cl100k_base")
    c = C.HashCounter(_hashes(tt, spec), _hashes(tr, spec), 3)
    for text in ("the cat sat on the mat", "a dog, another dog; dogs!"):
        c.add(tt.encode(text), tr.encode(text))
    occ = c.occurrence_output()
    assert occ.pend_h.shape[0] > 0
    plan = dist.Plan(target=tt, reference=tr, max_n=3, occurrence=True, spec=spec, scratch="unused")
    seen: list[bool] = []
    real = dist._buckets.resolve_range

    def looking_up(ref: Any, *args: Any) -> Any:
        seen.append(all(not np.shares_memory(ref, spare[0]) for spare in dist._REDUCE_SPARE))
        return real(ref, *args)

    dist.release_reduce_buffers()
    monkeypatch.setattr(dist._buckets, "resolve_range", looking_up)
    want = dist.resolve_buckets(plan, [0], 0, 1 << C.BUCKET_BITS, {0: occ})
    assert seen == [True] and len(dist._REDUCE_SPARE) == 1  # held while in use, handed back after
    assert np.array_equal(dist.resolve_buckets(plan, [0], 0, 1 << C.BUCKET_BITS, {0: occ}), want)
    dist.release_reduce_buffers()


def test_outputs_beyond_the_memory_budget_go_to_files_and_change_nothing(monkeypatch: pytest.MonkeyPatch,
                                                                         docs: list[str]) -> None:
    """With a budget that holds only some partitions' occurrence outputs, the others are written to the scratch
    directory by their tasks: the held ones never add up to more than the budget, and the report is the
    one-process run's."""
    from polymem.analysis.coverage import dist

    one = polymem.coverage("mistral-v1", "cl100k_base", docs, max_n=5, partition_mb=_mb(docs) / 8)
    claims: list[tuple[int, bool]] = []
    real_claim = dist.Budget.claim
    monkeypatch.setattr(dist.Budget, "claim",
                        lambda self, n: claims.append((n, real_claim(self, n))) or claims[-1][1])
    written: list[int] = []
    real_write = dist.write_buckets
    monkeypatch.setattr(dist, "write_buckets", lambda plan, i, occ: written.append(i) or real_write(plan, i, occ))
    reduced: list[tuple[list[int], dict[int, Any]]] = []
    real_resolve = dist.resolve_buckets

    def resolve(plan: Any, parts: list[int], lo: int, hi: int, held: Any = None, offsets: Any = None) -> Any:
        reduced.append((list(parts), dict(held or {})))
        return real_resolve(plan, parts, lo, hi, held, offsets)

    monkeypatch.setattr(dist, "resolve_buckets", resolve)
    # about two partitions' outputs (each ~1/8 of the corpus's keys at ~18 bytes per byte of text)
    monkeypatch.setattr(R, "KEEP_MB", _mb(docs) / 8 * 18 * 2)
    r = polymem.coverage("mistral-v1", "cl100k_base", docs, max_n=5, partition_mb=_mb(docs) / 8, workers=2)
    assert numbers(r) == numbers(one) and r.workers == 2
    kept = [n for n, ok in claims if ok]
    assert kept and written and len(kept) + len(written) == len(claims) >= 8, (claims, written)
    # what the reduce tasks got: every partition, each either held in memory or in files, the held ones within
    # the budget (measured on the outputs themselves)
    assert len(reduced) >= 2
    for parts, held in reduced:
        assert sorted(parts) == list(range(len(claims)))
        assert sorted(set(held) | set(written)) == parts and not set(held) & set(written)
        assert sum(dist.held_bytes(o) for o in held.values()) <= R.KEEP_MB * 1e6


class _Failing(Tokenizer):
    """Byte ids; a document with FAIL in it raises at once (a tokenizer's error on one document), the others take
    0.3 s each (so that the partitions queued behind them are still waiting when the error comes)."""

    def __init__(self) -> None:
        super().__init__(name="failing", family="bytes", vocab_size=256, dummy_prefix=False, lossy=False)
        self.seen: list[str] = []

    def _encode(self, text: str) -> list[int]:
        self.seen.append(text[:6])
        if "FAIL" in text:
            raise ValueError(f"cannot encode {text[:8]!r}")
        time.sleep(0.3)
        return list(text.encode())

    def _compute_all_token_bytes(self) -> list[bytes | None]:
        return [bytes([b]) for b in range(256)]


def _scratch_dirs() -> set[str]:
    import tempfile

    roots = {tempfile.gettempdir(), R.RAM_SCRATCH}
    return {os.path.join(d, n) for d in roots if os.path.isdir(d) for n in os.listdir(d)
            if n.startswith("polymem-coverage-")}


def test_a_failing_task_ends_the_run_with_its_error_and_drops_the_rest() -> None:
    """A task's exception reaches the caller as in one process; the partitions queued but not started are
    dropped (never tokenized), the pool's threads are gone and the scratch directory is removed."""
    tok = _Failing()
    # one document per partition (each over partition_mb): 0 fails at once; 1 and 2 run on the two threads
    # meanwhile; 3 waits in the queue (2 per thread in flight) and is dropped; 4.. are never sent
    docs = ["FAIL00" + "x" * 200] + [f"doc{i:03d}" + "x" * 200 for i in range(1, 12)]
    before = _scratch_dirs()
    with pytest.raises(ValueError, match="cannot encode 'FAIL00xx'"):
        polymem.coverage(tok, "bytes", docs, max_n=2, workers=2, partition_mb=1e-4)
    assert "FAIL00" in tok.seen and "doc001" in tok.seen
    assert "doc003" not in tok.seen and not [s for s in tok.seen if s >= "doc004"], tok.seen
    assert not [t for t in threading.enumerate() if t.name.startswith("polymem-coverage")]
    assert _scratch_dirs() == before


def test_ctrl_c_stops_the_run_and_leaves_nothing() -> None:
    """KeyboardInterrupt in the calling thread (here raised by the progress callback at the first partition):
    it reaches the caller, no partition is sent after it, the threads end, the scratch directory goes."""
    tok = _Failing()
    docs = [f"doc{i:03d}" + "x" * 200 for i in range(12)]
    before = _scratch_dirs()

    def progress(n: int, b: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        polymem.coverage(tok, "bytes", docs, max_n=2, workers=2, partition_mb=1e-4, progress=progress)
    assert len(tok.seen) <= 4, tok.seen  # the 2 per thread in flight when the first partition ended
    assert not [t for t in threading.enumerate() if t.name.startswith("polymem-coverage")]
    assert _scratch_dirs() == before


def test_cli_workers_runs_threads_and_equals_one_process(tmp_path: Path, docs: list[str]) -> None:
    """`polymem coverage --workers 2`: the same JSON numbers as --workers 1, 2 task slots reported."""
    from typer.testing import CliRunner

    from polymem.cli.app import app

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[:60]), encoding="utf-8")
    outs = []
    for w in ("1", "2"):
        out = tmp_path / f"w{w}.json"
        res = CliRunner().invoke(app, ["coverage", "-t", "bytes", "-r", "cl100k_base", "--max-n", "3", str(corpus),
                                       "--partition-mb", "0.002", "--json", str(out), "-q", "--workers", w])
        assert res.exit_code == 0, res.output
        outs.append(json.loads(out.read_text()))
    assert [d.pop("workers") for d in outs] == [1, 2]
    for d in outs:
        d.pop("elapsed_s"), d.pop("timing")
    assert outs[0] == outs[1]


@pytest.mark.slow
def test_worker_threads_need_no_dask(tmp_path: Path) -> None:
    """workers=N runs where `distributed` cannot be imported (polymem without its dask extra); processes=True
    then says which extra to install."""
    code = """if True:
        import json, sys
        sys.modules["distributed"] = None  # import distributed -> ImportError
        import polymem
        r = polymem.coverage("bytes", "cl100k_base", ["the cat sat", "on the mat"] * 50, max_n=3, workers=2,
                             partition_mb=1e-4)
        try:
            polymem.coverage("bytes", "bytes", ["x"], max_n=2, workers=2, processes=True)
        except polymem.PolymemError as e:
            err = str(e)
        print(json.dumps({"workers": r.workers, "docs": r.docs, "err": err}))
    """
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2])))
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["workers"] == 2 and got["docs"] == 100
    assert "dask" in got["err"] and "processes" in got["err"], got["err"]
