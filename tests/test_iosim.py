"""iosim: LRU counts against hand-worked streams and a reference, and the uncached read counts of each layout."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polymem import HashSpec, Layout, PolymemError, TokenHashes
from polymem.asset._format import geometry
from polymem.analysis.iosim import LRUCache, lru_misses_reference, ngram_blocks, plot, simulate


def byte_cache() -> TokenHashes:
    # 256 byte tokens plus one special token (id 256): n-grams touching it are invalid
    return TokenHashes.from_token_bytes([bytes([b]) for b in range(256)] + [None], HashSpec(), name="toy", fingerprint="t")


@pytest.mark.parametrize(
    "stream, capacity, misses",
    [
        ([1, 2, 1, 3, 2, 1], 2, 5),  # the module docstring's example
        ([1, 2, 1, 3, 2, 1], 3, 3),  # only cold misses
        ([1, 2, 1, 3, 2, 1], 1, 6),  # 1 2 1 3 2 1: every access changes block
        ([1, 1, 1, 2, 2, 1], 1, 3),
        ([1, 2, 3, 4, 1, 2, 3, 4], 3, 8),  # cyclic access one larger than the cache: LRU always misses
        ([1, 2, 3, 1, 4, 1, 2], 3, 5),  # 1 2 3 cold, 1 hit, 4 evicts 2, 1 hit, 2 evicts 3
        ([5, 5, 5], 0, 3),  # no cache: every access is a read
    ],
)
def test_lru_hand_worked(stream, capacity, misses):
    assert lru_misses_reference(stream, capacity) == misses
    lru = LRUCache(capacity, 8)
    lru.feed(np.array(stream))
    assert lru.misses == misses


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 12), max_size=200), st.integers(0, 14), st.integers(1, 5))
def test_lru_matches_reference_in_pieces(stream, capacity, pieces):
    lru = LRUCache(capacity, 13)
    for part in np.array_split(np.array(stream, dtype=np.int64), pieces):
        lru.feed(part)  # state carries across feeds
    assert lru.misses == lru_misses_reference(stream, capacity)


def test_lru_rejects_out_of_range():
    with pytest.raises(PolymemError, match=r"block ids must lie in \[0, 4\)"):
        LRUCache(2, 4).feed(np.array([4]))


def test_ngram_blocks_dedupes_within_an_ngram():
    g = geometry(Layout(pages=6, heads=2, slots=2, head_dim=4), "nf4")  # 16 B pages, all 6 in one block
    rows = np.array([[[0, 3], [5, 23]], [[-1, -1], [8, 9]]])  # [T=2, O=2, K=2]
    assert ngram_blocks(rows, g).tolist() == [0, 0, 0]
    g16 = geometry(Layout(pages=6, heads=2, slots=2, head_dim=4), "float16")  # one page per block
    assert ngram_blocks(rows, g16).tolist() == [0, 1, 5, 2]


@pytest.mark.parametrize("orders", [(1, 2, 3), (2, 3), (1,)])
def test_uncached_reads_per_token(orders):
    cache = byte_cache()
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 256, size=n) for n in (50, 300, 1)]
    docs[1][100] = 256  # a special token makes a few n-grams invalid
    base = Layout(pages=8 * 64, heads=8, slots=4, head_dim=8)  # P divisible by K: head sub-tables are page-disjoint
    sim = simulate(docs, cache, base, orders=orders, dtype="float16", cache_bytes=[0, 10**9])
    by = {r.kind: r for r in sim.results}
    # valid n-grams: order n is valid at positions >= n-1 of a document, minus those touching the special token
    T = sum(len(d) for d in docs)
    valid = sum(max(0, len(d) - n + 1) for d in docs for n in orders) - sum(n for n in orders)
    assert by["page-local"].tokens == T and by["page-local"].ngrams == valid
    assert by["page-local"].uncached_reads == valid  # one read per valid n-gram
    assert by["flat"].uncached_reads == valid
    assert by["independent-heads"].uncached_reads == 8 * valid  # K reads per valid n-gram
    for r in sim.results:
        assert r.cached_reads[0] == r.uncached_reads  # a zero-byte cache holds nothing
        assert r.cached_reads[1] <= r.uncached_reads  # a cache as large as the table: cold misses only
    # with a huge cache, reads = distinct blocks touched
    pl = by["page-local"]
    assert sim.to_dict()["results"][0]["uncached_reads_per_token"] == pytest.approx(pl.uncached_reads / T)


def test_page_local_beats_independent_heads_with_a_cache():
    cache = byte_cache()
    rng = np.random.default_rng(1)
    # a Zipf-ish stream over a small alphabet gives repeated n-grams, as text does
    docs = [np.minimum(rng.zipf(1.3, size=4000), 255) for _ in range(3)]
    base = Layout(pages=30 * 512, heads=8, slots=4, head_dim=64)
    g = geometry(base, "nf4")
    cache_bytes = [int(0.05 * g.num_chunks * g.chunk_bytes)]
    sim = simulate(docs, cache, base, orders=(2, 3), dtype="nf4", cache_bytes=cache_bytes)
    by = {r.kind: r for r in sim.results}
    assert by["page-local"].cached_reads[0] < by["independent-heads"].cached_reads[0]


def test_max_tokens_and_plot(tmp_path):
    cache = byte_cache()
    docs = [np.arange(100) % 256, np.arange(100) % 256]
    sim = simulate(docs, cache, Layout(pages=64, heads=2, slots=2, head_dim=4), orders=(1, 2), dtype="float32",
                   cache_bytes=[1024, 4096], max_tokens=150)
    assert sim.results[0].tokens == 150
    plot(sim, str(tmp_path / "p.png"))
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_iosim_json(tmp_path):
    import json

    from typer.testing import CliRunner

    from polymem.cli.app import app

    text = tmp_path / "c.jsonl"
    text.write_text("\n".join(json.dumps({"id": str(i), "text": f"def f{i % 7}(x):\n    return x + {i % 3}\n"})
                              for i in range(200)))
    out = tmp_path / "r.json"
    r = CliRunner().invoke(app, ["iosim", str(text), "--tokenizer", "bytes", "--params", "1M", "--heads", "8",
                                 "--slots", "4", "--head-dim", "64", "--orders", "2,3", "--cache-mb", "1,4",
                                 "--json", str(out), "--plot", str(tmp_path / "r.png")])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    by = {x["kind"]: x for x in doc["results"]}
    assert doc["tokenizer"]["name"] and doc["layout"]["orders"] == [2, 3]
    T = by["page-local"]["tokens"]
    assert T == sum(len(f"def f{i % 7}(x):\n    return x + {i % 3}\n".encode()) for i in range(200))
    assert by["page-local"]["uncached_reads"] == by["page-local"]["ngrams"]
    assert by["independent-heads"]["uncached_reads"] <= 8 * by["page-local"]["ngrams"]
    assert [c["bytes"] for c in by["flat"]["cache"]] == [1 << 20, 4 << 20]
    assert (tmp_path / "r.png").exists()


def test_cli_iosim_takes_geometry_from_asset(tmp_path):
    import json

    from typer.testing import CliRunner

    from polymem import MemoryAsset
    from polymem.cli.app import app

    layout = Layout(pages=300, heads=4, slots=2, head_dim=8)
    MemoryAsset.create(tmp_path / "a", HashSpec(), layout, dtype="float16", orders=(1, 3))
    (tmp_path / "t.txt").write_text("the cat sat on the mat; the cat sat on the hat. " * 20)
    out = tmp_path / "r.json"
    r = CliRunner().invoke(app, ["iosim", str(tmp_path / "t.txt"), "--tokenizer", "bytes", "--asset",
                                 str(tmp_path / "a"), "--cache-mb", "1", "--json", str(out)])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert doc["layout"]["pages"] == 300 and doc["layout"]["orders"] == [1, 3] and doc["dtype"] == "float16"
    assert doc["block_bytes"] == 4 * 2 * 8 * 2
    by = {x["kind"]: x for x in doc["results"]}
    T = by["page-local"]["tokens"]
    assert by["page-local"]["uncached_reads"] == T + (T - 2)  # order 1 everywhere, order 3 from the 3rd byte
