"""CLI: build-cache, demo, tokenizers list/check — through typer's CliRunner on the real app."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from polymem import TokenHashes, load_tokenizer
from polymem.cli.app import app, main

runner = CliRunner()


def test_build_cache_writes_a_loadable_cache(tmp_path: Path) -> None:
    out = tmp_path / "c.npz"
    r = runner.invoke(app, ["build-cache", "--tokenizer", "mistral-v1", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "32,000" in r.output and "faithful" in r.output and f"written {out}" in r.output
    cache = TokenHashes.load(out, tokenizer=load_tokenizer("mistral-v1"))
    assert cache.vocab_size == 32000 and cache.dummy_prefix


def test_build_cache_default_location_honours_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLYMEM_CACHE_DIR", str(tmp_path))
    r = runner.invoke(app, ["build-cache", "--tokenizer", "bytes"])
    assert r.exit_code == 0, r.output
    files = list((tmp_path / "token-caches").glob("bytes-*.npz"))
    assert len(files) == 1 and TokenHashes.load(files[0]).vocab_size == 256


def test_unknown_tokenizer_exits_2_listing_accepted_forms(capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.setattr("sys.argv", ["polymem", "build-cache", "--tokenizer", "no-such-tok"])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "no-such-tok" in err and "cl100k_base" in err and "tokenizer.json" in err


def test_demo_shows_byte_equivalent_ngrams_hash_alike(tmp_path: Path) -> None:
    r = runner.invoke(app, ["demo", "--a", "bytes", "--b", "mistral-v1", "--max-n", "4"])
    assert r.exit_code == 0, r.output
    assert "0 with different hashes" in r.output and "hash alike" in r.output
    assert "polymem coverage" in r.output and "token positions served" in r.output


def test_tokenizers_list_and_check(tmp_path: Path, wordpiece_json_path: Path, sample: str) -> None:
    r = runner.invoke(app, ["tokenizers"])
    assert r.exit_code == 0 and "cl100k_base" in r.output and "mistral-v1" in r.output
    text = tmp_path / "t.txt"
    text.write_text(sample, encoding="utf-8")
    r = runner.invoke(app, ["tokenizers", "check", "mistral-v1", "--text", str(text)])
    assert r.exit_code == 0 and "faithful" in r.output and "dummy-prefix" in r.output
    r = runner.invoke(app, ["tokenizers", "check", str(wordpiece_json_path), "--text", str(text)])
    assert r.exit_code == 1 and "lossy" in r.output


def test_tokenizers_check_bad_text_files(tmp_path: Path, monkeypatch, capsys) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    binary = tmp_path / "bin.txt"
    binary.write_bytes(b"\xff\xfe\x00\x81garbage")
    for f, msg in ((empty, "nothing to check"), (binary, "is not UTF-8 text")):
        monkeypatch.setattr("sys.argv", ["polymem", "tokenizers", "check", "bytes", "--text", str(f)])
        with pytest.raises(SystemExit) as e:
            main()
        assert e.value.code == 2
        assert msg in capsys.readouterr().err


def test_top_level_help_lists_every_command_group() -> None:
    import pkgutil

    import polymem.cli as cli_pkg

    r = runner.invoke(app, ["--help"])
    assert r.exit_code == 0, r.output
    modules = [m.name for m in pkgutil.iter_modules(cli_pkg.__path__) if m.name.startswith("cmd_")]
    assert len(modules) >= 2
    for cmd in ("build-cache", "demo", "tokenizers"):
        assert cmd in r.output
