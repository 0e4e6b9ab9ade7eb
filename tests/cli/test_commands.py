"""CLI: build-cache, demo, tokenizers list/check — through typer's CliRunner on the real app."""

from __future__ import annotations

import re
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


def test_build_cache_json_holds_what_the_table_shows(tmp_path: Path) -> None:
    import json

    r = runner.invoke(app, ["build-cache", "--tokenizer", "bytes", "-o", str(tmp_path / "c.npz"), "--json",
                            str(tmp_path / "c.json")])
    assert r.exit_code == 0, r.output
    got = json.loads((tmp_path / "c.json").read_text())
    assert got["tokenizer"] == "bytes" and got["vocab_size"] == 256 and got["faithful"] is True
    assert got["path"] == str(tmp_path / "c.npz") and got["fingerprint"][:16] in r.output
    r = runner.invoke(app, ["build-cache", "--tokenizer", "bytes", "-o", str(tmp_path / "c.npz"), "--json",
                            str(tmp_path / "c.npz")])
    assert r.exit_code != 0


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
    assert "polymem coverage" in r.output
    # the demo and `polymem coverage` name each measure the same way, with the same caption
    cov = runner.invoke(app, ["coverage", "-t", "mistral-v1", "-r", "bytes", "sample:pydocs", "--max-n", "2",
                              "--no-occurrence"])
    assert cov.exit_code == 0, cov.output
    for out in (r.output, cov.output):
        flat = " ".join(out.replace("│", " ").split())
        assert all(m in flat for m in ("per-doc mean", "occurrence", "XOR ids")), flat
        assert "occurrence: share of target n-gram positions served" in flat
    assert "token positions served" not in r.output


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


def command_tree() -> dict[tuple[str, ...], object]:
    """Every registered command and group of the real app, by path (e.g. ("tokenizers", "check"))."""
    import typer.main

    out: dict[tuple[str, ...], object] = {}

    def walk(cmd, path: tuple[str, ...]) -> None:
        out[path] = cmd
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            walk(sub, path + (name,))

    walk(typer.main.get_command(app), ())
    return out


def test_every_cmd_module_registers_commands_and_all_are_in_the_app() -> None:
    """The app is assembled from polymem/cli/cmd_*.py; each module adds at least one command, and the app holds
    exactly the union (nothing registered twice, nothing lost)."""
    import importlib
    import pkgutil

    import typer
    import typer.main

    import polymem.cli as cli_pkg

    union: list[str] = []
    for m in sorted(m.name for m in pkgutil.iter_modules(cli_pkg.__path__) if m.name.startswith("cmd_")):
        t = typer.Typer()
        importlib.import_module(f"polymem.cli.{m}").register(t)
        t.command("_probe", hidden=True)(lambda: None)  # a group of one still lists its command by name
        names = [n for n in typer.main.get_command(t).commands if n != "_probe"]
        assert names, f"{m} registers no command"
        union += names
    top = [p[0] for p in command_tree() if len(p) == 1]
    assert sorted(union) == sorted(top) and len(set(union)) == len(union)


def test_every_command_has_working_help() -> None:
    """`--help` of every command and sub-command, discovered (not listed by hand): exit 0, its usage line and
    the first line of its docstring; the top-level help lists every command."""
    tree = command_tree()
    assert len([p for p in tree if len(p) == 1]) >= 11
    top = runner.invoke(app, ["--help"])
    assert top.exit_code == 0
    for path, cmd in tree.items():
        if not path:
            continue
        r = runner.invoke(app, [*path, "--help"])
        assert r.exit_code == 0, (path, r.output)
        assert "Usage:" in r.output and " ".join(path) in r.output, path
        first = (cmd.help or "").strip().splitlines()[0]
        assert " ".join(first.split()[:4]) in " ".join(r.output.split()), (path, first)
        if len(path) == 1:
            assert path[0] in top.output


def test_tiny_real_invocation_of_the_cheap_commands(tmp_path: Path) -> None:
    """One real run of each command that takes seconds (train and transfer run in tests/recipes/test_train.py)."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat on the mat. " * 40)
    a, q = tmp_path / "a.pmem", tmp_path / "q.pmem"
    runs = {
        "init": ["init", str(a), "--params", "64K", "--heads", "4", "--slots", "2", "--head-dim", "8"],
        "inspect": ["inspect", str(a), "--json"],
        "verify": ["verify", str(a)],
        "quantize": ["quantize", str(a), "--to", "nf4", "-o", str(q)],
        "build-cache": ["build-cache", "--tokenizer", "bytes", "-o", str(tmp_path / "b.npz")],
        "demo": ["demo", "--a", "bytes", "--b", "bytes", "--max-n", "2", "--text", str(corpus)],
        "coverage": ["coverage", "-t", "bytes", "-r", "bytes", "--max-n", "3", "-q", "--json", str(tmp_path / "c.json"), str(corpus)],
        "iosim": ["iosim", "-t", "bytes", "--params", "64K", "--cache-mb", "1", "--orders", "1,2", str(corpus)],
        "tokenizers": ["tokenizers", "check", "bytes", "--text", str(corpus)],
    }
    for name, args in runs.items():
        r = runner.invoke(app, args)
        assert r.exit_code == 0, (name, r.output)
    assert q.is_dir() and (tmp_path / "b.npz").is_file()
    import json

    assert json.loads((tmp_path / "c.json").read_text())["per_doc_mean"][0] == 1.0  # a tokenizer covers itself
    # every other command is run for real by some test (a command line starting with its name)
    tests = "\n".join(f.read_text() for f in Path(__file__).parents[1].rglob("test_*.py"))
    for name in {p[0] for p in command_tree() if len(p) == 1} - set(runs):
        assert re.search(rf'\[\s*"{re.escape(name)}"\s*,', tests), f"no test runs `polymem {name}`"


def test_attach_help_names_its_own_defaults() -> None:
    """attach always takes a model: its --batch-size help names its one default, not train's two."""
    import typer.main

    opts = {p.name: p for p in typer.main.get_command(app).commands["attach"].params}
    assert opts["batch_size"].default == 4 and "--model" not in (opts["batch_size"].help or "")
