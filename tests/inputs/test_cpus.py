"""The default thread count (polymem/_cpus.py): the cgroup quota read from fabricated cgroup trees, physical cores
from a fabricated topology, busy CPUs from two /proc/stat snapshots, and the rule that combines them."""

from __future__ import annotations

from pathlib import Path

import pytest

from polymem._cpus import (busy_cpus, cgroup_cpu_limit, cgroup_paths, choose_threads, cores_of, parse_cfs_quota,
                           parse_cpu_max, pick_threads)


def _tree(tmp_path: Path, files: dict[str, str], proc: str) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (tmp_path / "proc_self_cgroup").write_text(proc)
    return root, tmp_path / "proc_self_cgroup"


@pytest.mark.parametrize("text, want", [("150000 100000\n", 1.5), ("max 100000\n", None), ("200000 100000", 2.0),
                                        ("50000", 0.5), ("", None), ("garbage x", None), ("0 100000", None)])
def test_cpu_max(text: str, want: float | None) -> None:
    assert parse_cpu_max(text) == want


@pytest.mark.parametrize("quota, period, want", [("-1\n", "100000\n", None), ("300000", "100000", 3.0),
                                                 ("x", "100000", None), ("100000", "0", None)])
def test_cfs_quota(quota: str, period: str, want: float | None) -> None:
    assert parse_cfs_quota(quota, period) == want


def test_cgroup_paths_of_a_v1_and_v2_host() -> None:
    assert cgroup_paths("0::/user.slice/app\n") == ("/user.slice/app", None)
    assert cgroup_paths("4:memory:/x\n2:cpu,cpuacct:/docker/abc\n1:name=systemd:/\n") == (None, "/docker/abc")
    assert cgroup_paths("garbage\n") == (None, None)


def test_v2_quota_is_the_smallest_on_the_path(tmp_path: Path) -> None:
    root, proc = _tree(tmp_path, {"cpu.max": "max 100000\n", "kube/cpu.max": "400000 100000\n",
                                  "kube/pod/cpu.max": "max 100000\n"}, "0::/kube/pod\n")
    assert cgroup_cpu_limit(root, proc) == 4.0  # the parent's limit holds for the child that has none


def test_v2_quota_at_the_namespace_root(tmp_path: Path) -> None:
    root, proc = _tree(tmp_path, {"cpu.max": "150000 100000\n"}, "0::/\n")
    assert cgroup_cpu_limit(root, proc) == 1.5


def test_v1_quota_under_either_controller_folder(tmp_path: Path) -> None:
    root, proc = _tree(tmp_path, {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "250000\n",
                                  "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n"}, "3:cpu,cpuacct:/docker/abc\n")
    assert cgroup_cpu_limit(root, proc) == 2.5
    root, proc = _tree(tmp_path / "b", {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, "3:cpu:/\n")
    assert cgroup_cpu_limit(root, proc) is None


def test_no_cgroup_files_is_no_limit(tmp_path: Path) -> None:
    assert cgroup_cpu_limit(tmp_path / "none", tmp_path / "missing") is None


def test_cores_count_hyperthread_siblings_once() -> None:
    topo = {0: ("0", "0"), 1: ("0", "1"), 2: ("0", "0"), 3: ("0", "1"), 4: ("1", "0")}
    assert cores_of({0, 1, 2, 3}, topo) == 2
    assert cores_of({0, 2}, topo) == 1
    assert cores_of({0, 4}, topo) == 2  # same core id on another package
    assert cores_of({7, 8}, {}) == 2  # no topology: each CPU its own core


def test_busy_cpus_from_two_stat_snapshots() -> None:
    before = "cpu  0 0 0 0\ncpu0 100 0 0 900 0 0 0 0\ncpu1 100 0 0 900 0 0 0 0\ncpu2 0 0 0 0 0 0 0 0\n"
    after = "cpu  0 0 0 0\ncpu0 200 0 0 900 0 0 0 0\ncpu1 100 0 0 1000 0 0 0 0\ncpu2 50 0 0 50 0 0 0 0\n"
    assert busy_cpus(before, after, {0, 1}) == 1.0  # cpu0 all busy, cpu1 all idle
    assert busy_cpus(before, after, {0, 1, 2}) == 1.5
    assert busy_cpus(before, after, {1}) == 0.0
    assert busy_cpus("", after, {0}) == 0.0


@pytest.mark.parametrize("kw, threads", [
    (dict(affinity=16, quota=None, cores=8, busy=0.0), 8),     # one per physical core
    (dict(affinity=16, quota=2.5, cores=8, busy=0.0), 2),      # the quota rounds down
    (dict(affinity=2, quota=0.5, cores=2, busy=None), 1),      # never below one
    (dict(affinity=2, quota=None, cores=2, busy=0.95), 1),     # one core taken by other work
    (dict(affinity=2, quota=None, cores=2, busy=0.3), 2),      # a little other work: keep both
    (dict(affinity=8, quota=None, cores=8, busy=7.9), 1),
    (dict(affinity=8, quota=None, cores=8, busy=3.0), 5),
])
def test_the_rule(kw: dict, threads: int) -> None:
    assert pick_threads(**kw).threads == threads


def test_a_busy_machine_gets_one_line_saying_so() -> None:
    c = pick_threads(affinity=2, quota=None, cores=2, busy=1.2)
    assert c.threads == 1 and c.note and "1.2 of 2" in c.note and "--threads" in c.note and "\n" not in c.note
    assert pick_threads(affinity=2, quota=None, cores=2, busy=0.0).note is None


def test_this_machine() -> None:
    import os

    c = choose_threads(sample_s=0.05)
    assert 1 <= c.threads <= len(os.sched_getaffinity(0))
