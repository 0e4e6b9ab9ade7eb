"""`polymem init / inspect / verify / quantize` through typer's CliRunner on real assets."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from polymem import HashSpec, Layout, MemoryAsset, PolymemError
from polymem.cli.app import app
from polymem.cli._options import parse_count

runner = CliRunner()


def test_parse_count():
    assert parse_count("200M") == 200_000_000
    assert parse_count("1.5G") == 1_500_000_000
    assert parse_count("20B") == 20_000_000_000
    assert parse_count("12000") == 12000
    with pytest.raises(PolymemError, match="not a count"):
        parse_count("lots")


def test_init_inspect_verify(tmp_path):
    path = tmp_path / "t.pmem"
    r = runner.invoke(app, ["init", str(path), "--params", "2M", "--heads", "8", "--slots", "4", "--head-dim", "64",
                            "--dtype", "float16"])
    assert r.exit_code == 0, r.output
    a = MemoryAsset.open(path)
    assert a.layout == Layout.for_params(2_000_000, heads=8, slots=4, head_dim=64)  # P = 976 pages
    assert a.layout.pages == 2_000_000 // (8 * 4 * 64) and a.dtype == "float16"
    assert a.provenance["created_by"].startswith("polymem")
    r = runner.invoke(app, ["inspect", str(path)])
    assert r.exit_code == 0, r.output
    assert "P=976 pages" in r.output and "0 of 976" in r.output
    r = runner.invoke(app, ["inspect", str(path), "--json"])
    doc = json.loads(r.output)
    assert doc["nonzero_pages"] == 0 and doc["header"]["layout"]["orders"] == [1, 2, 3]
    assert doc["header"]["hash_spec"]["spec_id"] == HashSpec().spec_id
    r = runner.invoke(app, ["verify", str(path)])
    assert r.exit_code == 0 and "OK" in r.output


def test_verify_names_bad_shard_and_field(tmp_path):
    path = tmp_path / "t"
    layout = Layout(pages=40, heads=2, slots=2, head_dim=4)
    a = MemoryAsset.from_array(path, np.ones((layout.num_rows, 4), np.float32), HashSpec(), layout, orders=(1, 2),
                               chunks_per_shard=16)
    key = a.geometry.shard_key(1)
    data = bytearray((path / key).read_bytes())
    data[5] ^= 1
    (path / key).write_bytes(bytes(data))
    r = runner.invoke(app, ["verify", str(path)])
    assert r.exit_code == 1 and key in r.output and "checksum mismatch" in r.output
    doc = json.loads((path / "zarr.json").read_text())
    doc["attributes"]["polymem"]["dtype"] = "float16"
    (path / "zarr.json").write_text(json.dumps(doc))
    r = runner.invoke(app, ["verify", str(path)])
    assert r.exit_code == 1 and "field 'attributes'" in r.output
    (path / "zarr.json").unlink()
    r = runner.invoke(app, ["verify", str(path)])
    assert r.exit_code == 1 and "zarr.json" in r.output


def test_quantize_reports_error(tmp_path):
    layout = Layout(pages=30, heads=8, slots=4, head_dim=64)
    t = np.random.default_rng(0).standard_normal((layout.num_rows, 64)).astype(np.float32)
    MemoryAsset.from_array(tmp_path / "src", t, HashSpec(), layout, orders=(1, 2, 3),
                           provenance={"corpus": "toy", "loss": 3.5})
    r = runner.invoke(app, ["quantize", str(tmp_path / "src"), "--to", "nf4", "-o", str(tmp_path / "q")])
    assert r.exit_code == 0, r.output
    assert "RMS" in r.output and "960 rows" in r.output
    q = MemoryAsset.open(tmp_path / "q")
    assert q.dtype == "nf4" and q.geometry.chunk_bytes == 4096 and q.geometry.pages_per_chunk == 3
    assert q.provenance["corpus"] == "toy" and q.provenance["converted_from"]["dtype"] == "float32"
    from polymem.asset import nf4

    assert np.array_equal(q.to_numpy(), nf4.dequantize(nf4.quantize(t), 64))
    src = MemoryAsset.open(tmp_path / "src")
    _, err = src.quantize(tmp_path / "q2")
    assert 0.05 < err.rel_mean < err.rel_max < 0.2  # NF4 on Gaussian rows: ~10% relative RMS


@pytest.mark.slow
def test_library_errors_exit_2_with_one_line(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "t"
    MemoryAsset.create(path, HashSpec(), Layout(pages=4, heads=2, slots=2, head_dim=4))
    r = subprocess.run([sys.executable, "-c", "from polymem.cli.app import main; main()", "init", str(path),
                        "--params", "10K"], capture_output=True, text=True)
    assert r.returncode == 2 and "already exists" in " ".join(r.stderr.split()) and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-c", "from polymem.cli.app import main; main()", "inspect",
                        str(tmp_path / "nope")], capture_output=True, text=True)
    assert r.returncode == 2 and "no asset directory" in " ".join(r.stderr.split())
    (path / "pages/c/0/0/0").unlink()  # a missing shard: a FileNotFoundError too, still a polymem error (exit 2)
    r = subprocess.run([sys.executable, "-c", "from polymem.cli.app import main; main()", "inspect", str(path)],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "shard 'pages/c/0/0/0' is missing" in " ".join(r.stderr.split()), r.stderr
    assert "Traceback" not in r.stderr and "Errno" not in r.stderr


def test_verify_repair_and_upgrade_commands(tmp_path):
    import shutil
    from pathlib import Path

    from polymem.asset import _commit

    path = tmp_path / "t"
    a = MemoryAsset.create(path, HashSpec(), Layout(pages=8, heads=2, slots=2, head_dim=4), chunks_per_shard=4)
    key = a.geometry.shard_key(1)
    _commit.write_marker(path, [key], "0" * 64)  # a page write killed mid-swap
    (path / (key + ".new")).write_bytes(b"half")
    r = runner.invoke(app, ["verify", str(path)])
    assert r.exit_code == 1 and "verify --repair" in " ".join(r.output.split())
    r = runner.invoke(app, ["verify", "--repair", str(path)])
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    assert "rolled back an interrupted page write" in out and "OK" in out and "crc32c" in out
    r = runner.invoke(app, ["verify", "--repair", str(path)])
    assert r.exit_code == 0 and "nothing to repair" in r.output
    old = tmp_path / "v1"
    shutil.copytree(Path(__file__).resolve().parents[1] / "data" / "asset-v1-float32", old)
    r = runner.invoke(app, ["verify", str(old)])
    assert r.exit_code == 0 and "polymem upgrade" in " ".join(r.output.split())
    r = runner.invoke(app, ["upgrade", str(old)])
    assert r.exit_code == 0 and "format version 1 -> 2" in " ".join(r.output.split()), r.output
    assert MemoryAsset.open(old).version == 2
    r = runner.invoke(app, ["upgrade", str(old)])
    assert r.exit_code == 0 and "already format version 2" in " ".join(r.output.split())
