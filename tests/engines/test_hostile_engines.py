"""`polymem import` / `polymem export` given hostile or careless files (docs/reliability.md, "Engine checkpoints and
GGUF files"): each gets one clear error naming the value, never a traceback, a wait or a wrong table. Every file
here is a real small checkpoint, GGUF or asset made in tmp_path, then edited as an attacker or a slip would."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import threading
import time
import tracemalloc
import zlib
from pathlib import Path

import gguf
import numpy as np
import pytest
from safetensors.torch import save_file

from assetedit import _edit_header
from polymem.engines import _gguf
from polymem.engines import _safetensors as st
from polymem.engines.addressing import EngineAddressing
from polymem.engines.io import export_table, import_table
from polymem.errors import FormatError, OutputError
from test_gguf import packed_rows
from test_import_export import raw_tensors, small_deepseek, small_qwen, write_qwen

QWEN = "qwen3.8-ple"


def run_main(args: list[str], capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    """The console entry point (what the `polymem` script runs): exit code and stderr in one line."""
    from polymem.cli.app import main

    monkeypatch.setattr("sys.argv", ["polymem", *args])
    with pytest.raises(SystemExit) as e:
        main()
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return int(e.value.code or 0), " ".join(err.split())


@pytest.fixture
def qw(tmp_path: Path) -> tuple[EngineAddressing, Path, Path]:
    """A small Qwen PLE checkpoint (one model.safetensors) and its addressing spec beside it."""
    a = small_qwen()
    write_qwen(tmp_path / "qw", a)
    (tmp_path / "spec.json").write_text(json.dumps(a.to_json()))
    return a, tmp_path / "qw", tmp_path / "spec.json"


# ------------------------------------------------------------------------- 1. an index naming files elsewhere
@pytest.mark.parametrize("how", ["dotdot", "absolute", "linked-dir", "linked-file"])
def test_an_index_naming_a_file_outside_the_checkpoint_is_refused(tmp_path: Path, qw: tuple, how: str) -> None:
    """The index names a real checkpoint file outside the folder: refused, not followed (before: imported)."""
    a, src, _ = qw
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.move(src / "model.safetensors", outside / "model.safetensors")
    name = {"dotdot": "../outside/model.safetensors", "absolute": str(outside / "model.safetensors"),
            "linked-dir": "sub/model.safetensors", "linked-file": "model.safetensors"}[how]
    if how == "linked-dir":
        (src / "sub").symlink_to(outside)
    if how == "linked-file":
        (src / "model.safetensors").symlink_to(outside / "model.safetensors")
    names = st.read_header(outside / "model.safetensors")[1]
    (src / st.INDEX).write_text(json.dumps({"weight_map": dict.fromkeys(names, name)}))
    why = "outside the checkpoint folder" if how == "linked-file" else "plain names in its folder"
    with pytest.raises(FormatError, match=rf"names .*{why}.*(refused, not followed|does not follow it)"):
        import_table(src, tmp_path / "x.pmem", addressing=a)
    assert not (tmp_path / "x.pmem").exists()


def test_a_hub_cache_snapshot_is_read_through_its_links(tmp_path: Path, qw: tuple) -> None:
    """The Hugging Face cache links snapshots/REV/NAME to ../../blobs/HASH: that one layout is followed."""
    a, src, _ = qw
    repo = tmp_path / "models--org--qwen"
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    shutil.move(src / "model.safetensors", repo / "blobs" / "0f1e2d")
    (snap / "model.safetensors").symlink_to("../../blobs/0f1e2d")
    asset = import_table(snap, tmp_path / "x.pmem", addressing=a)
    assert asset.layout.num_rows >= a.num_rows[0]


# ------------------------------------------------------------------------- 2. a safetensors header that lies
def _write_st(path: Path, header: object, data: bytes = bytes(16)) -> Path:
    body = json.dumps(header).encode() if not isinstance(header, bytes) else header
    path.write_bytes(len(body).to_bytes(8, "little") + body + data)
    return path


_U8 = {"dtype": "U8", "shape": [8]}


@pytest.mark.parametrize("header,match", [
    ({"a": {**_U8, "data_offsets": [0, 8]}, "b": {**_U8, "data_offsets": [0, 8]}},
     r"tensors 'a' and 'b' overlap \(the first ends at byte 8, the second starts at 0\)"),
    ({"a": {**_U8, "data_offsets": [0, 8]}, "b": {**_U8, "data_offsets": [4, 12]}}, r"'a' and 'b' overlap"),
    ({"a": {**_U8, "data_offsets": [8, 16]}, "b": {"dtype": "F4", "shape": [3], "data_offsets": [10, 12]}},
     r"'a' and 'b' overlap"),
    ({"a": {**_U8, "data_offsets": [10, 18]}}, r"data_offsets \[10, 18\]; expected two integers .* <= 16"),
    ({"a": {**_U8, "data_offsets": [0.0, 8.0]}}, r"data_offsets \[0.0, 8.0\]; expected two integers"),
    ({"a": {**_U8, "data_offsets": [-8, 0]}}, r"data_offsets \[-8, 0\]; expected two integers"),
    ({"a": {**_U8, "data_offsets": [False, True]}}, r"data_offsets \[False, True\]; expected two integers"),
    ({"a": {"dtype": "U8", "shape": [2.5, 3.2], "data_offsets": [0, 8]}}, r"shape \[2.5, 3.2\]; expected a list"),
    ({"a": {"dtype": ["U8"], "shape": [8], "data_offsets": [0, 8]}}, r"lacks dtype, shape or data_offsets"),
    ([{"a": 1}], r"safetensors header is a JSON list, not an object of tensors"),
    ({"__metadata__": {"format": 5}}, r"__metadata__ is \{'format': 5\}; expected an object of strings"),
    (b'{"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}, "a": {"dtype": "U8", "shape": [8], '
     b'"data_offsets": [8, 16]}}', r"safetensors header: key 'a' appears twice"),
], ids=["same-range", "overlap", "overlap-other-dtype", "past-end", "float", "negative", "bool", "float-shape",
        "list-dtype", "list-header", "metadata", "key-twice"])
def test_a_safetensors_header_that_lies_is_one_error(tmp_path: Path, header: object, match: str) -> None:
    """Overlapping ranges (two tensors, one content), a range past the data, float/negative/bool offsets, a list
    for a header: one FormatError naming the file and the value (before: accepted, or a Python traceback)."""
    path = _write_st(tmp_path / "bad.safetensors", header)
    with pytest.raises(FormatError, match=match) as e:
        st.read_header(path)
    assert str(path) in str(e.value)


def test_two_qwen_shards_over_one_byte_range_are_refused(tmp_path: Path, qw: tuple) -> None:
    """A crafted Qwen checkpoint whose shard 1 names shard 0's bytes: refused (before: shard 0 imported twice)."""
    a, src, _ = qw
    path = src / "model.safetensors"
    meta, tensors = st.read_header(path)
    n = int.from_bytes(path.read_bytes()[:8], "little")
    doc = json.loads(path.read_bytes()[8:8 + n])
    names = sorted(k for k in doc if ".shard_" in k)
    doc[names[1]]["data_offsets"] = doc[names[0]]["data_offsets"]
    _write_st(path, doc, path.read_bytes()[8 + n:])
    with pytest.raises(FormatError, match="overlap"):
        import_table(src, tmp_path / "x.pmem", addressing=a)


# ------------------------------------------------------------------------- 3. one tensor in two files
def test_one_tensor_in_two_files_is_refused_naming_both(tmp_path: Path, qw: tuple) -> None:
    a, src, _ = qw
    t = {k: v.clone() for k, v in write_qwen(tmp_path / "other", a).items()}
    first = sorted(t)[0]
    t[first] += 1
    save_file({first: t[first]}, str(src / "model-stale.safetensors"))
    with pytest.raises(FormatError, match=rf"tensor '{first}' is in both '.*model-stale.safetensors' and "
                                          r"'.*model.safetensors'; a checkpoint holds each tensor once"):
        import_table(src, tmp_path / "x.pmem", addressing=a)
    assert not (tmp_path / "x.pmem").exists()


# ------------------------------------------------------------------------- 4. GGUF tensors over one range
@pytest.mark.parametrize("where", ["one-offset", "overlapping"])
def test_two_gguf_layers_over_one_range_are_refused(tmp_path: Path, where: str) -> None:
    """ds4's two Engram layers at one data offset (or overlapping): before, layer 1's rows imported as layer 14's."""
    a = small_deepseek()
    rows = packed_rows(a)
    r1, r14 = rows[1], rows[14]
    off = 0 if where == "one-offset" else _gguf.aligned(r1.size // 2, 32)
    head = _gguf.header_bytes([["general.alignment", 4, 32]],
                              [("blk.1.engram_embd.weight", (r1.shape[1], r1.shape[0]), _gguf.TYPE_I8, 0),
                               ("blk.14.engram_embd.weight", (r14.shape[1], r14.shape[0]), _gguf.TYPE_I8, off)], 32)
    data = bytearray(max(r1.size, off + r14.size))
    data[:r1.size] = r1.tobytes()
    data[off:off + r14.size] = r14.tobytes()
    (tmp_path / "ds4.gguf").write_bytes(head + bytes(data))
    with pytest.raises(FormatError, match=r"ds4.gguf': tensors 'blk.1.engram_embd.weight' and "
                                          r"'blk.14.engram_embd.weight' overlap"):
        import_table(tmp_path / "ds4.gguf", tmp_path / "x.pmem", addressing=a)
    assert not (tmp_path / "x.pmem").exists()


def test_gguf_type_sizes_are_ggmls() -> None:
    for kind, size in _gguf.TYPE_SIZES.items():
        assert tuple(gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(kind)]) == size, kind


# ------------------------------------------------------------------------- 5. FIFOs and other non-files
class FifoWatch:
    """A FIFO at ``path`` that records whether anyone opened it for reading: a writer polls it with O_NONBLOCK,
    which succeeds only while a reader holds it open, and closes at once (the reader sees EOF, never hangs)."""

    def __init__(self, path: Path) -> None:
        os.mkfifo(path)
        self.path, self.opened, self._stop = path, False, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # no reader
                time.sleep(0.01)
                continue
            self.opened = True
            os.close(fd)

    def stop(self) -> bool:
        self._stop.set()
        self._thread.join()
        return self.opened


@pytest.mark.parametrize("fifo", ["x.safetensors", "source", "index", "x.gguf", "--spec", "--tokenizer"])
def test_a_fifo_is_refused_without_being_opened(tmp_path: Path, qw: tuple, fifo: str, capsys, monkeypatch) -> None:
    a, src, spec = qw
    args = ["import", str(src), "-o", str(tmp_path / "x.pmem"), "--engine", QWEN, "--spec", str(spec)]
    if fifo == "x.gguf":
        d = small_deepseek()
        (tmp_path / "ggufs").mkdir()
        from test_gguf import write_ds4

        write_ds4(tmp_path / "ggufs" / "a.gguf", d, packed_rows(d))
        (tmp_path / "ds.json").write_text(json.dumps(d.to_json()))
        args = ["import", str(tmp_path / "ggufs"), "-o", str(tmp_path / "x.pmem"), "--engine", "deepseek-v4.1",
                "--spec", str(tmp_path / "ds.json")]
    path = {"x.safetensors": src / "x.safetensors", "source": tmp_path / "pipe.safetensors",
            "index": src / st.INDEX, "x.gguf": tmp_path / "ggufs" / "b.gguf", "--spec": tmp_path / "pipe.json",
            "--tokenizer": tmp_path / "tokenizer.json"}[fifo]
    watch = FifoWatch(path)
    if fifo == "source":
        args[1] = str(path)
    if fifo in ("--spec", "--tokenizer"):
        args += [fifo, str(path)]
    try:
        t0 = time.monotonic()
        code, err = run_main(args, capsys, monkeypatch)
    finally:
        opened = watch.stop()
    assert not opened and time.monotonic() - t0 < 30
    assert code == 2 and f"{str(path)!r} is a FIFO (named pipe), not a regular file" in err, err
    assert not (tmp_path / "x.pmem").exists()


# ------------------------------------------------------------------------- 6. an index that is not JSON
@pytest.mark.parametrize("text,match", [
    ("{not json", r"checkpoint index '.*model.safetensors.index.json' is not JSON \(JSONDecodeError"),
    ('["model.safetensors"]', r"has weight_map None; expected an object mapping each tensor name"),
    ('{"weight_map": {"a": 3}}', r"has weight_map \{'a': 3\}; expected an object"),
    ('{"weight_map": {"a": "model.safetensors", "a": "other.safetensors"}}', r"key 'a' appears twice"),
])
def test_an_index_that_is_not_a_json_weight_map_is_one_error(tmp_path: Path, qw: tuple, text: str,
                                                             match: str) -> None:
    a, src, _ = qw
    (src / st.INDEX).write_text(text)
    with pytest.raises(FormatError, match=match):
        import_table(src, tmp_path / "x.pmem", addressing=a)


def test_a_spec_that_is_not_json_is_one_line(tmp_path: Path, qw: tuple, capsys, monkeypatch) -> None:
    _, src, spec = qw
    spec.write_text('{"format": "polymem.engine-addressing", ')
    code, err = run_main(["import", str(src), "-o", str(tmp_path / "x.pmem"), "--engine", QWEN, "--spec", str(spec)],
                         capsys, monkeypatch)
    assert code == 2 and f"addressing spec (--spec) {str(spec)!r} is not JSON" in err, err


# ------------------------------------------------------------------------- 7. token ids outside the vocabulary
def _tokenizer_json(path: Path, n: int) -> Path:
    from tokenizers import Tokenizer, models

    Tokenizer(models.WordLevel({f"t{i}": i for i in range(n)}, unk_token="t0")).save(str(path))
    return path


def test_a_spec_boundary_id_outside_its_vocabulary_is_refused(qw: tuple) -> None:
    a, _, spec = qw
    doc = {**a.to_json(), "boundary_id": 105}
    with pytest.raises(FormatError, match=r"boundary_id=105 is a token id outside the vocabulary \[0, 100\)"):
        EngineAddressing.from_json(doc)


@pytest.mark.parametrize("ids,boundary,match", [
    (150, 0, r"has token id 149, outside the vocabulary of the addressing spec 'qwen3.8-ple' \(vocab_size 100"),
    (50, 80, r"ends documents at token id 80, outside the vocabulary of tokenizer .* \(50 ids: 0..49\)"),
])
def test_a_spec_and_a_tokenizer_whose_ids_disagree_are_refused(tmp_path: Path, qw: tuple, ids: int, boundary: int,
                                                               match: str, capsys, monkeypatch) -> None:
    """Before: with --spec, --tokenizer was read for nothing and the import went on."""
    a, src, spec = qw
    spec.write_text(json.dumps({**a.to_json(), "boundary_id": boundary, "fill_id": boundary}))
    tok = _tokenizer_json(tmp_path / "tokenizer.json", ids)
    code, err = run_main(["import", str(src), "-o", str(tmp_path / "x.pmem"), "--engine", QWEN, "--spec", str(spec),
                          "--tokenizer", str(tok)], capsys, monkeypatch)
    assert code == 2 and re.search(match, err), err
    assert not (tmp_path / "x.pmem").exists()


def test_eos_id_that_disagrees_with_the_spec_is_refused(tmp_path: Path, qw: tuple, capsys, monkeypatch) -> None:
    _, src, spec = qw
    code, err = run_main(["import", str(src), "-o", str(tmp_path / "x.pmem"), "--engine", QWEN, "--spec", str(spec),
                          "--eos-id", "7"], capsys, monkeypatch)
    assert code == 2 and "--eos-id 7 is not the spec's end-of-text id 0" in err, err


def test_an_id_map_that_expands_to_gigabytes_is_not_expanded(qw: tuple) -> None:
    """A spec's id map is decompressed no further than its vocabulary needs (before: all 32 MiB of it)."""
    a = small_deepseek()
    doc = a.to_json()
    doc["id_map"] = {**doc["id_map"], "data": base64.b64encode(zlib.compress(bytes(32 << 20), 9)).decode()}
    tracemalloc.start()
    try:
        with pytest.raises(FormatError, match="id_map"):
            EngineAddressing.from_json(doc)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak


# ------------------------------------------------------------------------- 8. an export record that lies
def _source(h: dict) -> dict:
    return h["provenance"]["engine_source"]


@pytest.mark.parametrize("edit,match", [
    (lambda s: s["files"].append(json.loads(json.dumps(s["files"][0]))), r"names the file 'model.safetensors' twice"),
    (lambda s: s["files"][0]["tensors"][0].__setitem__(3, 5), r"recorded for layer index 5; this table has layer "
                                                              r"indices 0..0"),
    (lambda s: s["files"][0]["tensors"][0].__setitem__(4, 10**9), r"is recorded at rows 1000000000\.\."),
    (lambda s: s["files"][0]["tensors"][0].__setitem__(5, 60), r"byte column 60 of layer index 0"),
    (lambda s: s["files"][0]["tensors"][1].__setitem__(0, s["files"][0]["tensors"][0][0]),
     r"records tensor '.*shard_0.weight' twice in 'model.safetensors'"),
    (lambda s: s["files"][0]["tensors"][0].__setitem__(1, "F4"), r"is not \[name, dtype, shape, layer, first row, "
                                                                 r"column\] with a dtype in"),
    (lambda s: s["files"][0].__setitem__("metadata", ["x"]), r"has metadata \['x'\]; a safetensors file's metadata"),
    (lambda s: s.pop("files"), r"engine_source has files None"),
], ids=["file-twice", "layer", "rows", "column", "tensor-twice", "dtype", "metadata", "no-files"])
def test_an_export_record_that_lies_is_one_error_and_writes_nothing(tmp_path: Path, qw: tuple, edit,
                                                                    match: str) -> None:
    """The asset's provenance edited (checksums recomputed): before, a file named twice was written once (and
    reported twice), a layer out of range was an IndexError, an unknown dtype a KeyError."""
    a, src, _ = qw
    import_table(src, tmp_path / "qw.pmem", addressing=a)
    _edit_header(tmp_path / "qw.pmem", lambda h: edit(_source(h)))
    with pytest.raises(FormatError, match=match):
        export_table(str(tmp_path / "qw.pmem"), tmp_path / "exp")
    assert not (tmp_path / "exp").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".exp")] == []


def test_an_export_record_that_lies_is_one_line_from_the_cli(tmp_path: Path, qw: tuple, capsys, monkeypatch) -> None:
    a, src, _ = qw
    import_table(src, tmp_path / "qw.pmem", addressing=a)
    _edit_header(tmp_path / "qw.pmem", lambda h: _source(h)["files"][0]["tensors"][0].__setitem__(3, 9))
    code, err = run_main(["export", str(tmp_path / "qw.pmem"), "-o", str(tmp_path / "exp")], capsys, monkeypatch)
    assert code == 2 and err.startswith("error: ") and "layer index 9" in err, err


# ------------------------------------------------------------------------- 9. URLs
@pytest.mark.parametrize("args", [
    ["import", "{src}", "-o", "s3://bucket/x.pmem", "--engine", QWEN, "--spec", "{spec}"],
    ["import", "s3://bucket/ckpt", "-o", "{tmp}/x.pmem", "--engine", QWEN, "--spec", "{spec}"],
    ["import", "{src}", "-o", "{tmp}/x.pmem", "--engine", QWEN, "--spec", "gs://bucket/spec.json"],
    ["import", "{src}", "-o", "{tmp}/x.pmem", "--engine", QWEN, "--tokenizer", "https://example.com/tokenizer.json"],
    ["export", "{tmp}/qw.pmem", "-o", "s3://bucket/out"],
], ids=["import -o", "import SOURCE", "import --spec", "import --tokenizer", "export -o"])
def test_a_url_where_import_or_export_takes_a_local_path_is_refused(tmp_path: Path, qw: tuple, args: list[str],
                                                                    capsys, monkeypatch) -> None:
    """Before: `-o s3://bucket/x.pmem` wrote a local folder named `s3:`."""
    a, src, spec = qw
    import_table(src, tmp_path / "qw.pmem", addressing=a)
    monkeypatch.chdir(tmp_path)
    argv = [x.format(src=src, spec=spec, tmp=tmp_path) for x in args]
    code, err = run_main(argv, capsys, monkeypatch)
    url = next(x for x in argv if "://" in x)
    assert code == 2 and f"{url!r} is a URL; this takes a local" in err and "local files only" in err, err
    assert not any(p.name.endswith(":") for p in tmp_path.rglob("*"))


def test_export_reads_a_remote_asset(tmp_path: Path, qw: tuple, capsys, monkeypatch) -> None:
    """export's ASSET may be a URL (the asset is read remotely), its output is local: an fsspec memory:// copy of
    the asset exports the same bytes."""
    import fsspec

    a, src, _ = qw
    import_table(src, tmp_path / "qw.pmem", addressing=a)
    fs, base = fsspec.filesystem("memory"), "/polymem-engine-export"
    for p in (tmp_path / "qw.pmem").rglob("*"):
        if p.is_file():
            fs.pipe_file(f"{base}/{p.relative_to(tmp_path / 'qw.pmem')}", p.read_bytes())
    try:
        code, err = run_main(["export", f"memory://{base}", "-o", str(tmp_path / "exp")], capsys, monkeypatch)
    finally:
        fs.rm(base, recursive=True)
    assert code == 0, err
    assert raw_tensors(tmp_path / "exp") == raw_tensors(src)


# ------------------------------------------------------------------------- 10. --overwrite over an input
@pytest.mark.parametrize("which", ["spec", "tokenizer", "source"])
def test_overwrite_never_replaces_a_folder_holding_an_input(tmp_path: Path, qw: tuple, which: str, capsys,
                                                            monkeypatch) -> None:
    """`-o DIR --overwrite` where DIR holds the --spec (or --tokenizer, or is the checkpoint): refused before
    anything is deleted (before: the spec was read, then its folder replaced by the asset)."""
    a, src, spec = qw
    work = tmp_path / "work"
    work.mkdir()
    if which == "spec":
        spec = Path(shutil.move(spec, work / "spec.json"))
    args = ["import", str(src), "-o", str(work), "--engine", QWEN, "--spec", str(spec), "--overwrite"]
    if which == "tokenizer":
        args += ["--tokenizer", str(_tokenizer_json(work / "tokenizer.json", 50))]
    if which == "source":
        args[3] = str(src)
    before = sorted(p.name for p in work.iterdir()), sorted(p.name for p in src.iterdir())
    code, err = run_main(args, capsys, monkeypatch)
    kind = {"spec": "the spec file", "tokenizer": "the tokenizer file", "source": "the source directory"}[which]
    assert code == 2 and ("holds an input" if which != "source" else "is an input") in err and kind in err, err
    assert (sorted(p.name for p in work.iterdir()), sorted(p.name for p in src.iterdir())) == before


def test_the_library_never_writes_over_its_own_input(tmp_path: Path, qw: tuple) -> None:
    a, src, _ = qw
    with pytest.raises(OutputError, match=r"out '.*qw' is an input of this run \(the source directory"):
        import_table(src, src, addressing=a, overwrite=True)
    assert (src / "model.safetensors").is_file()
    asset = import_table(src, tmp_path / "qw.pmem", addressing=a)
    with pytest.raises(OutputError, match=r"out_dir '.*qw.pmem' is an input of this run \(the asset directory"):
        export_table(asset, tmp_path / "qw.pmem", overwrite=True)
    assert isinstance(asset.read_rows(np.arange(3)), np.ndarray)

