"""Deterministic fault injection for every asset writer, and a property test over random operation sequences.

Every file-system mutation of the writers goes through :mod:`polymem.asset._fs`. ``Injector`` wraps those
functions and fails the k-th call, for every k up to the number of calls a clean run makes, in two modes:
``crash`` (that call and every later one fail — nothing after it, not even cleanup, reaches the disk, like a
killed process) and ``error`` (only that call fails, so the writer's own rollback runs). After each injected
failure the asset must either open with exactly the old committed files, or exactly the new ones, or refuse
to open with an error naming ``polymem verify --repair`` — after which ``MemoryAsset.repair`` leaves exactly
the old or the new files. A writer that raised must not have landed (unless it said it committed).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from faults import OPS, Injector

from polymem import FormatError, HashSpec, Layout, MemoryAsset, PolymemError
from polymem.asset import nf4
from polymem.hash.idhash import IdHashSpec
from polymem.hash.xor import XorHashSpec
from polymem.ops.convert import convert
from polymem.ops.merge import merge
from polymem.ops.pull import pull
from polymem.tokenizers import load_tokenizer
from polymem.ops.subset import subset

SPEC = HashSpec()
LAYOUT = Layout(pages=11, heads=4, slots=2, head_dim=8)
def _table(seed: int = 0, layout: Layout = LAYOUT) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((layout.num_rows, layout.head_dim)).astype(np.float32)


def _files(root: Path) -> dict[str, bytes]:
    """Every file of the asset and every sibling that a writer may leave, byte for byte (the lock file aside)."""
    out = {}
    for p in sorted(root.parent.rglob("*")):
        if p.is_file() and p.name != ".polymem-lock":
            out[str(p.relative_to(root.parent))] = p.read_bytes()
    return out


def _writers(tmp: Path) -> dict[str, tuple[Callable[[], Path], Callable[[Path], None]]]:
    """name -> (make the starting state, the write to inject into)."""

    def base(dtype: str = "float16", counts: bool = False) -> Callable[[], Path]:
        template = tmp / f"template-{dtype}-{counts}"

        def make() -> Path:  # a fresh copy of one template asset
            if not template.exists():
                rows = np.arange(LAYOUT.num_rows, dtype=np.uint32) % 3 if counts else None
                MemoryAsset.from_array(template, _table(0), SPEC, LAYOUT, orders=(1, 2), dtype=dtype,
                                       chunks_per_shard=4, row_counts=rows)
            d = tmp / "case"
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir()
            shutil.copytree(template, d / "a")
            return d / "a"

        return make

    def v1() -> Path:
        d = tmp / "case"
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()
        shutil.copytree(Path(__file__).resolve().parents[1] / "data" / "asset-v1-float32", d / "a")
        return d / "a"

    def xor_source() -> Path:  # a tokenizer-bound (--hash xor) table over the bytes tokenizer, and a corpus
        d = tmp / "case"
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()
        tok = load_tokenizer("bytes")
        spec = IdHashSpec.from_xor(XorHashSpec(head_rows=67, orders=(1, 2), heads=2),
                                   tokenizer={"name": tok.name, "fingerprint": tok.fingerprint}, vocab_size=tok.vocab_size)
        lay = spec.layout(4)
        table = np.random.default_rng(0).normal(size=(lay.num_rows, 4)).astype(np.float32)
        (d / "docs.txt").write_text("the cat sat on the mat. the dog sat on the log.\n" * 3)
        MemoryAsset.from_array(d / "a", table, spec, lay, orders=(1, 2), chunks_per_shard=4)
        return d / "a"

    pages = np.full((3, 8, 8), 0.5, np.float32)
    return {
        "write_pages (2 shards)": (base(), lambda p: MemoryAsset.open(p).write_pages([1, 2, 9], pages)),
        "write_pages nf4": (base("nf4"), lambda p: MemoryAsset.open(p).write_pages([0, 5, 10], pages)),
        "from_array overwrite": (base(), lambda p: MemoryAsset.from_array(p, _table(1), SPEC, LAYOUT, orders=(1,),
                                                                          overwrite=True, chunks_per_shard=4)),
        "create (new path)": (base(), lambda p: MemoryAsset.create(p.parent / "b", SPEC, LAYOUT, chunks_per_shard=4)),
        "pull (new path)": (base(), lambda p: pull(str(p), p.parent / "b")),
        "subset (new path)": (base(counts=True), lambda p: subset(MemoryAsset.open(p), p.parent / "b", min_count=2)),
        "quantize overwrite": (base(), lambda p: MemoryAsset.open(p).quantize(p, to="nf4", overwrite=True)),
        "upgrade v1": (v1, lambda p: MemoryAsset.upgrade(p)),
        "merge (new path)": (base(counts=True), lambda p: merge([MemoryAsset.open(p), MemoryAsset.open(p)], p.parent / "b")),
        "convert (new path)": (xor_source, lambda p: convert(p, "bytes", [p.parent / "docs.txt"], p.parent / "b",
                                                            layout=Layout(pages=4, heads=2, slots=2, head_dim=4))),
    }


CASES = [pytest.param(c, marks=pytest.mark.slow) if c.startswith("convert") else c  # convert replays a corpus: seconds
         for c in _writers(Path("/unused"))]


@pytest.mark.parametrize("case", CASES)
def test_every_injected_failure_leaves_old_new_or_repairable(tmp_path, monkeypatch, case):
    make, write = _writers(tmp_path)[case]
    root = make()
    old = _files(root)
    clean = Injector(float("inf"), "none")
    with monkeypatch.context() as m:
        clean.install(m)
        write(root)
    new = _files(root)
    assert new != old
    n_ops = clean.n
    assert n_ops >= 5, clean.log
    seen = {"old": 0, "new": 0, "repaired": 0}
    for mode in ("crash", "error"):
        for k in range(1, n_ops + 1):
            root = make()
            inj = Injector(k, mode)
            raised: BaseException | None = None
            with monkeypatch.context() as m:
                inj.install(m)
                try:
                    write(root)
                except (OSError, PolymemError) as e:
                    raised = e
            where = f"{case}: {mode} at call {k} ({inj.log[k - 1] if k <= len(inj.log) else '-'})"
            try:
                a = MemoryAsset.open(root)
                state = _files(root)
                opened = True
            except FormatError as e:
                assert "verify --repair" in str(e) or "no asset directory" in str(e), (where, str(e))
                opened = False
            if opened and a.version == 2:
                assert a.problems() == [], where
            done = MemoryAsset.repair(root) if root.exists() or list(root.parent.glob(".a.old-*")) else []
            after = _files(root)
            target = root.parent / "b"
            if case.endswith("(new path)"):  # the new asset is 'b': either complete or absent
                if target.exists() or list(root.parent.glob(".b.*")):
                    MemoryAsset.repair(target)
                after = _files(root)
                assert {k2: v for k2, v in after.items() if not k2.startswith("b/")} == old, where
                if target.exists():  # byte for byte, but the group metadata (subset's provenance has a time)
                    def data(files: dict[str, bytes]) -> dict[str, bytes]:
                        return {k2: v for k2, v in files.items() if k2.startswith("b/") and k2 != "b/zarr.json"}

                    assert data(after) == data(new) and MemoryAsset.open(target).problems() == [], where
                seen["new" if target.exists() else "old"] += 1
                continue
            assert after in (old, new), (where, sorted(set(after) ^ set(old)), done)
            if opened:
                assert state == after or done, where  # an asset that opened needed no repair of its bytes
                seen["old" if state == old else "new"] += 1
            else:
                seen["repaired"] += 1
            if raised is not None and after == new:
                assert "committed" in str(raised) or "finish" in " ".join(done), (where, raised)
            if raised is None:
                assert after == new, where  # no error reported: the write landed
    assert seen["old"] and (seen["new"] or seen["repaired"]), seen


# ------------------------------------------------------------------------------------------ property
def _expected(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "float32":
        return x
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        from polymem.asset._codec import bf16_decode, bf16_encode

        return bf16_decode(bf16_encode(x))
    return nf4.dequantize(nf4.quantize(x), x.shape[-1])


_op = st.one_of(
    st.tuples(st.just("write"), st.lists(st.integers(0, 10), min_size=1, max_size=4, unique=True), st.integers(0, 99)),
    st.tuples(st.just("corrupt"), st.integers(0, 10), st.integers(0, 10**6)),
    st.tuples(st.just("restore")),
    st.tuples(st.just("verify")),
    st.tuples(st.just("quantize"), st.sampled_from(["float32", "nf4", "bfloat16"])),
    st.tuples(st.just("read"), st.lists(st.integers(0, 10), min_size=1, max_size=5)),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dtype=st.sampled_from(["float16", "nf4", "float32"]), ops=st.lists(_op, min_size=1, max_size=10))
def test_random_operations_never_serve_uncommitted_bytes(tmp_path_factory, dtype, ops):
    root = tmp_path_factory.mktemp("p") / "a"
    table = _table(3)
    a = MemoryAsset.from_array(root, table, SPEC, LAYOUT, orders=(1,), dtype=dtype, chunks_per_shard=4)
    g = a.geometry
    model = _expected(table, dtype).reshape(11, 8, 8)  # the last committed pages, decoded
    flips: dict[tuple[int, int], int] = {}  # (shard, byte) -> times flipped since the last restore
    bad_chunks: set[int] = set()

    def recount() -> None:
        bad_chunks.clear()
        bad_chunks.update(s * g.chunks_per_shard + off // g.stride for (s, off), n in flips.items() if n % 2)

    def flip(path: Path, off: int) -> None:
        data = bytearray(path.read_bytes())
        data[off] ^= 0x10
        path.write_bytes(bytes(data))

    def chunks_of(pages) -> set[int]:
        return {p // g.pages_per_chunk for p in pages}

    def bad_shards() -> set[int]:
        return {c // g.chunks_per_shard for c in bad_chunks}

    for i, op in enumerate(ops):
        if op[0] == "write":
            ids, seed = op[1], op[2]
            data = np.random.default_rng(seed).standard_normal((len(ids), 8, 8)).astype(np.float32)
            touched = {g.shard_of_page(p)[0] for p in ids}
            if touched & bad_shards():
                with pytest.raises(FormatError, match="crc32c|checksum mismatch"):
                    a.write_pages(ids, data)
            else:
                a.write_pages(ids, data)
                model[ids] = _expected(data, dtype)
        elif op[0] == "corrupt":
            page, r = op[1], op[2]
            s, ci = g.shard_of_page(page)
            off = ci * g.stride + r % g.stride  # a byte of that page's stored chunk (data or its crc32c)
            flip(root / g.shard_key(s), off)
            flips[(s, off)] = flips.get((s, off), 0) + 1
            recount()
        elif op[0] == "restore":
            for (s, off), n in flips.items():
                if n % 2:
                    flip(root / g.shard_key(s), off)
            flips.clear()
            recount()
        elif op[0] == "verify":
            probs = MemoryAsset.open(root).problems()
            assert bool(probs) == bool(bad_chunks), probs
            assert all(g.shard_key(s) in " ".join(probs) for s in bad_shards())
        elif op[0] == "quantize":
            out = root.parent / f"q{i}"
            if bad_chunks:
                with pytest.raises(FormatError):
                    a.quantize(out, to=op[1])
                assert not out.exists()
            else:
                q, _ = a.quantize(out, to=op[1])
                assert np.array_equal(q.to_numpy().reshape(11, 8, 8), _expected(model, op[1]))
        else:  # read
            ids = op[1]
            b = MemoryAsset.open(root)
            if chunks_of(ids) & bad_chunks:
                with pytest.raises(FormatError, match="fails its crc32c check"):
                    b.read_pages(ids)
            else:
                assert np.array_equal(b.read_pages(ids), model[ids])
        # the invariant after every step: every page either reads as last committed or raises FormatError
        b = MemoryAsset.open(root)
        for p in range(11):
            if p // g.pages_per_chunk in bad_chunks:
                with pytest.raises(FormatError):
                    b.read_pages([p])
            else:
                assert np.array_equal(b.read_pages([p])[0], model[p]), (i, op, p)


# ------------------------------------------------------------------------------------------ real SIGKILL
_KILL_AT = """
import os, signal, sys, numpy as np
from polymem import MemoryAsset
from polymem.asset import _fs
k, n = int(sys.argv[2]), [0]
for name in {ops!r}:
    def wrap(fn, name=name):
        def w(*a, **kw):
            n[0] += 1
            if n[0] == k:
                os.kill(os.getpid(), signal.SIGKILL)   # a real kill, at a known point: no cleanup runs
            return fn(*a, **kw)
        return w
    setattr(_fs, name, wrap(getattr(_fs, name)))
MemoryAsset.open(sys.argv[1]).write_pages([1, 2, 9], np.full((3, 8, 8), 0.5, np.float32))
print("finished", n[0])
"""


def _kill_case(tmp_path: Path, k: int) -> tuple[int, dict, dict, dict]:
    import subprocess
    import sys

    make, _ = _writers(tmp_path)["write_pages (2 shards)"]
    root = make()
    old = _files(root)
    r = subprocess.run([sys.executable, "-c", _KILL_AT.format(ops=OPS), str(root), str(k)], capture_output=True,
                       text=True, timeout=120)
    try:
        MemoryAsset.open(root)
    except FormatError as e:
        assert "verify --repair" in str(e)
    MemoryAsset.repair(root)
    return r.returncode, old, _files(root), {"out": r.stdout, "err": r.stderr[-500:]}


def _new_files(tmp_path: Path) -> tuple[dict, int]:
    """The files a clean write leaves, and how many _fs operations it makes."""
    ref = tmp_path / "ref"
    ref.mkdir()
    mk, wr = _writers(ref)["write_pages (2 shards)"]
    r = mk()
    clean = Injector(float("inf"), "none")
    with pytest.MonkeyPatch.context() as m:
        clean.install(m)
        wr(r)
    return _files(r), clean.n


# write_pages of 3 pages in 2 shards makes 32 _fs calls: 1-11 write the two SHARD.new files and the marker
# temp, 12 renames the marker into place, 14-21 swap the shards (unlink/link .old, rename .new), 22-25 write and
# rename zarr.json (25 = the commit point), 27 removes the marker, 29-32 the .old links.
@pytest.mark.parametrize("k, outcome", [(3, "old"), (16, "old"), (25, "old"), (29, "new")])
def test_writer_killed_at_a_known_operation(tmp_path, k, outcome):
    new, n_ops = _new_files(tmp_path)
    assert n_ops == 32
    rc, old, after, info = _kill_case(tmp_path, k)
    assert rc == -9, info  # the kill landed mid-write (at operation k), not after it
    assert after == (old if outcome == "old" else new), info


@pytest.mark.slow
def test_writer_killed_at_every_operation(tmp_path):
    new, n_ops = _new_files(tmp_path)
    outcomes = set()
    for k in range(1, n_ops + 1):
        (tmp_path / f"k{k}").mkdir()
        rc, old, after, info = _kill_case(tmp_path / f"k{k}", k)
        assert rc == -9, (k, info)
        assert after in (old, new), k
        outcomes.add("old" if after == old else "new")
    assert outcomes == {"old", "new"}
