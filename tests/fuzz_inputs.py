"""How each fuzz target of tests/test_fuzz_parsers.py makes its input from a seed (tests/data/fuzz/, or an asset
written here): the format-aware mutations, on top of tests/fuzzing.py's byte and JSON mutators.

    mutated_safetensors(data, seed)     bytes flipped, or the header JSON mutated and its length written back
    mutated_gguf(data, seed)            bytes flipped, or metadata and tensor infos mutated and written back
    mutate_asset(data, root)            zarr.json's header (checksum recomputed or not), pages/zarr.json, a shard
    mutate_site / mutate_token_cache    site.json or site.safetensors; the .npz rebuilt around a changed member
    corpus_files(data, d)               JSONL / text / gzip files with good and bad lines, or a seed mutated
"""

from __future__ import annotations

import gzip
import io
import json
import struct
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import strategies as st

from fuzz_seeds import seed_files
from fuzzing import HOSTILE, Raw, dumps, mutate_bytes, mutate_json
from polymem.asset._format import canonical_json, sha256_hex
from polymem.engines import _gguf
from polymem.engines import _safetensors as st_file


def _split_safetensors(blob: bytes) -> tuple[Any, bytes]:
    n = struct.unpack("<Q", blob[:8])[0]
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def _join_safetensors(doc: Any, data: bytes) -> bytes:
    head = dumps(doc).encode("utf-8", "surrogatepass")
    head += b" " * (-len(head) % 8)
    return struct.pack("<Q", len(head)) + head + data


def mutated_safetensors(data: st.DataObject, seed: Path) -> bytes:
    """A seed's bytes mutated, or its header JSON mutated and written back with the right length."""
    blob = seed.read_bytes()
    if data.draw(st.booleans()):
        return mutate_bytes(data, blob)
    doc, rest = _split_safetensors(blob)
    return _join_safetensors(mutate_json(data, doc), rest)


def mutated_gguf(data: st.DataObject, seed: Path) -> bytes:
    """A seed's bytes mutated, or its metadata and tensor infos mutated as JSON (an alignment of 0 or 7, a value
    of another type code, huge dims, a misaligned offset, ...) and written back by polymem's GGUF writer."""
    blob = seed.read_bytes()
    if data.draw(st.booleans()):
        return mutate_bytes(data, blob, max_ops=3)
    h = _gguf.read_header(seed)
    doc = {"metadata": [[k, kind, v] for k, kind, v in h.metadata],
           "tensors": [[t.name, list(t.dims), t.ggml_type, t.start - h.data_start] for t in h.tensors.values()]}
    text = dumps(mutate_json(data, doc)).replace("NaN", "0").replace("Infinity", "0")
    try:
        doc = json.loads(text)
        tensors = [(str(n), tuple(dims), kind, off) for n, dims, kind, off in doc["tensors"]]
        head = _gguf.header_bytes(doc["metadata"], tensors, h.alignment)
    except Exception:  # noqa: BLE001 - the writer cannot write this mutation (a test input, not a parser result)
        return mutate_bytes(data, blob, max_ops=3)
    return head + blob[h.data_start:]


def small_qwen() -> Any:
    """Qwen's PLE addressing cut down: 4 primes above 200, 2 heads of orders 2 and 3, a vocabulary of 100."""
    from polymem.engines import qwen
    from polymem.engines.addressing import EngineAddressing, LayerTable

    ps = qwen.primes(4, floor=200)
    table = LayerTable(layer=qwen.LAYER, multipliers=qwen.multipliers(0, vocab_size=100), primes=ps,
                       stored_rows=-(-sum(ps) // 2) * 2)
    return EngineAddressing(name=qwen.NAME, vocab_size=100, orders=(2, 3), heads=2, layers=(table,), fill_id=0,
                            boundary_id=0)


QWEN_PREFIX = "model.language_model.layers.1.ple_embedding.ngram_embedding"


def qwen_checkpoint(root: Path, a: Any, d: int = 16) -> None:
    """Qwen's PLE table as two BF16 shards in one model.safetensors (polymem's safetensors writer)."""
    rows = a.layers[0].stored_rows // 2
    rng = np.random.default_rng(0)
    vals = (rng.standard_normal((2, rows, d)).astype("<f4").view("<u4") >> 16).astype("<u2")
    head = st_file.header_bytes({"format": "pt"}, [(f"{QWEN_PREFIX}.shard_{i}.weight", "BF16", (rows, d))
                                                    for i in range(2)])
    root.mkdir(parents=True)
    (root / "model.safetensors").write_bytes(head + vals.tobytes())


def make_assets(root: Path) -> dict[str, tuple[Path, np.ndarray]]:
    """Small real assets written with polymem's API (float32 with row counts and shards of 2 pages, nf4, fp8-e4m3,
    a sparse subset), each with its pages as read back."""
    from polymem import HashSpec, Layout, MemoryAsset
    from polymem.ops.subset import subset

    lay = Layout(pages=6, heads=2, slots=2, head_dim=8)
    rng = np.random.default_rng(0)
    tab = rng.standard_normal((lay.num_rows, lay.head_dim)).astype(np.float32)
    a = MemoryAsset.from_array(root / "f32", tab, HashSpec(), lay, orders=(1, 2), chunks_per_shard=2,
                               row_counts=rng.integers(0, 3, lay.num_rows), provenance={"tokens_seen": 5})
    a.quantize(root / "nf4", to="nf4")
    MemoryAsset.from_array(root / "fp8", np.repeat(tab, 4, axis=1), HashSpec(), Layout(pages=6, heads=2, slots=2,
                           head_dim=32), orders=(1, 2, 3), dtype="fp8-e4m3")
    subset(a, root / "sparse", min_count=2, keep_counts=True)
    out = {}
    for name in ("f32", "nf4", "fp8", "sparse"):
        x = MemoryAsset.open(root / name)
        out[name] = (root / name, x.read_pages(np.arange(x.layout.pages)))
    return out


def reseal(doc: Any, meta_bytes: bytes | None) -> Any:
    """zarr.json with its attributes checksum (and the array metadata's, given its bytes) recomputed, as an
    attacker would; left as it is where the mutation made that impossible."""
    h = doc.get("attributes", {}).get("polymem") if isinstance(doc, dict) and isinstance(doc.get("attributes"), dict) else None
    if not isinstance(h, dict) or not isinstance(h.get("checksums"), dict):
        return doc
    if meta_bytes is not None:
        h["checksums"]["array_metadata"] = sha256_hex(meta_bytes)
    try:
        body = json.loads(dumps({k: v for k, v in h.items() if k != "checksums"}))
        h["checksums"]["attributes"] = sha256_hex(canonical_json(body))
    except (ValueError, RecursionError, TypeError):
        pass
    return doc


def mutate_asset(data: st.DataObject, root: Path) -> None:
    """One of the asset's files mutated: zarr.json's header (resealed or not), pages/zarr.json (its checksum
    recomputed or not), counts metadata, or a shard's bytes."""
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    jsons = [f for f in files if f.endswith("zarr.json")]
    which = data.draw(st.sampled_from(["header", "header", "header", "json", "bytes"]))
    group = json.loads((root / "zarr.json").read_text())
    if which == "header":
        h = group["attributes"]["polymem"]
        part = data.draw(st.sampled_from(sorted(h)))
        m = mutate_json(data, {"v": h[part]})  # the field itself may be replaced or removed
        if isinstance(m, dict) and set(m) <= {"v"}:
            h[part] = m["v"] if m else h.pop(part)
        else:
            h[part] = m
        if data.draw(st.integers(0, 4)):
            group = reseal(group, None)
        (root / "zarr.json").write_text(dumps(group))
        return
    name = data.draw(st.sampled_from(jsons if which == "json" else files))
    f = root / name
    if which == "json":
        f.write_text(dumps(mutate_json(data, json.loads(f.read_text()))))
    else:
        f.write_bytes(mutate_bytes(data, f.read_bytes(), max_ops=2))
    if name == "pages/zarr.json" and data.draw(st.booleans()):
        (root / "zarr.json").write_text(dumps(reseal(group, f.read_bytes())))


def mutate_site(data: st.DataObject, d: Path) -> None:
    """The site folder ``d`` with site.json mutated as JSON (three times in four), or one of its files' bytes."""
    if data.draw(st.integers(0, 3)):
        f = d / "site.json"
        f.write_text(dumps(mutate_json(data, json.loads(f.read_text()))))
    else:
        name = data.draw(st.sampled_from(["site.json", "site.safetensors"]))
        (d / name).write_bytes(mutate_bytes(data, (d / name).read_bytes(), max_ops=2))


def _members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def mutate_token_cache(data: st.DataObject, seed: Path) -> bytes:
    """The .npz's bytes mutated, or rebuilt as a valid zip after one member changed: its JSON header, an array's
    .npy header or data, a member dropped, or an array of another dtype or length put in its place."""
    how = data.draw(st.sampled_from(["bytes", "header", "npy", "array", "drop"]))
    if how == "bytes":
        return mutate_bytes(data, seed.read_bytes())
    members = _members(seed)
    key = data.draw(st.sampled_from(sorted(members)))
    if how == "header":
        arr = np.load(io.BytesIO(members["header.npy"]))
        doc = mutate_json(data, json.loads(arr.tobytes()))
        buf = io.BytesIO()
        np.save(buf, np.frombuffer(dumps(doc).encode("utf-8", "surrogatepass"), np.uint8))
        members["header.npy"] = buf.getvalue()
    elif how == "npy":
        members[key] = mutate_bytes(data, members[key], max_ops=2)
    elif how == "array":
        old = np.load(io.BytesIO(members[key]))
        dtype = data.draw(st.sampled_from([old.dtype, np.dtype(np.float64), np.dtype(np.int64), np.dtype(np.uint8),
                                           np.dtype(np.bool_), np.dtype(">u8")]))
        n = data.draw(st.sampled_from([len(old), 0, 1, len(old) - 1, len(old) + 1]))
        new = np.resize(old, n).astype(dtype) if n else np.zeros(0, dtype)
        if data.draw(st.booleans()):
            new = new.reshape(-1, 1) if n else new
        buf = io.BytesIO()
        np.save(buf, new)
        members[key] = buf.getvalue()
    else:
        del members[key]
    out = io.BytesIO()
    method = data.draw(st.sampled_from([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED]))
    with zipfile.ZipFile(out, "w", method) as zf:
        for k, v in members.items():
            zf.writestr(k, v)
    return out.getvalue()


def _line(data: st.DataObject) -> bytes:
    """One line of a JSONL file: a good record, or one of the ways a line goes wrong."""
    kind = data.draw(st.sampled_from(["good", "good", "hostile", "list", "no-text", "bad-utf8", "long", "nul", "raw"]))
    if kind == "good":
        doc: Any = {"text": data.draw(st.text(max_size=30)), "id": data.draw(st.sampled_from([None, 1, "x", [1]]))}
    elif kind == "hostile":
        doc = {"text": data.draw(st.sampled_from(HOSTILE))}
    elif kind == "list":
        doc = ["text", "a list"]
    elif kind == "no-text":
        doc = {"txt": "missing"}
    elif kind == "raw":
        doc = data.draw(st.sampled_from([Raw('{"text": "\\ud800x"}'), Raw('{"text": "a", "text": 1}'), Raw("{")]))
    else:
        return {"bad-utf8": b'{"text": "caf\xe9 \xff"}', "long": b'{"text": "' + b"y" * 300 + b'"}',
                "nul": b'{"text": "a\x00b"}'}[kind]
    return dumps(doc).encode("utf-8", "surrogatepass")


def corpus_files(data: st.DataObject, d: Path) -> list[Path]:
    """1-3 files of the corpus readers' kinds: JSONL lines good and bad, text with invalid UTF-8, gzip (maybe
    truncated or flipped), or a seed file mutated."""
    paths = []
    for i in range(data.draw(st.integers(1, 3))):
        kind = data.draw(st.sampled_from(["jsonl", "jsonl.gz", "txt", "md", "txt.gz", "seed"]))
        if kind == "seed":
            seed = data.draw(st.sampled_from(seed_files("corpus")))
            p = d / f"f{i}-{seed.name}"
            p.write_bytes(mutate_bytes(data, seed.read_bytes()))
            paths.append(p)
            continue
        if kind.startswith("jsonl"):
            body = b"\n".join(_line(data) for _ in range(data.draw(st.integers(0, 5))))
            body += data.draw(st.sampled_from([b"\n", b"", b"\r\n"]))
        else:
            body = data.draw(st.binary(max_size=80)) if data.draw(st.booleans()) else data.draw(st.text(max_size=80)).encode()
        if kind.endswith(".gz"):
            body = gzip.compress(body, mtime=0)
            cut = data.draw(st.integers(0, len(body)))
            body = body[:cut] if data.draw(st.booleans()) else body
        p = d / f"f{i}.{kind}"
        p.write_bytes(body)
        paths.append(p)
    return paths


# ------------------------------------------------------------------------ files swapped for what they are not
def swap_kind(data: st.DataObject, path: Path, outside: Path) -> str | None:
    """One time in six: ``path`` replaced by a FIFO (no writer ever comes), a link to a file ``outside`` its
    folder, or a sparse 1 GiB file; returns what it did (None: left alone)."""
    import os

    how = data.draw(st.sampled_from([None] * 15 + ["fifo", "link", "huge"]))
    if how is None:
        return None
    if path.exists() or path.is_symlink():
        path.unlink()
    if how == "fifo":
        os.mkfifo(path)
    elif how == "link":
        outside.write_bytes(b'{"format": 2}')
        path.symlink_to(outside)
    else:
        with open(path, "wb") as f:
            f.truncate(1 << 30)
    return how


# ------------------------------------------------------------------------------------------ model cache entries
def cache_entry(root: Path) -> tuple[Path, str, int, dict[str, Any]]:
    """A weights-cache entry as the cache writes it (``write_entry``: files, then the manifest with every size and
    crc32c and its own crc): (folder, manifest name, format, the kind's declared fields)."""
    from polymem.models import _weightcache
    from polymem.models._entry import write_entry

    folder = root / "models" / "weights" / f"{'ab' * 32}-float32-transformers-4.0"

    def fill(tmp: Path) -> dict[str, Any]:
        (tmp / "config.json").write_text('{"model_type": "llama"}')
        (tmp / "model.safetensors").write_bytes(bytes(range(256)) * 4)
        return {"format": _weightcache._FORMAT, "gguf_sha256": "ab" * 32, "source": "tiny.gguf", "dtype": "float32",
                "transformers": "4.0", "safetensors": "0.4", "class": "LlamaForCausalLM", "weights": ["a", "b"]}

    assert write_entry(folder, _weightcache.MANIFEST, fill) is None
    return folder, _weightcache.MANIFEST, _weightcache._FORMAT, _weightcache._fields()


def mutate_cache_entry(data: st.DataObject, folder: Path, manifest: str) -> None:
    """The manifest mutated as JSON (its crc32c kept, or recomputed so the schema is what refuses it), one file's
    bytes mutated, or a file swapped for a FIFO, a link outside or a huge file."""
    from polymem.models._entry import manifest_crc

    how = data.draw(st.sampled_from(["json", "json", "json-sealed", "bytes", "kind"]))
    f = folder / manifest
    if how.startswith("json"):
        doc = mutate_json(data, json.loads(f.read_text()))
        if how == "json-sealed" and isinstance(doc, dict):
            doc["manifest_crc32c"] = manifest_crc(doc)
        f.write_text(dumps(doc))
        return
    name = data.draw(st.sampled_from([manifest, "config.json", "model.safetensors"]))
    if how == "bytes":
        (folder / name).write_bytes(mutate_bytes(data, (folder / name).read_bytes(), max_ops=2))
    else:
        swap_kind(data, folder / name, folder.parent.parent.parent / "outside.json") or (folder / name).unlink()


# ------------------------------------------------------------------------------------------ training checkpoints
CKPT_STEPS = 10


def checkpoints(path: Path) -> Any:
    """A :class:`~polymem.recipes.checkpoint.Checkpoints` of a small run (a table with its row-wise optimizer, a
    linear layer with AdamW, 10 steps) at ``path``."""
    import torch

    from polymem.hash.layout import Layout
    from polymem.hash.spec import HashSpec
    from polymem.recipes.checkpoint import Checkpoints
    from polymem.torch.optim import SparseRowRMS
    from polymem.torch.tables import TrainableTable

    torch.manual_seed(0)
    table = TrainableTable(None, spec=HashSpec(), layout=Layout.for_params(64 * 4 * 4 * 8, heads=4, slots=4, head_dim=8),
                           orders=(1, 2))
    lin = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(lin.parameters())
    lin(torch.ones(1, 3)).sum().backward()
    opt.step()
    return Checkpoints(path, every=2, key="k", modules={"m": lin}, opt=opt, table=table,
                       topt=SparseRowRMS([table.weight]), steps=CKPT_STEPS)


def mutate_checkpoint(data: st.DataObject, path: Path) -> None:
    """state.json mutated as JSON, a file's bytes mutated (state, dense, a row file, the table's zarr.json), or a
    file swapped for a FIFO, a link outside or a huge file."""
    how = data.draw(st.sampled_from(["json", "json", "bytes", "kind"]))
    if how == "json":
        f = path / "state.json"
        f.write_text(dumps(mutate_json(data, json.loads(f.read_text()))))
        return
    files = sorted(p for p in path.rglob("*") if p.is_file())
    f = data.draw(st.sampled_from(files))
    if how == "bytes":
        f.write_bytes(mutate_bytes(data, f.read_bytes(), max_ops=2))
    else:
        swap_kind(data, f, path.parent / "outside.bin") or f.unlink()


# ------------------------------------------------------------------------------------------------ prompts files
PROMPTS = "def f(x):\n\n  return x ** 2  # naïve café\n日本語\r\n\tlast line".encode()


def prompts_file(data: st.DataObject, path: Path) -> None:
    """A prompts file: the seed text mutated as bytes, or swapped for a FIFO, a link or a huge file."""
    path.write_bytes(mutate_bytes(data, PROMPTS))
    swap_kind(data, path, path.parent / "outside.txt")
