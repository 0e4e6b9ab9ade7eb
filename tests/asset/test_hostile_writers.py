"""Writers never write outside their asset or destination, and never replace what they were not told to.

Hostile states are made by the tests on the local file system: links planted where a writer creates or locks
a file, a crafted page-write marker, object keys with '..' or empty segments on a local S3 server (moto on
127.0.0.1), an asset that appears while another writer builds, a pull killed with SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from polymem import HashSpec, Layout, MemoryAsset, PolymemError
from polymem.asset import _fs
from polymem.ops.pull import pull

LAYOUT = Layout(pages=11, heads=4, slots=2, head_dim=8)
PAGES = np.full((2, 8, 8), 0.25, np.float32)


def _table(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((LAYOUT.num_rows, LAYOUT.head_dim)).astype(np.float32)


def _asset(path: Path, seed: int = 0) -> MemoryAsset:
    return MemoryAsset.from_array(path, _table(seed), HashSpec(), LAYOUT, orders=(1, 2), chunks_per_shard=4)


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file outside every asset that a hostile link points at; tests check it is never changed."""
    p = tmp_path / "outside" / "precious.txt"
    p.parent.mkdir()
    p.write_text("keep me\n")
    return p


# ------------------------------------------------------------------------------------------- the writer lock
def test_a_lock_file_that_is_a_link_is_refused_and_its_target_untouched(tmp_path: Path, victim: Path) -> None:
    a = _asset(tmp_path / "a.pmem")
    (tmp_path / "a.pmem" / ".polymem-lock").unlink(missing_ok=True)
    os.symlink(victim, tmp_path / "a.pmem" / ".polymem-lock")
    with pytest.raises(PolymemError, match=r"writer lock '.polymem-lock' is a symbolic link .*never writes through"):
        a.write_pages([1, 2], PAGES)
    with pytest.raises(PolymemError, match="is a symbolic link"):
        MemoryAsset.repair(tmp_path / "a.pmem")
    assert victim.read_text() == "keep me\n"
    (tmp_path / "a.pmem" / ".polymem-lock").unlink()  # the fix the message names
    a.write_pages([1, 2], PAGES)
    assert np.array_equal(MemoryAsset.open(tmp_path / "a.pmem").read_pages([1]), PAGES[:1].astype(np.float16))


def test_a_lock_file_hard_linked_outside_is_refused(tmp_path: Path, victim: Path) -> None:
    a = _asset(tmp_path / "a.pmem")
    (tmp_path / "a.pmem" / ".polymem-lock").unlink(missing_ok=True)
    os.link(victim, tmp_path / "a.pmem" / ".polymem-lock")
    with pytest.raises(PolymemError, match="is a file with 2 hard links"):
        a.write_pages([1], PAGES[:1])
    assert victim.read_text() == "keep me\n"


# --------------------------------------------------------------------------------- temp files and directories
@pytest.mark.parametrize("name", ["SHARD.new", ".zarr.json.tmp", ".polymem-writing.tmp"])
def test_dangling_temp_file_links_are_replaced_not_followed(tmp_path: Path, name: str) -> None:
    a = _asset(tmp_path / "a.pmem")
    name = name.replace("SHARD", a.geometry.shard_key(0))  # the name the write of page 0 creates
    target = tmp_path / "outside" / "created-by-polymem"
    target.parent.mkdir()
    assert (tmp_path / "a.pmem" / name).parent.is_dir()
    os.symlink(target, tmp_path / "a.pmem" / name)
    a.write_pages([0, 1], PAGES)
    assert not target.exists()
    again = MemoryAsset.open(tmp_path / "a.pmem")
    assert again.problems() == []
    assert np.array_equal(again.read_pages([0, 1]), PAGES.astype(np.float16))


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("linked", ["pages/c/0", "pages/c", "pages"])
def test_a_shard_directory_that_is_a_link_is_refused(tmp_path: Path, linked: str) -> None:
    root = tmp_path / "a.pmem"
    a = _asset(root)
    outside = tmp_path / "outside"
    os.rename(root / linked, outside)
    os.symlink(outside, root / linked)
    (outside / "backup.old").write_bytes(b"the user's")  # a file the stale-file sweep must not reach
    before = _tree(outside)
    with pytest.raises(PolymemError, match=rf"{linked}' is a symbolic link; polymem writes only inside the asset"):
        a.write_pages([0], PAGES[:1])
    try:  # repair refuses a linked pages or pages/c, and never walks into a linked shard directory
        MemoryAsset.repair(root)
    except PolymemError as e:
        assert "is a symbolic link" in str(e)
    assert _tree(outside) == before and not (root / ".polymem-writing").exists()


# ----------------------------------------------------------------------------------------------- the marker
@pytest.mark.parametrize("key", ["../../outside/precious.txt", "pages/c/../../../outside/precious.txt",
                                 "/etc/passwd", "pages/c//0", "zarr.json"])
def test_a_crafted_marker_is_refused_and_touches_nothing(tmp_path: Path, victim: Path, key: str) -> None:
    root = tmp_path / "a.pmem"
    _asset(root)
    (victim.parent / "precious.txt.old").write_text("attacker's\n")
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    (root / ".polymem-writing").write_text(json.dumps({"replacing": [key], "new_zarr_json_sha256": "0" * 64}))
    with pytest.raises(PolymemError, match=r"lists .* which is not a shard key .*refusing to touch it"):
        MemoryAsset.repair(root)
    assert victim.read_text() == "keep me\n" and (victim.parent / "precious.txt.old").exists()
    assert {p: p.read_bytes() for p in before} == before


def test_a_marker_key_through_a_linked_directory_is_refused(tmp_path: Path, victim: Path) -> None:
    root = tmp_path / "a.pmem"
    _asset(root)
    os.rename(root / "pages" / "c" / "0", victim.parent / "0")
    os.symlink(victim.parent / "0", root / "pages" / "c" / "0")
    (victim.parent / "0" / "0.old").write_text("attacker's\n")
    (root / ".polymem-writing").write_text(json.dumps({"replacing": ["pages/c/0/0"], "new_zarr_json_sha256": ""}))
    with pytest.raises(PolymemError, match="is a symbolic link"):
        MemoryAsset.repair(root)
    assert (victim.parent / "0" / "0.old").read_text() == "attacker's\n"


def test_a_giant_marker_is_refused_unread(tmp_path: Path) -> None:
    root = tmp_path / "a.pmem"
    _asset(root)
    with open(root / ".polymem-writing", "wb") as f:
        f.truncate(3 << 30)  # 3 GiB, sparse
    with pytest.raises(PolymemError, match=r"page-write marker is 3,221,225,472 bytes; a polymem page-write marker "
                                           r"is a regular file of at most"):
        MemoryAsset.repair(root)


# ------------------------------------------------------------------------------------- siblings of an asset
def test_repair_leaves_live_build_directories_and_other_assets_alone(tmp_path: Path, victim: Path) -> None:
    _asset(tmp_path / "[ab].pmem")
    other = tmp_path / ".a.pmem.tmp-inprogress"  # another asset's, matched by the unescaped glob '[ab]'
    other.mkdir()
    live, fd = _fs.locked_mkdtemp(".[ab].pmem.tmp-", tmp_path)  # a writer building right now
    dead = tmp_path / ".[ab].pmem.tmp-dead"
    dead.mkdir()
    try:
        done = MemoryAsset.repair(tmp_path / "[ab].pmem")
    finally:
        os.close(fd)
    assert done == ["removed stale build directory '.[ab].pmem.tmp-dead'"]
    assert other.is_dir() and live.is_dir() and not dead.exists()


def test_repair_never_restores_through_a_linked_old_directory(tmp_path: Path, victim: Path) -> None:
    (victim.parent / "asset").mkdir()
    os.symlink(victim.parent, tmp_path / ".x.pmem.old-evil")
    with pytest.raises(PolymemError, match="nothing left aside"):
        MemoryAsset.repair(tmp_path / "x.pmem")
    assert (victim.parent / "asset").is_dir() and not (tmp_path / "x.pmem").exists()


@pytest.mark.parametrize("rewrite", ["quantize", "upgrade"])
def test_an_in_place_rewrite_never_drops_a_write_committed_meanwhile(tmp_path: Path, rewrite: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Another writer commits page 5 while an in-place quantize / upgrade reads the asset: the rewrite refuses
    at its commit and page 5 keeps the other writer's value."""
    from polymem.asset import _commit

    root = tmp_path / "a.pmem"
    _asset(root)
    if rewrite == "upgrade":  # an asset that upgrade rewrites: one written before shard ids
        from assetedit import _strip_shard_ids

        _strip_shard_ids(root)
    a = MemoryAsset.open(root)
    new = np.full((1, 8, 8), 7.0, np.float32)
    real = _commit.install

    def meanwhile(tmp: Path, dest: Path, **kw: object) -> None:
        MemoryAsset.open(root).write_pages([5], new)  # another writer's commit lands
        real(tmp, dest, **kw)

    monkeypatch.setattr(_commit, "install", meanwhile)
    with pytest.raises(PolymemError, match="another writer committed pages while this rewrite read the asset; "
                                           "nothing was replaced"):
        a.quantize(root, to="float32", overwrite=True) if rewrite == "quantize" else MemoryAsset.upgrade(root)
    assert np.array_equal(MemoryAsset.open(root).read_pages([5]), new.astype(np.float16))


# ---------------------------------------------------------------------------------- no overwrite, at commit
def test_an_asset_created_meanwhile_is_not_replaced_without_overwrite(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A second writer creates the asset while the first builds (between its checks and its commit): the first
    refuses at commit and the second's asset is intact."""
    dest = tmp_path / "a.pmem"
    real = _fs.rename_noreplace

    def other_writer_wins(src: Path, dst: Path) -> None:
        if Path(dst) == dest and not dest.exists():
            monkeypatch.setattr(_fs, "rename_noreplace", real)
            _asset(dest, seed=7)  # the other process's asset lands first
        real(src, dst)

    monkeypatch.setattr(_fs, "rename_noreplace", other_writer_wins)
    with pytest.raises(PolymemError, match="was created by another writer while this one was building.*nothing "
                                           "was replaced"):
        _asset(dest, seed=1)
    assert np.array_equal(MemoryAsset.open(dest).to_numpy(), MemoryAsset.open(_asset(tmp_path / "b", 7).path)
                          .to_numpy())
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".a.pmem")] == []


def test_rename_noreplace_refuses_every_kind_of_existing_target(tmp_path: Path) -> None:
    for kind in ("file", "empty dir", "dir", "dangling link"):
        src, dst = tmp_path / f"src-{kind}", tmp_path / f"dst-{kind}"
        src.mkdir()
        if kind == "file":
            dst.write_text("x")
        elif kind == "dangling link":
            os.symlink(tmp_path / "nowhere", dst)
        else:
            dst.mkdir()
            if kind == "dir":
                (dst / "f").write_text("x")
        with pytest.raises(FileExistsError):
            _fs.rename_noreplace(src, dst)
        assert src.is_dir()
    _fs.rename_noreplace(tmp_path / "src-file", tmp_path / "fresh")
    assert (tmp_path / "fresh").is_dir() and not (tmp_path / "src-file").exists()


def test_overwriting_through_a_symlinked_destination_is_refused(tmp_path: Path) -> None:
    real = _asset(tmp_path / "real.pmem")
    os.symlink(tmp_path / "real.pmem", tmp_path / "link.pmem")
    with pytest.raises(PolymemError, match="is a symbolic link .*pass the real path"):
        MemoryAsset.from_array(tmp_path / "link.pmem", _table(3), HashSpec(), LAYOUT, orders=(1,), overwrite=True,
                               chunks_per_shard=4)
    assert np.array_equal(MemoryAsset.open(tmp_path / "real.pmem").to_numpy(), real.to_numpy())


# --------------------------------------------------------------------------------------------------- pull
def test_a_pull_killed_with_sigkill_leaves_staging_that_the_next_pull_removes(tmp_path: Path) -> None:
    src = _asset(tmp_path / "src.pmem")
    out = tmp_path / "dst" / "p.pmem"
    code = ("import os, signal, sys\nfrom polymem.ops.pull import pull\n"
            "pull(sys.argv[1], sys.argv[2], workers=1, progress=lambda k, n: os.kill(os.getpid(), signal.SIGKILL))")
    r = subprocess.run([sys.executable, "-c", code, src.path, str(out)], capture_output=True, text=True)
    assert r.returncode == -signal.SIGKILL, r.stderr
    left = list(out.parent.glob(".p.pmem.pull-*"))
    assert len(left) == 1 and not out.exists()
    # a staging directory whose pull still runs (its lock held) is left alone
    busy = _fs.mkdtemp(".p.pmem.pull-", out.parent)
    fd = _fs.lock_dir(busy)
    try:
        got = pull(src.path, out)
        assert np.array_equal(got.to_numpy(), src.to_numpy())
        assert list(out.parent.glob(".p.pmem.pull-*")) == [busy]
    finally:
        os.close(fd)
    assert MemoryAsset.repair(out) == [f"removed the staging directory of an interrupted pull {busy.name!r}"]
    assert list(out.parent.glob(".p.pmem.pull-*")) == []


def test_pull_of_a_local_source_never_copies_through_a_link(tmp_path: Path, victim: Path) -> None:
    src = _asset(tmp_path / "src.pmem")
    os.symlink(victim, tmp_path / "src.pmem" / "README")
    with pytest.raises(PolymemError, match=r"'README' is a symbolic link; a pulled asset holds only its own files"):
        pull(src.path, tmp_path / "dst.pmem")
    (tmp_path / "src.pmem" / "README").unlink()
    (tmp_path / "src.pmem" / "notes.txt").write_text("not named by the header")
    got = pull(src.path, tmp_path / "dst.pmem")
    assert not (Path(got.path) / "notes.txt").exists() and got.problems() == []


def test_pull_from_an_unknown_protocol_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(PolymemError, match=r"'bogus' is not a protocol fsspec knows \(e.g. s3://"):
        pull("bogus://bucket/t.pmem", tmp_path / "x")
    assert not (tmp_path / "x").exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3() -> Iterator[tuple[object, dict]]:
    s3fs = pytest.importorskip("s3fs")
    moto_server = pytest.importorskip("moto.server")
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=(port := _free_port()), verbose=False)
    server.start()
    try:
        opts = {"endpoint_url": f"http://127.0.0.1:{port}"}
        s3fs.S3FileSystem.clear_instance_cache()
        fs = s3fs.S3FileSystem(**opts)
        try:
            fs.mkdir("hostile")
        except FileExistsError:  # moto keeps one in-process state across servers
            pass
        yield fs, opts
    finally:
        server.stop()
        s3fs.S3FileSystem.clear_instance_cache()  # instances made here point at this server
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


@pytest.mark.parametrize("extra", ["../escaped.bin", "pages/../../escaped.bin", "/{abs}/escaped.bin"])
def test_pull_refuses_object_keys_that_leave_the_destination(tmp_path: Path, s3, extra: str) -> None:
    fs, opts = s3
    extra = extra.format(abs=str(tmp_path / "abs").lstrip("/"))  # an empty segment, then an absolute path
    src = _asset(tmp_path / "src.pmem")
    prefix = f"hostile/t-{abs(hash(extra))}.pmem"
    for p in sorted(Path(src.path).rglob("*")):
        if p.is_file() and not p.name.startswith("."):
            fs.pipe_file(f"{prefix}/{p.relative_to(src.path).as_posix()}", p.read_bytes())
    bucket, _, root = prefix.partition("/")
    import boto3  # the raw key, unnormalised, as a hostile bucket would hold it

    boto3.client("s3", **opts).put_object(Bucket=bucket, Key=f"{root}/{extra}", Body=b"attacker's")
    fs.invalidate_cache()
    dest = tmp_path / "dst" / "p.pmem"
    os.environ["AWS_ENDPOINT_URL"] = opts["endpoint_url"]
    try:
        with pytest.raises(PolymemError, match=r"is not a path inside the asset .*refusing to touch anything"):
            pull(f"s3://{prefix}", dest)
    finally:
        os.environ.pop("AWS_ENDPOINT_URL", None)
        type(fs).clear_instance_cache()
    assert not dest.exists() and list(dest.parent.iterdir()) == []
    assert not (tmp_path / "escaped.bin").exists() and not (tmp_path / "abs").exists()


def test_check_key_accepts_plain_keys_only() -> None:
    for ok in ("zarr.json", "pages/c/0/0", "counts/c/12"):
        assert _fs.check_key(ok, "t") == ok
    for bad in ("", "/x", "a//b", "a/./b", "a/..", "..", "a\\b", "a\x00b", "a/"):
        with pytest.raises(PolymemError, match="is not a path inside the asset"):
            _fs.check_key(bad, "t")
