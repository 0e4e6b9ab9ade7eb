"""The hash spec: golden vectors, reference == numba == numpy == torch, concatenation, normalisers, errors."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polymem import HashSpec, Layout, TokenHashes
from polymem.hash import reference as ref
from polymem.errors import FormatError, PolymemError
from polymem.hash.spec import (
    MASK64,
    MIN_BASE_ORDER_LOG2,
    NORMALIZERS,
    base_order_log2,
    finalize,
    normalize_bytes,
    splitmix64,
)
from polymem.torch.hash import TorchTokenHashes

GOLDEN = json.loads((Path(__file__).parents[1] / "data" / "hash_golden_v1.json").read_text())
SPEC = HashSpec()
HYP = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _h(x: str | None) -> int | None:
    return None if x is None else int(x, 16)


# ------------------------------------------------------------------------------------------- golden
def test_golden_spec_is_the_default_spec() -> None:
    assert SPEC.to_dict() == GOLDEN["spec"]
    assert SPEC.spec_id == GOLDEN["spec_id"]


def test_splitmix64_matches_the_published_sequence() -> None:
    # the reference splitmix64 test vector for seed 1234567
    s, out = 1234567, []
    for _ in range(3):
        s, v = splitmix64(s)
        out.append(v)
    assert out == [6457827717110365317, 3203168211198807973, 9817491932198370423]


@pytest.mark.parametrize("case", GOLDEN["hash_bytes"], ids=lambda c: c["bytes_hex"][:16] or "empty")
def test_golden_hash_bytes(case: dict) -> None:
    assert SPEC.hash_bytes(bytes.fromhex(case["bytes_hex"])) == int(case["hash"], 16)


def test_golden_hash_by_hand() -> None:
    # Hash(b"ab") = h[a]·base² + h[b]·base, computed here straight from the definition
    t, b = SPEC.byte_table, SPEC.base
    assert SPEC.hash_bytes(b"ab") == (t[ord("a")] * b * b + t[ord("b")] * b) & MASK64
    assert SPEC.hash_bytes(b"") == 0


def test_golden_normalizer_and_finalizer_and_rows() -> None:
    lower = HashSpec(normalizer="ascii-lower")
    for case in GOLDEN["hash_bytes_ascii_lower"]:
        assert lower.hash_bytes(bytes.fromhex(case["bytes_hex"])) == int(case["hash"], 16)
    for case in GOLDEN["finalize"]:
        assert finalize(int(case["hash"], 16), case["stream"]) == int(case["out"], 16)
    fns = {"page-local": ref.page_local_rows, "flat": ref.flat_rows, "independent-heads": ref.independent_rows}
    for kind, case in GOLDEN["rows"].items():
        h = int(case["hash"], 16)
        assert fns[kind](h, **case["geometry"]) == case["rows"]
        layout = Layout(kind=kind, **case["geometry"])
        assert layout.rows(np.array([h], dtype=np.uint64))[0].tolist() == case["rows"]


def _golden_cache() -> tuple[TokenHashes, list[bytes | None], np.ndarray, list[list[int | None]]]:
    g = GOLDEN["ngrams"]
    vocab = [None if v is None else bytes.fromhex(v) for v in g["vocab_hex"]]
    cache = TokenHashes.from_token_bytes(vocab, SPEC, name="golden", fingerprint="-")
    expected = [[_h(x) for x in row] for row in g["hashes"]]
    return cache, vocab, np.array(g["ids"]), expected


@pytest.mark.parametrize("backend", ["reference", "numba", "numpy", "torch"])
def test_golden_ngrams_every_backend(backend: str) -> None:
    cache, vocab, ids, expected = _golden_cache()
    max_n = GOLDEN["ngrams"]["max_n"]
    if backend == "reference":
        got = ref.ngram_hashes(SPEC, lambda i: vocab[i], ids.tolist(), max_n)
        assert got == expected
        return
    if backend == "torch":
        h_t, v_t = TorchTokenHashes.from_cache(cache).ngram_hashes(torch.from_numpy(ids), max_n)
        h, v = h_t.numpy().view(np.uint64), v_t.numpy()
    else:
        h, v = cache.ngram_hashes(ids, max_n, backend=backend)
    for i, row in enumerate(expected):
        for n, x in enumerate(row):
            assert bool(v[i, n]) == (x is not None)
            assert int(h[i, n]) == (0 if x is None else x)


def test_joint_space_a_bigram_and_a_unigram_with_the_same_bytes_share_a_hash() -> None:
    cache, vocab, ids, expected = _golden_cache()
    # ids[0:2] = "a","b" (a 2-gram) and ids[2] = "ab" (a 1-gram)
    assert expected[1][1] == expected[2][0] == SPEC.hash_bytes(b"ab")


# ------------------------------------------------------------------------------- properties
token_bytes_st = st.one_of(st.none(), st.binary(min_size=0, max_size=6))
vocab_st = st.lists(token_bytes_st, min_size=1, max_size=40)


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_torch_on_every_device_matches_numba_on_real_sized_input(device: str) -> None:
    rng = np.random.default_rng(3)
    vocab = [None] + [rng.bytes(int(n)) for n in rng.integers(1, 9, size=5000)]
    cache = TokenHashes.from_token_bytes(vocab, SPEC, name="rand", fingerprint="-")
    ids = rng.integers(0, len(vocab), size=(4, 2048))
    h, v = cache.ngram_hashes(ids, 7)
    tc = TorchTokenHashes.from_cache(cache, device)
    ht, vt = tc.ngram_hashes(torch.from_numpy(ids).to(device), 7)
    np.testing.assert_array_equal(ht.cpu().numpy().view(np.uint64), h)
    np.testing.assert_array_equal(vt.cpu().numpy(), v)
    for kind in ("page-local", "flat", "independent-heads"):
        layout = Layout(pages=100_003, heads=8, slots=15, kind=kind)
        rows = tc.ngram_rows(torch.from_numpy(ids).to(device), layout, 7).cpu().numpy()
        np.testing.assert_array_equal(rows, cache.ngram_rows(ids, layout, 7))


@HYP
@given(vocab=vocab_st, data=st.data(), max_n=st.integers(1, 7), batch=st.booleans())
def test_reference_equals_numba_numpy_torch(vocab, data, max_n, batch) -> None:
    cache = TokenHashes.from_token_bytes(vocab, SPEC, name="hyp", fingerprint="-")
    T = data.draw(st.integers(0, 30))
    rows = 2 if batch else 1
    ids = np.array(
        [[data.draw(st.integers(0, len(vocab) - 1)) for _ in range(T)] for _ in range(rows)], dtype=np.int64
    )
    if not batch:
        ids = ids[0]
    h_nb, v_nb = cache.ngram_hashes(ids, max_n)
    h_np, v_np = cache.ngram_hashes(ids, max_n, backend="numpy")
    h_t, v_t = TorchTokenHashes.from_cache(cache).ngram_hashes(torch.from_numpy(ids), max_n)
    np.testing.assert_array_equal(h_nb, h_np)
    np.testing.assert_array_equal(v_nb, v_np)
    np.testing.assert_array_equal(h_nb, h_t.numpy().view(np.uint64))
    np.testing.assert_array_equal(v_nb, v_t.numpy())
    for b, seq in enumerate(ids.reshape(rows, T)):
        expected = ref.ngram_hashes(SPEC, lambda i: vocab[i], seq.tolist(), max_n)
        hb = h_nb.reshape(rows, T, max_n)[b]
        for i in range(T):
            for n in range(max_n):
                e = expected[i][n]
                assert int(hb[i, n]) == (0 if e is None else e)


@HYP
@given(a=st.binary(max_size=40), b=st.binary(max_size=40), normalizer=st.sampled_from(sorted(NORMALIZERS)))
def test_concatenation_identity(a: bytes, b: bytes, normalizer: str) -> None:
    spec = HashSpec(normalizer=normalizer)
    assert spec.hash_bytes(a + b) == spec.concat(spec.hash_bytes(a), spec.hash_bytes(b), len(b))


@HYP
@given(a=st.binary(max_size=40), b=st.binary(max_size=40), normalizer=st.sampled_from(sorted(NORMALIZERS)))
def test_every_offered_normalizer_commutes_with_concatenation(a: bytes, b: bytes, normalizer: str) -> None:
    assert normalize_bytes(normalizer, a + b) == normalize_bytes(normalizer, a) + normalize_bytes(normalizer, b)


@HYP
@given(text=st.text(max_size=30), cut=st.integers(0, 200))
def test_ascii_lower_is_safe_on_utf8_split_anywhere(text: str, cut: int) -> None:
    data = text.encode("utf-8")
    a, b = data[: cut % (len(data) + 1)], data[cut % (len(data) + 1) :]
    spec = HashSpec(normalizer="ascii-lower")
    assert spec.hash_bytes(a + b) == spec.concat(spec.hash_bytes(a), spec.hash_bytes(b), len(b))
    assert spec.hash_bytes(data) == HashSpec().hash_bytes(normalize_bytes("ascii-lower", data))


def test_unicode_normalisers_are_not_offered_because_they_break_concatenation() -> None:
    # NFKC of "e" + combining acute composes across a token boundary: norm(a‖b) != norm(a)‖norm(b)
    a, b = "e", "\u0301"
    assert unicodedata.normalize("NFKC", a + b) != unicodedata.normalize("NFKC", a) + unicodedata.normalize("NFKC", b)
    # full Unicode lowercasing is context-dependent (final sigma)
    assert ("ΟΔΟΣ").lower()[-1] == "ς" and ("Σ").lower() == "σ"
    for name in ("nfkc", "lower", "strip-accents"):
        with pytest.raises(PolymemError, match="accepted: ascii-lower"):
            HashSpec(normalizer=name)


@HYP
@given(a=st.binary(min_size=1, max_size=12), b=st.binary(min_size=1, max_size=12))
def test_leading_bytes_never_vanish(a: bytes, b: bytes) -> None:
    # h(byte) != 0 for every byte: prefixing any byte changes the hash
    assert all(v != 0 for v in SPEC.byte_table)
    assert SPEC.hash_bytes(a + b) != SPEC.hash_bytes(b) or a + b == b


# ----------------------------------------------------------------------------------- the spec
def test_spec_json_round_trip_and_equality() -> None:
    for spec in (HashSpec(), HashSpec(normalizer="ascii-lower-ws"), HashSpec(base=0x1234567, byte_seed=7)):
        back = HashSpec.from_json(spec.to_json())
        assert back == spec and back.byte_table == spec.byte_table and back.spec_id == spec.spec_id
    assert HashSpec(byte_seed=7).spec_id != HashSpec().spec_id


def test_spec_errors_name_the_value_and_the_fix() -> None:
    d = SPEC.to_dict()
    with pytest.raises(FormatError, match=r"version 2 is not supported; supported: \[1\]"):
        HashSpec.from_dict({**d, "version": 2})
    with pytest.raises(FormatError, match="format is 'other'"):
        HashSpec.from_dict({**d, "format": "other"})
    table = list(d["byte_table"])
    table[3] = "0x0000000000000001"
    with pytest.raises(FormatError, match="byte_table does not match"):
        HashSpec.from_dict({**d, "byte_table": table})
    with pytest.raises(FormatError, match="missing field 'base'"):
        HashSpec.from_dict({k: v for k, v in d.items() if k != "base"})
    with pytest.raises(PolymemError, match="must be an odd integer"):
        HashSpec(base=256)
    with pytest.raises(FormatError, match="not valid JSON"):
        HashSpec.from_json("{nope")


# ------------------------------------------------------------------------------ the base's order
def _brute_order(b: int, bits: int) -> int:
    x, k = b % (1 << bits), 1
    while x != 1:
        x, k = (x * b) % (1 << bits), k + 1
    return k


@pytest.mark.parametrize("bits", [3, 4, 7, 12])
def test_base_order_formula_matches_brute_force_on_small_rings(bits: int) -> None:
    # (Z/2^k)^* = {±1} x <5>: the formula is checked against counting powers, for every odd b
    for b in range(1, 1 << bits, 2):
        assert 1 << base_order_log2(b, bits=bits) == _brute_order(b, bits), b


def test_base_order_on_the_full_ring() -> None:
    assert base_order_log2(SPEC.base) == 60  # default: b ≡ -1 (mod 16), not (mod 32)
    assert base_order_log2(3) == base_order_log2(5) == 62  # the maximum: b ≡ 3, 5 (mod 8)
    assert base_order_log2(1) == 0 and base_order_log2(MASK64) == 1
    assert pow(SPEC.base, 1 << 60, 1 << 64) == 1 and pow(SPEC.base, 1 << 59, 1 << 64) != 1


def test_degenerate_bases_are_refused_with_the_reason() -> None:
    t = SPEC.byte_table
    # what they would do: base 1 forgets byte order, base 2^64-1 cancels a repeated byte
    assert (t[97] * 1 + t[98]) * 1 == (t[98] * 1 + t[97]) * 1  # H(ab) = H(ba) with base 1
    assert ((t[97] * MASK64 + t[97]) * MASK64) & MASK64 == 0  # H(aa) = 0 with base 2^64-1
    with pytest.raises(PolymemError, match=r"hash base 0x0000000000000001 has multiplicative order 1 "):
        HashSpec(base=1)
    with pytest.raises(PolymemError, match=r"order 2 mod 2\^64 .*at least 2\^56.*default base"):
        HashSpec(base=MASK64)
    with pytest.raises(PolymemError, match=r"order 2\^55 .*≡ 1 \(mod 2\^9\)"):
        HashSpec(base=1 + (1 << 9))
    with pytest.raises(PolymemError, match=r"order 2\^54 .*≡ -1 \(mod 2\^10\)"):
        HashSpec(base=MASK64 - (1 << 10))
    assert HashSpec(base=1 + (1 << 8)).base == 257  # order 2^56: the least accepted
    assert HashSpec(base=MASK64 - (1 << 8)).base == MASK64 - 256
    with pytest.raises(FormatError, match="order 1"):  # a stored spec is checked the same way
        HashSpec.from_dict({**SPEC.to_dict(), "base": "0x0000000000000001", "byte_table": None})


@HYP
@given(base=st.integers(0, MASK64 >> 1).map(lambda x: 2 * x + 1), a=st.binary(min_size=1, max_size=1),
       b=st.binary(min_size=1, max_size=1), seed=st.integers(0, MASK64))
def test_accepted_bases_tell_order_and_repeats_apart(base: int, a: bytes, b: bytes, seed: int) -> None:
    if base_order_log2(base) < MIN_BASE_ORDER_LOG2:
        with pytest.raises(PolymemError, match="multiplicative order"):
            HashSpec(base=base)
        return
    spec = HashSpec(base=base, byte_seed=seed)
    assert spec.hash_bytes(a + a) != 0
    assert spec.hash_bytes(a + a + a + a) != 0
    if a != b:
        assert spec.hash_bytes(a + b) != spec.hash_bytes(b + a)
        assert spec.hash_bytes(a + b + b) != spec.hash_bytes(b + b + a)


# ---------------------------------------------------------------------------------------- XOR
def test_xor_baseline_matches_its_reference_and_is_tokenizer_bound() -> None:
    from polymem.hash.xor import XorHashSpec

    xs = XorHashSpec(head_rows=1000, orders=(2, 3), heads=4)
    assert len(set(xs.primes)) == 8 and all(p <= 1000 for p in xs.primes)
    ids = np.array([5, 17, 3, 99, 3, 5])
    rows, valid = xs.rows(ids)
    offsets = np.concatenate([[0], np.cumsum(xs.primes)[:-1]])
    for t in range(len(ids)):
        for oi, n in enumerate(xs.orders):
            assert valid[t, oi] == (t >= n - 1)
            if not valid[t, oi]:
                continue
            mix = ref.xor_mix(ids[t - n + 1 : t + 1].tolist(), xs.multipliers[:n])
            for k in range(xs.heads):
                j = oi * xs.heads + k
                assert rows[t, oi, k] == offsets[j] + mix % xs.primes[j]
    assert xs.tokenizer_bound
