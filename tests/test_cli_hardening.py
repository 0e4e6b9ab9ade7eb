"""Issue 9 (non-asset half) through the CLI: rich markup in user data, and one-line errors with exit code 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from polymem import HashSpec, Layout, MemoryAsset
from polymem.cli.app import app

runner = CliRunner()
MARKUP = "x[/]y[bold]z[/bold]"  # a closing tag with nothing open crashes rich; [bold] would silently vanish


def _flat(text: str) -> str:
    return "".join(text.split())  # rich wraps long lines; compare without whitespace


def test_markup_in_paths_and_provenance_is_printed_literally(tmp_path: Path) -> None:
    # "x[/]y..." as a path means a directory "x[" holding "]y[bold]z[", itself holding "bold]"
    root = tmp_path / MARKUP
    root.parent.mkdir(parents=True)
    layout = Layout(pages=12, heads=2, slots=2, head_dim=4)
    table = np.arange(layout.num_rows * 4, dtype=np.float32).reshape(-1, 4)
    MemoryAsset.from_array(root, table, HashSpec(), layout, orders=(1, 2), provenance={"note": MARKUP})

    r = runner.invoke(app, ["inspect", str(root)])
    assert r.exit_code == 0, r.output
    assert _flat(str(root)) in _flat(r.output) and _flat(json.dumps(MARKUP)) in _flat(r.output)

    r = runner.invoke(app, ["verify", str(root)])
    assert r.exit_code == 0, r.output
    assert _flat(str(root)) in _flat(r.output) and "OK" in r.output

    out = tmp_path / "q[/]" / "[red]q"
    out.parent.mkdir(parents=True)
    r = runner.invoke(app, ["quantize", str(root), "--to", "float16", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert _flat(str(out)) in _flat(r.output)

    new = tmp_path / "q[/]" / "[i]new"
    r = runner.invoke(app, ["init", str(new), "--params", "20K", "--heads", "2", "--head-dim", "8"])
    assert r.exit_code == 0, r.output
    assert _flat(str(new)) in _flat(r.output)


def test_markup_in_a_failing_verify_is_printed_literally(tmp_path: Path) -> None:
    root = tmp_path / "[b]a[/]"
    root.parent.mkdir(parents=True, exist_ok=True)
    MemoryAsset.create(root, HashSpec(), Layout(pages=4, heads=2, slots=2, head_dim=4))
    (root / "zarr.json").unlink()
    r = runner.invoke(app, ["verify", str(root)])
    assert r.exit_code == 1, r.output
    assert "FAIL" in r.output and _flat(str(root)) in _flat(r.output)


def test_markup_in_cache_tokenizer_and_report_paths(tmp_path: Path, bpe_json_path: Path) -> None:
    d = tmp_path / "[dim]tok[/]"
    d.mkdir(parents=True)
    tok = d / "tokenizer.json"
    shutil.copy(bpe_json_path, tok)
    out = d / "[b]c.npz"
    r = runner.invoke(app, ["build-cache", "-t", str(tok), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert out.exists() and _flat(str(out)) in _flat(r.output)

    text = tmp_path / "[" / "]doc.txt"
    text.parent.mkdir()
    text.write_text("hello [/] world [bold]x\n", encoding="utf-8")
    r = runner.invoke(app, ["tokenizers", "check", str(tok), "--text", str(text)])
    assert r.exit_code == 0, r.output

    rep = tmp_path / "[" / "]rep[b].json"
    r = runner.invoke(app, ["coverage", str(text), "-t", str(tok), "-r", "bytes", "--max-n", "2", "--json", str(rep)])
    assert r.exit_code == 0, r.output
    assert json.loads(rep.read_text())["docs"] == 1 and _flat(str(rep)) in _flat(r.output)
