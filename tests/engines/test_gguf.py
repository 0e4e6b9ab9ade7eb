"""ds4's GGUF of DeepSeek-V4.1's Engram tables and Qwen's FP8 PLE variant, in and out of assets (docs/engines.md
§4): small synthetic files with the engines' tensor names, types and metadata and scaled-down geometry. The
``gguf`` package (llama.cpp's gguf-py) writes and reads files independently of polymem's own container code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from polymem.asset.engine_table import EngineTableSpec
from polymem.engines import _gguf
from polymem.engines.addressing import EngineAddressing
from polymem.engines.io import DS4_ENCODING, export_table, import_table
from polymem.errors import FormatError
from test_import_export import (D_DS, big_deepseek_addressing, fp8_tensors, raw_tensors, small_deepseek,
                                small_qwen)

V = gguf.GGUFValueType


def packed_rows(a: EngineAddressing, d: int = D_DS) -> dict[int, np.ndarray]:
    """Per layer, uint8 [rows, d + d/32]: E4M3 codes then E8M0 scales (the source test's random tensors)."""
    out = {}
    for t in a.layers:
        w, s = fp8_tensors(t.stored_rows, d, seed=t.layer)
        out[t.layer] = np.concatenate([w.view(torch.uint8).numpy(), s.view(torch.uint8).numpy()], axis=1)
    return out


def write_ds4(path: Path, a: EngineAddressing, rows: dict[int, np.ndarray], *, alignment: int = 64,
              metadata: bool = True, encoding: str = DS4_ENCODING, layers: tuple[int, ...] | None = None) -> None:
    """A GGUF laid out like ds4's quantiser output, written by gguf-py: the model's tensors (here one F32
    stand-in), then per Engram layer ``blk.{L}.engram_embd.weight`` I8 [264-style row bytes, rows], and ds4's
    ``deepseek41.engram.*`` metadata."""
    w = gguf.GGUFWriter(str(path), arch="deepseek41")
    w.add_custom_alignment(alignment)
    w.add_string("general.name", "DeepSeek V4.1 Flash (scaled down)")
    if metadata:
        w.add_string("deepseek41.engram.encoding", encoding)
        w.add_key_value("deepseek41.engram.layer_ids", list(a.layer_ids), V.ARRAY, sub_type=V.UINT32)
        w.add_key_value("deepseek41.engram.rows", [t.stored_rows for t in a.layers], V.ARRAY, sub_type=V.UINT32)
        w.add_uint32("deepseek41.engram.compressed_vocab_size", a.hashed_vocab)
        w.add_uint32("deepseek41.engram.pad_id", a.fill_id)
        w.add_key_value("deepseek41.engram.token_map", a.id_map.tolist(), V.ARRAY, sub_type=V.UINT32)
        w.add_key_value("deepseek41.engram.primes", [p for t in a.layers for p in t.primes], V.ARRAY,
                        sub_type=V.UINT32)
        w.add_key_value("deepseek41.engram.multipliers", [m for t in a.layers for m in t.multipliers], V.ARRAY,
                        sub_type=V.UINT64)
        w.add_float32("deepseek41.rms_norm_eps", 1e-6)
        w.add_bool("tokenizer.ggml.add_bos_token", True)
        w.add_array("tokenizer.ggml.tokens", ["<pad>", "a", "é", "▁b"])
    w.add_tensor("output_norm.weight", np.arange(16, dtype=np.float32))
    for layer in layers or a.layer_ids:
        w.add_tensor(f"blk.{layer}.engram_embd.weight", rows[layer].view(np.int8), raw_dtype=gguf.GGMLQuantizationType.I8)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture
def ds4(tmp_path: Path) -> tuple[EngineAddressing, dict[int, np.ndarray], Path]:
    a = small_deepseek()
    rows = packed_rows(a)
    write_ds4(tmp_path / "ds4.gguf", a, rows)
    return a, rows, tmp_path / "ds4.gguf"


def test_ds4_gguf_import_export_round_trip(tmp_path: Path, ds4: tuple) -> None:
    a, rows, src = ds4
    asset = import_table(src, tmp_path / "ds.pmem", addressing=a)
    assert asset.dtype == "fp8-e4m3-e8m0" and asset.layout.head_dim == D_DS
    spec = asset.spec
    assert isinstance(spec, EngineTableSpec)
    for li, t in enumerate(a.layers):  # rows decode to torch's float8_e4m3fn × float8_e8m0fnu
        r = torch.from_numpy(rows[t.layer])
        want = r[:, :D_DS].view(torch.float8_e4m3fn).float() * \
            r[:, D_DS:].contiguous().view(torch.float8_e8m0fnu).float().repeat_interleave(32, dim=1)
        got = asset.read_rows(np.arange(t.stored_rows) + spec.row_base[li])
        assert torch.equal(torch.from_numpy(got), want)
    (out,) = export_table(asset, tmp_path / "out")
    assert out.name == "ds4.gguf"
    # gguf-py reads the export: the Engram tensors, I8 [264-style, rows], bytes equal to the source's
    r = gguf.GGUFReader(str(out))
    tensors = {t.name: t for t in r.tensors}
    assert sorted(tensors) == ["blk.1.engram_embd.weight", "blk.14.engram_embd.weight"]
    for layer in a.layer_ids:
        t = tensors[f"blk.{layer}.engram_embd.weight"]
        assert t.tensor_type == gguf.GGMLQuantizationType.I8 and list(t.shape) == [D_DS + 2, len(rows[layer])]
        assert np.array_equal(np.asarray(t.data).view(np.uint8).reshape(rows[layer].shape), rows[layer])
    fields = r.fields
    assert fields["deepseek41.engram.encoding"].contents() == DS4_ENCODING
    assert fields["deepseek41.engram.multipliers"].contents() == [m for t in a.layers for m in t.multipliers]
    assert fields["tokenizer.ggml.tokens"].contents() == ["<pad>", "a", "é", "▁b"]
    assert fields["general.alignment"].contents() == 64 and r.alignment == 64
    assert float(np.float32(fields["deepseek41.rms_norm_eps"].contents())) == float(np.float32(1e-6))
    # export(import(x)) is x, byte for byte, once x is an export
    again = import_table(out, tmp_path / "ds2.pmem", addressing=a)
    (out2,) = export_table(again, tmp_path / "out2")
    assert out2.read_bytes() == out.read_bytes()
    assert np.array_equal(again.read_stored(np.arange(again.layout.pages)),
                          asset.read_stored(np.arange(asset.layout.pages)))


def test_gguf_container_matches_gguf_py(tmp_path: Path) -> None:
    """polymem's writer and reader against gguf-py on every value type: the same metadata, offsets and data."""
    meta = [["general.architecture", 8, "deepseek41"], ["general.alignment", 4, 32], ["u8", 0, 7], ["i8", 1, -3],
            ["u16", 2, 65535], ["i16", 3, -300], ["i32", 5, -70000], ["f32", 6, int(np.float32(0.1).view(np.uint32))],
            ["b", 7, 1], ["u64", 10, 2**63 + 5], ["i64", 11, -2**40], ["f64", 12, int(np.float64(0.3).view(np.uint64))],
            ["s", 8, "Zürich ▁"], ["arr", 9, [8, ["x", "yz"]]], ["nested", 9, [9, [[4, [1, 2]], [4, [3]]]]]]
    infos = [("a", (5, 3), 24, 0), ("b", (7,), 24, 32)]
    head = _gguf.header_bytes(meta, infos, 32)
    path = tmp_path / "t.gguf"
    path.write_bytes(head + bytes(range(15)) + bytes(17) + bytes(range(100, 107)) + bytes(25))
    h = _gguf.read_header(path)
    assert [list(m) for m in h.metadata] == meta and h.data_start == len(head) and h.alignment == 32
    r = gguf.GGUFReader(str(path))
    assert r.fields["u64"].contents() == 2**63 + 5 and r.fields["f64"].contents() == 0.3
    assert r.fields["s"].contents() == "Zürich ▁" and r.fields["arr"].contents() == ["x", "yz"]
    assert [bytes(np.asarray(t.data).view(np.uint8)) for t in r.tensors] == [bytes(range(15)), bytes(range(100, 107))]
    assert [t.data_offset for t in r.tensors] == [h.tensors["a"].start, h.tensors["b"].start]


def test_ds4_metadata_must_match_the_addressing(tmp_path: Path) -> None:
    a = small_deepseek()
    rows = packed_rows(a)
    other = small_deepseek(floor=300)  # other primes and rows
    write_ds4(tmp_path / "x.gguf", other, packed_rows(other))
    with pytest.raises(FormatError, match=r"deepseek41.engram.rows is \[\d+, \d+\], the addressing 'deepseek-v4.1' "
                       r"has .*--spec"):
        import_table(tmp_path / "x.gguf", tmp_path / "x.pmem", addressing=a)
    write_ds4(tmp_path / "q4.gguf", a, rows, encoding="lloyd4_e5m3_32_r136")
    with pytest.raises(FormatError, match="encoding is 'lloyd4_e5m3_32_r136'"):
        import_table(tmp_path / "q4.gguf", tmp_path / "x.pmem", addressing=a)
    write_ds4(tmp_path / "bare.gguf", a, rows, metadata=False)  # no ds4 keys: the tensors alone are checked
    assert import_table(tmp_path / "bare.gguf", tmp_path / "bare.pmem", addressing=a).dtype == "fp8-e4m3-e8m0"
    assert not (tmp_path / "x.pmem").exists()


def _no_leftovers(tmp_path: Path, keep: set[str]) -> None:
    assert {p.name for p in tmp_path.iterdir()} == keep


@pytest.mark.parametrize("cut", ["magic", "header", "data"])
def test_damaged_gguf_is_refused(tmp_path: Path, ds4: tuple, cut: str) -> None:
    a, _, src = ds4
    data = src.read_bytes()
    h = _gguf.read_header(src)
    bad = tmp_path / "bad.gguf"
    if cut == "magic":
        bad.write_bytes(b"GGUX" + data[4:])
        match = r"bad.gguf' is not a GGUF file \(starts with b'GGUX'"
    elif cut == "header":
        bad.write_bytes(data[:h.data_start // 2])
        match = r"bad.gguf': GGUF header truncated at byte \d+ \("
    else:
        bad.write_bytes(data[:-1000])
        match = r"bad.gguf': tensor 'blk.14.engram_embd.weight' \[66, \d+\] ends at byte \d+, past the end"
    with pytest.raises(FormatError, match=match):
        import_table(bad, tmp_path / "x.pmem", addressing=a)
    _no_leftovers(tmp_path, {"ds4.gguf", "bad.gguf"})


def test_wrong_or_missing_engram_tensor(tmp_path: Path) -> None:
    a = small_deepseek()
    rows = packed_rows(a)
    write_ds4(tmp_path / "one.gguf", a, rows, layers=(1,))
    with pytest.raises(FormatError, match=r"no tensor blk.14.engram_embd.weight \(found layers \[1\]\)"):
        import_table(tmp_path / "one.gguf", tmp_path / "x.pmem", addressing=a)
    w = gguf.GGUFWriter(str(tmp_path / "f32.gguf"), arch="deepseek41")
    for t in a.layers:  # F32 values instead of I8 rows
        w.add_tensor(f"blk.{t.layer}.engram_embd.weight", rows[t.layer].astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(FormatError, match=r"f32.gguf': tensor blk.1.engram_embd.weight is ggml type 0 with dims "
                       r"\[66, \d+\]; expected I8 \(type 24\)"):
        import_table(tmp_path / "f32.gguf", tmp_path / "x.pmem", addressing=a)
    narrow = {k: v[:, :60] for k, v in rows.items()}  # 60 bytes a row: not D + D/32
    write_ds4(tmp_path / "narrow.gguf", a, narrow)
    with pytest.raises(FormatError, match=r"dims \[60, \d+\]; expected I8"):
        import_table(tmp_path / "narrow.gguf", tmp_path / "x.pmem", addressing=a)
    _no_leftovers(tmp_path, {"one.gguf", "f32.gguf", "narrow.gguf"})


def test_cli_import_export_gguf(tmp_path: Path, ds4: tuple) -> None:
    from typer.testing import CliRunner

    from polymem.cli.app import app

    a, _, src = ds4
    (tmp_path / "spec.json").write_text(json.dumps(a.to_json()))
    r = CliRunner().invoke(app, ["import", str(src), "-o", str(tmp_path / "ds.pmem"), "--engine", "deepseek-v4.1",
                                 "--spec", str(tmp_path / "spec.json")])
    assert r.exit_code == 0, r.output
    assert "(fp8-e4m3-e8m0)" in r.output and "(gguf)" in r.output
    r = CliRunner().invoke(app, ["export", str(tmp_path / "ds.pmem"), "-o", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    assert [t.name for t in gguf.GGUFReader(str(tmp_path / "out" / "ds4.gguf")).tensors] == [
        "blk.1.engram_embd.weight", "blk.14.engram_embd.weight"]


# ---------------------------------------------------------------------------------------- Qwen's FP8 variant
def write_qwen_fp8(root: Path, a: EngineAddressing, scale: torch.Tensor, shards: int = 4, d: int = 32) -> dict:
    root.mkdir(parents=True, exist_ok=True)
    rows = a.layers[0].stored_rows // shards
    prefix = "model.language_model.layers.1.ple.ple_embedding"
    rng = np.random.default_rng(1)
    tensors: dict[str, torch.Tensor] = {}
    for i in range(shards):
        w = rng.integers(0, 256, (rows, d), dtype=np.uint8)
        w[(w & 0x7F) == 0x7F] = 0x38
        tensors[f"{prefix}.ngram_embedding.shard_{i}.weight"] = torch.from_numpy(w).view(torch.float8_e4m3fn)
    tensors[f"{prefix}.ngram_embedding.weight_scale"] = scale
    tensors[f"{prefix}.layer_multipliers"] = torch.tensor([3, 5, 7])  # beside the table: not imported
    save_file(tensors, str(root / "model.safetensors"), metadata={"format": "pt"})
    return tensors


@pytest.mark.parametrize("scale", [torch.tensor(0.0123, dtype=torch.float32),
                                   torch.tensor([0.5], dtype=torch.bfloat16)], ids=["f32", "bf16-1"])
def test_qwen_fp8_import_export_round_trip(tmp_path: Path, scale: torch.Tensor) -> None:
    a = small_qwen()
    src = write_qwen_fp8(tmp_path / "qw", a, scale)
    asset = import_table(tmp_path / "qw", tmp_path / "qw.pmem", addressing=a)
    s = float(scale.float().reshape(()))
    assert asset.dtype == "fp8-e4m3" and asset.geometry.fp8_scale == s
    names = sorted((k for k in src if ".shard_" in k), key=lambda k: int(k.split("shard_")[1].split(".")[0]))
    want = torch.cat([src[k].float() for k in names]) * torch.tensor(s, dtype=torch.float32)
    assert torch.equal(torch.from_numpy(asset.read_rows(np.arange(a.num_rows[0]))), want)
    export_table(asset, tmp_path / "out")
    got, orig = raw_tensors(tmp_path / "out"), raw_tensors(tmp_path / "qw")
    assert set(orig) - set(got) == {"model.language_model.layers.1.ple.ple_embedding.layer_multipliers"}
    assert all(got[k] == orig[k] for k in got)
    again = import_table(tmp_path / "out", tmp_path / "qw2.pmem", addressing=a)
    export_table(again, tmp_path / "out2")
    assert (tmp_path / "out2" / "model.safetensors").read_bytes() == (tmp_path / "out" / "model.safetensors").read_bytes()


def test_qwen_fp8_needs_its_scale(tmp_path: Path) -> None:
    a = small_qwen()
    t = write_qwen_fp8(tmp_path / "qw", a, torch.tensor(1.0))
    del t["model.language_model.layers.1.ple.ple_embedding.ngram_embedding.weight_scale"]
    save_file(t, str(tmp_path / "qw" / "model.safetensors"))
    with pytest.raises(FormatError, match=r"FP8 PLE shards need their one global scale"):
        import_table(tmp_path / "qw", tmp_path / "x.pmem", addressing=a)
    t["model.language_model.layers.1.ple.ple_embedding.ngram_embedding.weight_scale"] = torch.tensor(-2.0)
    save_file(t, str(tmp_path / "qw" / "model.safetensors"))
    with pytest.raises(FormatError, match=r"weight_scale holds -2.0 \(000000c0\); an FP8 PLE scale is a finite"):
        import_table(tmp_path / "qw", tmp_path / "x.pmem", addressing=a)
    assert not (tmp_path / "x.pmem").exists()


# ---------------------------------------------------------------------------------------- bounded memory
_RSS_SCRIPT = """
import json, resource, sys
from pathlib import Path
from polymem.engines import EngineAddressing
from polymem.engines.io import export_table, import_table
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
if sys.argv[1] == "import":
    spec = EngineAddressing.from_json(json.loads(Path({spec!r}).read_text()))
    import_table(Path({src!r}), Path({out!r}), addressing=spec)
else:
    export_table(Path({out!r}), Path({exp!r}))
print(before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def write_big_ds4(path: Path, a: EngineAddressing) -> None:
    """One-layer ds4 GGUF of 264-byte rows, written in slices by polymem's writer (never held whole)."""
    rows = a.num_rows[0]
    head = _gguf.header_bytes([["general.architecture", 8, "deepseek41"], ["general.alignment", 4, 16384],
                               ["deepseek41.engram.encoding", 8, DS4_ENCODING]],
                              [("blk.1.engram_embd.weight", (264, rows), _gguf.TYPE_I8, 0)], 16384)
    rng = np.random.default_rng(0)
    with open(path, "wb") as f:
        f.write(head)
        for step in range(0, rows, 1 << 16):
            block = np.full((min(rows, step + (1 << 16)) - step, 264), 127, np.uint8)
            block[:, :256] = rng.integers(0, 0x7E, (len(block), 256), dtype=np.uint8)
            f.write(block.tobytes())
        f.write(bytes(-(rows * 264) % 16384))


@pytest.mark.slow
def test_gguf_import_and_export_of_a_1gb_table_stay_under_400mb(tmp_path: Path) -> None:
    """Peak RSS of a GGUF import and of its export, each in a fresh process: bounded by a shard or a batch. The
    export reads the asset with ``pread`` (``POLYMEM_NO_MMAP=1``): through the asset reader's shard maps, the
    pages it touched would count in RSS too (file-backed page cache, docs/benchmarks/asset.md)."""
    a = big_deepseek_addressing(int(os.environ.get("POLYMEM_BIG_ROWS", 4_000_000)))  # 4M × 264 B = 1.06 GB
    src = tmp_path / "ds4.gguf"
    write_big_ds4(src, a)
    (tmp_path / "spec.json").write_text(json.dumps(a.to_json()))
    script = _RSS_SCRIPT.format(spec=str(tmp_path / "spec.json"), src=str(src), out=str(tmp_path / "big.pmem"),
                                exp=str(tmp_path / "exp"))
    for step in ("import", "export"):
        # through sh, so the child is a fresh process (Linux keeps ru_maxrss across exec)
        env = dict(os.environ, POLYMEM_NO_MMAP="1") if step == "export" else None
        r = subprocess.run(["sh", "-c", f'"{sys.executable}" -c "$0" {step}; exit $?', script], capture_output=True,
                           text=True, check=True, env=env)
        before_mb, peak_mb = (int(v) / 1024 for v in r.stdout.split()[-2:])
        print(f"{step} of {src.stat().st_size / 1e9:.2f} GB: peak RSS {peak_mb:.0f} MB (after imports "
              f"{before_mb:.0f} MB)")
        assert peak_mb < 400
    assert (tmp_path / "exp" / "ds4.gguf").read_bytes() == src.read_bytes()
