"""Tokenizer-bound (Engram XOR) assets, row counts, and the asset operations convert / subset / merge
(docs/asset-format.md §10-12, polymem/ops/). Real tokenizers, real zarr stores, tiny sizes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import polymem
from polymem import HashSpec, Layout, MemoryAsset
from polymem.ops.convert import convert
from polymem.ops.engram import IdTable, open_id_table, read_engram_table, write_engram_table
from polymem.ops.merge import merge
from polymem.ops.subset import subset
from polymem.errors import FormatError, PolymemError, SpecMismatchError, TokenizerBoundError
from polymem.hash.idhash import IdHashSpec
from polymem.hash.xor import XorHashSpec
from polymem.samples import sample_text
from polymem.tokenizers import load_tokenizer

DOCS = [p for p in sample_text().split("\n\n") if p.strip()]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("ops-corpus")
    p = d / "docs.jsonl"
    p.write_text("".join(json.dumps({"text": t}) + "\n" for t in DOCS[: len(DOCS) // 2]))
    return p


@pytest.fixture(scope="module")
def heldout(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("ops-heldout")
    p = d / "held.jsonl"
    p.write_text("".join(json.dumps({"text": t}) + "\n" for t in DOCS[len(DOCS) // 2 :]))
    return p


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("bytes")


def _xor_spec(tok, head_rows=211, orders=(1, 2, 3), heads=2) -> IdHashSpec:
    return IdHashSpec.from_xor(XorHashSpec(head_rows=head_rows, orders=orders, heads=heads),
                               tokenizer={"name": tok.name, "fingerprint": tok.fingerprint}, vocab_size=tok.vocab_size)


# ------------------------------------------------------------------------------------------ id hash
def test_id_hash_residues_equal_xor_hash_spec(tok):
    xor = XorHashSpec(head_rows=97, orders=(1, 2, 3), heads=3, seed=5)
    spec = IdHashSpec.from_xor(xor, tokenizer={"name": "t", "fingerprint": "f"}, vocab_size=300)
    ids = np.random.default_rng(0).integers(0, 300, size=50)
    rows_x, valid_x = xor.rows(ids)
    offs = np.concatenate([[0], np.cumsum(xor.primes)[:-1]]).reshape(3, 3)
    rows_i, valid_i = spec.rows(ids)
    assert np.array_equal(valid_x, valid_i)
    assert np.array_equal((rows_x - offs)[valid_x], (rows_i - spec.offsets())[valid_i])
    assert (rows_i[~valid_i] == -1).all() and rows_i.max() < spec.num_rows
    assert IdHashSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


def test_id_hash_by_hand():
    spec = IdHashSpec(orders=(2,), heads=1, primes=(101,), multipliers=(3, 5), stride=101,
                      tokenizer={"name": "t", "fingerprint": "f"}, vocab_size=50)
    rows, valid = spec.rows([7, 11, 13])
    assert valid.tolist() == [[False], [True], [True]]
    assert rows[1, 0, 0] == ((11 * 3) ^ (7 * 5)) % 101 and rows[2, 0, 0] == ((13 * 3) ^ (11 * 5)) % 101


def test_torch_id_rows_match_numpy(tok):
    torch = pytest.importorskip("torch")
    from polymem.torch.idrows import TorchIdRows

    spec = _xor_spec(tok)
    special = np.zeros(tok.vocab_size, bool)
    special[5] = True
    ids = np.random.default_rng(1).integers(0, 256, size=(2, 40))
    ids[0, 10] = 5
    got = TorchIdRows.build(spec, special).ngram_rows(torch.from_numpy(ids), spec.layout(8), 3).numpy()
    for b in range(2):
        want, _ = spec.rows(ids[b], special)
        assert np.array_equal(got[b], want)
    assert (got[0, 10] == -1).all() and (got[0, 11, 1:] == -1).all() and (got[0, 12, 2] == -1).all()  # a separator
    assert (got[0, 11, 0] >= 0).all() and (got[0, 12, :2] >= 0).all() and (got[0, 13] >= 0).all()  # breaks n-grams


def test_engram_hash_matches_the_demo_formula():
    """Multipliers/primes exactly as Engram's NgramHashMapping derives them (re-derived here independently)."""
    V, seed, layer = 1000, 7, 2
    spec = IdHashSpec.engram(layer_id=layer, seed=seed, vocab_size=V, max_n=3, heads=2, order_vocab_sizes=[50, 60],
                             tokenizer={"name": "t", "fingerprint": ""}, layer_ids=[1, 2])
    half = (np.iinfo(np.int64).max // V) // 2
    r = np.random.default_rng(seed + 10007 * layer).integers(0, half, size=(3,), dtype=np.int64)
    assert spec.multipliers == tuple(int(x) * 2 + 1 for x in r)
    # primes: layer 1 takes 53, 59 (order 2) and 61, 67 (order 3); layer 2 the next unused ones
    assert spec.primes == (71, 73, 79, 83)
    x = np.array([[4, 9, 2, 9]], dtype=np.int64)
    m = np.array(spec.multipliers, dtype=np.int64)
    pad = np.pad(x, ((0, 0), (1, 0)))[:, :4]
    mix2 = (x * m[0]) ^ (pad * m[1])
    u, valid = spec.residues(x[0])
    assert np.array_equal(u[1:, 0, :], np.stack([mix2[0] % 71, mix2[0] % 73], -1)[1:])


# --------------------------------------------------------------------------- tokenizer-bound assets
def test_tokenizer_bound_asset_header_and_refusals(tmp_path, tok):
    spec = _xor_spec(tok)
    lay = spec.layout(8)
    t = np.random.default_rng(0).normal(size=(lay.num_rows, 8)).astype(np.float32)
    a = MemoryAsset.from_array(tmp_path / "x.pmem", t, spec, lay, orders=(1, 2, 3))
    a = MemoryAsset.open(a.path)
    assert a.tokenizer_bound and a.header["tokenizer_bound"]["fingerprint"] == tok.fingerprint
    assert a.header["hash_spec"]["tokenizer_bound"] is True and isinstance(a.spec, IdHashSpec)
    a.verify()
    with pytest.raises(TokenizerBoundError, match="tokenizer-bound.*polymem convert"):
        a.lookup(np.array([1, 2], dtype=np.uint64))
    with pytest.raises(TokenizerBoundError):
        a.token_cache(tok)
    with pytest.raises(TokenizerBoundError):
        a.check_spec(HashSpec())
    with pytest.raises(TokenizerBoundError):
        polymem.TokenHashes.build(tok, a.spec)
    with pytest.raises(FormatError):  # a layout that does not fit the id hash
        MemoryAsset.from_array(tmp_path / "y.pmem", np.zeros((64, 8), np.float32), spec, Layout(pages=8, heads=2, slots=4, head_dim=8), orders=(1,))


def test_tokenizer_bound_header_matches_schema(tmp_path, tok):
    jsonschema = pytest.importorskip("jsonschema")
    text = (Path(__file__).parents[2] / "docs" / "asset-format.md").read_text()
    start = text.index("```json", text.index("## 8. JSON schema")) + len("```json")
    schema = json.loads(text[start : text.index("```", start)])
    spec = _xor_spec(tok)
    lay = spec.layout(4)
    a = MemoryAsset.from_array(tmp_path / "x.pmem", np.ones((lay.num_rows, 4), np.float32), spec, lay, orders=(1, 2, 3),
                               row_counts=np.arange(lay.num_rows))
    jsonschema.validate(a.header, schema)
    bad = json.loads(json.dumps(a.header))
    del bad["tokenizer_bound"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_header_without_tokenizer_bound_field_is_refused(tmp_path, tok):
    from polymem.asset._format import canonical_json, parse_header, sha256_hex

    spec = _xor_spec(tok)
    lay = spec.layout(4)
    a = MemoryAsset.from_array(tmp_path / "x.pmem", np.zeros((lay.num_rows, 4), np.float32), spec, lay, orders=(1, 2, 3))
    h = a.header
    h.pop("tokenizer_bound")  # an old writer, or an edit that hides the binding (checksum recomputed)
    h["checksums"]["attributes"] = sha256_hex(canonical_json({k: v for k, v in h.items() if k != "checksums"}))
    with pytest.raises(FormatError, match="tokenizer_bound"):
        parse_header({"polymem": h}, "x")


def test_attach_reads_tokenizer_bound_table_by_ids_only(tmp_path, tok):
    torch = pytest.importorskip("torch")
    from polymem.recipes.model import GPT, GPTConfig

    spec = _xor_spec(tok)
    lay = spec.layout(8)
    a = MemoryAsset.from_array(tmp_path / "x.pmem", np.ones((lay.num_rows, 8), np.float32), spec, lay, orders=(1, 2, 3))
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, n_used=tok.vocab_size, block_size=16, n_layer=2, n_head=2, d_model=16),
                torch.arange(tok.vocab_size))
    import dataclasses

    other = dataclasses.replace(spec, tokenizer={"name": "bytes-v0", "fingerprint": "0" * 64})
    b = MemoryAsset.from_array(tmp_path / "o.pmem", np.ones((lay.num_rows, 8), np.float32), other, lay, orders=(1, 2, 3))
    with pytest.raises(SpecMismatchError, match="tokenizer-bound to 'bytes-v0'"):
        polymem.attach(model, b, tok, layers=[1])
    h = polymem.attach(model, a, tok, layers=[1], value_init="orthogonal")
    ids = torch.tensor([list(b"hello world hello")])
    y = model(ids[:, :-1], ids[:, 1:])
    assert torch.isfinite(y).all()
    h.detach()


# ------------------------------------------------------------------------------------------ row counts
def test_row_counts_round_trip_checksum_and_zarr(tmp_path):
    zarr = pytest.importorskip("zarr")
    lay = Layout(pages=6, heads=2, slots=2, head_dim=4)
    counts = np.random.default_rng(0).integers(0, 1000, size=lay.num_rows)
    a = MemoryAsset.from_array(tmp_path / "a.pmem", np.ones((lay.num_rows, 4), np.float32), HashSpec(), lay,
                               orders=(1, 2), row_counts=counts)
    b = MemoryAsset.open(tmp_path / "a.pmem")
    assert np.array_equal(b.row_counts(), counts) and b.header["row_counts"]["total"] == counts.sum()
    assert np.array_equal(np.asarray(zarr.open_array(str(tmp_path / "a.pmem" / "counts"), mode="r")[:]), counts)
    b.write_pages([1], np.zeros((1, 4, 4), np.float32))  # page writes keep the counts
    assert np.array_equal(MemoryAsset.open(b.path).row_counts(), counts)
    b.verify()
    q, _ = b.quantize(tmp_path / "q.pmem", to="float16")
    assert np.array_equal(q.row_counts(), counts)
    f = tmp_path / "a.pmem" / "counts" / "c" / "0"
    raw = bytearray(f.read_bytes())
    raw[0] ^= 1
    f.write_bytes(bytes(raw))
    probs = MemoryAsset.open(tmp_path / "a.pmem").problems()
    assert probs and "row counts file 'counts/c/0' checksum mismatch" in probs[0]
    with pytest.raises(PolymemError, match="shape"):
        MemoryAsset.from_array(tmp_path / "c.pmem", np.ones((lay.num_rows, 4), np.float32), HashSpec(), lay,
                               orders=(1,), row_counts=counts[:-1])


def test_train_records_row_counts_and_xor_assets(corpus, tmp_path):
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    from polymem.recipes.train import MemoryConfig, TrainConfig, train_donor

    cfg = TrainConfig(steps=3, batch_size=2, block_size=32, n_layer=2, n_head=2, d_model=32)
    mem = MemoryConfig(params=64 * 4 * 8 * 3 * 2, heads=4, slots=4, head_dim=8)
    s = train_donor("bytes", [corpus], tmp_path / "x.pmem", cfg=cfg, mem=mem, hash="xor", heldout_every=3)
    a = MemoryAsset.open(s["path"])
    assert a.tokenizer_bound and a.layout.kind == "independent-heads" and a.provenance["hash"] == "xor"
    c = a.row_counts()
    nz = np.abs(a.to_numpy()).max(axis=1) > 0
    assert c.sum() > 0 and np.array_equal(c > 0, nz)  # exactly the rows the optimizer moved
    s2 = train_donor("bytes", [corpus], tmp_path / "b.pmem", cfg=cfg, mem=mem, heldout_every=3)
    b = MemoryAsset.open(s2["path"])
    assert not b.tokenizer_bound and np.array_equal(b.row_counts() > 0, np.abs(b.to_numpy()).max(axis=1) > 0)


# -------------------------------------------------------------------------------------------- convert
def _toy_source(tok, r=4, seed=0):
    spec = _xor_spec(tok, head_rows=67, orders=(1, 2), heads=2)
    lay = spec.layout(r)
    table = np.random.default_rng(seed).normal(size=(lay.num_rows, r)).astype(np.float32)
    return spec, lay, table


def test_convert_equals_occurrence_weighted_means(tmp_path, tok, corpus):
    """Every source id-row is known; the converted byte rows are the occurrence-weighted means, recomputed here
    by a plain loop over positions with the plain-Python reference hash."""
    spec, lay, table = _toy_source(tok)
    src = MemoryAsset.from_array(tmp_path / "src.pmem", table, spec, lay, orders=(1, 2))
    target = Layout(pages=16, heads=2, slots=2, head_dim=4)
    rep = convert(src.path, "bytes", [corpus], tmp_path / "out.pmem", layout=target)
    out = MemoryAsset.open(rep.path)
    got = out.to_numpy()
    hs = HashSpec()
    sums: dict[int, np.ndarray] = {}
    cnt: dict[int, int] = {}
    occ = 0
    for text in DOCS[: len(DOCS) // 2]:
        ids = tok.encode(text)
        srows, svalid = spec.rows(ids)
        for t in range(len(ids)):
            for oi, n in enumerate((1, 2)):
                if t < n - 1:
                    continue
                occ += 1
                hb = hs.hash_bytes(b"".join(tok.token_bytes(int(i)) for i in ids[t - n + 1 : t + 1]))
                trows = target.rows(np.array([hb], dtype=np.uint64))[0]
                for k in range(2):
                    sums.setdefault(int(trows[k]), np.zeros(4))
                    sums[int(trows[k])] += table[srows[t, oi, k]]
                    cnt[int(trows[k])] = cnt.get(int(trows[k]), 0) + 1
    want = np.zeros_like(got)
    for row, s in sums.items():
        want[row] = s / cnt[row]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert rep.occurrences == occ == rep.carried and rep.rows_written == len(cnt)
    assert np.array_equal(out.row_counts()[list(cnt)], [cnt[k] for k in cnt])
    assert out.provenance["convert"]["share_carried"] == 1.0 and not out.tokenizer_bound
    assert out.provenance["tokenizer"]["fingerprint"] == tok.fingerprint


def test_convert_errors(tmp_path, tok, corpus):
    spec, lay, table = _toy_source(tok)
    src = MemoryAsset.from_array(tmp_path / "src.pmem", table, spec, lay, orders=(1, 2))
    with pytest.raises(SpecMismatchError, match="fingerprint"):
        convert(src.path, "cl100k_base", [corpus], tmp_path / "o.pmem")
    with pytest.raises(SpecMismatchError, match="K and r must match"):
        convert(src.path, "bytes", [corpus], tmp_path / "o.pmem", layout=Layout(pages=4, heads=4, slots=1, head_dim=4))
    byte = MemoryAsset.create(tmp_path / "b.pmem", HashSpec(), Layout(pages=4, heads=2, slots=2, head_dim=4))
    with pytest.raises(SpecMismatchError, match="already byte-addressed"):
        convert(byte.path, "bytes", [corpus], tmp_path / "o.pmem")
    assert not (tmp_path / "o.pmem").exists()


def test_engram_safetensors_form_round_trips_and_converts(tmp_path, tok, corpus):
    V = tok.vocab_size
    spec = IdHashSpec.engram(layer_id=1, seed=0, vocab_size=V, max_n=3, heads=2, order_vocab_sizes=[50, 60],
                             tokenizer={"name": tok.name, "fingerprint": tok.fingerprint})
    table = np.random.default_rng(3).normal(size=(sum(spec.primes), 4)).astype(np.float32)
    lut = np.arange(V, dtype=np.int64)[::-1].copy()  # a compression map: hashed id = V-1-id
    p = write_engram_table(tmp_path / "engram.safetensors", table, layer_id=1, seed=0, vocab_size=V, max_n=3, heads=2,
                           order_vocab_sizes=[50, 60], tokenizer=tok.name, tokenizer_fingerprint=tok.fingerprint,
                           lookup_table=lut)
    e = read_engram_table(p)
    assert e.spec == spec and np.array_equal(e.table, table) and np.array_equal(e.id_map, lut)
    ids = np.array(tok.encode(DOCS[0]))[:30]
    rows, valid = e.rows(ids)
    u, v2 = spec.residues(lut[ids])
    offs = np.concatenate([[0], np.cumsum(spec.primes)[:-1]]).reshape(2, 2)  # the demo's MultiHeadEmbedding offsets
    assert np.array_equal(rows[valid], (u + offs)[valid]) and (rows[~valid] == -1).all()
    rep = convert(p, tok, [corpus], tmp_path / "conv.pmem", layout=Layout(pages=64, heads=2, slots=2, head_dim=4))
    assert rep.carried == rep.occurrences > 0 and rep.orders == [2, 3]
    from safetensors.numpy import load_file, save_file

    d = load_file(str(p))
    from safetensors import safe_open

    with safe_open(str(p), framework="numpy") as f:
        meta = dict(f.metadata())
    meta["seed"] = "1"
    save_file(d, str(tmp_path / "bad.safetensors"), metadata=meta)
    with pytest.raises(FormatError, match="multipliers"):
        read_engram_table(tmp_path / "bad.safetensors")


# --------------------------------------------------------------------------------------------- subset
def _byte_asset(tmp_path, name="full.pmem", seed=0, dtype="float32", zero_frac=0.0, counts=True, pages=128):
    lay = Layout(pages=pages, heads=2, slots=2, head_dim=4)
    rng = np.random.default_rng(seed)
    t = rng.normal(size=(lay.num_rows, 4)).astype(np.float32)
    if zero_frac:
        t[rng.random(lay.num_rows) < zero_frac] = 0
    c = rng.integers(0, 10, size=lay.num_rows) if counts else None
    return MemoryAsset.from_array(tmp_path / name, t, HashSpec(), lay, orders=(1, 2, 3), dtype=dtype,
                                     chunks_per_shard=16 if pages <= 128 else 1024, row_counts=c)


@pytest.mark.parametrize("dtype", ["float32", pytest.param("nf4", marks=pytest.mark.slow)])
def test_subset_serves_every_corpus_lookup_and_stores_only_kept_chunks(tmp_path, tok, corpus, heldout, dtype):
    zarr = pytest.importorskip("zarr")
    full = _byte_asset(tmp_path, dtype=dtype, pages=1 << 13, zero_frac=0.3)
    rep = subset(full, tmp_path / "sub.pmem", tokenizer=tok, corpus=[corpus], heldout=[heldout])
    sub = MemoryAsset.open(rep.path)
    assert sub.sparse and 0 < rep.pages_kept <= rep.pages_touched < full.layout.pages or dtype == "nf4"
    assert 0 < rep.chunks_kept <= full.geometry.num_chunks and rep.bytes_subset < rep.bytes_full
    assert rep.chunks_kept < full.geometry.num_chunks or dtype == "nf4"  # nf4 here: 256 pages per 4 KiB chunk
    cache = full.token_cache(tok)
    for text in DOCS[: len(DOCS) // 2]:
        h, v = cache.ngram_hashes(tok.encode(text), max_n=3)
        np.testing.assert_array_equal(sub.lookup(h, v), full.lookup(h, v))
    c, hd = rep.lookups["corpus"], rep.lookups["heldout"]
    assert c["lost_nonzero"] == 0 and c["share_nonzero_served"] == 1.0 and 0 < c["share_served"] <= 1.0
    assert hd["lookups"] > 0 and 0 <= hd["share_served"] <= 1.0
    # absent chunks are really absent: shard files hold only the kept chunks, empty shards have no file
    g = full.geometry
    stored = 0
    for s in range(g.num_shards):
        f = tmp_path / "sub.pmem" / g.shard_key(s)
        if f.exists():
            stored += (f.stat().st_size - 16 * g.chunks_per_shard - 4) // g.stride  # chunk + crc32c
    assert stored == rep.chunks_kept
    sub.verify()
    # zarr-python reads the missing chunks as zeros and the kept ones as stored
    arr = zarr.open_array(str(tmp_path / "sub.pmem" / "pages"), mode="r")
    if dtype == "float32":
        np.testing.assert_array_equal(np.asarray(arr[:]), sub.read_stored(np.arange(g.pages)))
        for p in np.linspace(0, g.pages - 1, 64).astype(int).tolist():  # the single-page path too
            np.testing.assert_array_equal(sub.read_stored([p])[0], np.asarray(arr[p]))
        dropped = np.setdiff1d(np.arange(g.pages), np.flatnonzero(np.abs(sub.to_numpy()).reshape(g.pages, -1).max(1) > 0))
        assert dropped.size and (np.asarray(arr[dropped]) == 0).all()
    back = MemoryAsset.open(tmp_path / "sub.pmem", backend="zarr")
    np.testing.assert_array_equal(back.to_numpy(), sub.to_numpy())
    from polymem.serve.service import service_for  # the page service (attach(in_memory=False)) reads sparse shards too

    svc = service_for(sub, cache_mb=1)
    ids = np.arange(g.num_chunks)
    got = np.zeros((g.num_chunks, g.chunk_bytes), np.uint8)
    assert svc.fetch_into(ids, got, background=False) is None
    again = np.zeros_like(got)  # prefetched (reader threads), all hits now
    pending = svc.fetch_into(ids, again, background=True)
    assert pending is None and np.array_equal(again, got)
    from polymem.serve.service import PageService

    nocache = PageService(sub, cache_mb=0)  # prefetched with nothing cached: the reader threads read them
    pending = nocache.fetch_into(ids, again, background=True)
    pending.wait()
    assert np.array_equal(again, got) and nocache.stats()["reads"] == g.num_chunks
    nocache.close()
    full_chunks = np.ascontiguousarray(full._reader.read_chunks(ids)).view(np.uint8).reshape(g.num_chunks, -1)
    keep = np.zeros(g.num_chunks, bool)
    keep[np.flatnonzero(np.abs(sub.to_numpy()).reshape(g.pages, -1).max(1) > 0) // g.pages_per_chunk] = True
    np.testing.assert_array_equal(got[keep], full_chunks[keep])
    assert (got[~keep] == 0).all()
    svc.close()


def test_subset_min_count_and_errors(tmp_path, tok, corpus):
    full = _byte_asset(tmp_path)
    rep = subset(full, tmp_path / "mc.pmem", min_count=9)
    sub = MemoryAsset.open(rep.path)
    c = full.row_counts().reshape(full.layout.pages, -1)
    want = (c >= 9).any(axis=1)
    got = np.abs(sub.to_numpy()).reshape(full.layout.pages, -1).max(axis=1) > 0
    assert np.array_equal(got, want) and rep.pages_kept == int(want.sum())
    with pytest.raises(PolymemError, match="already exists"):
        subset(full, tmp_path / "mc.pmem", min_count=9)
    with pytest.raises(PolymemError, match="needs a corpus"):
        subset(full, tmp_path / "x.pmem")
    with pytest.raises(PolymemError, match="read-only"):
        sub.write_pages([0], np.zeros((1, 4, 4), np.float32))
    nocount = _byte_asset(tmp_path, name="nc.pmem", counts=False)
    with pytest.raises(PolymemError, match="row counts"):
        subset(nocount, tmp_path / "y.pmem", min_count=1)
    # a tampered sparse shard is named
    g = sub.geometry
    key = next(k for k in sub.header["checksums"]["shards"])
    f = tmp_path / "mc.pmem" / key
    raw = bytearray(f.read_bytes())
    raw[0] ^= 0xFF
    f.write_bytes(bytes(raw))
    assert any(key in p for p in MemoryAsset.open(tmp_path / "mc.pmem").problems())


# ---------------------------------------------------------------------------------------------- merge
def test_merge_with_all_zero_table_returns_the_donor(tmp_path):
    donor = _byte_asset(tmp_path, name="d.pmem", zero_frac=0.5)
    zero = MemoryAsset.create(tmp_path / "z.pmem", HashSpec(), donor.layout, orders=(1, 2, 3))
    for how in ("count-weighted", "mean", "first"):
        rep = polymem.merge([zero, donor], tmp_path / f"m-{how}.pmem", how=how)
        np.testing.assert_array_equal(MemoryAsset.open(rep.path).to_numpy(), donor.to_numpy())


def test_merge_count_weighted_by_hand(tmp_path):
    lay = Layout(pages=1, heads=2, slots=2, head_dim=2)  # 4 rows
    a = np.array([[1, 1], [2, 2], [0, 0], [4, 0]], np.float32)
    b = np.array([[3, 3], [0, 0], [5, 5], [0, 8]], np.float32)
    ca, cb = np.array([1, 2, 0, 3]), np.array([3, 0, 7, 1])
    A = MemoryAsset.from_array(tmp_path / "a.pmem", a, HashSpec(), lay, orders=(1,), row_counts=ca)
    B = MemoryAsset.from_array(tmp_path / "b.pmem", b, HashSpec(), lay, orders=(2,), row_counts=cb)
    m = MemoryAsset.open(merge([A, B], tmp_path / "m.pmem").path)
    want = np.array([[(1 * 1 + 3 * 3) / 4] * 2, [2, 2], [5, 5], [(4 * 3 + 0) / 4, (0 + 8 * 1) / 4]], np.float32)
    np.testing.assert_allclose(m.to_numpy(), want)
    assert m.row_counts().tolist() == [4, 2, 7, 4] and m.orders == (1, 2)
    mean = MemoryAsset.open(merge([A, B], tmp_path / "mean.pmem", how="mean").path).to_numpy()
    np.testing.assert_allclose(mean, [[2, 2], [2, 2], [5, 5], [2, 4]])
    first = MemoryAsset.open(merge([B, A], tmp_path / "first.pmem", how="first").path).to_numpy()
    np.testing.assert_allclose(first, [[3, 3], [2, 2], [5, 5], [0, 8]])


def test_merge_refuses_mismatched_spec_or_layout(tmp_path):
    a = MemoryAsset.create(tmp_path / "a.pmem", HashSpec(), Layout(pages=4, heads=2, slots=2, head_dim=4))
    b = MemoryAsset.create(tmp_path / "b.pmem", HashSpec(), Layout(pages=8, heads=2, slots=2, head_dim=4))
    c = MemoryAsset.create(tmp_path / "c.pmem", HashSpec(normalizer="ascii-lower"), Layout(pages=4, heads=2, slots=2, head_dim=4))
    with pytest.raises(SpecMismatchError, match="layouts differ at .*pages"):
        merge([a, b], tmp_path / "o.pmem")
    with pytest.raises(SpecMismatchError, match="hash specs differ"):
        merge([a, c], tmp_path / "o.pmem")
    with pytest.raises(PolymemError, match="--how"):
        merge([a, a], tmp_path / "o.pmem", how="max")
    with pytest.raises(PolymemError, match="one of the inputs"):
        merge([a, a], a.path, overwrite=True)
    assert not (tmp_path / "o.pmem").exists()


# ------------------------------------------------------------------------------------------------ CLI
def test_cli_convert_subset_merge(tmp_path, tok, corpus, heldout):
    from polymem.cli.app import app

    runner = CliRunner()
    spec, lay, table = _toy_source(tok)
    MemoryAsset.from_array(tmp_path / "src.pmem", table, spec, lay, orders=(1, 2))
    r = runner.invoke(app, ["convert", str(tmp_path / "src.pmem"), "--tokenizer", "bytes", "--corpus", str(corpus),
                            "-o", str(tmp_path / "conv.pmem"), "--pages", "32", "--slots", "2"])
    assert r.exit_code == 0, r.output
    assert "share of n-gram occurrences carried" in r.output
    conv = MemoryAsset.open(tmp_path / "conv.pmem")
    assert conv.layout == Layout(pages=32, heads=2, slots=2, head_dim=4)
    r = runner.invoke(app, ["subset", str(tmp_path / "conv.pmem"), "--tokenizer", "bytes", "--corpus", str(corpus),
                            "--heldout", str(heldout), "-o", str(tmp_path / "sub.pmem"), "--json", str(tmp_path / "s.json")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "s.json").read_text())["pages_kept"] > 0
    r = runner.invoke(app, ["merge", str(tmp_path / "conv.pmem"), str(tmp_path / "sub.pmem"), "-o", str(tmp_path / "m.pmem")])
    assert r.exit_code == 0, r.output
    np.testing.assert_allclose(MemoryAsset.open(tmp_path / "m.pmem").to_numpy(), conv.to_numpy(), rtol=1e-6)
    r = runner.invoke(app, ["merge", str(tmp_path / "conv.pmem"), str(tmp_path / "src.pmem"), "-o", str(tmp_path / "bad.pmem")])
    assert r.exit_code == 2 and "hash specs differ" in r.output
    r = runner.invoke(app, ["merge", str(tmp_path / "conv.pmem"), str(tmp_path / "sub.pmem"), "-o", str(tmp_path / "m2.pmem"), "--how", "max"])
    assert r.exit_code == 2
