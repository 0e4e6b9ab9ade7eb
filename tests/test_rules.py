"""One home per rule: order validators, CLI choices vs their homes, optional extras named in errors,
README/CI install commands."""

from __future__ import annotations

import ast
import functools
import re
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from polymem._optional import EXTRAS, MissingExtraError, optional_import, pyplot
from polymem.errors import PolymemError
from polymem.hash.spec import MAX_ORDER, check_max_n, check_orders

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("good,expected", [(1, 1), (np.int64(7), 7), (MAX_ORDER, MAX_ORDER)])
def test_check_max_n_accepts_integers_in_range(good, expected) -> None:
    assert check_max_n(good) == expected and type(check_max_n(good)) is int


@pytest.mark.parametrize("bad", [0, MAX_ORDER + 1, -3, 2.0, True, "3", None])
def test_check_max_n_names_the_value_and_the_range(bad) -> None:
    with pytest.raises(PolymemError, match=rf"max_n={re.escape(repr(bad))} is out of range.*1 to {MAX_ORDER}"):
        check_max_n(bad)


def test_check_orders_sorts_and_dedupes() -> None:
    assert check_orders([3, 1, 2, 2]) == (1, 2, 3)
    assert check_orders(np.array([2, 3])) == (2, 3)


@pytest.mark.parametrize("bad", [(), (0, 1), (1, MAX_ORDER + 1), (1.5,), (True, 2), "12", 3, None])
def test_check_orders_rejects_with_the_value(bad) -> None:
    with pytest.raises(PolymemError, match="orders .* must be"):
        check_orders(bad)


def test_every_order_check_is_the_same_rule(tmp_path: Path) -> None:
    """TokenHashes, the asset, iosim, coverage and the torch site all refuse max_n/orders beyond MAX_ORDER."""
    from polymem import HashSpec, Layout, MemoryAsset, TokenHashes, load_tokenizer
    from polymem.analysis.coverage import check_max_n as coverage_check
    from polymem.analysis.iosim import simulate

    cache = TokenHashes.build(load_tokenizer("bytes"))
    with pytest.raises(PolymemError, match="out of range"):
        cache.ngram_hashes([1, 2, 3], MAX_ORDER + 1)
    with pytest.raises(PolymemError, match="the Tokenizer-Agnostic Engram paper uses 7"):
        coverage_check(MAX_ORDER + 1)
    small = Layout(pages=4, heads=2, slots=2, head_dim=8)
    with pytest.raises(PolymemError, match=r"orders .* integers in 1\.\.32"):
        MemoryAsset.create(tmp_path / "a", HashSpec(), small, orders=(1, MAX_ORDER + 1))
    with pytest.raises(PolymemError, match=r"orders .* integers in 1\.\.32"):
        simulate([np.arange(5)], cache, small, orders=(0, 1))
    from polymem.torch.site import SiteConfig

    with pytest.raises(PolymemError, match="out of range"):
        SiteConfig(d_model=16, max_n=MAX_ORDER + 1)


def test_cli_choices_match_their_homes() -> None:
    from polymem.asset import DTYPES
    from polymem.cli import _options
    from polymem.hash.layout import LAYOUT_KINDS
    from polymem.hash.spec import NORMALIZERS
    from polymem.recipes.frozen import SOFTMAX
    from polymem.recipes.train import HASHES
    from polymem.recipes.pretrained import DONOR_INITS
    from polymem.torch.site import GATES, VALUE_INITS

    values = lambda e: sorted(m.value for m in e)  # noqa: E731
    assert values(_options.AssetDtype) == sorted(DTYPES)
    assert values(_options.LayoutKind) == sorted(LAYOUT_KINDS)
    assert values(_options.Normalizer) == sorted(NORMALIZERS)
    assert values(_options.Gate) == sorted(GATES)
    assert values(_options.ValueInit) == sorted(set(VALUE_INITS) - {"aligned"})  # aligned needs a donor: --init
    assert values(_options.DonorInit) == sorted(DONOR_INITS)
    assert values(_options.HashKind) == sorted(HASHES)
    assert values(_options.Softmax) == sorted(SOFTMAX)


def test_shared_options_are_declared_once() -> None:
    """train/transfer and init/iosim take their common options from polymem/cli/_options.py, so the flags,
    ranges and help agree; no command re-declares them with typer.Option."""
    import typer.main

    from polymem.cli.app import app

    cmd = typer.main.get_command(app)

    def opts(name: str) -> dict:
        return {p.name: p for p in cmd.commands[name].params if p.param_type_name == "option"}

    for a, b, shared in [("train", "transfer", ("batch_size", "block_size", "n_layer", "d_model", "n_head",
                                                "lr", "table_lr_mult", "max_eval_tokens", "bf16", "threads",
                                                "device", "json_out")),
                         ("init", "iosim", ("params", "heads", "slots", "head_dim", "dtype", "orders"))]:
        oa, ob = opts(a), opts(b)
        for name in shared:
            pa, pb = oa[name], ob[name]
            same = ("opts", "secondary_opts", "min", "max", "help", "metavar", "is_flag")
            help_b = (pb.help or "").removeprefix("From scratch (--tokenizer): ")  # transfer's from-scratch group
            assert [getattr(pa, k) for k in same] == [help_b if k == "help" else getattr(pb, k) for k in same], name
    for src in ("cmd_train.py", "cmd_transfer.py", "cmd_asset.py", "cmd_iosim.py"):
        text = (ROOT / "polymem" / "cli" / src).read_text()
        for flag in ("--batch-size", "--heads", "--head-dim", "--slots", "--table-lr-mult", "--device"):
            assert f'"{flag}"' not in text, f"{src} re-declares {flag}"


def test_missing_extra_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what Python does for a package that is not installed
    with pytest.raises(MissingExtraError, match=r"iosim --plot needs matplotlib.*pip install 'polymem\[plot\]'"):
        pyplot("iosim --plot")
    monkeypatch.setitem(sys.modules, "tensorstore", None)
    with pytest.raises(PolymemError, match=r"pip install 'polymem\[fast\]'"):
        optional_import("tensorstore", extra="fast", purpose="the asset backend 'tensorstore'")


def test_missing_extra_through_the_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from polymem.cli.app import app

    (tmp_path / "c.txt").write_text("hello hello world " * 20)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    r = CliRunner().invoke(app, ["iosim", "-t", "bytes", "--params", "64K", "--cache-mb", "1",
                                 "--plot", str(tmp_path / "p.png"), str(tmp_path / "c.txt")])
    assert isinstance(r.exception, MissingExtraError) and "polymem[plot]" in str(r.exception)
    assert not (tmp_path / "p.png").exists()


def test_missing_mistral_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from polymem.tokenizers import load_tokenizer

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mistral_common" else real(name, *a))
    with pytest.raises(MissingExtraError, match=r"'mistral-v1'.*pip install 'polymem\[mistral\]'"):
        load_tokenizer("mistral-v1")


def test_extras_declared_and_test_pulls_all() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = meta["optional-dependencies"]
    assert set(EXTRAS) <= set(extras)
    assert "polymem[all]" in extras["test"]
    core = {re.split(r"[<>=\[; ]", d, maxsplit=1)[0] for d in meta["dependencies"]}
    for heavy in ("transformers", "matplotlib", "mistral-common", "tensorstore", "dask", "s3fs"):
        assert heavy not in core, f"{heavy} is a core dependency; it belongs in an extra"
    assert {"tokenizers", "tiktoken", "sentencepiece", "torch", "numpy", "zarr", "typer", "numba"} <= core


def test_the_package_ships_its_type_marker() -> None:
    """polymem/py.typed (PEP 561) is there and the wheel takes the whole package directory (hatchling's
    ``packages``: every file under it that git does not ignore), so type checkers read polymem's annotations."""
    assert (ROOT / "polymem" / "py.typed").is_file()
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert build["build-system"]["build-backend"] == "hatchling.build"
    wheel = build["tool"]["hatch"]["build"]["targets"]["wheel"]
    assert wheel["packages"] == ["polymem"] and not wheel.get("exclude") and not wheel.get("only-include")
    ignored = (ROOT / ".gitignore").read_text().split() if (ROOT / ".gitignore").is_file() else []
    assert not any(p in ("py.typed", "*.typed", "polymem/py.typed") for p in ignored)


def test_readme_commands_install_what_they_run() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    demo = next(line for line in readme.splitlines() if line.endswith("polymem demo"))
    assert "'.[mistral]'" in demo or "'.[all]'" in demo  # the demo's default second tokenizer is mistral-v1
    test_cmd = next(line for line in readme.splitlines() if line.endswith("python -m pytest"))
    assert test_cmd.split("&& ", 2)[-1] in ci  # .ci/run runs the README's test command verbatim


# Words that mean something only to whoever wrote them: work sessions, numbered passes over the code, the
# project's private seed documents and design brief. Cite the paper by its title and link a section of docs/.
_NOTEBOOK_WORDS = re.compile(
    r"\bsessions? \d"                                                     # "session 4", "sessions 7"
    r"|\b(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|\d+(?:st|nd|rd|th))[ -]pass(?:es)?\b"
    r"|\bpass(?:es)? \d"                                                  # "pass 3"
    r"|\bseeds? 00\d"                                                     # "seed 002"
    r"|\bDESIGN(?:\.md)? ?§"                                              # "DESIGN §5"
    r"|\b(?:issue|probe) \d+\b",                                         # "issue 9", "probe 12"
    re.I,
)
_NOTEBOOK_SCOPE = ("polymem", "docs", "README.md", "tests", "benchmarks")


def _text_files(scope: tuple[str, ...]) -> list[Path]:
    files: list[Path] = []
    for name in scope:
        top = ROOT / name
        for path in [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file()):
            if "__pycache__" in path.parts or path == Path(__file__).resolve():
                continue
            data = path.read_bytes()
            if b"\0" in data[:8192]:
                continue  # binary (images, gzip): not prose
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                continue
            files.append(path)
    return files


def test_no_lab_notebook_wording() -> None:
    """No "session N", "ninth pass", "seed 00N", "DESIGN §" or "issue N" in code, docs, tests or benchmarks: a
    reader who clones the repository has none of those; history lives in git."""
    hits = []
    for path in _text_files(_NOTEBOOK_SCOPE):
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if m := _NOTEBOOK_WORDS.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{lineno}: {m.group(0)!r}")
    assert not hits, "lab-notebook wording (cite the paper by its title, link a docs/ section):\n" + "\n".join(hits)


def test_notebook_rule_catches_what_it_names() -> None:
    for bad in ("session 4", "the Ninth pass", "fifth-pass", "seed 002's example", "DESIGN §5", "Sessions 7", "Issue 9 probe 12", "(issue 13)"):
        assert _NOTEBOOK_WORDS.search(bad), bad
    # an algorithm's pass is named by what it does ("the occurrence pass"), never by its rank
    for fine in ('scope="session"', "the occurrence pass", "two stable 32-way passes", "seed 0", "§5 of hash-spec.md", "an issue of 9 pages", "issue #9 on GitHub"):
        assert not _NOTEBOOK_WORDS.search(fine), fine


def test_every_raw_benchmark_file_is_cited() -> None:
    """docs/benchmarks/ keeps a raw JSON file only while a page cites it, and every cited file is there."""
    pages = [ROOT / "docs" / "benchmarks.md", *sorted((ROOT / "docs" / "benchmarks").glob("*.md"))]
    text = "\n".join(p.read_text(encoding="utf-8") for p in pages)
    kept = {p.name for p in (ROOT / "docs" / "benchmarks").glob("*.json")}
    cited = set(re.findall(r"(?:benchmarks/|\(|\[|`)([\w.-]+\.json)\b", text))
    assert kept <= cited, f"raw files no page cites: {sorted(kept - cited)}"
    linked = set(re.findall(r"\]\((?:benchmarks/)?([\w.-]+\.json)\)", text))
    assert linked <= kept, f"links to missing raw files: {sorted(linked - kept)}"


# ------------------------------------------------------------------------------------------ import circles
# Imports that close a circle and stay for now, each with why. An entry is one edge (importer, imported): the
# test drops it before looking for circles, so any other edge that closes a circle still fails.
# (importer, imported) edges of a known circle, each with the reason it is allowed; none now
_KNOWN_CIRCLE_EDGES: set[tuple[str, str]] = set()


def _modules(pkg_dir: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package's __init__) for every .py file under ``pkg_dir``."""
    out = {}
    for path in sorted(pkg_dir.rglob("*.py")):
        parts = list(path.relative_to(pkg_dir.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:``: annotations only, never run, so no import circle."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            skip.update(id(n) for sub in node.body for n in ast.walk(sub))
    return skip


def import_graph(pkg_dir: Path) -> dict[str, set[str]]:
    """module -> the package's modules it imports, at module level or inside functions: ``import a.b``,
    ``from a import b`` (b a submodule: an edge to it; else to ``a``), relative imports resolved. An import of a
    module that is not a file of the package goes to its nearest enclosing module that is."""
    mods = _modules(pkg_dir)
    top = pkg_dir.name

    def nearest(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for mod, (path, is_pkg) in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        skip = _type_checking_only(tree)
        here = mod if is_pkg else mod.rpartition(".")[0]
        deps: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                deps.update(t for a in node.names if a.name.split(".")[0] == top and (t := nearest(a.name)))
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                    full = ".".join(base + ([node.module] if node.module else []))
                else:
                    full = node.module or ""
                if full.split(".")[0] != top:
                    continue
                for a in node.names:
                    sub = f"{full}.{a.name}"
                    t = sub if sub in mods else nearest(full)
                    if t:
                        deps.add(t)
        deps.discard(mod)
        graph[mod] = deps
    return graph


@functools.cache
def _polymem_graph_frozen() -> tuple[tuple[str, frozenset[str]], ...]:
    return tuple((m, frozenset(d)) for m, d in import_graph(ROOT / "polymem").items())


def _polymem_graph() -> dict[str, set[str]]:
    """polymem's import graph, parsed once per test run (a fresh, mutable copy each call)."""
    return {m: set(d) for m, d in _polymem_graph_frozen()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def _describe(graph: dict[str, set[str]], comp: list[str]) -> str:
    return " | ".join(f"{m} -> {', '.join(sorted(d for d in graph[m] if d in comp))}" for m in comp)


def test_no_import_circles() -> None:
    """No module of polymem imports, directly or through others, a module that imports it back (imports inside
    functions count: they run too). A circle is broken by moving the shared piece down, passing a callable, or
    merging the two modules; see docs/architecture.md "Imports as they are"."""
    graph = _polymem_graph()
    for importer, imported in _KNOWN_CIRCLE_EDGES:
        assert imported in graph.get(importer, set()), f"known circle edge {importer} -> {imported} is gone: drop it from _KNOWN_CIRCLE_EDGES"
        graph[importer] = graph[importer] - {imported}
    found = circles(graph)
    assert not found, "import circles:\n" + "\n".join(_describe(graph, c) for c in found)


def test_circle_rule_catches_what_it_names(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "a.py": "def f():\n    from pkg.sub import b\n",               # inside a function: counts
        "sub/__init__.py": "",
        "sub/b.py": "from . import c\n",                              # relative: pkg.sub.c
        "sub/c.py": "from ..a import f\nimport pkg.d as d\n",         # relative two up; import ... as
        "d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n",  # never runs
        "e.py": "import os\nfrom pkg.sub.b import nothing_here\n",   # a name of a module: an edge to it
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    graph = import_graph(pkg)
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.sub.c"}
    assert graph["pkg.sub.c"] == {"pkg.a", "pkg.d"} and graph["pkg.d"] == set() and graph["pkg.e"] == {"pkg.sub.b"}
    assert circles(graph) == [["pkg.a", "pkg.sub.b", "pkg.sub.c"]]
    assert circles({"x": {"y"}, "y": {"z"}, "z": set()}) == []



# The stages of the flow, lowest first (docs/architecture.md). A module may import from its own stage or a lower
# one, never a higher one; the package root (`polymem/__init__.py`, lazy names for users) stands above them all.
STAGES = [
    ("base", ("polymem.errors", "polymem._cpus", "polymem._paths", "polymem._globs", "polymem._io", "polymem._npy", "polymem._schema", "polymem._optional", "polymem.samples")),
    ("inputs", ("polymem.sources", "polymem._discover", "polymem.corpus", "polymem.tokenizers")),
    ("hash", ("polymem.hash",)),
    ("asset format", ("polymem.asset",)),
    ("page service", ("polymem.serve",)),
    ("asset operations", ("polymem.ops",)),
    ("engines' tables", ("polymem.engines",)),
    ("analysis", ("polymem.analysis",)),
    ("torch mechanism", ("polymem.torch",)),
    ("pretrained models", ("polymem.models",)),
    ("recipes", ("polymem.recipes",)),
    ("cli", ("polymem.cli", "polymem.__main__")),
]


def stage_of(module: str) -> int | None:
    for rank, (_, prefixes) in enumerate(STAGES):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return rank
    return None


def test_every_module_sits_in_one_stage() -> None:
    graph = _polymem_graph()
    loose = sorted(m for m in graph if m != "polymem" and stage_of(m) is None)
    assert not loose, f"modules in no stage (add them to STAGES and docs/architecture.md): {loose}"


def test_no_import_runs_from_a_lower_stage_to_a_higher_one() -> None:
    graph = _polymem_graph()
    upward = sorted(
        f"{m} ({STAGES[stage_of(m)][0]}) -> {d} ({STAGES[stage_of(d)][0]})"
        for m, deps in graph.items() if m != "polymem"
        for d in deps if d != "polymem" and stage_of(d) is not None and stage_of(m) is not None and stage_of(d) > stage_of(m)
    )
    assert not upward, "imports from a lower stage to a higher one:\n" + "\n".join(upward)


def test_stage_rule_catches_what_it_names() -> None:
    assert stage_of("polymem.asset.core") < stage_of("polymem.serve.service") < stage_of("polymem.ops.convert")
    assert stage_of("polymem.corpus") == stage_of("polymem.sources") and stage_of("polymem.cli.app") == len(STAGES) - 1
    assert stage_of("polymem.assets") is None and stage_of("polymem") is None


def test_every_module_is_under_600_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for p in sorted((ROOT / "polymem").rglob("*.py"))
            if (n := len(p.read_text(encoding="utf-8").splitlines())) >= 600}
    assert not long, f"modules of 600 lines or more (split them by concern): {long}"


# ------------------------------------------------------------------------------------------ public entry points
_PUBLIC = ("polymem", "polymem.asset", "polymem.serve", "polymem.ops", "polymem.engines", "polymem.models",
           "polymem.torch")


def _undocumented(module: str) -> list[str]:
    """The public functions, classes and public methods of ``module.__all__`` without a docstring."""
    import importlib
    import inspect

    mod = importlib.import_module(module)
    bare = []
    for name in mod.__all__:
        obj = getattr(mod, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue  # constants
        if not (inspect.getdoc(obj) or "").strip():
            bare.append(f"{module}.{name}")
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                fn = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
                # an override without its own docstring inherits its base's (inspect.getdoc, help())
                if not attr.startswith("_") and inspect.isfunction(fn) and not (inspect.getdoc(getattr(obj, attr)) or "").strip():
                    bare.append(f"{module}.{name}.{attr}")
    return bare


@pytest.mark.parametrize("module", _PUBLIC)
def test_public_entry_points_are_documented(module: str) -> None:
    """Every public function, class and method says what it takes and returns (help() and the docs read it)."""
    bare = _undocumented(module)
    assert not bare, f"public names without a docstring: {bare}"
