"""A writer that runs out of room (a file size limit standing in for a full disk) or is killed leaves nothing
behind that the next run does not remove, and never touches the asset it was to replace.

The size limit is real: each writer runs in a child process under ``RLIMIT_FSIZE``, so its writes fail with
EFBIG exactly as they would with ENOSPC on a full file system (Python ignores SIGXFSZ, so the write raises).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from polymem import HashSpec, Layout, MemoryAsset
from polymem.asset import _fs

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_FSIZE and flock are POSIX")

LIMITED = textwrap.dedent("""
    import resource, sys
    from polymem.cli.app import main
    limit = int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    sys.argv = ["polymem", *sys.argv[2:]]
    main()
""")


def _limited(tmp_path: Path, limit: int, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", LIMITED, str(limit), *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "COLUMNS": "400"})


def _siblings(tmp_path: Path, name: str) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(f".{name}."))


def test_a_write_past_the_size_limit_is_one_line_and_leaves_nothing(tmp_path):
    r = _limited(tmp_path, 1_000_000, "init", "t.pmem", "--params", "4M")
    assert r.returncode == 2, r.stderr
    line = " ".join(r.stderr.split())
    assert "cannot write 't.pmem'" in line and "file size limit" in line and "nothing was left behind" in line
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "t.pmem").exists()
    assert _siblings(tmp_path, "t.pmem") == []
    # the same command with room enough succeeds
    ok = _limited(tmp_path, 1 << 30, "init", "t.pmem", "--params", "4M")
    assert ok.returncode == 0, ok.stderr
    assert MemoryAsset.open(tmp_path / "t.pmem").layout.num_rows > 0


def test_an_overwrite_that_runs_out_of_room_keeps_the_old_asset(tmp_path):
    layout = Layout(pages=16, heads=2, slots=2, head_dim=8)
    table = np.random.default_rng(0).standard_normal((layout.num_rows, layout.head_dim)).astype(np.float32)
    MemoryAsset.from_array(tmp_path / "t.pmem", table, HashSpec(), layout, orders=(1, 2))
    r = _limited(tmp_path, 200_000, "init", "t.pmem", "--params", "4M", "--overwrite")
    assert r.returncode == 2 and "file size limit" in r.stderr, r.stderr
    assert np.array_equal(MemoryAsset.open(tmp_path / "t.pmem").to_numpy(), table)
    assert _siblings(tmp_path, "t.pmem") == []


KILLED = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from polymem.asset import _commit
    with _commit.building(Path(sys.argv[1])) as tmp:
        (tmp / "pages").mkdir()
        (tmp / "pages" / "part").write_bytes(b"x" * 4096)
        os.kill(os.getpid(), signal.SIGKILL)
""")


def test_a_killed_writers_build_directory_is_removed_by_the_next_write(tmp_path):
    r = subprocess.run([sys.executable, "-c", KILLED, str(tmp_path / "t.pmem")], capture_output=True, timeout=60)
    assert r.returncode == -signal.SIGKILL
    left = _siblings(tmp_path, "t.pmem")
    assert len(left) == 1 and left[0].startswith(".t.pmem.tmp-")
    # a live writer's build directory (its flock held) is not a dead one's: it stays
    live = tmp_path / ".t.pmem.tmp-live"
    live.mkdir()
    fd = _fs.lock_dir(live)
    assert fd is not None
    try:
        MemoryAsset.create(tmp_path / "t.pmem", HashSpec(), Layout(pages=4, heads=2, slots=2, head_dim=8))
        assert _siblings(tmp_path, "t.pmem") == [".t.pmem.tmp-live"]
    finally:
        os.close(fd)
    assert not MemoryAsset.open(tmp_path / "t.pmem").to_numpy().any()


def test_the_build_directory_stays_locked_until_it_is_installed(tmp_path, monkeypatch):
    """zarr's ``mode="w"`` deletes and re-creates the folder it is given: the build directory's flock would then
    sit on a deleted inode and a concurrent `verify --repair` (or the next writer) would take the live build for
    a dead one and remove it."""
    from polymem.asset import _commit

    real, seen = _commit.install, []

    def install(tmp, dest, **kw):
        fd = _fs.lock_dir(tmp)
        seen.append(fd)
        if fd is not None:
            os.close(fd)
        return real(tmp, dest, **kw)

    monkeypatch.setattr(_commit, "install", install)
    layout = Layout(pages=8, heads=2, slots=2, head_dim=8)
    MemoryAsset.from_array(tmp_path / "t.pmem", np.ones((layout.num_rows, 8), np.float32), HashSpec(), layout,
                           orders=(1, 2))
    assert seen == [None]
