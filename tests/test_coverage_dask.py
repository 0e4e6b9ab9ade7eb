"""polymem.coverage on a Dask cluster (2 worker processes, shared by this module; and a local cluster of worker
threads): every number of the JSON equals the single-process run; a worker killed mid-run is retried and changes
nothing; the CLI options."""

from __future__ import annotations

import json
import logging
import os
import signal
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from typer.testing import CliRunner

import polymem
from polymem.analysis.coverage import CoverageReport
from polymem.cli.app import app
from polymem.errors import PolymemError

from conftest import generated_text, sample_text

distributed = pytest.importorskip("distributed")
import test_coverage  # noqa: E402 - the toy tokenizers; pickled by value so the workers need not import tests/

cloudpickle.register_pickle_by_value(test_coverage)
TA, TB, Greedy = test_coverage.TA, test_coverage.TB, test_coverage.Greedy
RUN_FIELDS = ("elapsed_s", "workers", "timing")  # how the run went, not what it measured


@pytest.fixture(scope="module")
def client() -> Any:
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                      silence_logs=logging.ERROR) as cluster, Client(cluster) as c:
        yield c


@pytest.fixture(scope="module")
def docs() -> list[str]:
    text = sample_text() + "\n" + generated_text(4000, seed=5)
    lines = text.splitlines(keepends=True)
    return ["".join(lines[i:i + 5]) for i in range(0, len(lines), 5)]


def numbers(r: CoverageReport) -> dict[str, Any]:
    d = r.to_dict()
    for k in RUN_FIELDS:
        d.pop(k)
    return d


@pytest.fixture(scope="module")
def single(docs: list[str]) -> CoverageReport:
    return polymem.coverage("mistral-v1", "cl100k_base", docs, max_n=5, partition_mb=_mb(docs) / 6)


def _mb(docs: list[str]) -> float:
    return sum(len(d) for d in docs) / 1e6


def test_dask_run_equals_single_process_run(client: Any, docs: list[str], single: CoverageReport) -> None:
    parts: list[int] = []
    r = polymem.coverage("mistral-v1", "cl100k_base", docs, max_n=5, partition_mb=_mb(docs) / 6, client=client,
                         progress=lambda n, b: parts.append(n))
    assert len(parts) >= 4, "the corpus should be spread over at least 4 partitions"
    assert r.workers == 2 and single.workers == 1
    assert numbers(r) == numbers(single)
    assert json.loads(r.to_json())["occurrence_weighted"] == json.loads(single.to_json())["occurrence_weighted"]


def test_a_killed_worker_is_retried_and_changes_nothing(client: Any, docs: list[str],
                                                        single: CoverageReport) -> None:
    killed: list[tuple[str, int, list[Any]]] = []

    def kill_one_busy_worker(n: int, b: int) -> None:
        if killed:
            return
        busy = {w: ks for w, ks in client.processing().items() if ks}
        if not busy:
            return
        addr, keys = next(iter(busy.items()))
        pid = client.run(os.getpid, workers=[addr])[addr]
        os.kill(pid, signal.SIGKILL)
        killed.append((addr, pid, list(keys)))

    r = polymem.coverage("mistral-v1", "cl100k_base", docs, max_n=5, partition_mb=_mb(docs) / 6, client=client,
                         progress=kill_one_busy_worker)
    assert killed and killed[0][2], "a worker busy with a partition was killed"
    assert numbers(r) == numbers(single)
    client.wait_for_workers(2, timeout=60)
    assert killed[0][1] not in client.run(os.getpid).values()  # the nanny started a new process


def test_occurrences_are_resolved_across_workers(client: Any) -> None:
    C = Greedy(["a", "b", "ab"], "C")
    r = polymem.coverage(TA, C, ["ab", "ba"] * 4, max_n=2, partition_mb=1e-6, client=client)
    assert r.occurrence_weighted == [1.0, 1.0] and r.per_doc_mean == [0.5, 1.0] and r.docs == 8


def test_workers_load_their_tokenizers_once_across_runs(client: Any, docs: list[str]) -> None:
    """Each worker loads the tokenizers and builds their token hashes once, for all its tasks and for later runs
    with the same specs; another hash spec is loaded afresh. The driver does not load them at all: the report's
    tokenizer info comes from the workers, the same as a one-process run's."""
    from polymem.analysis.coverage import dist

    small = docs[:24]
    loads = lambda: dist.LOADS[0]  # noqa: E731 - run on each worker
    before = client.run(loads)
    reports = [polymem.coverage("mistral-v1", "cl100k_base", small, max_n=3, partition_mb=_mb(small) / 6,
                                client=client) for _ in range(2)]
    after = client.run(loads)
    assert all(after[w] - before.get(w, 0) <= 1 for w in after)  # 0 if an earlier test loaded these already
    assert numbers(reports[0]) == numbers(reports[1])
    one = polymem.coverage("mistral-v1", "cl100k_base", small, max_n=3, partition_mb=_mb(small) / 6)
    assert reports[0].target == one.target and reports[0].reference == one.reference
    other = polymem.HashSpec(byte_seed=12345)
    r = polymem.coverage("mistral-v1", "cl100k_base", small, max_n=3, partition_mb=_mb(small) / 6, client=client,
                         spec=other)
    again = client.run(loads)
    assert sum(again[w] - after[w] for w in again) >= 1 and r.hash_spec == other.spec_id


def test_a_corpus_with_few_partitions_is_cut_finer_on_dask(client: Any, tmp_path: Path, docs: list[str]) -> None:
    """A corpus of files that gives fewer partitions than 4 per worker is cut finer on Dask (every worker busy to
    the end); the numbers equal the one-process run's with its one big partition, bit for bit (exact sums)."""
    import gzip

    from polymem.corpus import Corpus

    path = tmp_path / "c.jsonl.gz"
    path.write_bytes(gzip.compress("".join(json.dumps({"text": d}) + "\n" for d in docs).encode(), mtime=0))
    mb = path.stat().st_size * 4.5 / 1e6  # one partition in one process (compressed sizes count 4x)
    one = polymem.coverage("mistral-v1", "cl100k_base", Corpus([path]), max_n=4, partition_mb=mb)
    parts: list[int] = []
    r = polymem.coverage("mistral-v1", "cl100k_base", Corpus([path]), max_n=4, partition_mb=mb, client=client,
                         progress=lambda n, b: parts.append(n))
    assert len(Corpus([path]).partitions(mb)) == 1 and len(parts) >= 8
    assert numbers(r) == numbers(one)


def test_a_failing_task_raises_its_error(client: Any) -> None:
    with pytest.raises(ValueError, match="not in the toy vocabulary"):
        polymem.coverage(TA, TB, ["aabb", "abc"], max_n=2, client=client)


def test_exact_bytes_stays_in_one_process(client: Any) -> None:
    with pytest.raises(PolymemError, match="exact_bytes runs in one process"):
        polymem.coverage(TA, TB, ["aabb"], max_n=2, exact_bytes=True, client=client)


def test_cli_dask_address_and_worker_threads_equal_in_process(client: Any, tmp_path: Path, docs: list[str]) -> None:
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[:40]), encoding="utf-8")
    outs = []
    for extra in ([], ["--dask", client.scheduler.address], ["--workers", "2"]):
        out = tmp_path / f"r{len(outs)}.json"
        res = CliRunner().invoke(app, ["coverage", "-t", "bytes", "-r", "cl100k_base", "--max-n", "3", str(corpus),
                                       "--partition-mb", "0.002", "--json", str(out), "-q", *extra])
        assert res.exit_code == 0, res.output
        outs.append(json.loads(out.read_text()))
    assert outs[1].pop("workers") == 2 and outs[2].pop("workers") == 2 and outs[0].pop("workers") == 1
    for d in outs:
        d.pop("elapsed_s"), d.pop("timing")
    assert outs[0] == outs[1] == outs[2]


def test_cli_rejects_dask_with_workers(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("hello", encoding="utf-8")
    res = CliRunner().invoke(app, ["coverage", "-t", "bytes", "-r", "bytes", str(tmp_path / "a.txt"),
                                   "--dask", "tcp://127.0.0.1:1", "--workers", "2"])
    assert res.exit_code == 2 and "--dask" in res.output and "--workers" in res.output


@pytest.mark.slow
def test_workers_start_a_local_cluster_of_processes(docs: list[str], single: CoverageReport) -> None:
    r = polymem.coverage("mistral-v1", "cl100k_base", docs, max_n=5, partition_mb=_mb(docs) / 6, workers=2,
                         processes=True)
    assert r.workers == 2 and numbers(r) == numbers(single)


def test_worker_threads_equal_one_process(tmp_path: Path, docs: list[str]) -> None:
    """workers=2 (a local cluster whose worker runs 2 threads in this process): every number of the JSON equals
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
    a, b = (dist.Plan(target=dist.InProcess("target"), reference=dist.InProcess("reference"), max_n=2,
                      occurrence=False, spec=spec, scratch="unused") for _ in range(2))
    dist.preload(a, tools)
    dist.preload(b, tools)
    dist.release(b)
    assert dist._tools(a)[0] is tok
    dist.release(a)
    with pytest.raises(PolymemError, match="loaded by the process that started it"):
        dist._tools(a)


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
    real = dist._kernels.resolve_range

    def looking_up(ref: Any, *args: Any) -> Any:
        seen.append(all(not np.shares_memory(ref, spare[0]) for spare in dist._REDUCE_SPARE))
        return real(ref, *args)

    dist.release_reduce_buffers()
    monkeypatch.setattr(dist._kernels, "resolve_range", looking_up)
    want = dist.resolve_buckets(plan, [0], 0, 1 << C.BUCKET_BITS, {0: occ})
    assert seen == [True] and len(dist._REDUCE_SPARE) == 1  # held while in use, handed back after
    assert np.array_equal(dist.resolve_buckets(plan, [0], 0, 1 << C.BUCKET_BITS, {0: occ}), want)
    dist.release_reduce_buffers()


def test_worker_threads_have_no_memory_limit() -> None:
    """Dask's memory monitor would measure the whole process (the caller's data too) and pause a worker at 80 %
    of the machine's memory, silently: the in-process worker runs without a limit."""
    from polymem.analysis.coverage.run import _local_cluster

    with _local_cluster(2) as c:
        workers = list(c.cluster.workers.values())
        assert len(workers) == 1 and sum(c.nthreads().values()) == 2
        assert not workers[0].memory_manager.memory_limit


def test_the_local_cluster_runs_quiet_and_leaves_the_dask_config_alone() -> None:
    """The cluster a call starts runs without Dask's statistical profiler (it samples the worker threads' stacks
    every 10 ms, holding the GIL) and with a slower health tick, in its worker processes too; the process's Dask
    config is what it was before, during the run and after."""
    import dask

    from polymem.analysis.coverage.run import _local_cluster

    keys = ("distributed.worker.profile.enabled", "distributed.admin.tick.interval",
            "distributed.admin.system-monitor.interval")
    before = [dask.config.get(k) for k in keys]
    with _local_cluster(2) as c:
        worker = next(iter(c.cluster.workers.values()))
        assert "profile" not in worker.periodic_callbacks and worker._tick_interval == 1.0
        assert [dask.config.get(k) for k in keys] == before
    with _local_cluster(2, processes=True) as c:
        got = c.run(lambda: [dask.config.get(k) for k in keys])
        assert len(got) == 2 and all(v == [False, "1s", "5s"] for v in got.values())
    assert [dask.config.get(k) for k in keys] == before and before[0] is True


def test_tools_held_by_another_process_are_a_clear_error() -> None:
    """A plan whose tokenizers the starting process holds (workers=N threads) cannot be served elsewhere."""
    from polymem.analysis.coverage import dist

    dist.release()
    plan = dist.Plan(target=dist.InProcess("target"), reference=dist.InProcess("reference"), max_n=2,
                     occurrence=False, spec=polymem.HashSpec(), scratch="unused")
    with pytest.raises(PolymemError, match="loaded by the process that started it"):
        dist._tools(plan)


def test_processes_must_be_a_bool_and_needs_workers(client: Any, tmp_path: Path) -> None:
    with pytest.raises(PolymemError, match="processes='yes' must be True"):
        polymem.coverage(TA, TB, ["aabb"], max_n=2, workers=2, processes="yes")  # type: ignore[arg-type]
    with pytest.raises(PolymemError, match="pass workers=N, or drop processes"):
        polymem.coverage(TA, TB, ["aabb"], max_n=2, processes=True)
    with pytest.raises(PolymemError, match="a client's cluster has the workers it has"):
        polymem.coverage(TA, TB, ["aabb"], max_n=2, processes=True, client=client)
    (tmp_path / "a.txt").write_text("hello", encoding="utf-8")
    res = CliRunner().invoke(app, ["coverage", "-t", "bytes", "-r", "bytes", str(tmp_path / "a.txt"),
                                   "--processes"])
    assert res.exit_code == 2 and "--processes" in res.output and "--workers N" in res.output
    res = CliRunner().invoke(app, ["coverage", "-t", "bytes", "-r", "bytes", str(tmp_path / "a.txt"),
                                   "--processes", "--dask", "tcp://127.0.0.1:1"])
    assert res.exit_code == 2 and "drop --processes" in res.output and "add --workers" not in res.output

