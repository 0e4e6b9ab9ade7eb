"""A new user's first hour: every command checks what it needs (an extra, a writable output) before any work;
a shipped corpus (`sample:pydocs`) that every command and doc example can use; `--jobs` parallel whenever there
is more than one task; end-of-run output a reader understands; docs figures with one source."""

from __future__ import annotations

import ast
import io
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main
from rich.console import Console
from typer.testing import CliRunner

from polymem.cli._needs import NEEDS
from polymem.cli.app import app
from polymem.errors import PolymemError

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _commands() -> dict[str, object]:
    """'name' (or 'group sub') -> the click command of every registered command."""
    out: dict[str, object] = {}
    for name, cmd in typer.main.get_command(app).commands.items():
        out[name] = cmd
        for sub, c in getattr(cmd, "commands", {}).items():
            out[f"{name} {sub}"] = c
    return out


# ------------------------------------------------------------------------------------- one table of needs
def test_every_command_is_in_the_needs_table_with_its_real_flags() -> None:
    commands = _commands()
    assert set(NEEDS) == set(commands)
    for name, needs in NEEDS.items():
        params = {p.name: p for p in commands[name].params}
        for flag, param, _ in needs:
            assert param in params, (name, param)
            assert (flag in params[param].opts) if flag else params[param].param_type_name == "argument", (name, flag)


def test_every_command_checks_its_needs_first() -> None:
    """The first statement after the docstring of every command is ``check_needs("<command>", locals())``."""
    seen = set()
    for path in sorted((ROOT / "polymem" / "cli").glob("cmd_*.py")):
        for fn in ast.parse(path.read_text()).body:
            calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "check_needs"]
            if not isinstance(fn, ast.FunctionDef) or not calls:
                continue
            first = fn.body[1] if isinstance(fn.body[0].value, ast.Constant) else fn.body[0]  # type: ignore[attr-defined]
            assert first.value is calls[0], f"{path.name}:{fn.name}: check_needs is not its first statement"  # type: ignore[attr-defined]
            assert ast.unparse(calls[0].args[1]) == "locals()"
            seen.add(calls[0].args[0].value)  # type: ignore[attr-defined]
    assert seen == set(NEEDS)


# Each case: (modules made missing, arguments, what the error says). Every case also names an input that the work
# would trip on first (an unknown tokenizer, an asset that is not there): the needs error proves the check ran
# before it, and so before any counting or training.
def _cases(tmp: Path) -> dict[str, tuple[str, list[str], str]]:
    c, txt, blocker = str(tmp / "c.jsonl"), str(tmp / "t.txt"), str(tmp / "file")
    return {
        "build-cache": ("", ["build-cache", "-t", "nosuch", "-o", f"{blocker}/x.npz"], "cannot write"),
        "convert": ("mistral_common", ["convert", "nosuch.st", "-t", "mistral-v1", "-c", c, "-o", str(tmp / "o")],
                    "convert --tokenizer mistral-v1 (the builtin tokenizer) needs mistral-common"),
        "coverage": ("matplotlib", ["coverage", "-t", "bytes", "-r", "nosuch", c, "--plot", str(tmp / "p.png")],
                     "coverage --plot needs matplotlib"),
        "demo": ("mistral_common", ["demo"], "demo --b mistral-v1 (the builtin tokenizer) needs mistral-common"),
        "eval": ("transformers", ["eval", "--model", "smollm2-135m", "-c", c], "eval --model smollm2-135m needs transformers"),
        "init": ("s3fs", ["init", "s3://bucket/t.pmem", "--params", "64K"], "init s3://bucket/t.pmem needs s3fs"),
        "inspect": ("s3fs", ["inspect", "s3://bucket/t.pmem"], "inspect s3://bucket/t.pmem needs s3fs"),
        "iosim": ("matplotlib", ["iosim", "-t", "nosuch", "--cache-mb", "1", c, "--plot", str(tmp / "p.png")],
                  "iosim --plot needs matplotlib"),
        "merge": ("", ["merge", "nosuch1", "nosuch2", "-o", f"{blocker}/m.pmem"], "cannot write"),
        "pull": ("s3fs", ["pull", "s3://bucket/t.pmem", str(tmp / "pulled")], "pull s3://bucket/t.pmem needs s3fs"),
        "quantize": ("s3fs", ["quantize", "nosuch.pmem", "-o", "s3://bucket/q.pmem"], "quantize --output s3://bucket/q.pmem needs s3fs"),
        "subset": ("mistral_common", ["subset", "nosuch.pmem", "-o", str(tmp / "s"), "-t", "mistral-v1", "-c", c],
                   "subset --tokenizer mistral-v1"),
        "tokenizers check": ("mistral_common", ["tokenizers", "check", "mistral-v1", "--text", txt],
                             "tokenizers check mistral-v1 (the builtin tokenizer) needs mistral-common"),
        "train": ("transformers", ["train", "--model", "smollm2-135m", "-c", c, "--out", str(tmp / "d.pmem")],
                  "train --model smollm2-135m needs transformers"),
        "transfer": ("matplotlib", ["transfer", "--asset", "nosuch.asset", "-t", "bytes", "-c", c, "--plot",
                                    str(tmp / "t.png")], "transfer --plot needs matplotlib"),
        "verify": ("s3fs", ["verify", "s3://bucket/t.pmem"], "verify s3://bucket/t.pmem needs s3fs"),
        "train --json": ("", ["train", "-t", "nosuch", "-c", c, "--out", str(tmp / "d2.pmem"), "--json",
                              f"{blocker}/j.json"], "cannot write"),
    }


# Runs every case in one fresh interpreter (one start-up): a meta-path finder makes the named packages fail to
# import, as they do when not installed; each case's exception and output come back as JSON.
_RUNNER = r"""
import json, sys
BLOCKED = set()
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Block())
from typer.testing import CliRunner
from polymem.cli.app import app
out = {}
for key, (blocked, args, _) in json.loads(sys.argv[1]).items():
    BLOCKED.clear(); BLOCKED.update(b for b in blocked.split(",") if b)
    r = CliRunner().invoke(app, args)
    out[key] = {"error": type(r.exception).__name__, "message": str(r.exception), "output": r.output}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def needs_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    tmp = tmp_path_factory.mktemp("needs")
    (tmp / "c.jsonl").write_text(json.dumps({"text": "hello world " * 50}) + "\n")
    (tmp / "t.txt").write_text("hello world\n")
    (tmp / "file").write_text("a file, not a directory\n")
    cases = _cases(tmp)
    run = subprocess.run([sys.executable, "-c", _RUNNER, json.dumps(cases)], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "POLYMEM_OFFLINE": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    return {k: {**v, "expect": cases[k][2]} for k, v in json.loads(run.stdout.splitlines()[-1]).items()}


@pytest.mark.parametrize("case", sorted(_cases(Path("/x"))))
def test_a_missing_extra_or_an_unwritable_output_fails_before_any_work(case: str, needs_results) -> None:
    r = needs_results[case]
    assert r["error"] in ("MissingExtraError", "OutputError"), r
    assert r["expect"] in r["message"], r
    assert "pip install 'polymem[" in r["message"] or "choose an output path" in r["message"]
    assert r["output"] == "", r  # nothing printed: no precision line, no progress, no table


def test_commands_without_needs_are_listed_as_such() -> None:
    """`upgrade` rewrites a local asset in place and `tokenizers` lists names: no extra, no new output."""
    assert NEEDS["upgrade"] == () and NEEDS["tokenizers"] == ()


# ------------------------------------------------------------------------------------------ sample:pydocs
def test_the_sample_corpus_is_addressable_by_name_and_says_its_licence() -> None:
    from polymem.samples import SAMPLES, resolve_sample

    path = resolve_sample("sample:pydocs")
    assert path.is_file() and path.stat().st_size < 400_000 and set(SAMPLES) == {"pydocs"}
    assert resolve_sample("data/x.jsonl") == "data/x.jsonl"
    with pytest.raises(PolymemError, match=r"'sample:nope' is not a shipped sample corpus; known: sample:pydocs"):
        resolve_sample("sample:nope")
    notes = (ROOT / "polymem" / "_samples" / "README.md").read_text()
    assert "pydocs.jsonl.gz" in notes and "PSF License" in notes


def test_the_sample_corpus_through_the_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLYMEM_OFFLINE", "1")
    out = tmp_path / "cov.json"
    r = CliRunner().invoke(app, ["coverage", "-t", "bytes", "-r", "bytes", "sample:pydocs", "--max-n", "1", "-q",
                                 "--no-occurrence", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["docs"] == 43
    r = CliRunner().invoke(app, ["train", "-t", "bytes", "-c", "sample:nope", "--out", str(tmp_path / "d")])
    assert r.exit_code == 2 and "not a shipped sample corpus" in r.output


def _doc_commands() -> list[tuple[str, str]]:
    """(doc, command line) of every `polymem …` line in a console/bash/sh block of README.md and docs/ (continuation
    lines joined, comments dropped), the blocks marked `<!-- not run: … -->` included; `...` elisions left out."""
    found = []
    for doc in DOCS:
        for lang, block in re.findall(r"^```(console|bash|sh)\n(.*?)^```", doc.read_text(encoding="utf-8"), re.S | re.M):
            for line in block.replace("\\\n", " ").splitlines():
                if lang == "console" and not line.startswith("$ "):
                    continue  # output the doc shows
                words = shlex.split(line.removeprefix("$ "), comments=True)
                if words[:1] == ["polymem"] and "..." not in words:
                    found.append((doc.name, shlex.join(words)))
    return found


_WRITES = {"--out", "-o", "--output", "--json", "--csv", "--plot", "--out-dir"}


def test_doc_commands_parse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every documented command parses as written: its flags exist, its values are valid, `sample:pydocs` resolves
    (tests/test_docs.py runs the blocks not marked `not run`; this also holds the marked ones to the real flags).
    The local inputs they name (a corpus not shipped, a donor an earlier step writes) are stood in for by empty
    files in a temp dir, so only the flags and values are judged here."""
    commands, cmds = _doc_commands(), typer.main.get_command(app)
    assert len(commands) >= 30 and {d for d, _ in commands} >= {"README.md", "coverage.md", "transfer.md"}
    assert sum("sample:pydocs" in line for _, line in commands) >= 8
    monkeypatch.chdir(tmp_path)
    for doc, line in commands:
        args = shlex.split(line)[1:]
        for flag, value in zip(["", *args], args):
            if flag not in _WRITES and not value.startswith("-") and ("/" in value or Path(value).suffix) \
                    and ":" not in value and not Path(value).exists():
                target = tmp_path / value
                target.parent.mkdir(parents=True, exist_ok=True)
                folder = value.endswith("/") or Path(value).suffix in (".asset", ".pmem", ".site")
                target.mkdir() if folder else target.touch()
        sub = cmds.commands[args[0]]
        try:
            sub.make_context(args[0], args[1:])  # raises on an unknown flag or a bad value
        except Exception as e:  # noqa: BLE001 - say which doc line
            pytest.fail(f"{doc}: {line}: {e}")


def test_the_wheel_ships_the_samples() -> None:
    import tomllib

    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]
    assert build["packages"] == ["polymem"]  # hatch ships every file under polymem/, data files included
    ignored = subprocess.run(["git", "check-ignore", "-q", "polymem/_samples/pydocs.jsonl.gz"], cwd=ROOT)
    assert ignored.returncode != 0  # not git-ignored, so hatch does not leave it out


# ------------------------------------------------------------------------------------------------ --jobs
def test_jobs_runs_the_arms_of_one_seed_side_by_side() -> None:
    """`--jobs 2 --seeds 1` takes two processes for five arms (one seed was one process); never more processes
    than tasks. (tests/recipes/test_train.py runs `--jobs 2` end to end and reads what ran from the JSON.)"""
    from polymem.recipes.transfer import worker_processes

    arms = ["none", "random", "donor", "donor_finetune", "scratch"]
    assert worker_processes(2, [0], arms) == 2
    assert worker_processes(8, [0], ["none", "donor"]) == 2
    assert worker_processes(1, [0, 1, 2], arms) == 1 and worker_processes(4, [0], ["none"]) == 1


# --------------------------------------------------------------------------------------- output at a glance
def _printed(fn, *args) -> str:
    buf = io.StringIO()
    fn(*args, Console(file=buf, width=200))
    return buf.getvalue()


def test_the_end_of_a_transfer_run_reads_as_words() -> None:
    from polymem.cli._transfer_report import print_analysis

    text = _printed(print_analysis, json.loads((ROOT / "docs" / "results" / "transfer-curves.json").read_text()))
    assert "{'" not in text and "n/a" not in text and "None" not in text
    assert "│ donor − none             │ -0.2618 │ 0.0473 │" in text
    assert "donor: scratch reaches its 2.1104 bits/byte with 15% fewer tokens (87,371): donor saved nothing" in text
    assert "scratch caught up with the frozen donor at 21,252 tokens (per seed: 10,240, 24,559, 22,605)" in text
    assert "  yes  donor < random at every budget, on every seed" in text
    assert text.splitlines()[-1].startswith("verdict: the frozen donor table lowers held-out bits/byte against no "
                                            "memory: -0.2618 (-11.04%), better on 3/3 seeds")


def test_compute_saved_in_words_by_hand() -> None:
    from polymem.cli._transfer_report import _saved_words

    def point(b, need, status, extra):
        return {"budget": b, "target_bpb": 2.5, "ref_tokens_needed": need, "status": status, "extra_fraction": extra}

    assert _saved_words("donor", [point(100, 125, "interpolated", 0.25)]) == (
        "scratch needs 25% more tokens (125) to reach its 2.5000 bits/byte: donor saved 20% of recipient tokens")
    never = _saved_words("donor", [point(50, 60, "interpolated", 0.2), point(100, None, "not_reached", None)])
    assert never.startswith("scratch never reached its 2.5000 bits/byte within the run") and "at 50 tokens it needed +20%" in never


def test_iosim_labels_its_ratios_and_says_a_verdict(tmp_path: Path) -> None:
    (tmp_path / "c.txt").write_text("the cat sat on the mat. " * 400)
    r = CliRunner().invoke(app, ["iosim", "-t", "bytes", "--params", "64K", "--cache-mb", "1,2", str(tmp_path / "c.txt")])
    flat = " ".join(r.output.split())
    assert r.exit_code == 0, r.output
    assert re.search(r"independent-heads ÷ page-local: [\d.]+× uncached, [\d.]+× with 1 MiB, [\d.]+× with 2 MiB", flat)
    assert "verdict: " in flat


def test_coverage_plot_labels_contrast_with_their_bar() -> None:
    from polymem.analysis.coverage.report import _ink

    assert _ink((0.993, 0.906, 0.144, 1.0)) == "black"  # viridis yellow
    assert _ink((0.267, 0.005, 0.329, 1.0)) == "white"  # viridis purple


def test_quantize_without_output_says_what_to_pass(tmp_path: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(app, ["init", str(tmp_path / "t.pmem"), "--params", "64K"]).exit_code == 0
    r = runner.invoke(app, ["quantize", str(tmp_path / "t.pmem")])
    assert isinstance(r.exception, PolymemError)
    assert "quantize needs --output/-o" in str(r.exception) and "-o t-nf4.pmem" in str(r.exception)


def test_tables_are_not_cut_at_80_columns_in_a_pipe() -> None:
    run = subprocess.run([sys.executable, "-c", "import sys; sys.argv = ['polymem', 'tokenizers']; "
                          "from polymem.cli.app import main; main()"], capture_output=True, text=True, timeout=60,
                         env={k: v for k, v in os.environ.items() if k != "COLUMNS"})
    assert run.returncode == 0, run.stderr
    assert max(len(line) for line in run.stdout.splitlines()) > 80


# ------------------------------------------------------------------------------------ docs: one source
def test_transfer_doc_coverage_figures_come_from_the_benchmark_json() -> None:
    report = json.loads((ROOT / "docs" / "benchmarks" / "coverage.json").read_text())["report"]
    occ = " ".join(f"{x:.2f}" for x in report["occurrence_weighted"])
    per_doc = " ".join(f"{x:.2f}" for x in report["per_doc_mean"])
    text = " ".join((ROOT / "docs" / "transfer.md").read_text().split())
    assert f"occurrence-weighted: {occ};" in text and f"n-grams: {per_doc}." in text
    first3 = " / ".join(occ.split()[:3])
    assert text.count(first3) == 2 and "0.97 / 0.85 / 0.77" not in text


def test_the_library_corpus_takes_a_sample_name_too() -> None:
    from polymem.corpus import Corpus
    from polymem.errors import PolymemError

    docs = list(Corpus("sample:pydocs"))
    assert len(docs) >= 40 and sum(len(d.text) for d in docs) > 500_000
    with pytest.raises(PolymemError, match="'sample:nope' is not a shipped sample corpus; known: sample:pydocs"):
        Corpus(["sample:nope"])
