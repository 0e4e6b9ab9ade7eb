"""polymem.coverage on a Dask cluster (2 worker processes, shared by this module; and a local cluster of worker
processes started by the call): every number of the JSON equals the single-process run; a worker killed mid-run
is retried and changes nothing; the CLI options. Worker threads (no Dask): test_coverage_threads.py."""

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

from conftest import numbers
from conftest import text_mb as _mb

distributed = pytest.importorskip("distributed")
import test_coverage  # noqa: E402 - the toy tokenizers; pickled by value so the workers need not import tests/

cloudpickle.register_pickle_by_value(test_coverage)
TA, TB, Greedy = test_coverage.TA, test_coverage.TB, test_coverage.Greedy
pytestmark = pytest.mark.slow  # local Dask clusters: seconds each (the quick tier keeps the thread-pool runner)


@pytest.fixture(scope="module")
def client() -> Any:
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                      silence_logs=logging.ERROR) as cluster, Client(cluster) as c:
        yield c


@pytest.fixture(scope="module")
def single(docs: list[str]) -> CoverageReport:
    return polymem.coverage("mistral-v1", "cl100k_base", docs, max_n=5, partition_mb=_mb(docs) / 6)


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


def test_the_local_cluster_runs_quiet_and_leaves_the_dask_config_alone() -> None:
    """The cluster a call starts (processes=True) runs without Dask's statistical profiler (it samples the
    worker threads' stacks every 10 ms, holding the GIL) and with a slower health tick, in its worker processes;
    the process's Dask config is what it was before, during the run and after."""
    import dask

    from polymem.analysis.coverage.run import _local_cluster

    keys = ("distributed.worker.profile.enabled", "distributed.admin.tick.interval",
            "distributed.admin.system-monitor.interval")
    before = [dask.config.get(k) for k in keys]
    with _local_cluster(2) as c:
        got = c.run(lambda: [dask.config.get(k) for k in keys])
        assert len(got) == 2 and all(v == [False, "1s", "5s"] for v in got.values())
        assert [dask.config.get(k) for k in keys] == before
    assert [dask.config.get(k) for k in keys] == before and before[0] is True


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

