"""What tests/test_fuzz_parsers.py found, each as a plain test with the minimal failing input: a parser that raised
another exception than a PolymemError (a traceback) or read a file differently in parts than whole.

Every one is fixed: each test fails on the code before its fix (docs/reliability.md, "Fuzzing"). A crash found
later and not yet fixed goes here as ``xfail(strict=True)`` with the crash named.
"""

from __future__ import annotations

import io
import json
import shutil
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest

from fuzz_seeds import seed_files, tiny_gpt
from polymem.errors import FormatError, PolymemError

DEEP = "[" * 3000 + "]" * 3000  # nested deeper than Python's JSON decoder recurses (RecursionError)
DIGITS = '{"a": ' + "1" * 5000 + "}"  # an integer of more digits than int() converts (ValueError)


# ------------------------------------------------------------------------------------------------------ fixed
@pytest.mark.parametrize("text", [DEEP, DIGITS], ids=["deep", "digits"])
@pytest.mark.parametrize("key", ["zarr.json", "pages/zarr.json"])
def test_asset_metadata_that_json_cannot_hold_is_a_format_error(tmp_path: Path, text: str, key: str) -> None:
    """Before: RecursionError / ValueError from MemoryAsset.open (polymem/asset/_validate.py)."""
    from polymem import MemoryAsset

    (_small_asset(tmp_path) / key).write_text(text)
    with pytest.raises(FormatError, match=rf"'{key}' is not (valid JSON|asset metadata).*restore the asset"):
        MemoryAsset.open(tmp_path / "a")


def _small_asset(root: Path) -> Path:
    from polymem import HashSpec, Layout, MemoryAsset

    MemoryAsset.create(root / "a", HashSpec(), Layout(pages=2, heads=1, slots=2, head_dim=8), orders=(1, 2))
    return root / "a"


def _edit_json(path: Path, fn) -> None:
    doc = json.loads(path.read_text())
    fn(doc)
    path.write_text(json.dumps(doc))


def _reseal_array_metadata(root: Path) -> None:
    """zarr.json's checksum of pages/zarr.json (and its attributes checksum) recomputed, as an attacker would."""
    from assetedit import _edit_header
    from polymem.asset._format import sha256_hex

    sha = sha256_hex((root / "pages" / "zarr.json").read_bytes())
    _edit_header(root, lambda h: h["checksums"].__setitem__("array_metadata", sha))


@pytest.mark.parametrize("field,value", [("chunk_grid", None), ("chunk_key_encoding", None), ("shape", None),
                                         ("chunk_grid", []), ("fill_value", None), ("extra", {"a": 1}),
                                         ("attributes", []), ("dimension_names", 3)])
@pytest.mark.parametrize("backend", ["auto", "zarr"])
def test_pages_metadata_of_the_wrong_type_is_a_format_error(tmp_path: Path, field: str, value: object,
                                                            backend: str) -> None:
    """pages/zarr.json with a field of the wrong type, or one zarr v3 does not define, its checksum recomputed.
    Before: AttributeError / TypeError from check_array_metadata (polymem/asset/_format.py), and zarr-python's
    MetadataValidationError from the zarr backend (polymem/asset/_zarr.py)."""
    from polymem import MemoryAsset

    root = _small_asset(tmp_path)
    _edit_json(root / "pages" / "zarr.json", lambda d: d.__setitem__(field, value))
    _reseal_array_metadata(root)
    with pytest.raises(FormatError, match=rf"pages/zarr.json field '{field}' is .*; restore the asset"):
        MemoryAsset.open(root, backend=backend)


def test_zarr_backend_refusals_are_format_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What zarr-python refuses in the metadata of an asset polymem's checks let pass is one FormatError too."""
    import zarr

    from polymem import MemoryAsset

    root = _small_asset(tmp_path)

    def refuse(*a: object, **k: object) -> None:
        raise zarr.errors.MetadataValidationError("a field zarr does not take")

    monkeypatch.setattr(zarr, "open_array", refuse)
    with pytest.raises(FormatError, match="zarr-python cannot open its pages/zarr.json .MetadataValidationError"):
        MemoryAsset.open(root, backend="zarr")


@pytest.mark.parametrize("field,value", [("shards", {"pages/c/0/0/0": 5}), ("shards", {"pages/c/0/0/0": None}),
                                         ("shards", {"pages/c/0/0/0": "abc"}), ("row_counts", [])])
def test_checksums_that_are_not_sha256_digests_are_a_format_error(tmp_path: Path, field: str, value: object) -> None:
    """checksums.shards mapping a shard to null (the header resealed): open passed and problems() raised
    TypeError slicing it (polymem/asset/core.py); now the header is refused at open."""
    from assetedit import _edit_header
    from polymem import MemoryAsset

    root = _small_asset(tmp_path)
    _edit_header(root, lambda h: h["checksums"].__setitem__(field, value))
    with pytest.raises(FormatError, match=rf"field 'checksums.{field}' .*expected an object mapping each file to its sha256"):
        MemoryAsset.open(root)


def _npz(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        for k, v in members.items():
            zf.writestr(k, v)
    return out.getvalue()


def _cache_members() -> dict[str, bytes]:
    with zipfile.ZipFile(seed_files("token_cache")[0]) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def _npy_with_header(text: str) -> bytes:
    """A version 1.0 .npy whose header dict is ``text`` (padded as numpy pads it)."""
    head = text.encode("latin-1")
    head += b" " * (-(10 + len(head) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head)) + head


@pytest.mark.parametrize("header", ["{'descr': '|u1', 'fortran_order': False, 'shape': (3, }",
                                    "{'descr': '|u1', 'fortran_order': False, 'shape': (3,)"],
                         ids=["unclosed-parenthesis", "unclosed-brace"])
def test_a_token_cache_with_a_malformed_npy_header_is_a_format_error(tmp_path: Path, header: str) -> None:
    """Before: tokenize.TokenError from numpy's header parser (its fallback re-reads a header it cannot parse with
    tokenize) escaped TokenHashes.load (polymem/_npy.py); found as one byte of the seed cache set to '{'."""
    from polymem import TokenHashes

    members = _cache_members()
    members["C.npy"] = _npy_with_header(header)
    (tmp_path / "c.npz").write_bytes(_npz(members))
    with pytest.raises(FormatError, match=r"array 'C': malformed \.npy header \(TokenError"):
        TokenHashes.load(tmp_path / "c.npz")


def _patch_central_directory(blob: bytes, offset: int, value: bytes) -> bytes:
    """``blob`` (a zip) with ``value`` written at ``offset`` of every central directory entry."""
    out, at = bytearray(blob), blob.find(b"PK\x01\x02")
    while at >= 0:
        out[at + offset:at + offset + len(value)] = value
        at = blob.find(b"PK\x01\x02", at + 4)
    return bytes(out)


@pytest.mark.parametrize("offset,value,why", [(10, struct.pack("<H", 99), "NotImplementedError"),
                                              (8, struct.pack("<H", 1), "RuntimeError: File .* is encrypted")],
                         ids=["compression-method", "encrypted"])
def test_a_token_cache_zip_that_zipfile_cannot_read_is_a_format_error(tmp_path: Path, offset: int, value: bytes,
                                                                      why: str) -> None:
    """A bit flipped in the zip's central directory: an unknown compression method (NotImplementedError) or the
    encrypted flag (RuntimeError) escaped TokenHashes.load (polymem/hash/token_hashes.py)."""
    from polymem import TokenHashes

    (tmp_path / "c.npz").write_bytes(_patch_central_directory(_npz(_cache_members()), offset, value))
    with pytest.raises(FormatError, match=rf"is not a readable .npz \({why}"):
        TokenHashes.load(tmp_path / "c.npz")


@pytest.mark.parametrize("text,why", [
    (DEEP, "corrupt header .JSON nested deeper"), (DIGITS, "corrupt header .Exceeds the limit"),
    ('{"format": "polymem.token-cache", "version": 1, "vocab_size": Infinity, "tokenizer": {"name": "b", '
     '"fingerprint": "f"}, "spec": SPEC}', r"without a valid 'vocab_size' field \(it is 'inf'; expected an integer >= 0"),
    ('{"format": "polymem.token-cache", "version": 1, "vocab_size": 256.5, "tokenizer": {"name": "b", '
     '"fingerprint": "f"}, "spec": SPEC}', r"without a valid 'vocab_size' field \(it is '256.5'"),
], ids=["deep", "digits", "inf-vocab", "float-vocab"])
def test_a_token_cache_header_json_cannot_hold_is_a_format_error(tmp_path: Path, text: str, why: str) -> None:
    """Before: RecursionError, or OverflowError from int(inf) (polymem/hash/token_hashes.py); a float vocab_size
    was cut to an integer."""
    from polymem import TokenHashes

    members = _cache_members()
    old = json.loads(np.load(io.BytesIO(members["header.npy"])).tobytes())
    buf = io.BytesIO()
    np.save(buf, np.frombuffer(text.replace("SPEC", json.dumps(old["spec"])).encode(), np.uint8))
    members["header.npy"] = buf.getvalue()
    (tmp_path / "c.npz").write_bytes(_npz(members))
    with pytest.raises(FormatError, match=why):
        TokenHashes.load(tmp_path / "c.npz")


def _site(tmp_path: Path) -> Path:
    shutil.copytree(seed_files("site")[0].parent, tmp_path / "site")
    return tmp_path / "site"


@pytest.mark.parametrize("text", [DEEP, DIGITS], ids=["deep", "digits"])
def test_eval_site_header_json_cannot_hold_is_a_format_error(tmp_path: Path, text: str) -> None:
    """Before: RecursionError / ValueError from `polymem eval --site`'s header reader (polymem/cli/cmd_eval.py)."""
    from polymem.cli.cmd_eval import _site_header

    site = _site(tmp_path)
    (site / "site.json").write_text(text)
    with pytest.raises(FormatError, match=r"site.json' is not (valid JSON|JSON|a site header)"):
        _site_header(site)


@pytest.mark.parametrize("source", [{"path": ["t.pmem"]}, {"path": 3}, {"path": ""}, [], "t.pmem", None])
def test_eval_site_table_path_that_is_not_a_string_is_one_line(tmp_path: Path, source: object) -> None:
    """Before: `table.source` a list or string was an AttributeError (.get on it), a path that is a list reached
    the asset reader; now one error line saying to pass --table."""
    from polymem.cli.cmd_eval import _table_path

    header = {"table": {"source": source, "saved": False}}
    with pytest.raises(PolymemError, match="(?i)pass --table"):
        _table_path(tmp_path, header, None)
    from polymem import HashSpec, Layout, MemoryAsset

    MemoryAsset.create(tmp_path / "t.pmem", HashSpec(), Layout(pages=4, heads=2, slots=2, head_dim=4))
    assert _table_path(tmp_path, header, str(tmp_path / "t.pmem")) == str(tmp_path / "t.pmem")
    # a relative path is relative to the site folder
    assert _table_path(tmp_path, {"table": {"source": {"path": "t.pmem"}}}, None) == str(tmp_path / "t.pmem")
    assert _table_path(tmp_path, {"table": {"saved": True}}, None) is None


def test_a_tokenizer_json_that_cannot_encode_a_character_is_a_tokenizer_error(tmp_path: Path) -> None:
    """A Unigram tokenizer.json with its unk_id set to null loads, then the Rust core raised a plain Exception
    ('Encountered an unknown token but `unk_id` is missing') from encode for a character it lacks
    (polymem/tokenizers/hf_adapter.py); found from the seed unigram.json."""
    from polymem.errors import TokenizerError
    from polymem.tokenizers import load_tokenizer

    doc = json.loads(next(f for f in seed_files("tokenizer") if f.name == "unigram.json").read_text())
    doc["model"]["unk_id"] = None
    (tmp_path / "tokenizer.json").write_text(json.dumps(doc))
    tok = load_tokenizer(tmp_path / "tokenizer.json")
    assert len(tok.encode("the ")) > 0
    for encode in (tok.encode, lambda t: tok.encode_batch([t])):
        with pytest.raises(TokenizerError, match=r"cannot encode this text: .*unk_id.* is missing"):
            encode("日本")


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_a_binary_jsonl_file_yields_nothing_in_parts_too(tmp_path: Path, suffix: str) -> None:
    """A JSONL file with a NUL byte in its first 8 KiB is skipped whole; read in partitions, the parts after the
    first yielded its later lines as documents (polymem/corpus.py). Found as the seed docs.jsonl with byte 0 set
    to NUL."""
    import gzip

    from polymem.corpus import Corpus

    body = b'\x00"id": "a"}\n{"text": "second"}\n{"text": "third"}\n'
    path = tmp_path / f"docs{suffix}"
    path.write_bytes(gzip.compress(body) if suffix.endswith(".gz") else body)
    whole = Corpus([path])
    assert list(whole) == [] and [s.reason.split(":")[0] for s in whole.skipped] == ["binary file"]
    parts = Corpus([path]).partitions(0.00001)
    skipped: list = []
    assert [d for p in parts for d in p.read(skipped)] == []
    assert [s.reason.split(":")[0] for s in skipped] == ["binary file"]


# ---------------------------------------------------------------- left: files the fuzzing harness may not fix
def test_an_index_naming_a_too_long_file_name(tmp_path: Path) -> None:
    """A checkpoint index naming a file of 300 characters: open_regular's os.stat raises OSError ENAMETOOLONG
    (polymem/engines/_files.py, open_regular), not a FormatError naming the index."""
    from polymem.engines import _safetensors as st

    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / st.INDEX).write_text(json.dumps({"weight_map": {"a.weight": "x" * 300}}))
    with pytest.raises(PolymemError):
        for f in st.find_files(tmp_path / "ckpt")[0]:
            st.read_header(f)



def test_an_index_naming_a_file_with_a_lone_surrogate(tmp_path: Path) -> None:
    """A checkpoint index whose file name holds a lone surrogate, which no file system path can encode."""
    from polymem.engines import _safetensors as st

    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / st.INDEX).write_text('{"weight_map": {"a.weight": "x\\ud800"}}')
    with pytest.raises(PolymemError):
        st.find_files(tmp_path / "ckpt")


SITE_JSON: list = [  # site.json edits the fuzzer found crashing read_site / load_attached (now one FormatError each)
    pytest.param(lambda h: [], id="json-list"),
    pytest.param(lambda h: {k: v for k, v in h.items() if k != "table"}, id="no-table"),
    pytest.param(lambda h: {**h, "table": "t.pmem"}, id="table-string"),
    pytest.param(lambda h: {**h, "layers": 5}, id="layers-int"),
    pytest.param(lambda h: {**h, "site": {**h["site"], "init_seed": 0.5}}, id="seed-float"),
    pytest.param(lambda h: {**h, "site": {**h["site"], "gate_init": ""}}, id="gate-init-empty"),
    pytest.param(lambda h: {**h, "site": {**h["site"], "gate_init": None}}, id="gate-init-null"),
    pytest.param(lambda h: {**h, "site": {**h["site"], "init_seed": "0"}}, id="seed-string"),
    pytest.param(lambda h: {**h, "layers": [""]}, id="layer-empty-name"),
    pytest.param(lambda h: {**h, "table": {**h["table"], "orders": [[1]]}}, id="orders-nested"),
    pytest.param(lambda h: {**h, "layers": ["transformer.h.0"]}, id="other-layer"),
]


@pytest.mark.parametrize("edit", SITE_JSON)
def test_load_attached_with_an_edited_site_json(tmp_path: Path, edit) -> None:
    """load_attached of the seed site with one field of site.json edited: a PolymemError, not a traceback."""
    from polymem.torch.attach import load_attached

    site = _site(tmp_path)
    header = json.loads((site / "site.json").read_text())
    (site / "site.json").write_text(json.dumps(edit(header)))
    with pytest.raises(PolymemError):
        load_attached(tiny_gpt(), site, tokenizer="bytes").detach()


SITE_FILES: list = [  # (file, bytes) given to read_site
    pytest.param("site.json", b"\xff{}", id="json-not-utf8"),
    pytest.param("site.json", DEEP.encode(), id="json-deep"),
    pytest.param("site.json", DIGITS.encode(), id="json-digits"),
    pytest.param("site.safetensors", b"", id="safetensors-empty"),
]


@pytest.mark.parametrize("name,data", SITE_FILES)
def test_read_site_of_a_damaged_file(tmp_path: Path, name: str, data: bytes) -> None:
    """read_site of the seed site with one file replaced: a PolymemError, not a traceback."""
    from polymem.torch.sitefile import read_site

    site = _site(tmp_path)
    (site / name).write_bytes(data)
    with pytest.raises(PolymemError):
        read_site(site)
