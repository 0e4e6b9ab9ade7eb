"""Engine tables in assets: the fp8 row encodings, import and export of the released layouts
(docs/engines.md §3-4, docs/asset-format.md §5), on small synthetic checkpoints with the engines' key names,
dtypes and metadata and scaled-down geometry."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from faults import Injector

from polymem import HashSpec, Layout, MemoryAsset
from polymem.asset import fp8
from polymem.engines import deepseek, qwen
from polymem.engines.addressing import EngineAddressing, LayerTable
from polymem.engines.io import export_table, import_table
from polymem.asset.engine_table import EngineTableSpec
from polymem.errors import FormatError, PolymemError

D_DS, D_QW = 64, 32  # row widths (the engines: 256 and 160)


def small_deepseek(heads: int = 2, floor: int = 100) -> EngineAddressing:
    primes = deepseek.layer_primes(floor=floor, orders=3, heads=heads)
    layers = tuple(LayerTable(layer=L, multipliers=deepseek.multipliers(L, 50), primes=primes[L],
                              stored_rows=sum(primes[L])) for L in deepseek.LAYERS)
    return EngineAddressing(name=deepseek.NAME, vocab_size=60, orders=(2, 3, 4), heads=heads, layers=layers,
                            fill_id=2, id_map=np.minimum(np.arange(60), 49))


def small_qwen(shards: int = 4) -> EngineAddressing:
    ps = qwen.primes(4, floor=200)
    stored = -(-sum(ps) // shards) * shards
    table = LayerTable(layer=qwen.LAYER, multipliers=qwen.multipliers(0, vocab_size=100), primes=ps, stored_rows=stored)
    return EngineAddressing(name=qwen.NAME, vocab_size=100, orders=(2, 3), heads=2, layers=(table,), fill_id=0,
                            boundary_id=0)


def fp8_tensors(rows: int, d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random E4M3 codes (no NaN) and E8M0 scales in [120, 134]."""
    rng = np.random.default_rng(seed)
    w = rng.integers(0, 256, (rows, d), dtype=np.uint8)
    w[(w & 0x7F) == 0x7F] = 0x3F
    s = rng.integers(120, 135, (rows, d // 32), dtype=np.uint8)
    return (torch.from_numpy(w).view(torch.float8_e4m3fn), torch.from_numpy(s).view(torch.float8_e8m0fnu))


def write_deepseek(root: Path, a: EngineAddressing, d: int = D_DS) -> dict[str, torch.Tensor]:
    """Two files and model.safetensors.index.json, like the released checkpoint (plus an unrelated tensor)."""
    root.mkdir(parents=True, exist_ok=True)
    tensors, weight_map = {}, {}
    for i, t in enumerate(a.layers):
        w, s = fp8_tensors(t.stored_rows, d, seed=t.layer)
        part = {f"layers.{t.layer}.engram.embed.weight": w, f"layers.{t.layer}.engram.embed.scale": s,
                f"layers.{t.layer}.attn.wq.weight": torch.ones(3, 4)}
        name = f"model-{i + 1:05d}-of-{len(a.layers):05d}.safetensors"
        save_file(part, str(root / name), metadata={"format": "pt"})
        tensors.update(part)
        weight_map.update(dict.fromkeys(part, name))
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 0},
                                                                   "weight_map": weight_map}))
    return tensors


def write_qwen(root: Path, a: EngineAddressing, shards: int = 4, d: int = D_QW) -> dict[str, torch.Tensor]:
    root.mkdir(parents=True, exist_ok=True)
    rows = a.layers[0].stored_rows // shards
    g = torch.Generator().manual_seed(0)
    prefix = "model.language_model.layers.1.ple_embedding.ngram_embedding"
    tensors = {f"{prefix}.shard_{i}.weight": torch.randn(rows, d, generator=g).to(torch.bfloat16)
               for i in range(shards)}
    save_file(tensors, str(root / "model.safetensors"), metadata={"format": "pt"})
    return tensors


def raw_tensors(root: Path) -> dict[str, bytes]:
    out = {}
    for f in sorted(root.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            for k in h.keys():
                out[k] = h.get_tensor(k).contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return out


# ---------------------------------------------------------------------------------------- fp8 dtypes in assets
FP8 = ["fp8-e4m3-e8m0", "fp8-e4m3"]
LAY = Layout(pages=6, heads=2, slots=3, head_dim=64)


def _table(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((LAY.num_rows, LAY.head_dim)).astype(np.float32)


@pytest.mark.parametrize("dtype", FP8)
def test_fp8_every_read_path_agrees(tmp_path: Path, dtype: str) -> None:
    a = MemoryAsset.from_array(tmp_path / "a", _table(), HashSpec(), LAY, orders=(1, 2), dtype=dtype,
                               chunks_per_shard=1)
    x = a.to_numpy()
    assert np.abs(x - _table()).max() < 0.2
    rows = np.array([[0, 35], [-1, 7]])
    want = np.where(rows[..., None] >= 0, x[rows], 0)
    assert np.array_equal(a.read_rows(rows), want)
    for backend in ("zarr", "tensorstore"):
        assert np.array_equal(MemoryAsset.open(a.path, backend=backend).to_numpy(), x)
    from polymem.serve.service import PageService
    from polymem.torch.pages import PagedRows

    svc = PageService(a, cache_mb=1, workers=1)
    try:
        paged = PagedRows(a, svc)
        assert np.array_equal(paged.gather(torch.from_numpy(rows)).numpy(), want)
        paged.start(torch.from_numpy(rows))  # prefetched, then gathered
        assert np.array_equal(paged.gather(torch.from_numpy(rows)).numpy(), want)
    finally:
        svc.close()
    a.verify()


def test_fp8_block_rows_decode_as_torch(tmp_path: Path) -> None:
    """A stored fp8-e4m3-e8m0 row is r E4M3 bytes then r/32 E8M0 bytes; decoded as torch's float8 × 2^(s−127)."""
    a = MemoryAsset.from_array(tmp_path / "a", _table(), HashSpec(), LAY, orders=(1, 2), dtype="fp8-e4m3-e8m0")
    st = a.read_stored([1])[0].reshape(LAY.rows_per_page, 66)  # [K·S, 64 + 2]
    w = torch.from_numpy(st[:, :64].copy()).view(torch.float8_e4m3fn).float()
    s = torch.from_numpy(st[:, 64:].copy()).view(torch.float8_e8m0fnu).float().repeat_interleave(32, dim=1)
    assert torch.equal(w * s, torch.from_numpy(a.read_pages([1])[0]))


def test_fp8_global_scale_is_in_the_header(tmp_path: Path) -> None:
    a = MemoryAsset.from_array(tmp_path / "a", _table(), HashSpec(), LAY, orders=(1, 2), dtype="fp8-e4m3")
    scale = a.header["storage"]["fp8_scale"]
    assert scale == float(np.float32(scale)) and np.abs(_table()).max() / scale <= 448
    st = a.read_stored([0])[0].reshape(LAY.rows_per_page, 64)
    assert np.array_equal(a.read_pages([0])[0], fp8.decode_e4m3(st) * np.float32(scale))


@pytest.mark.parametrize("to", FP8 + ["bfloat16"])
def test_quantize_to_the_new_dtypes(tmp_path: Path, to: str) -> None:
    a = MemoryAsset.from_array(tmp_path / "a", _table(), HashSpec(), LAY, orders=(1, 2))
    q, err = a.quantize(tmp_path / "q", to=to)
    assert q.dtype == to and err.rel_max < 0.1 and q.to_numpy().shape == (LAY.num_rows, 64)


@pytest.mark.parametrize("dtype", FP8)
def test_fp8_nan_code_is_refused_on_read(tmp_path: Path, dtype: str) -> None:
    """A NaN code written with valid checksums (a faulty tool): every decoding read and verify name the row."""
    a = MemoryAsset.from_array(tmp_path / "a", _table(), HashSpec(), LAY, orders=(1, 2), dtype=dtype)
    g = a.geometry
    stored = a.read_stored(np.arange(LAY.pages))  # [P, page_bytes]
    stored[2, g.row_bytes + 5] = 0x7F  # page 2, row 1
    from polymem.asset._codec import pages_to_chunks
    from polymem.asset.core import MemoryAsset as M

    bad = M._write_new(tmp_path / "b", a.spec, LAY, None, dtype=dtype, orders=(1, 2), provenance={},
                       overwrite=False, chunks_per_shard=None, fp8_scale=g.fp8_scale,
                       chunk_source=lambda s: pages_to_chunks(stored, g))
    row = 2 * LAY.rows_per_page + 1
    with pytest.raises(FormatError, match=rf"page 2 \(row {row}\) decodes to nan"):
        bad.read_pages([2])
    with pytest.raises(FormatError, match=rf"row {row}\)"):
        bad.read_rows(np.array([row]))
    assert any(f"row {row})" in p for p in bad.problems())
    assert np.array_equal(bad.read_pages([1]), a.read_pages([1]))


def test_fp8_e8m0_needs_blocks_of_32(tmp_path: Path) -> None:
    with pytest.raises(PolymemError, match="multiple of 32"):
        MemoryAsset.create(tmp_path / "a", HashSpec(), Layout(pages=2, heads=1, slots=1, head_dim=48),
                           dtype="fp8-e4m3-e8m0")


def test_older_header_values_are_refused(tmp_path: Path) -> None:
    """An fp8-e4m3 header without its scale, or a scale that is no float32, does not open."""
    from polymem.asset._format import geometry

    with pytest.raises(PolymemError, match="finite float32"):
        geometry(LAY, "fp8-e4m3", fp8_scale=0.1)
    with pytest.raises(PolymemError, match="fp8-e4m3 only"):
        geometry(LAY, "nf4", fp8_scale=1.0)


# ---------------------------------------------------------------------------------------- golden bytes
GOLDEN_TABLE = np.arange(4 * 32, dtype=np.float32).reshape(4, 32) / 8 - 7.5  # rows 0..3, r = 32


@pytest.mark.parametrize("dtype,first,shard_sha", [
    ("fp8-e4m3-e8m0", "f7f7f6f6f6f6f6f5f5f5f4f4f4f4f4f3f3f3f2f2f2f2f2f1f1f1f0f0f0f0efee7a",
     "a340454ac9c5deb9fbd840081f3d624b8b34d9ea2a41e272cfb893d999cfede8"),
    ("fp8-e4m3", "fdfcfcfcfcfbfbfbfbfbfafafafafaf9f9f9f9f9f8f8f8f7f7f7f6f6f5f5f5f4",
     "b366705603d5f9a93af8fe3dd2a7dbbcde748b37fadbd7d0f468f20555dc3435"),
])
def test_golden_fp8_rows(tmp_path: Path, dtype: str, first: str, shard_sha: str) -> None:
    """docs/asset-format.md §5: the stored bytes of the golden table's row 0 and the sha256 of its one shard."""
    import hashlib

    lay = Layout(pages=2, heads=1, slots=2, head_dim=32, kind="flat")
    a = MemoryAsset.from_array(tmp_path / "g", GOLDEN_TABLE, HashSpec(), lay, orders=(1,), dtype=dtype)
    assert a.read_stored([0])[0][: a.geometry.row_bytes].tobytes().hex() == first
    assert hashlib.sha256((Path(a.path) / a.geometry.shard_key(0)).read_bytes()).hexdigest() == shard_sha
    if dtype == "fp8-e4m3":  # the smallest float32 with max|x| / scale <= 448: 8.375 / 448 rounded up
        assert a.header["storage"]["fp8_scale"] == 0.01869419775903225


# ---------------------------------------------------------------------------------------- import / export
def test_deepseek_import_export_round_trip(tmp_path: Path) -> None:
    a = small_deepseek()
    src = write_deepseek(tmp_path / "ds", a)
    asset = import_table(tmp_path / "ds", tmp_path / "ds.pmem", addressing=a)
    assert asset.dtype == "fp8-e4m3-e8m0" and asset.tokenizer_bound
    spec = MemoryAsset.open(asset.path).spec
    assert isinstance(spec, EngineTableSpec) and spec.addressing.to_json() == a.to_json()
    # every layer's row decodes to torch's float8_e4m3fn × float8_e8m0fnu
    for li, t in enumerate(a.layers):
        w, s = src[f"layers.{t.layer}.engram.embed.weight"], src[f"layers.{t.layer}.engram.embed.scale"]
        want = w.float() * s.float().repeat_interleave(32, dim=1)
        rows = np.arange(t.stored_rows) + spec.row_base[li]
        assert torch.equal(torch.from_numpy(asset.read_rows(rows)), want)
    ids = np.array([5, 7, 9, 11, 59])  # the engine's rows, then the asset's
    assert np.array_equal(spec.rows(ids), a.rows(ids) + np.array(spec.row_base)[:, None])
    files = export_table(asset, tmp_path / "out")
    assert sorted(p.name for p in files) == sorted(p.name for p in (tmp_path / "ds").glob("*.safetensors"))
    got, want = raw_tensors(tmp_path / "out"), raw_tensors(tmp_path / "ds")
    assert got and all(got[k] == want[k] for k in got) and set(want) - set(got) == {
        "layers.1.attn.wq.weight", "layers.14.attn.wq.weight"}
    for f in files:
        with safe_open(str(f), framework="pt") as h:
            assert h.metadata() == {"format": "pt"}
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(got)
    again = import_table(tmp_path / "out", tmp_path / "ds2.pmem", addressing=a)
    export_table(again, tmp_path / "out2")
    for f in files:
        assert f.read_bytes() == (tmp_path / "out2" / f.name).read_bytes()


def test_qwen_import_export_round_trip(tmp_path: Path) -> None:
    a = small_qwen()
    src = write_qwen(tmp_path / "qw", a)
    asset = import_table(tmp_path / "qw", tmp_path / "qw.pmem", addressing=a)
    assert asset.dtype == "bfloat16" and asset.spec.row_base == (0,)
    want = torch.cat([src[k] for k in sorted(src, key=lambda k: int(k.split("shard_")[1].split(".")[0]))]).float()
    assert torch.equal(torch.from_numpy(asset.read_rows(np.arange(a.num_rows[0]))), want)
    export_table(asset, tmp_path / "out")
    assert raw_tensors(tmp_path / "out") == raw_tensors(tmp_path / "qw")
    assert not (tmp_path / "out" / "model.safetensors.index.json").exists()  # the source had none


def test_import_refuses_a_table_of_another_size(tmp_path: Path) -> None:
    write_deepseek(tmp_path / "ds", small_deepseek())
    with pytest.raises(FormatError, match=r"layer 1 holds \d+ rows, the addressing 'deepseek-v4.1' expects"):
        import_table(tmp_path / "ds", tmp_path / "x.pmem", addressing=small_deepseek(floor=300))
    assert not (tmp_path / "x.pmem").exists()


def test_import_refuses_nan_rows(tmp_path: Path) -> None:
    a = small_qwen()
    t = write_qwen(tmp_path / "qw", a)
    name = sorted(t)[1]
    t[name][3, 4] = float("nan")
    save_file(t, str(tmp_path / "qw" / "model.safetensors"))
    with pytest.raises(FormatError, match="BF16 inf or NaN"):
        import_table(tmp_path / "qw", tmp_path / "x.pmem", addressing=a)


def test_export_needs_the_engine_dtype(tmp_path: Path) -> None:
    a = small_qwen()
    write_qwen(tmp_path / "qw", a)
    asset = import_table(tmp_path / "qw", tmp_path / "qw.pmem", addressing=a)
    q, _ = asset.quantize(tmp_path / "q.pmem", to="float32")
    with pytest.raises(PolymemError, match=r"quantize --to bfloat16"):
        export_table(q, tmp_path / "out")
    with pytest.raises(PolymemError, match="not an imported engine table"):
        export_table(MemoryAsset.from_array(tmp_path / "b", _table(), HashSpec(), LAY, orders=(1,)), tmp_path / "o")


def test_cli_import_export(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from polymem.cli.app import app
    from polymem.cli.cmd_engines import Engine
    from polymem.engines import ENGINES

    assert sorted(e.value for e in Engine) == sorted(ENGINES)
    a = small_deepseek()
    write_deepseek(tmp_path / "ds", a)
    (tmp_path / "spec.json").write_text(json.dumps(a.to_json()))
    r = CliRunner().invoke(app, ["import", str(tmp_path / "ds"), "-o", str(tmp_path / "ds.pmem"),
                                 "--engine", "deepseek-v4.1", "--spec", str(tmp_path / "spec.json")])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["export", str(tmp_path / "ds.pmem"), "-o", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    assert raw_tensors(tmp_path / "out").keys() <= raw_tensors(tmp_path / "ds").keys()
    r = CliRunner().invoke(app, ["import", str(tmp_path / "ds"), "-o", str(tmp_path / "q.pmem"),
                                 "--engine", "qwen3.8-ple", "--spec", str(tmp_path / "spec.json")])
    assert r.exit_code != 0 and "--spec is for engine 'deepseek-v4.1'" in r.output


_RSS_SCRIPT = """
import json, resource
from pathlib import Path
from polymem.engines import EngineAddressing
from polymem.engines.io import import_table
spec = EngineAddressing.from_json(json.loads(Path({spec!r}).read_text()))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
import_table(Path({src!r}), Path({out!r}), addressing=spec)
print(before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def big_deepseek_addressing(rows: int) -> EngineAddressing:
    """One layer of about ``rows`` rows: 24 primes of about rows / 24 each."""
    primes = deepseek.layer_primes((1,), floor=rows // 24, orders=3, heads=8)[1]
    table = LayerTable(layer=1, multipliers=deepseek.multipliers(1, 50), primes=primes, stored_rows=sum(primes))
    return EngineAddressing(name=deepseek.NAME, vocab_size=50, orders=(2, 3, 4), heads=8, layers=(table,), fill_id=2)


def write_big_deepseek(path: Path, rows: int) -> None:
    """A one-layer checkpoint of 264-byte rows written in slices (random codes, scale 127), never held whole."""
    from polymem.engines import _safetensors as st

    entries = [("layers.1.engram.embed.weight", "F8_E4M3", (rows, 256)),
               ("layers.1.engram.embed.scale", "F8_E8M0", (rows, 8))]
    rng = np.random.default_rng(0)
    with open(path, "wb") as f:
        f.write(st.header_bytes({"format": "pt"}, entries))
        for step in range(0, rows, 1 << 16):
            w = rng.integers(0, 0x7E, (min(rows, step + (1 << 16)) - step, 256), dtype=np.uint8)
            f.write(w.tobytes())
        f.write(np.full((rows, 8), 127, np.uint8).tobytes())


@pytest.mark.slow
def test_import_of_a_2gb_table_stays_under_400mb(tmp_path: Path) -> None:
    """Peak RSS of an import, in a fresh process: bounded by a shard, not by the table."""
    a = big_deepseek_addressing(int(os.environ.get("POLYMEM_BIG_ROWS", 8_000_000)))  # 8M × 264 B = 2.1 GB
    (tmp_path / "ds").mkdir()
    write_big_deepseek(tmp_path / "ds" / "model.safetensors", a.num_rows[0])
    (tmp_path / "spec.json").write_text(json.dumps(a.to_json()))
    script = _RSS_SCRIPT.format(spec=str(tmp_path / "spec.json"), src=str(tmp_path / "ds"),
                                out=str(tmp_path / "big.pmem"))
    # through sh, so the child is a fresh process: Linux keeps ru_maxrss across exec, and a process forked from
    # this one (torch loaded) would start at this one's size
    r = subprocess.run(["sh", "-c", f'"{sys.executable}" -c "$0"; exit $?', script], capture_output=True, text=True,
                       check=True)
    before_mb, peak_mb = (int(v) / 1024 for v in r.stdout.split()[-2:])
    size_gb = (tmp_path / "ds" / "model.safetensors").stat().st_size / 1e9
    print(f"import of {size_gb:.2f} GB: peak RSS {peak_mb:.0f} MB (after imports {before_mb:.0f} MB)")
    assert peak_mb < 400


@pytest.mark.parametrize("name", ["../outside/victim.txt", "/abs/victim.txt", "sub/victim.txt"])
def test_export_refuses_file_names_that_leave_the_output(tmp_path: Path, name: str) -> None:
    """A crafted header (checksums recomputed) naming a file outside the output: refused, nothing written."""
    from assetedit import _edit_header

    a = small_qwen()
    write_qwen(tmp_path / "qw", a)
    import_table(tmp_path / "qw", tmp_path / "qw.pmem", addressing=a)
    victim = tmp_path / "outside" / "victim.txt"
    victim.parent.mkdir()
    victim.write_text("keep me")

    def evil(h: dict) -> None:
        h["provenance"]["engine_source"]["files"][0]["name"] = name

    _edit_header(tmp_path / "qw.pmem", evil)
    with pytest.raises(PolymemError, match="is not a path inside the asset|is a plain name in the output directory"):
        export_table(str(tmp_path / "qw.pmem"), tmp_path / "exp")
    assert victim.read_text() == "keep me" and not (tmp_path / "exp").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".exp")] == []


@pytest.mark.parametrize("step", ["import", "export"])
def test_an_injected_failure_leaves_the_table_whole_or_absent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              step: str) -> None:
    """Import and export commit like every asset writer: fail each file-system call in turn (as a killed process,
    and as an error the writer rolls back) and the output is either absent or complete, never half-written."""
    a = small_deepseek()
    write_deepseek(tmp_path / "ds", a)
    base = import_table(tmp_path / "ds", tmp_path / "base.pmem", addressing=a)

    def run(out: Path) -> None:
        if step == "import":
            import_table(tmp_path / "ds", out, addressing=a)
        else:
            export_table(base, out)

    def data(root: Path) -> dict[str, bytes]:  # the group metadata aside (an import records when it ran)
        return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
                if p.is_file() and p.name not in ("zarr.json", ".polymem-lock")}

    clean = Injector(float("inf"), "none")
    with monkeypatch.context() as m:
        clean.install(m)
        run(tmp_path / "clean")
    want = data(tmp_path / "clean")
    assert clean.n >= 3 and want, clean.log
    landed = 0
    for mode in ("crash", "error"):
        for k in range(1, clean.n + 1):
            out = tmp_path / f"{mode}-{k}"
            inj = Injector(k, mode)
            with monkeypatch.context() as m:
                inj.install(m)
                try:
                    run(out)
                except (OSError, PolymemError):
                    pass
            where = f"{step}: {mode} at call {k} ({inj.log[k - 1] if k <= len(inj.log) else '-'})"
            if out.exists():
                assert data(out) == want, where
                if step == "import":
                    assert MemoryAsset.open(out).problems() == [], where
                landed += 1
            if mode == "error":  # the writer's own clean-up ran: nothing of it is left beside the output
                assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(f".{out.name}")], where
    assert 0 < landed < 2 * clean.n
