"""polymem._io: atomic writes (whole file or none, temp removed on failure) and one-line errors for places
that cannot be written. The failing places are real: a parent that is a regular file (works as root too, where
permission bits do not stop anything), an existing directory as the target, and /sys (sysfs refuses root)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from polymem._io import atomic_path, atomic_write_bytes, atomic_write_json, atomic_write_text, check_output_path
from polymem.errors import OutputError, PolymemError


def leftovers(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.startswith("."))


def test_bytes_text_and_json_land_whole_and_leave_no_temp(tmp_path: Path) -> None:
    assert atomic_write_bytes(tmp_path / "a" / "b.bin", b"\x00\x01") == tmp_path / "a" / "b.bin"  # parents made
    assert (tmp_path / "a" / "b.bin").read_bytes() == b"\x00\x01"
    atomic_write_text(tmp_path / "t.txt", "héllo")
    assert (tmp_path / "t.txt").read_bytes() == "héllo".encode()
    atomic_write_json(tmp_path / "j.json", {"x": [1, 2]})
    assert json.loads((tmp_path / "j.json").read_text()) == {"x": [1, 2]}
    atomic_write_json(tmp_path / "j.json", {"x": 3})  # replaces
    assert json.loads((tmp_path / "j.json").read_text()) == {"x": 3}
    assert leftovers(tmp_path) == [] and leftovers(tmp_path / "a") == []


def test_path_writers_get_a_temp_with_the_same_suffix(tmp_path: Path) -> None:
    with atomic_path(tmp_path / "c.npz") as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".c.npz.tmp-") and tmp.suffix == ".npz"
        np.savez(tmp, x=np.arange(3))  # np.savez would append .npz to a path without it
    assert np.load(tmp_path / "c.npz")["x"].tolist() == [0, 1, 2] and leftovers(tmp_path) == []


def test_a_failing_writer_keeps_the_old_file_and_removes_the_temp(tmp_path: Path) -> None:
    target = tmp_path / "r.json"
    atomic_write_json(target, {"old": True})
    with pytest.raises(TypeError):
        atomic_write_json(target, {"bad": object()})  # not serialisable: nothing touches the disk
    with pytest.raises(RuntimeError, match="mid-write"):
        with atomic_path(target) as tmp:
            tmp.write_bytes(b'{"new": tr')  # half a file ...
            raise RuntimeError("mid-write")  # ... then the writer dies
    assert json.loads(target.read_text()) == {"old": True} and leftovers(tmp_path) == []
    with pytest.raises(OutputError, match="nothing was written"):
        with atomic_path(target):
            pass
    assert json.loads(target.read_text()) == {"old": True}


def test_a_failing_rename_keeps_the_temp_out_and_says_why(tmp_path: Path) -> None:
    target = tmp_path / "d"
    target.mkdir()
    (target / "inside").write_text("x")  # os.replace(file, non-empty directory) fails for real
    with pytest.raises(OutputError, match=r"cannot write '.*d': it is a directory"):
        atomic_write_text(target, "data")
    assert leftovers(tmp_path) == [] and (target / "inside").read_text() == "x"


def test_a_parent_that_is_a_file_is_a_one_line_error(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("I am a file")
    bad = tmp_path / "plain" / "sub" / "out.json"
    for call in (lambda: atomic_write_json(bad, {}), lambda: check_output_path(bad)):
        with pytest.raises(OutputError) as e:
            call()
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith(f"cannot write {str(bad)!r}: a part of the path is a file")
        assert f"({str(tmp_path / 'plain')!r} is a file)" in msg and "writable directory" in msg
        assert isinstance(e.value, PolymemError) and isinstance(e.value, OSError) and e.value.filename == str(bad)
    assert (tmp_path / "plain").read_text() == "I am a file"


@pytest.mark.skipif(not os.path.isdir("/sys/kernel"), reason="needs a mounted sysfs")
def test_a_pseudo_file_system_is_a_one_line_error() -> None:
    with pytest.raises(OutputError, match=r"cannot write '/sys/polymem-probe/x.json': (permission denied|operation "
                                          r"not permitted|the file system is read-only|the directory cannot be)"):
        check_output_path("/sys/polymem-probe/x.json")


def test_check_output_path_accepts_a_fresh_place_and_leaves_nothing(tmp_path: Path) -> None:
    assert check_output_path(tmp_path / "new" / "x.png") == tmp_path / "new" / "x.png"
    assert check_output_path(tmp_path / "asset", directory=True) == tmp_path / "asset"
    assert leftovers(tmp_path / "new") == [] and not (tmp_path / "new" / "x.png").exists()
    with pytest.raises(OutputError, match="it is a directory"):
        check_output_path(tmp_path / "new")


# --------------------------------------------------------------------------- every writer goes through _io
def _writers():
    """(name, write(path)) for each file writer of the library; each must use the atomic helper."""
    import polymem
    from polymem import HashSpec, Layout, TokenHashes
    from polymem.torch import attach
    from polymem.recipes.model import GPT, GPTConfig
    from polymem.torch.tablefile import save_table
    from polymem.recipes.transfer import write_json

    cache = TokenHashes.build("bytes", HashSpec())
    report = polymem.coverage("bytes", "bytes", ["some text", "more text"], max_n=2)
    layout = Layout(pages=4, heads=2, slots=2, head_dim=4)

    def site(path: Path) -> None:
        model = GPT(GPTConfig(vocab_size=256, n_used=256, block_size=8, n_layer=1, n_head=1, d_model=8),
                    torch_arange(256))
        h = attach(model, layout, cache, layers=[0])
        try:
            h.save(path)
        finally:
            h.detach()

    return [
        ("token cache", lambda p: cache.save(p.with_suffix(".npz"))),
        ("coverage JSON", lambda p: report.to_json(p)),
        ("coverage CSV", lambda p: report.to_csv(p)),
        ("coverage plot", lambda p: report.plot(p.with_suffix(".png"))),
        ("table file", lambda p: save_table(p.with_suffix(".safetensors"), np.zeros((layout.num_rows, 4)),
                                            HashSpec(), layout)),
        ("site files", site),
        ("transfer JSON", lambda p: write_json({"x": 1}, p)),
    ]


def torch_arange(n: int):
    import torch

    return torch.arange(n)


def test_every_writer_is_atomic_and_fails_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("a file")
    for name, write in _writers():
        good = tmp_path / "ok" / name.replace(" ", "_")
        write(good)
        assert leftovers(good.parent) == [], name  # no temporary file left beside a finished one
        bad = tmp_path / "plain" / "sub" / name.replace(" ", "_")
        with pytest.raises(OutputError, match=r"cannot write .*a part of the path is a file") as e:
            write(bad)
        assert "\n" not in str(e.value), name
    assert (tmp_path / "plain").read_text() == "a file"


def test_one_rule_tells_a_remote_url_from_a_local_path(tmp_path: Path) -> None:
    """_paths.is_url is the one test of "URL or local path": file://PATH is a URL but not a remote one, and the
    output checks of _io and the CLI's path parsers follow it (a file:// output is checked as the local path,
    an s3:// one is left to the writer, a file:// input of a corpus is refused as a local path that is missing)."""
    import typer

    from polymem._io import check_outputs_not_inputs
    from polymem._paths import is_url
    from polymem.cli._needs import _local
    from polymem.cli._options import local_path

    for text, url, remote in [("s3://b/k", True, True), ("https://h/x", True, True), ("file:///tmp/x", True, False),
                              ("/tmp/x", False, False), ("x.txt", False, False), ("-", False, False),
                              ("C:/x", False, False)]:
        assert (is_url(text), is_url(text, remote=True)) == (url, remote), text
    assert not is_url(tmp_path) and not is_url(None)  # only strings are URLs
    data = tmp_path / "data.txt"
    data.write_text("x")
    with pytest.raises(OutputError, match="is an input of this run"):
        check_outputs_not_inputs({"--json": f"file://{data}"}, [("corpus", str(data))])
    check_outputs_not_inputs({"--json": "s3://bucket/data.txt"}, [("corpus", str(data))])  # not local: not ours
    assert _local(f"file://{data}") == str(data) and _local("s3://b/k") is None and _local("-") is None
    assert local_path("a local file")(f"file://{data}") == data
    with pytest.raises(typer.BadParameter, match="is a URL"):
        local_path("a local file")("s3://b/k")
