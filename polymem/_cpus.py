"""How many CPU threads a model command should use: the CPUs this process may run on (its affinity, its cgroup's
CPU quota), one thread per physical core, and fewer when other work already keeps the CPUs busy.

The counting rules are pure functions of file contents (``/proc/self/cgroup``, ``cpu.max``, ``cpu.cfs_quota_us``,
sysfs topology, ``/proc/stat``), so they are tested on fabricated files; :func:`choose_threads` reads the real ones. This module
does not import torch and does not set anything: ``polymem.cli._options.apply_threads`` does.

Why fewer threads on a busy machine: torch's CPU kernels split each operation over all their threads and wait for
the slowest; a thread that shares its core with another process arrives late every time, so on a 2-core machine
with one other busy process two threads ran a model command 5–29× slower than one (docs/benchmarks.md).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ThreadChoice", "cgroup_cpu_limit", "cgroup_paths", "choose_threads", "cores_of", "parse_cpu_max",
           "parse_cfs_quota", "pick_threads", "busy_cpus"]


def parse_cpu_max(text: str) -> float | None:
    """CPUs a cgroup v2 ``cpu.max`` file allows: ``"150000 100000"`` → 1.5; ``"max 100000"`` → None (no limit)."""
    parts = text.split()
    if len(parts) < 1 or parts[0] == "max":
        return None
    try:
        quota = int(parts[0])
        period = int(parts[1]) if len(parts) > 1 else 100_000
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def parse_cfs_quota(quota_text: str, period_text: str) -> float | None:
    """CPUs a cgroup v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` pair allows: ``"-1"`` → None (no limit)."""
    try:
        quota, period = int(quota_text.strip()), int(period_text.strip())
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def cgroup_paths(proc_self_cgroup: str) -> tuple[str | None, str | None]:
    """(the cgroup v2 path, the v1 ``cpu`` controller's path) named by ``/proc/self/cgroup``'s text."""
    v2 = v1 = None
    for line in proc_self_cgroup.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if hid == "0" and controllers == "":
            v2 = path
        elif "cpu" in controllers.split(","):
            v1 = path
    return v2, v1


def cgroup_cpu_limit(root: str | os.PathLike[str] = "/sys/fs/cgroup",
                     proc_self_cgroup: str | os.PathLike[str] = "/proc/self/cgroup") -> float | None:
    """The CPUs this process's cgroup quota allows (the smallest quota on its path up to the root), or None.

    cgroup v2: ``ROOT/PATH/cpu.max`` and each parent's; v1: ``cpu.cfs_quota_us`` under ``ROOT/cpu`` (or
    ``ROOT/cpu,cpuacct``) along the ``cpu`` controller's path. Unreadable files count as no limit."""
    root = Path(root)
    try:
        v2, v1 = cgroup_paths(Path(proc_self_cgroup).read_text())
    except OSError:
        v2 = v1 = None
    limits: list[float] = []
    if v2 is not None:
        for d in _up(root, v2):
            lim = _read(d / "cpu.max")
            if lim is not None and (q := parse_cpu_max(lim)) is not None:
                limits.append(q)
    if v1 is not None:
        for base in (root / "cpu", root / "cpu,cpuacct"):
            for d in _up(base, v1):
                quota, period = _read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us")
                if quota is not None and period is not None and (q := parse_cfs_quota(quota, period)) is not None:
                    limits.append(q)
    return min(limits) if limits else None


def _up(base: Path, path: str) -> list[Path]:
    """``base/a/b``, ``base/a``, ``base`` for the cgroup path ``/a/b``."""
    parts = [p for p in path.split("/") if p and p not in (".", "..")]
    return [base.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]


def _read(p: Path) -> str | None:
    try:
        return p.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def cores_of(cpus: set[int] | frozenset[int], topology: dict[int, tuple[str, str]]) -> int:
    """Physical cores among ``cpus``: distinct (package, core) pairs of ``topology`` (cpu → (package id, core
    id), from sysfs); a CPU with no topology counts as its own core."""
    return len({topology.get(c, ("cpu", str(c))) for c in cpus}) or len(cpus)


def _topology(cpus: set[int]) -> dict[int, tuple[str, str]]:
    out = {}
    for c in cpus:
        d = Path(f"/sys/devices/system/cpu/cpu{c}/topology")
        pkg, core = _read(d / "physical_package_id"), _read(d / "core_id")
        if pkg is not None and core is not None:
            out[c] = (pkg.strip(), core.strip())
    return out


def busy_cpus(stat_before: str, stat_after: str, cpus: set[int] | frozenset[int]) -> float:
    """CPUs kept busy between two reads of ``/proc/stat`` (the ``cpuN`` lines of ``cpus``): the busy share of the
    elapsed ticks times the number of CPUs. Read while this process sleeps, it is the other work's.

    >>> busy_cpus("cpu0 10 0 0 90 0 0 0 0", "cpu0 60 0 0 140 0 0 0 0", {0})
    0.5
    """
    def ticks(text: str) -> dict[int, tuple[int, int]]:
        out = {}
        for line in text.splitlines():
            f = line.split()
            if len(f) > 4 and f[0].startswith("cpu") and f[0][3:].isdigit() and int(f[0][3:]) in cpus:
                v = [int(x) for x in f[1:9] if x.isdigit()]
                out[int(f[0][3:])] = (sum(v), v[3] + (v[4] if len(v) > 4 else 0))  # (total, idle + iowait)
        return out

    a, b = ticks(stat_before), ticks(stat_after)
    busy = 0.0
    for c in set(a) & set(b):
        total, idle = b[c][0] - a[c][0], b[c][1] - a[c][1]
        if total > 0:
            busy += max(0.0, min(1.0, (total - idle) / total))
    return busy


@dataclass(frozen=True)
class ThreadChoice:
    """The default thread count and what it came from (``note``: one line when other work keeps CPUs busy)."""

    threads: int
    usable_cpus: float  # affinity, capped by the cgroup quota
    cores: int  # physical cores among the CPUs of the affinity
    busy: float | None  # CPUs other work kept busy when the command started; None where it cannot be read
    note: str | None


def pick_threads(*, affinity: int, quota: float | None, cores: int, busy: float | None) -> ThreadChoice:
    """The rule, as a pure function. Usable CPUs = the affinity's CPUs, capped by the cgroup quota; threads = one per
    physical core among them, at most the usable CPUs (rounded down, at least 1); then, when other work keeps
    ``busy`` CPUs busy, only the CPUs it leaves idle (at least 1), with a one-line note.

    >>> pick_threads(affinity=8, quota=2.5, cores=8, busy=0.0).threads
    2
    >>> pick_threads(affinity=2, quota=None, cores=2, busy=0.9).threads
    1
    """
    usable = float(affinity) if quota is None else min(float(affinity), quota)
    threads = max(1, min(cores, math.floor(usable + 1e-9)))
    note = None
    if busy is not None:
        idle = math.floor(usable - busy + 0.5)  # CPUs the other work leaves free, to the nearest CPU
        if idle < threads:
            fewer = max(1, idle)
            note = (f"note: the CPUs are busy with other work ({busy:.1f} of {_fmt(usable)} usable CPUs): using "
                    f"{fewer} torch thread{'s' if fewer != 1 else ''}, not {threads} (threads that share cores with "
                    "other work run many times slower); --threads N overrides")
            threads = fewer
    return ThreadChoice(threads, usable, cores, busy, note)


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.2f}"


def choose_threads(sample_s: float = 0.5) -> ThreadChoice:
    """:func:`pick_threads` on this machine: ``os.sched_getaffinity``, the cgroup quota, sysfs topology and the
    CPUs kept busy over ``sample_s`` seconds of ``/proc/stat`` (each optional: absent on a platform, it does not
    limit)."""
    import time

    try:
        cpus = set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = set(range(os.cpu_count() or 1))
    quota = cgroup_cpu_limit()
    cores = cores_of(cpus, _topology(cpus))
    busy = None
    before = _read(Path("/proc/stat"))
    if before is not None and sample_s > 0:
        time.sleep(sample_s)
        after = _read(Path("/proc/stat"))
        busy = busy_cpus(before, after, cpus) if after is not None else None
    return pick_threads(affinity=len(cpus), quota=quota, cores=cores, busy=busy)
