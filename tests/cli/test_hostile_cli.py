"""The CLI against hostile or careless input: outputs over inputs, control characters from data, URLs given for
paths, a --dask address that is no Dask scheduler, iosim's cache sizes and empty corpora. Real files, real
sockets, a local S3 server (moto on 127.0.0.1); nothing mocked."""

from __future__ import annotations

import json
import os
import re
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from polymem import HashSpec, Layout, MemoryAsset
from polymem.cli.app import app

runner = CliRunner()
ESC = "\x1b]0;owned\x07\x1b[2J\x9b31m"  # set the window title, clear the screen, a C1 CSI


def run_main(args: list[str], capsys, monkeypatch) -> tuple[int, str]:
    """The console entry point (what the `polymem` script runs): exit code and stderr."""
    from polymem.cli.app import main

    monkeypatch.setattr("sys.argv", ["polymem", *args])
    with pytest.raises(SystemExit) as e:
        main()
    return e.value.code, capsys.readouterr().err


def one_line(err: str) -> str:
    text = " ".join(err.split())  # rich wraps at the terminal width; the message itself is one line
    assert text.startswith("error: ") and "Traceback" not in err, err
    return text


def small_asset(path: Path, provenance: dict | None = None) -> Path:
    layout = Layout(pages=8, heads=2, slots=2, head_dim=4)
    table = np.arange(layout.num_rows * 4, dtype=np.float32).reshape(-1, 4)
    MemoryAsset.from_array(path, table, HashSpec(), layout, orders=(1, 2), provenance=provenance)
    return path


# --------------------------------------------------------------------------------------- outputs over inputs
@pytest.fixture()
def inputs(tmp_path: Path, bpe_json_path: Path) -> dict[str, Path]:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("hello world, hello there\n")
    (corpus / "b.jsonl").write_text(json.dumps({"text": "another document"}) + "\n")
    os.link(corpus / "a.txt", tmp_path / "hard.txt")
    (tmp_path / "link.txt").symlink_to(corpus / "a.txt")
    tok = tmp_path / "tokenizer.json"
    tok.write_bytes(bpe_json_path.read_bytes())
    return {"corpus": corpus, "tok": tok, "asset": small_asset(tmp_path / "t.pmem"), "root": tmp_path}


def _cases(d: dict[str, Path]) -> dict[str, tuple[list[str], str]]:
    c, a, tok, root = d["corpus"], d["asset"], d["tok"], d["root"]
    cov = ["coverage", str(c), "-t", "bytes", "-r", "bytes", "--max-n", "2"]
    return {
        "coverage --json = a corpus file": (cov + ["--json", str(c / "a.txt")], "a file of the corpus directory"),
        "coverage --csv through ..": (cov + ["--csv", str(c / ".." / "corpus" / "b.jsonl")], "a file of the corpus"),
        "coverage --plot = a symlink": (["coverage", str(c / "a.txt"), "-t", "bytes", "-r", "bytes",
                                         "--plot", str(root / "link.txt")], "the corpus file"),
        "coverage --json = a hard link": (["coverage", str(c / "a.txt"), "-t", "bytes", "-r", "bytes",
                                           "--json", str(root / "hard.txt")], "the corpus file"),
        "coverage --json = the tokenizer": (["coverage", str(c), "-t", str(tok), "-r", "bytes",
                                             "--json", str(tok)], "the tokenizer file"),
        "iosim --json": (["iosim", str(c), "-t", "bytes", "--cache-mb", "1", "--json", str(c / "a.txt")],
                         "a file of the corpus directory"),
        "iosim --plot in the asset": (["iosim", str(c), "-t", "bytes", "--cache-mb", "1", "--asset", str(a),
                                       "--plot", str(a / "plot.png")], "is inside an input of this run"),
        "quantize -o = the input": (["quantize", str(a), "--to", "float16", "--overwrite", "-o", str(a)],
                                    "the asset directory"),
        "quantize -o = its parent": (["quantize", str(a), "--to", "float16", "--overwrite", "-o", str(root)],
                                     "holds an input of this run"),
        "build-cache -o = the tokenizer": (["build-cache", "-t", str(tok), "-o", str(tok)], "the tokenizer file"),
        "subset -o inside the asset": (["subset", str(a), "--min-count", "1", "-o", str(a / "sub")],
                                       "is inside an input"),
        "merge --json in the asset": (["merge", str(a), str(a), "-o", str(root / "m"), "--json",
                                       str(a / "zarr.json")], "is inside an input"),
        "convert --json = the corpus": (["convert", str(a), "-t", "bytes", "-c", str(c / "a.txt"), "-o",
                                         str(root / "cv"), "--json", str(c / "a.txt")], "the corpus file"),
        "train --json = the corpus": (["train", "-c", str(c), "-t", "bytes", "--out", str(root / "tr"), "--json",
                                       str(c / "a.txt")], "a file of the corpus directory"),
        "transfer --json = the corpus": (["transfer", "--asset", str(a), "-c", str(c), "-t", "bytes", "--json",
                                          str(c / "b.jsonl")], "a file of the corpus directory"),
    }


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_an_output_over_an_input_is_refused_before_any_work(inputs, capsys, monkeypatch) -> None:
    before = _snapshot(inputs["root"])
    for what, (args, why) in _cases(inputs).items():
        code, err = run_main(args, capsys, monkeypatch)
        text = one_line(err)
        assert code == 2, (what, err)
        assert "is an input of this run" in text or "holds an input" in text or "is inside an input" in text, text
        assert why in text and "choose another output path" in text, (what, text)
        assert _snapshot(inputs["root"]) == before, what  # nothing written, nothing replaced


def test_an_output_over_a_file_an_input_names_is_refused(inputs, capsys, monkeypatch) -> None:
    """The files a site names (its table), and the sites a command reads by default (quantize --check-model:
    ASSET.site; attach --init aligned: the donor's ASSET.site), are inputs too, --overwrite or not. Before: the
    table's metadata replaced by a report, the donor site replaced by the new one."""
    c, a, root = inputs["corpus"], inputs["asset"], inputs["root"]
    site = root / "t.pmem.site"
    site.mkdir()
    (site / "site.json").write_text(json.dumps({"format": "polymem.memory-site", "version": 1,
                                                "table": {"source": {"kind": "asset", "path": str(a)}}}))
    cases = {
        "eval --json over the table the site names": (
            ["eval", "--model", "no-such-model", "-c", str(c), "--site", str(site), "--json", str(a / "zarr.json")],
            "the site's table (named by"),
        "generate --json over the table the site names": (
            ["generate", "--model", "no-such-model", "--prompt", "x", "--site", str(site), "--json",
             str(a / "zarr.json")], "the site's table (named by"),
        "quantize -o over the check site it reads by default": (
            ["quantize", str(a), "--to", "float16", "--overwrite", "--check-model", "no-such-model", "--check-corpus",
             str(c), "-o", str(site)], "the site directory"),
        "transfer --out-dir over the donor site --init aligned reads": (
            ["transfer", "--model", "no-such-model", "--asset", str(a), "-c", str(c), "--init", "aligned",
             "--out-dir", str(site)], "the donor site directory"),
        "attach --out over the donor site, --overwrite": (
            ["attach", "--model", "no-such-model", "--asset", str(a), "-c", str(c), "--out", str(site),
             "--overwrite"], "the donor site directory"),
    }
    gguf = root / "donor.gguf"  # the donor model an aligned start loads by default: the one the provenance names
    gguf.write_bytes(b"GGUF" + bytes(60))
    named = small_asset(root / "named.pmem", provenance={"model": {"spec": str(gguf)}})
    for cmd, extra in (("attach", ["--out", str(root / "new.site")]), ("transfer", ["--init", "aligned"])):
        cases[f"{cmd} --json over the donor model the asset's provenance names"] = (
            [cmd, "--model", "no-such-model", "--asset", str(named), "-c", str(c), *extra, "--json", str(gguf)],
            "the donor model file")
    before = _snapshot(root)
    for what, (args, why) in cases.items():
        code, err = run_main(args, capsys, monkeypatch)
        text = one_line(err)
        assert code == 2, (what, err)
        assert why in text and "choose another output path" in text, (what, text)
        assert _snapshot(root) == before, what


def test_outputs_beside_the_inputs_are_still_fine(inputs) -> None:
    c = inputs["corpus"]
    rep = c / "report.json"  # a new file in the corpus directory, of a kind the corpus does not read
    for _ in range(2):  # and again, now that it exists
        r = runner.invoke(app, ["coverage", str(c), "-t", "bytes", "-r", "bytes", "--max-n", "2", "--json",
                                str(rep), "-q"])
        assert r.exit_code == 0, r.output
        assert json.loads(rep.read_text())["docs"] == 2


# --------------------------------------------------------------------------------------- control characters
def test_generated_text_keeps_its_newlines_and_tabs_only() -> None:
    from rich.console import Console

    from polymem.cli._display import escape_text

    shown = escape_text("def f():\n\treturn 1\x1b[2J [bold]x\r\x9b")
    assert shown == "def f():\n\treturn 1\\x1b[2J \\[bold]x\\x0d\\x9b"
    con = Console(record=True, width=200)
    con.print(shown, highlight=False)
    assert con.export_text().expandtabs(8) == "def f():\n\treturn 1\\x1b[2J [bold]x\\x0d\\x9b\n".expandtabs(8)


def test_control_characters_from_data_never_reach_the_terminal(tmp_path: Path, capsys, monkeypatch) -> None:
    a = small_asset(tmp_path / "a.pmem", provenance={f"key{ESC}": f"value{ESC}"})
    r = runner.invoke(app, ["inspect", str(a), "--no-scan"])
    assert r.exit_code == 0, r.output
    assert "\x1b" not in r.output and "\x9b" not in r.output and "\x07" not in r.output
    assert "key\\x1b]0;owned\\x07" in "".join(r.output.split())

    corpus = tmp_path / f"c{ESC}"
    corpus.mkdir()
    (corpus / f"empty{ESC}.txt").write_text("")
    (corpus / "k.jsonl").write_text(json.dumps({f"{ESC}key": 1}) + "\n" + json.dumps({"text": "hi there"}) + "\n")
    r = runner.invoke(app, ["coverage", str(corpus), "-t", "bytes", "-r", "bytes", "--max-n", "2"])
    assert r.exit_code == 0, r.output
    flat = "".join(r.output.split())
    assert "\x1b" not in r.output and "\x9b" not in r.output and "\x07" not in r.output
    assert "empty\\x1b]0;owned\\x07" in flat and "\\x9b31mkey" in flat

    r = runner.invoke(app, ["verify", str(corpus)])  # a FAIL line naming the path
    assert r.exit_code == 1 and "\x1b" not in r.output and "\\x1b" in r.output

    code, err = run_main(["inspect", str(tmp_path / f"missing{ESC}")], capsys, monkeypatch)
    assert code == 2 and "\x1b" not in err and "\\x1b" in one_line(err)


# --------------------------------------------------------------------------------------- URLs given for paths
BUCKET = "polymem-hostile"


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    pytest.importorskip("s3fs")
    moto_server = pytest.importorskip("moto.server")
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    old = {k: os.environ.get(k) for k in (*env, "AWS_ENDPOINT_URL")}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    os.environ.update(env | {"AWS_ENDPOINT_URL": url})
    try:
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()  # another module's instances point at its own server
        s3fs.S3FileSystem(endpoint_url=url).mkdir(BUCKET)
        yield url
    finally:
        server.stop()
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


@pytest.mark.slow
def test_init_on_a_url_writes_the_bucket_not_a_local_s3_directory(s3_endpoint: str, tmp_path: Path,
                                                                   monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    url, opts = f"s3://{BUCKET}/t.pmem", json.dumps({"endpoint_url": s3_endpoint})
    r = runner.invoke(app, ["init", url, "--params", "20K", "--heads", "2", "--head-dim", "8",
                            "--storage-options", opts])
    assert r.exit_code == 0, r.output
    assert url in r.output and list(tmp_path.iterdir()) == []  # no local "s3:" directory
    r = runner.invoke(app, ["verify", url, "--storage-options", opts])
    assert r.exit_code == 0 and "OK" in r.output, r.output
    a = MemoryAsset.open(url, storage_options={"endpoint_url": s3_endpoint})
    assert a.layout.head_dim == 8 and a.nonzero_pages() == 0

    import s3fs

    s3fs.S3FileSystem(endpoint_url=s3_endpoint).pipe(f"{BUCKET}/docs/a.txt", b"hello world, hello there")
    r = runner.invoke(app, ["subset", url, "-t", "bytes", "-c", f"s3://{BUCKET}/docs/a.txt",
                            "-o", str(tmp_path / "sub")])  # a corpus option takes a URL too
    assert r.exit_code == 0 and re.search(r"touched [1-9]", r.output), r.output  # the S3 text was read


@pytest.mark.slow
def test_missing_object_store_credentials_are_one_line_exit_2(tmp_path: Path) -> None:
    """No credentials anywhere (no env, no config file, no instance metadata): one line, not botocore's traceback."""
    import subprocess
    import sys

    pytest.importorskip("s3fs")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env |= {"AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": str(tmp_path / "none"),
            "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"), "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}
    r = subprocess.run([sys.executable, "-c", "from polymem.cli.app import main; main()", "init",
                        "s3://bucket/t.pmem", "--params", "20K"], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and "NoCredentialsError" in r.stderr and "set credentials" in r.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args", [
    ["pull", "{asset}", "s3://b/copy"],
    ["upgrade", "s3://b/t.pmem"],
    ["build-cache", "-t", "bytes", "-o", "s3://b/c.npz"],
    ["coverage", "{txt}", "-t", "bytes", "-r", "bytes", "--json", "s3://b/r.json"],
    ["coverage", "{txt}", "-t", "bytes", "-r", "bytes", "--csv", "gs://b/r.csv"],
    ["coverage", "{txt}", "-t", "bytes", "-r", "bytes", "--plot", "memory://r.png"],
    ["iosim", "{txt}", "-t", "bytes", "--cache-mb", "1", "--json", "s3://b/r.json"],
    ["train", "-c", "{txt}", "-t", "bytes", "--out", "s3://b/t.pmem"],
    ["subset", "{asset}", "--min-count", "1", "-o", "s3://b/sub"],
    ["merge", "{asset}", "{asset}", "-o", "s3://b/m"],
    ["convert", "{asset}", "-t", "bytes", "-c", "{txt}", "-o", "s3://b/cv"],
    ["eval", "-m", "x", "-c", "{txt}", "--site", "s3://b/site"],
    ["transfer", "--asset", "{asset}", "-c", "{txt}", "-m", "x", "--out-dir", "s3://b/runs"],
    ["demo", "--text", "s3://b/t.txt"],
    ["tokenizers", "check", "bytes", "--text", "https://example.com/t.txt"],
], ids=lambda a: " ".join(a[:1] + [x for x in a if x.startswith("-")][-1:]))
def test_options_that_need_a_local_path_refuse_a_url(args: list[str], tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.txt").write_text("hello world")
    asset = small_asset(tmp_path / "a.pmem")
    argv = [x.format(asset=asset, txt=tmp_path / "a.txt") for x in args]
    r = runner.invoke(app, argv)
    url = next(x for x in argv if "://" in x)
    assert r.exit_code == 2, r.output
    line = next(x for x in r.output.splitlines() if "is a URL" in x)
    assert f"{url!r} is a URL; this takes a local" in line and "give a local path" in line
    assert not any(p.name.endswith(":") for p in tmp_path.rglob("*"))  # no "s3:", "gs:", "memory:" directory


# --------------------------------------------------------------------------------------- --dask: not a scheduler
def _server(reply: bytes | None) -> tuple[str, socket.socket]:
    """A TCP server on 127.0.0.1 that accepts, sends ``reply`` (None: nothing) and then keeps silent."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)

    def serve() -> None:
        held = []
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:  # closed by the test
                break
            held.append(conn)
            if reply:
                conn.sendall(reply)
        for c in held:
            c.close()

    threading.Thread(target=serve, daemon=True).start()
    return f"tcp://127.0.0.1:{srv.getsockname()[1]}", srv


@pytest.mark.parametrize("reply,why", [
    (None, "accepted the connection but sent nothing within 2 s"),
    (b"\xff" * 8 + b"garbage", "not Dask's protocol"),
    (b"HTTP/1.1 400 Bad Request\r\n\r\n", "not Dask's protocol"),
    (struct.pack("Q", 200), "no handshake within 2 s"),  # a plausible greeting, then silence
])
@pytest.mark.slow
def test_dask_address_that_is_not_a_scheduler_is_one_line_within_its_timeout(reply, why, tmp_path: Path, capsys,
                                                                             monkeypatch) -> None:
    pytest.importorskip("distributed")
    (tmp_path / "a.txt").write_text("hello world")
    address, srv = _server(reply)
    try:
        t0 = time.monotonic()
        code, err = run_main(["coverage", str(tmp_path / "a.txt"), "-t", "bytes", "-r", "bytes", "--dask", address,
                              "--dask-timeout", "2", "-q"], capsys, monkeypatch)
        elapsed = time.monotonic() - t0
    finally:
        srv.close()
    text = one_line(err)
    assert code == 2 and f"cannot connect to a Dask scheduler at {address!r}" in text and why in text, text
    assert elapsed < 8, elapsed


def test_a_real_scheduler_still_connects() -> None:
    distributed = pytest.importorskip("distributed")
    import logging

    from polymem.analysis.coverage.dist import connect

    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp",
                                  dashboard_address=":0", silence_logs=logging.ERROR) as cluster:
        with connect(cluster.scheduler_address, timeout=10) as client:
            assert client.submit(lambda x: x + 1, 1).result() == 2


# --------------------------------------------------------------------------------------- iosim values
def test_iosim_cache_size_out_of_bounds_and_empty_corpus_exit_2(tmp_path: Path, capsys, monkeypatch) -> None:
    text = tmp_path / "a.txt"
    text.write_text("hello world, hello there")
    out = tmp_path / "r.json"
    base = ["iosim", "-t", "bytes", "--params", "20K", "--heads", "2", "--json", str(out)]
    code, err = run_main([*base, str(text), "--cache-mb", "64,1e30"], capsys, monkeypatch)
    line = one_line(err)
    assert code == 2 and "--cache-mb '64,1e30'" in line and "1,073,741,824 MiB" in line, line

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "e.txt").write_text("")
    code, err = run_main([*base, str(empty), "--cache-mb", "64"], capsys, monkeypatch)
    line = one_line(err)
    assert code == 2 and "no tokens to replay" in line and "empty document" in line and "inf" not in line, line
    assert not out.exists()

    code, err = run_main([*base, str(text), "--cache-mb", "64,1000000"], capsys, monkeypatch)  # > the table: ok
    assert code == 0, err
    cache = json.loads(out.read_text())["results"][0]["cache"]
    assert cache[1]["reads"] <= cache[0]["reads"] and cache[1]["blocks"] > 0

