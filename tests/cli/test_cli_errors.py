"""Hostile input through the CLI: rich markup in user data, and one-line errors with exit code 2."""

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

    pulled = tmp_path / "q[/]" / "[u]pulled"
    r = runner.invoke(app, ["pull", str(root), str(pulled)])
    assert r.exit_code == 0, r.output
    assert _flat(str(root)) in _flat(r.output) and _flat(str(pulled)) in _flat(r.output)
    r = runner.invoke(app, ["upgrade", str(pulled)])
    assert r.exit_code == 0, r.output
    assert _flat(str(pulled)) in _flat(r.output) and "nothing to do" in r.output

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


# ------------------------------------------------------------------------------------ one line, exit code 2
def run_main(args: list[str], capsys, monkeypatch) -> tuple[int, str]:
    """The console entry point (what the `polymem` script runs): exit code and stderr."""
    import pytest

    from polymem.cli.app import main

    monkeypatch.setattr("sys.argv", ["polymem", *args])
    with pytest.raises(SystemExit) as e:
        main()
    return e.value.code, capsys.readouterr().err


def _one_line_error(err: str) -> str:
    text = " ".join(err.split())  # rich wraps long lines at the terminal width; the message is one line
    assert text.startswith("error: ") and "Traceback" not in err, err
    return text


def test_outputs_that_cannot_be_written_exit_2_before_any_work(tmp_path: Path, capsys, monkeypatch) -> None:
    """A path under a regular FILE fails for root too (chmod does not stop root; tests run as root)."""
    plain = tmp_path / "plain"
    plain.write_text("a file")
    src = tmp_path / "src"
    MemoryAsset.create(src, HashSpec(), Layout(pages=8, heads=2, slots=2, head_dim=4))
    cases = {
        "init": ["init", str(plain / "a"), "--params", "20K", "--heads", "2"],
        "quantize": ["quantize", str(src), "--to", "float16", "-o", str(plain / "q")],
        "build-cache": ["build-cache", "-t", "bytes", "-o", str(plain / "c.npz")],
        "coverage --json": ["coverage", str(plain), "-t", "bytes", "-r", "bytes", "--json", str(plain / "r.json")],
        "coverage --plot": ["coverage", str(plain), "-t", "bytes", "-r", "bytes", "--plot", str(plain / "r.png")],
    }
    for what, args in cases.items():
        code, err = run_main(args, capsys, monkeypatch)
        text = _one_line_error(err)
        assert code == 2, (what, err)
        assert "a part of the path is a file" in text and f"({str(plain)!r} is a file)" in text, (what, text)
    assert plain.read_text() == "a file"


def test_a_pseudo_file_system_output_exits_2(tmp_path: Path, capsys, monkeypatch) -> None:
    import os

    import pytest

    if not os.path.isdir("/sys/kernel"):
        pytest.skip("needs a mounted sysfs (where even root cannot create files)")
    code, err = run_main(["init", "/sys/polymem-probe/a", "--params", "20K", "--heads", "2"], capsys, monkeypatch)
    assert code == 2 and "cannot write '/sys/polymem-probe/a'" in _one_line_error(err)


def test_non_finite_params_exit_2(tmp_path: Path, capsys, monkeypatch) -> None:
    for value in ("inf", "nan", "-inf", "1e400"):
        code, err = run_main(["init", str(tmp_path / "a"), "--params", value], capsys, monkeypatch)
        text = _one_line_error(err)
        assert code == 2 and f"--params {value!r}" in text and "finite" in text, text
        assert not (tmp_path / "a").exists()
    code, err = run_main(["init", str(tmp_path / "a"), "--params", "2.5M", "--heads", "2"], capsys, monkeypatch)
    assert code == 0, err


def test_an_os_error_mid_run_is_one_line_and_exit_1(capsys, monkeypatch) -> None:
    """Not misuse but the environment: reading /proc/self/mem fails with EIO (a real failing read)."""
    import os

    import pytest

    if not os.path.exists("/proc/self/mem"):
        pytest.skip("needs /proc")
    code, err = run_main(["demo", "--text", "/proc/self/mem", "--a", "bytes", "--b", "bytes"], capsys, monkeypatch)
    assert code == 1 and _one_line_error(err) == "error: Input/output error (OSError)"
