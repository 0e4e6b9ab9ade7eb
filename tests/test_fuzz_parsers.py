"""Fuzzing every parser of untrusted input (docs/reliability.md, "Fuzzing"): safetensors and GGUF headers, checkpoint
indexes and engine import, asset headers and zarr.json, site folders, model cache entries, training checkpoints,
prompts files, token caches, tokenizer files and corpora (files swapped for FIFOs, links and huge files too).

Each target starts from small valid files made by the real writers (tests/data/fuzz/, see tests/fuzz_seeds.py; assets
are written here with polymem's own API), mutates them (tests/fuzzing.py: byte flips, truncation, a JSON field
replaced by a wrong type, a huge, negative or float number, a list for an object, a key given twice, ...) and checks
the rule: the parser returns a correct result or raises a PolymemError, never another exception, never a hang, and
never writes outside its target. Default tier: a few examples per target, the same ones every run;
POLYMEM_FUZZ_EXAMPLES=2000 runs that many per target from a random start. Crashes found are pinned by plain tests in
tests/test_fuzz_found.py.
"""

from __future__ import annotations

import json
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzz_inputs import (cache_entry, checkpoints, corpus_files, make_assets, mutate_asset, mutate_cache_entry,
                         mutate_checkpoint, mutate_site, mutate_token_cache, mutated_gguf, mutated_safetensors,
                         prompts_file, qwen_checkpoint, small_qwen, swap_kind)
from fuzz_seeds import SITE_LAYOUT, seed_files, tiny_gpt
from fuzzing import Watch, budget, dumps, fuzz, mutate_bytes, mutate_json, refused_or
from polymem.asset._format import sha256_hex
from polymem.engines import _gguf
from polymem.engines import _safetensors as st_file


def _fresh() -> Path:
    """A fresh directory for one example (hypothesis runs many examples in one call of the test function)."""
    return Path(tempfile.mkdtemp(prefix="polymem-fuzz-"))


def _done(d: Path) -> None:
    shutil.rmtree(d, ignore_errors=True)


# ------------------------------------------------------------------------------------------------ safetensors
def check_safetensors_result(path: Path, result: tuple[dict[str, str], dict[str, st_file.Tensor]]) -> None:
    """What read_header promises: string metadata, every tensor inside the file's data, no two sharing a byte."""
    meta, tensors = result
    size = path.stat().st_size
    n = struct.unpack("<Q", path.read_bytes()[:8])[0]
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items())
    spans = sorted((t.start, t.start + t.nbytes) for t in tensors.values() if t.nbytes)
    for (a, b), (c, _) in zip(spans, spans[1:]):
        assert b <= c, spans
    assert all(8 + n <= a and b <= size for a, b in spans), (spans, n, size)


@fuzz(80)
@given(data=st.data(), seed=st.sampled_from(seed_files("safetensors")))
def test_safetensors_headers(data: st.DataObject, seed: Path) -> None:
    """engines' safetensors header reader on a mutated file (or header JSON with its length written back)."""
    d = _fresh()
    try:
        (d / "x.safetensors").write_bytes(mutated_safetensors(data, seed))
        with Watch(d):
            result = refused_or(st_file.read_header, d / "x.safetensors")
        if result is not None:
            check_safetensors_result(d / "x.safetensors", result)
    finally:
        _done(d)


# Crashes a fuzz target tolerates while a strict xfail test in tests/test_fuzz_found.py pins them:
# (exception, file, function) -> the test. None is left.
KNOWN_ENGINE_CRASHES: dict[tuple[str, str, str], str] = {}  # every crash found there is fixed
INDEX = {"metadata": {"total_size": 96}, "weight_map": {"a.weight": "polymem.safetensors",
                                                        "x": "library.safetensors"}}


@fuzz(50)
@given(data=st.data())
def test_checkpoint_index(data: st.DataObject) -> None:
    """A checkpoint folder's model.safetensors.index.json, mutated (file names included: '../x', '/etc/passwd'):
    find_files names only the folder's own files, and each reads or is refused."""
    d = _fresh()
    try:
        (d / "ckpt").mkdir()
        for f in seed_files("safetensors"):
            shutil.copy(f, d / "ckpt" / f.name)
        shutil.copy(seed_files("safetensors")[0], d / "outside.safetensors")
        (d / "ckpt" / st_file.INDEX).write_text(dumps(mutate_json(data, INDEX)))
        with Watch(d):
            found = refused_or(st_file.find_files, d / "ckpt", known=KNOWN_ENGINE_CRASHES)
            for f in found[0] if found else []:
                assert f.resolve().parent == (d / "ckpt").resolve(), f
                refused_or(st_file.read_header, f, known=KNOWN_ENGINE_CRASHES)
    finally:
        _done(d)


# ------------------------------------------------------------------------------------------------------ GGUF
@fuzz(80)
@given(data=st.data(), seed=st.sampled_from(seed_files("gguf")))
def test_gguf_headers(data: st.DataObject, seed: Path) -> None:
    """engines' GGUF reader and the model loader's first check (models.registry.check_gguf_header)."""
    from polymem.models.registry import check_gguf_header

    d = _fresh()
    try:
        path = d / "x.gguf"
        path.write_bytes(mutated_gguf(data, seed))
        with Watch(d):
            refused_or(check_gguf_header, path)
            refused_or(_gguf.is_gguf, path)
            h = refused_or(_gguf.read_header, path)
            if h is not None:
                assert h.alignment > 0 and h.alignment % 8 == 0 and h.data_start % h.alignment == 0
                for t in h.tensors.values():
                    assert t.start >= h.data_start and (t.start - h.data_start) % h.alignment == 0
                    assert 1 <= len(t.dims) <= _gguf.MAX_DIMS
                    refused_or(_gguf.check_tensor, h, t)
                    _gguf.nbytes(t)
                _gguf.recorded_metadata(h)
                h.get("general.alignment")
    finally:
        _done(d)


# --------------------------------------------------------------------------------------------- engine import
@fuzz(25)
@given(data=st.data())
def test_engine_import(data: st.DataObject) -> None:
    """`polymem import` of a Qwen PLE checkpoint whose header was mutated: an asset at the output (that opens, with
    the table's rows) or a refusal, and nothing written anywhere but the output."""
    from polymem.asset.core import MemoryAsset
    from polymem.engines.io import import_table

    d = _fresh()
    try:
        a = small_qwen()
        qwen_checkpoint(d / "qw", a)
        f = d / "qw" / "model.safetensors"
        f.write_bytes(mutated_safetensors(data, f))
        with Watch(d, allowed=("out.pmem",)):
            asset = refused_or(import_table, d / "qw", d / "out.pmem", addressing=a)
        leftovers = sorted(p.name for p in d.iterdir() if p.name not in ("qw", "out.pmem"))
        assert not leftovers, leftovers
        if asset is not None:
            assert MemoryAsset.open(d / "out.pmem").problems() == []
        else:
            assert not (d / "out.pmem").exists()
    finally:
        _done(d)


# ----------------------------------------------------------------------------------------------------- assets
@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, np.ndarray]]:
    """The small real assets the asset targets mutate copies of (fuzz_inputs.make_assets)."""
    return make_assets(tmp_path_factory.mktemp("assets"))


@fuzz(100)
@given(data=st.data(), name=st.sampled_from(["f32", "nf4", "fp8", "sparse"]), backend=st.sampled_from(["auto", "zarr"]))
def test_asset_open(assets: dict[str, tuple[Path, np.ndarray]], data: st.DataObject, name: str, backend: str) -> None:
    """MemoryAsset.open of an asset with a mutated header or metadata, then reading every page and problems()."""
    from polymem import MemoryAsset

    src, pages = assets[name]
    d = _fresh()
    try:
        shutil.copytree(src, d / "a")
        mutate_asset(data, d / "a")
        with Watch(d):
            a = refused_or(MemoryAsset.open, d / "a", backend=backend)
            if a is not None:
                got = refused_or(a.read_pages, np.arange(a.layout.pages))
                refused_or(a.problems)
                orig = MemoryAsset.open(src)
                if got is not None and a.geometry == orig.geometry and a.layout == orig.layout:
                    assert np.array_equal(got, pages, equal_nan=True)
                a.close()
    finally:
        _done(d)


@fuzz(30)
@given(data=st.data(), name=st.sampled_from(["f32", "sparse"]), old_copy=st.booleans())
def test_asset_repair(assets: dict[str, tuple[Path, np.ndarray]], data: st.DataObject, name: str,
                      old_copy: bool) -> None:
    """`polymem verify --repair` (MemoryAsset.repair) of an asset holding a mutated page-write marker (keys such as
    '../outside', '/etc/passwd'), then open: nothing outside the asset is touched, and the asset opens or is refused."""
    from polymem import MemoryAsset
    from polymem.asset._format import WRITING_MARKER

    src, pages = assets[name]
    d = _fresh()
    try:
        shutil.copytree(src, d / "a")
        (d / "outside").write_text("must stay")
        key = "pages/c/0/0/0"
        if old_copy:  # the shard as an interrupted swap leaves it: the old one beside the new
            shutil.copy(d / "a" / key, d / "a" / (key + ".old"))
        marker = {"replacing": [key], "new_zarr_json_sha256": sha256_hex((d / "a" / "zarr.json").read_bytes())}
        (d / "a" / WRITING_MARKER).write_text(dumps(mutate_json(data, marker)))
        with Watch(d, allowed=("a",)):
            refused_or(MemoryAsset.repair, d / "a", lock_timeout=1)
        with Watch(d):
            a = refused_or(MemoryAsset.open, d / "a")
            if a is not None:
                got = refused_or(a.read_pages, np.arange(a.layout.pages))
                assert got is None or np.array_equal(got, pages, equal_nan=True)
                a.close()
    finally:
        _done(d)


# ------------------------------------------------------------------------------------------------ site folders
# Site files: every crash the fuzzer found there is fixed (tests/test_fuzz_found.py); none is tolerated.
KNOWN_SITE_CRASHES: dict[tuple[str, str, str], str] = {}


@fuzz(50)
@given(data=st.data())
def test_site_folders(data: st.DataObject) -> None:
    """A saved site with a mutated site.json or site.safetensors: `polymem eval --site`'s header reader, read_site
    and load_attached (onto the model it was saved from)."""
    from polymem._io import check_outputs_not_inputs
    from polymem.cli.cmd_eval import _site_header, _table_path
    from polymem.torch.attach import load_attached
    from polymem.torch.sitefile import read_site

    d = _fresh()
    try:
        site = d / "site"
        shutil.copytree(seed_files("site")[0].parent, site)
        mutate_site(data, site)
        swap_kind(data, site / data.draw(st.sampled_from(["site.json", "site.safetensors"])), d / "outside.json")
        with Watch(d):
            refused_or(check_outputs_not_inputs, {"--json": str(d / "report.json")}, [("site", site)])
            header = refused_or(_site_header, site)
            if header is not None:
                assert isinstance(header, dict) and isinstance(header["table"], dict)
                path = refused_or(_table_path, site, header, None)
                assert path is None or isinstance(path, str)
            refused_or(read_site, site, known=KNOWN_SITE_CRASHES)
            h = refused_or(load_attached, tiny_gpt(), site, tokenizer="bytes", known=KNOWN_SITE_CRASHES)
            if h is not None:
                h.detach()
    finally:
        _done(d)


# ------------------------------------------------------------------------------------------ model cache entries
@fuzz(40)
@given(data=st.data())
def test_model_cache_entries(data: st.DataObject) -> None:
    """A weights-cache entry with a mutated manifest (its crc kept or recomputed), a mutated file, or a file that is
    a FIFO, a link outside or 1 GiB: read_manifest reads it back or says why it is damaged (the ValueError the
    cache turns into one note), and `polymem models`' listing never fails."""
    import os

    from polymem.errors import PolymemError
    from polymem.models._entry import read_manifest
    from polymem.models.cache import list_entries

    def read_or_refuse(folder: Path, manifest: str, fmt: int, fields: dict[str, Any]) -> Any:
        try:
            return read_manifest(folder, manifest, fmt, fields)
        except ValueError as e:
            if isinstance(e, (UnicodeError, json.JSONDecodeError)):  # the reader's own words, not a stray decoder's
                raise
            raise PolymemError(str(e)) from None

    d = _fresh()
    old = os.environ.get("POLYMEM_CACHE_DIR")
    os.environ["POLYMEM_CACHE_DIR"] = str(d)
    try:
        folder, manifest, fmt, fields = cache_entry(d)
        mutate_cache_entry(data, folder, manifest)
        with Watch(d):
            meta = refused_or(read_or_refuse, folder, manifest, fmt, fields)
            if meta is not None:  # accepted: exactly the files it lists, each regular
                assert sorted(meta["files"]) == sorted(p.name for p in folder.iterdir() if p.name != manifest)
                assert all((folder / n).is_file() and not (folder / n).is_symlink() for n in meta["files"])
            with budget():
                listed = list_entries()
            assert [e.path for e in listed if e.kind == "weights"] == [folder]
    finally:
        if old is None:
            del os.environ["POLYMEM_CACHE_DIR"]
        else:
            os.environ["POLYMEM_CACHE_DIR"] = old
        _done(d)


# ------------------------------------------------------------------------------------------ training checkpoints
@fuzz(25)
@given(data=st.data())
def test_checkpoint_files(data: st.DataObject) -> None:
    """A training checkpoint with a mutated state.json, a mutated file (dense, rows, the table's asset) or a file
    swapped for a FIFO, a link or 1 GiB: resume restores a run that fits its schema or raises a PolymemError."""
    from fuzz_inputs import CKPT_STEPS

    d = _fresh()
    try:
        p = d / "out.pmem.ckpt"
        checkpoints(p).save(4, [2.0, 1.5, 1.25, 1.0], 3.5)
        mutate_checkpoint(data, p)
        with Watch(d):
            got = refused_or(checkpoints(p).resume)
        if got is not None:
            assert isinstance(got["step"], int) and 1 <= got["step"] < CKPT_STEPS
            assert len(got["losses"]) == got["step"] and got["train_s"] >= 0
    finally:
        _done(d)


# ------------------------------------------------------------------------------------------------ prompts files
@fuzz(40)
@given(data=st.data())
def test_prompts_files(data: st.DataObject) -> None:
    """`polymem generate --prompts`' reader on mutated text, a FIFO, a link or a 1 GiB file: prompts or one error."""
    from polymem.models.generate import read_prompts

    d = _fresh()
    try:
        prompts_file(data, d / "p.txt")
        with Watch(d):
            got = refused_or(read_prompts, d / "p.txt")
        assert got is None or all(isinstance(t, str) and t.strip() for t in got)
    finally:
        _done(d)


# ------------------------------------------------------------------------------------------------ token caches
@fuzz(80)
@given(data=st.data(), with_tokenizer=st.booleans())
def test_token_caches(data: st.DataObject, with_tokenizer: bool) -> None:
    """TokenHashes.load of a mutated `polymem build-cache` file; a loaded cache hashes n-grams."""
    from polymem import TokenHashes

    d = _fresh()
    try:
        path = d / "cache.npz"
        path.write_bytes(mutate_token_cache(data, seed_files("token_cache")[0]))
        with Watch(d):
            cache = refused_or(TokenHashes.load, path, tokenizer="bytes" if with_tokenizer else None)
            if cache is not None:
                assert cache.C.shape == cache.L.shape == cache.P.shape == cache.special.shape
                if cache.vocab_size > 3:
                    h, v = cache.ngram_hashes([1, 2, 3], 2)
                    assert h.shape == v.shape == (3, 2)
    finally:
        _done(d)


# ------------------------------------------------------------------------------------------------- tokenizers
@pytest.mark.filterwarnings("ignore:tokenizer .* is not byte-faithful")
@fuzz(60)
@given(data=st.data(), seed=st.sampled_from(seed_files("tokenizer")))
def test_tokenizer_files(data: st.DataObject, seed: Path) -> None:
    """load_tokenizer of a mutated tokenizer.json (or .tiktoken); a loaded tokenizer encodes, has its byte map and
    fingerprint, and builds a token-hash cache; or it raises a TokenizerError."""
    from polymem import TokenHashes
    from polymem.tokenizers import load_tokenizer

    d = _fresh()
    try:
        path = d / seed.name
        if seed.suffix == ".json" and data.draw(st.integers(0, 3)):
            path.write_text(dumps(mutate_json(data, json.loads(seed.read_text()))), encoding="utf-8",
                            errors="surrogatepass")
        else:
            path.write_bytes(mutate_bytes(data, seed.read_bytes()))
        with Watch(d):
            tok = refused_or(load_tokenizer, path)
            if tok is not None:
                ids = refused_or(tok.encode, "Hello wörld, 123 — 日本\n")
                table = refused_or(tok.all_token_bytes)
                if table is not None:
                    assert len(table) == tok.vocab_size
                    assert all(b is None or isinstance(b, bytes) for b in table)
                if ids is not None:
                    assert all(0 <= i < tok.vocab_size for i in ids)
                refused_or(lambda: tok.fingerprint)
                refused_or(TokenHashes.build, tok)
    finally:
        _done(d)


# ----------------------------------------------------------------------------------------------------- corpora
@fuzz(80)
@given(data=st.data(), skip_bad_utf8=st.booleans())
def test_corpus_readers(data: st.DataObject, skip_bad_utf8: bool) -> None:
    """Corpus over generated and mutated files never raises mid-stream: every document is non-empty UTF-8 text of
    at most max_document_bytes, read the same way whole and in partitions; read_documents returns or refuses."""
    from polymem.corpus import Corpus
    from polymem.recipes.data import read_documents

    d = _fresh()
    try:
        paths = corpus_files(data, d)
        policy = "skip" if skip_bad_utf8 else "replace"
        with Watch(d):
            c = Corpus(paths, max_document_bytes=200, invalid_utf8=policy)
            docs = refused_or(list, c)
            assert docs is not None, "the corpus reader raised mid-stream"
            for doc in docs:
                assert doc.text and isinstance(doc.text, str) and len(doc.text.encode("utf-8")) <= 200
                assert not (skip_bad_utf8 and doc.replaced)
            parts = Corpus(paths, max_document_bytes=200, invalid_utf8=policy).partitions(0.00005)
            skipped: list[Any] = []
            split = [doc for p in parts for doc in p.read(skipped)]
            # (a document's id may differ: a part read from a byte offset names lines by offset, FILE@BYTE)
            files = {p.name: p.read_bytes() for p in paths}
            assert [(x.text, x.replaced) for x in split] == [(x.text, x.replaced) for x in docs], (files, c.skipped)
            got = refused_or(read_documents, paths)
            assert got is None or got == [x.text for x in list(Corpus(paths))]
    finally:
        _done(d)


def test_every_seed_parses() -> None:
    """The unmutated seeds are accepted (else the fuzzer only ever tests the first refusal)."""
    from polymem import TokenHashes
    from polymem.cli.cmd_eval import _site_header
    from polymem.corpus import Corpus
    from polymem.models.registry import check_gguf_header
    from polymem.tokenizers import load_tokenizer
    from polymem.torch.sitefile import read_site

    for f in seed_files("safetensors"):
        check_safetensors_result(f, st_file.read_header(f))
    for f in seed_files("gguf"):
        check_gguf_header(f)
        assert _gguf.read_header(f).tensors
    assert TokenHashes.load(seed_files("token_cache")[0], tokenizer="bytes").vocab_size == 256
    for f in seed_files("tokenizer"):
        assert load_tokenizer(f).vocab_size >= 100
    site = seed_files("site")[0].parent
    assert _site_header(site)["table"]["layout"]["pages"] == SITE_LAYOUT["pages"]
    assert read_site(site)[1]
    assert len(list(Corpus(seed_files("corpus")))) == 7


def test_every_known_crash_is_pinned() -> None:
    """Each crash the fuzz targets let pass (KNOWN_*_CRASHES) names its strict xfail test in test_fuzz_found.py."""
    import test_fuzz_found as found

    ids = {p.id for p in found.SITE_JSON + found.SITE_FILES}
    for name in [*KNOWN_SITE_CRASHES.values(), *KNOWN_ENGINE_CRASHES.values()]:
        func, _, param = name.partition("[")
        assert callable(getattr(found, func, None)), name
        assert not param or param.rstrip("]") in ids, name
