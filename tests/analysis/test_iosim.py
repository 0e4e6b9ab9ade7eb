"""iosim: LRU counts against hand-worked streams and a reference, and the uncached read counts of each layout."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polymem import HashSpec, Layout, PolymemError, TokenHashes
from polymem.asset._format import geometry
from polymem.analysis.iosim import LRUCache, lru_misses_reference, ngram_blocks, plot, simulate
from polymem.hash import reference as ref


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


def brute_force(docs, vocab, base: Layout, orders, dtype: str, cache_bytes) -> dict[str, tuple[int, int, list[int]]]:
    """An independent simulation from the definitions, in plain Python: the bytes of every n-gram, hashed by the
    spec's reference, rows from the reference layout formulas, blocks from the asset format (a float page is
    one block; NF4 packs ⌊4096 / (K·S·(r/2+2))⌋ pages into a 4 KiB block), distinct blocks of an n-gram in
    head order, and an LRU kept as a Python list. kind -> (valid n-grams, uncached reads, reads per cache)."""
    K, S, P, r = base.heads, base.slots, base.pages, base.head_dim
    page_bytes = K * S * ({"float32": 4 * r, "float16": 2 * r, "bfloat16": 2 * r}.get(dtype) or r // 2 + 2)
    pages_per_block = 4096 // page_bytes if dtype == "nf4" else 1
    block_bytes = 4096 if dtype == "nf4" else page_bytes
    rows_of = {"page-local": ref.page_local_rows, "flat": ref.flat_rows, "independent-heads": ref.independent_rows}
    spec = HashSpec()
    out = {}
    for kind, rows_fn in rows_of.items():
        stream: list[int] = []
        ngrams = 0
        for ids in docs:
            grams = ref.ngram_bytes(vocab, [int(t) for t in ids], max(orders))
            for t in range(len(ids)):
                for n in orders:
                    b = grams[t][n - 1]
                    if b is None:
                        continue
                    ngrams += 1
                    blocks: list[int] = []
                    for row in rows_fn(spec.hash_bytes(b), heads=K, slots=S, pages=P):
                        blk = row // (K * S) // pages_per_block
                        if blk not in blocks:
                            blocks.append(blk)
                    stream += blocks
        reads = []
        for cb in cache_bytes:
            cap, lru, misses = cb // block_bytes, [], 0
            for blk in stream:
                if blk in lru:
                    lru.remove(blk)
                else:
                    misses += 1
                    if cap == 0:
                        continue
                    if len(lru) == cap:
                        lru.pop(0)  # least recently used first
                lru.append(blk)
            reads.append(misses)
        out[kind] = (ngrams, len(stream), reads)
    return out


BYTES_VOCAB = [bytes([b]) for b in range(256)] + [None]


@pytest.mark.parametrize("orders,dtype,geom", [
    ((1, 2, 3), "float16", dict(pages=64, heads=4, slots=2, head_dim=8)),
    ((2, 3), "nf4", dict(pages=200, heads=8, slots=4, head_dim=16)),  # 8 pages per 4 KiB block
    ((1,), "float32", dict(pages=5, heads=3, slots=3, head_dim=4)),  # P not divisible by K
])
def test_simulate_equals_an_independent_brute_force(orders, dtype, geom):
    cache = byte_cache()
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 8, size=n) for n in (40, 120, 1, 0)]  # a small alphabet: n-grams repeat
    docs[1][60] = 256  # a special token makes the n-grams that touch it invalid
    base = Layout(**geom)
    g = geometry(base, dtype)
    cache_bytes = [0, g.chunk_bytes, 3 * g.chunk_bytes, 10 * g.chunk_bytes, 10**9]
    sim = simulate(docs, cache, base, orders=orders, dtype=dtype, cache_bytes=cache_bytes)
    expected = brute_force(docs, BYTES_VOCAB, base, orders, dtype, cache_bytes)
    for r in sim.results:
        assert (r.ngrams, r.uncached_reads, list(r.cached_reads)) == expected[r.kind], r.kind
        assert r.tokens == 161
    # the cases differ between kinds and cache sizes, so the comparison is not vacuous
    assert len({v[1] for v in expected.values()}) > 1 and len(set(expected["page-local"][2])) > 2


def test_simulate_hand_computed():
    """One token repeated: every lookup is the same n-gram. K=4 heads, float16 (one page per block), P = 8
    pages divisible by K, so independent heads read 4 distinct blocks (head k lives in pages 2k..2k+1)."""
    cache = byte_cache()
    T = 10
    base = Layout(pages=8, heads=4, slots=2, head_dim=8)
    g = geometry(base, "float16")
    sim = simulate([np.full(T, 97)], cache, base, orders=(1,), dtype="float16",
                   cache_bytes=[0, g.chunk_bytes, 3 * g.chunk_bytes, 4 * g.chunk_bytes])
    by = {r.kind: r for r in sim.results}
    assert by["page-local"].ngrams == T
    # page-local and flat: 1 block per lookup; any cache of ≥ 1 block leaves only the cold miss
    assert by["page-local"].uncached_reads == T and by["page-local"].cached_reads == (T, 1, 1, 1)
    assert by["flat"].uncached_reads == T and by["flat"].cached_reads == (T, 1, 1, 1)
    # independent heads: 4 blocks per lookup, cycled; an LRU of 1 or 3 blocks misses every time, 4 blocks only cold
    assert by["independent-heads"].uncached_reads == 4 * T
    assert by["independent-heads"].cached_reads == (4 * T, 4 * T, 4 * T, 4)
    # orders (1, 2) on "aaaa": a 2-gram "aa" from the 2nd token on, a different hash, another page
    sim2 = simulate([np.full(4, 97)], cache, base, orders=(1, 2), dtype="float16", cache_bytes=[])
    assert {r.kind: r.uncached_reads for r in sim2.results} == {"page-local": 7, "flat": 7, "independent-heads": 28}


def test_simulation_json_reports_per_token_rates():
    cache = byte_cache()
    sim = simulate([np.arange(50) % 7], cache, Layout(pages=16, heads=2, slots=2, head_dim=4), orders=(1, 2),
                   dtype="float16", cache_bytes=[64])
    d = sim.to_dict()
    for res, r in zip(d["results"], sim.results):
        assert res["uncached_reads_per_token"] == r.uncached_reads / 50
        assert res["cache"][0]["reads_per_token"] == r.cached_reads[0] / 50 and res["cache"][0]["blocks"] == 64 // 32


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
