"""Refusals said before any work: `--device` (every command that runs a model takes it: eval, train and transfer,
scratch or pretrained; a device this machine lacks is one line naming the fix, said before any model loads), and
an existing `train --out` or `--site` (said before the model loads, not after it trained)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from polymem.cli.app import app
from polymem.errors import PolymemError
from polymem.torch.device import resolve_device

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")


def test_resolve_device_accepts_the_documented_spellings() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(" CPU ") == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    for bad, says in (("gpu0", "is not a device"), ("meta", "runs on cpu or cuda"), ("", "is not a device")):
        with pytest.raises(PolymemError, match=says) as e:
            resolve_device(bad)
        assert "accepted: auto" in str(e.value)


@no_cuda
def test_cuda_without_cuda_is_one_line() -> None:
    for spec in ("cuda", "cuda:1"):
        with pytest.raises(PolymemError, match=r"this machine has no CUDA device .*pass --device cpu"):
            resolve_device(spec)


@no_cuda
@pytest.mark.parametrize("args", [
    ["eval", "--model", "no-such-model", "-c", "{c}"],
    ["train", "--model", "no-such-model", "-c", "{c}", "--out", "{tmp}/t.pmem"],
    ["transfer", "--model", "no-such-model", "--asset", "{tmp}/a.pmem", "-c", "{c}", "--out-dir", "{tmp}/runs"],
    ["train", "--tokenizer", "bytes", "-c", "{c}", "--out", "{tmp}/s.pmem", "--steps", "1"],
], ids=["eval", "train --model", "transfer --model", "train from scratch"])
def test_each_command_refuses_a_missing_cuda_device_before_any_work(tmp_path: Path, args: list[str]) -> None:
    """The model named does not exist: the device error coming first shows the check runs before the load."""
    c = tmp_path / "c.jsonl"
    c.write_text("".join(json.dumps({"text": f"document {i} " * 40}) + "\n" for i in range(12)))
    argv = [a.format(c=c, tmp=tmp_path) for a in args] + ["--device", "cuda"]
    r = CliRunner().invoke(app, argv)
    assert r.exit_code != 0 and isinstance(r.exception, PolymemError), (r.output, r.exception)
    assert "--device 'cuda': this machine has no CUDA device" in str(r.exception)
    assert not (tmp_path / "t.pmem").exists() and not (tmp_path / "s.pmem").exists()


@pytest.mark.parametrize("existing", ["out", "site"])
def test_train_refuses_an_existing_output_before_the_model_loads(tmp_path: Path, existing: str) -> None:
    c = tmp_path / "c.jsonl"
    c.write_text(json.dumps({"text": "hello " * 50}) + "\n")
    out = tmp_path / "t.pmem"
    (out if existing == "out" else tmp_path / "t.pmem.site").mkdir()
    r = CliRunner().invoke(app, ["train", "--model", "no-such-model", "-c", str(c), "--out", str(out)])
    assert isinstance(r.exception, PolymemError), (r.output, r.exception)
    flag = "--out" if existing == "out" else "--site"
    assert f"{flag} '" in str(r.exception) and "exists; pass --overwrite" in str(r.exception)


def test_init_refuses_a_table_the_disk_cannot_hold_before_writing(tmp_path: Path) -> None:
    """Twice the free space of the test's file system: refused with both numbers, nothing written (before: zeros
    until the disk was full)."""
    import shutil

    free = shutil.disk_usage(tmp_path).free
    params = str(free // 2)  # float16 rows: 2 bytes a scalar, so the table needs about twice the free space
    r = CliRunner().invoke(app, ["init", str(tmp_path / "big.pmem"), "--params", params, "--dtype", "float16"])
    assert isinstance(r.exception, PolymemError), (r.output, r.exception)
    msg = str(r.exception)
    assert "big.pmem' needs" in msg and "GiB free; free some space" in msg, msg
    assert list(tmp_path.iterdir()) == []  # no asset, no build directory


def test_a_table_memory_cannot_hold_is_refused_before_it_is_allocated() -> None:
    from polymem import HashSpec, Layout
    from polymem.torch.tables import TrainableTable, available_memory

    avail = available_memory()
    if avail is None:
        pytest.skip("no /proc/meminfo here")
    layout = Layout.for_params(avail // 2, heads=8, slots=4, head_dim=32)  # fp32 rows alone: about twice what is free
    with pytest.raises(PolymemError, match=r"needs [\d,.]+ GiB of memory .* GiB is available; pass a smaller --params"):
        TrainableTable(None, spec=HashSpec(), layout=layout)


def test_train_refuses_a_table_memory_cannot_hold_before_the_model_loads(tmp_path: Path) -> None:
    from polymem.torch.tables import available_memory

    avail = available_memory()
    if avail is None:
        pytest.skip("no /proc/meminfo here")
    c = tmp_path / "c.jsonl"
    c.write_text(json.dumps({"text": "hello " * 50}) + "\n")
    for how in (["--model", "no-such-model"], ["--tokenizer", "bytes"]):
        r = CliRunner().invoke(app, ["train", *how, "-c", str(c), "--out", str(tmp_path / "t.pmem"),
                                     "--params", str(avail // 2)])
        assert isinstance(r.exception, PolymemError), (how, r.output, r.exception)
        assert "GiB of memory" in str(r.exception) and "GiB is available" in str(r.exception)


def test_out_of_range_counts_and_a_site_without_keys_are_one_line(tmp_path: Path) -> None:
    """`--threads 2^31` is a usage error (not a torch traceback); `--seed-list 10^20` and a site.json that is `{}`
    or a list are refused before the model loads (the model named does not exist)."""
    c = tmp_path / "c.jsonl"
    c.write_text(json.dumps({"text": "hello " * 50}) + "\n")
    runner = CliRunner()
    r = runner.invoke(app, ["eval", "--model", "no-such-model", "-c", str(c), "--threads", str(2**31)])
    assert r.exit_code == 2 and "--threads" in r.output and "4096" in r.output, r.output
    r = runner.invoke(app, ["transfer", "--model", "no-such-model", "--asset", str(tmp_path / "a.pmem"), "-c", str(c),
                            "--out-dir", str(tmp_path / "runs"), "--seed-list", str(10**20)])
    assert isinstance(r.exception, PolymemError) and "seeds in 0..4294967295" in str(r.exception), r.exception
    for body in ("{}", "[1, 2]", '{"table": 3}'):
        site = tmp_path / f"site{len(body)}"
        site.mkdir()
        (site / "site.json").write_text(body)
        r = runner.invoke(app, ["eval", "--model", "no-such-model", "-c", str(c), "--site", str(site)])
        assert isinstance(r.exception, PolymemError), (body, r.exception)
        assert "is not a site header (no 'table' object)" in str(r.exception)
