"""The model cache (polymem.models._weightcache, polymem.models.cache, `polymem models`) on a tiny Llama GGUF written
by the gguf package (tests/tinygguf.py): the first load de-quantises and writes the entry, the next maps it and
gives the same model; a truncated, tampered or incomplete entry is reported in one line, never used, and rebuilt;
a cache that cannot take an entry (not a folder, a file-size limit) costs one line and leaves nothing behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tinygguf import write_tiny_gguf

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")
import torch  # noqa: E402

from polymem.cli.app import app  # noqa: E402
from polymem.models import load_model  # noqa: E402
from polymem.models._weightcache import MANIFEST, _write, cache_dir  # noqa: E402

TEXT = "The tutorial: def f(x): return x ** 2 — naïve café"


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture(scope="module")
def reference(gguf_file, tmp_path_factory):
    """The model as transformers de-quantises it, no cache involved."""
    os.environ["POLYMEM_CACHE_DIR"] = str(tmp_path_factory.mktemp("refcache"))
    try:
        return load_model(gguf_file, cache=False)
    finally:
        del os.environ["POLYMEM_CACHE_DIR"]


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("POLYMEM_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _same(lm, reference) -> None:
    a, b = lm.model.state_dict(), reference.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ids = torch.tensor([reference.tokenizer.encode(TEXT).tolist()])
    assert torch.equal(lm.model(ids).logits, reference.model(ids).logits)
    assert lm.tokenizer.fingerprint == reference.tokenizer.fingerprint
    assert not lm.model.training and not any(p.requires_grad for p in lm.model.parameters())


def _entry(gguf_file: Path, dtype=torch.float32) -> Path:
    from polymem.models.registry import _sha256

    return cache_dir(_sha256(gguf_file), dtype)


def test_first_load_writes_the_entry_the_next_maps_it(cache, gguf_file, reference, capfd):
    first = load_model(gguf_file)
    assert first.load["weights"] == "gguf, cached"
    entry = _entry(gguf_file)
    assert entry.parent == cache / "models" / "weights"
    meta = json.loads((entry / MANIFEST).read_text())
    assert meta["source"] == "tiny.gguf" and meta["dtype"] == "float32" and meta["class"] == "LlamaForCausalLM"
    assert set(meta["files"]) == {"config.json", "model.safetensors"}
    assert "quantization_config" not in json.loads((entry / "config.json").read_text())
    assert not [p for p in entry.parent.iterdir() if p.name.startswith(".")]  # no temporary left
    second = load_model(gguf_file)
    assert second.load["weights"] == "cache" and "loaded tiny in" in second.load_line()
    _same(first, reference)
    _same(second, reference)
    assert second.describe() == reference.describe()  # provenance does not depend on where the weights came from
    notes = [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("note:")]
    assert [n for n in notes if "first use" not in n] == [] and len(notes) <= 1  # the first conversion only, said once


def test_each_dtype_has_its_own_entry(cache, gguf_file, reference):
    lm = load_model(gguf_file, dtype=torch.bfloat16)
    again = load_model(gguf_file, dtype=torch.bfloat16)
    assert again.load["weights"] == "cache" and next(again.model.parameters()).dtype == torch.bfloat16
    assert _entry(gguf_file, torch.bfloat16).is_dir() and not _entry(gguf_file).exists()
    assert torch.equal(lm.model.model.embed_tokens.weight, again.model.model.embed_tokens.weight)
    assert torch.equal(again.model.model.embed_tokens.weight,
                       reference.model.model.embed_tokens.weight.to(torch.bfloat16))


def _truncate(entry: Path) -> None:
    f = entry / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _tamper(entry: Path) -> None:  # one weight byte changed, the manifest left as it was
    f = entry / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[-7] ^= 0x40
    f.write_bytes(bytes(data))


def _drop_a_weight(entry: Path) -> None:  # a consistent entry (manifest rehashed) missing one of the model's weights
    from safetensors.torch import load_file, save_file

    from polymem.models._entry import file_hashes, manifest_crc

    weights = load_file(str(entry / "model.safetensors"))
    weights.pop(sorted(k for k in weights if "q_proj" in k)[0])
    save_file(weights, str(entry / "model.safetensors"), metadata={"format": "pt"})
    meta = json.loads((entry / MANIFEST).read_text())
    meta["files"] = file_hashes(entry, MANIFEST)
    meta["manifest_crc32c"] = manifest_crc(meta)
    (entry / MANIFEST).write_text(json.dumps(meta))


def _no_manifest(entry: Path) -> None:
    (entry / MANIFEST).unlink()


@pytest.mark.parametrize("damage", [_truncate, _tamper, _drop_a_weight, _no_manifest], ids=lambda f: f.__name__[1:])
def test_a_damaged_entry_is_never_used_and_is_rebuilt(cache, gguf_file, reference, capfd, damage):
    load_model(gguf_file)
    entry = _entry(gguf_file)
    damage(entry)
    capfd.readouterr()
    lm = load_model(gguf_file)
    err = [ln for ln in capfd.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("note: the cached weights") and "damaged" in err[0], err
    assert str(entry) in err[0] and lm.load["weights"] == "gguf, cached"
    _same(lm, reference)
    again = load_model(gguf_file)  # rebuilt: read back with no notice
    assert again.load["weights"] == "cache" and "note:" not in capfd.readouterr().err
    _same(again, reference)
    assert [p.name for p in entry.parent.iterdir()] == [entry.name]


def test_a_cache_that_is_not_a_folder_costs_one_line_per_entry(tmp_path, monkeypatch, gguf_file, reference, capfd):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    monkeypatch.setenv("POLYMEM_CACHE_DIR", str(blocker / "cache"))
    lm = load_model(gguf_file)
    err = [ln for ln in capfd.readouterr().err.splitlines() if ln.strip() and "(first use" not in ln]
    assert lm.load["weights"] == "gguf, not cached"
    assert len(err) == 2 and all(ln.startswith("note: ") and "not cached" in ln for ln in err), err
    _same(lm, reference)


_LIMITED = r"""
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)            # a write past the limit fails with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), int(sys.argv[2])))
from polymem.models import load_model
lm = load_model(sys.argv[1])
print(lm.load["weights"])
"""


def test_a_write_cut_short_by_a_size_limit_leaves_nothing_behind(cache, gguf_file):
    """Files over 40 KB cannot be written (RLIMIT_FSIZE): the safetensors file fails part-way, the load goes on
    from the GGUF, and no temporary folder stays in the cache."""
    r = subprocess.run([sys.executable, "-c", _LIMITED, str(gguf_file), str(40_000)], capture_output=True,
                       text=True, timeout=300, env=os.environ.copy())
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().endswith("gguf, not cached"), r.stdout
    notes = [ln for ln in r.stderr.splitlines() if ln.startswith("note: ")]
    assert any("weights were not cached" in ln and "File too large" in ln for ln in notes), r.stderr[-2000:]
    weights = cache / "models" / "weights"
    assert not weights.exists() or not list(weights.iterdir())
    assert load_model(gguf_file).load["weights"] == "gguf, cached"  # without the limit: written as usual


def test_racing_writers_all_end_fine(cache, gguf_file, reference):
    from polymem.models.registry import _sha256

    sha, entry = _sha256(gguf_file), _entry(gguf_file)
    results: list[object] = []
    threads = [threading.Thread(target=lambda: results.append(_write(entry, reference.model, sha, torch.float32)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [None] * 4
    assert [p.name for p in entry.parent.iterdir()] == [entry.name]
    lm = load_model(gguf_file)
    assert lm.load["weights"] == "cache"
    _same(lm, reference)


def test_models_command_lists_sizes_and_clears(cache, gguf_file):
    load_model(gguf_file)
    load_model(gguf_file, dtype=torch.bfloat16)
    dead = cache / "models" / "weights" / ".x.tmp-999999999-abcd"  # an interrupted write whose process is gone
    dead.mkdir()
    (dead / "model.safetensors").write_bytes(b"\0" * 1000)
    runner = CliRunner()
    r = runner.invoke(app, ["models"], env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    assert "smollm2-135m" in r.output and "gemma3-270m" in r.output
    for what in ("weights", "tokenizers", "leftover", "tiny.gguf", "float32", "bfloat16"):
        assert what in r.output, what
    from polymem.models.cache import list_entries

    found = list_entries()
    assert sorted(e.kind for e in found) == ["leftover", "tokenizers", "weights", "weights"]
    assert all(e.bytes > 0 for e in found)
    bf16 = next(e for e in found if "bfloat16" in e.key)
    r = runner.invoke(app, ["models", "clear", "no-such-entry"])
    assert r.exit_code != 0 and "no model cache entry matches 'no-such-entry'" in str(r.exception)
    assert len(list_entries()) == 4  # a bad selector removes nothing
    r = runner.invoke(app, ["models", "clear", bf16.key])
    assert r.exit_code == 0 and "removed 1 entry" in r.output, r.output
    assert not bf16.path.exists() and len(list_entries()) == 3
    r = runner.invoke(app, ["models", "clear", bf16.key[:12]])  # a key prefix: every entry of that GGUF
    assert r.exit_code == 0 and "removed 2 entries" in r.output, r.output
    assert [e.kind for e in list_entries()] == ["leftover"]
    r = runner.invoke(app, ["models", "clear"])
    assert r.exit_code == 0 and "removed 1 entry" in r.output, r.output
    assert list_entries() == [] and not dead.exists()
    r = runner.invoke(app, ["models"], env={"COLUMNS": "250"})
    assert "is empty" in r.output


def _link_weights_outside(entry: Path) -> None:  # the weights moved out and linked back: sizes and crcs still match
    outside = entry.parent.parent.parent / "elsewhere.safetensors"
    os.replace(entry / "model.safetensors", outside)
    (entry / "model.safetensors").symlink_to(outside)


def _manifest_fifo(entry: Path) -> None:  # made by the test (tests/fifos.py), so a reader that waits is released
    (entry / MANIFEST).unlink()


def _manifest_huge(entry: Path) -> None:  # 1 GiB (sparse): read whole, it took 2 GB of memory
    with open(entry / MANIFEST, "r+b") as f:
        f.truncate(1 << 30)


def _manifest_field_edited(entry: Path) -> None:  # a field outside every file checksum and check, changed
    meta = json.loads((entry / MANIFEST).read_text())
    (entry / MANIFEST).write_text(json.dumps({**meta, "source": "other.gguf"}))


@pytest.mark.parametrize("damage", [_link_weights_outside, _manifest_fifo, _manifest_huge, _manifest_field_edited],
                         ids=lambda f: f.__name__[1:])
def test_an_entry_holding_a_link_a_fifo_or_an_oversized_manifest_is_never_used(cache, gguf_file, reference, capfd,
                                                                               damage):
    """The cache is the user's own folder, checked for accidents: a weights file linked to one outside the entry
    is not followed (even when its size and crc32c match), a FIFO manifest is refused without waiting for a writer,
    a 1 GiB manifest unread, an edited manifest field fails the manifest's own crc32c. One note, the GGUF loads."""
    import contextlib
    import tracemalloc

    from fifos import fifo, quick

    from polymem.models._entry import read_manifest

    load_model(gguf_file)
    entry = _entry(gguf_file)
    damage(entry)
    with contextlib.ExitStack() as stack:
        if damage is _manifest_fifo:
            stack.enter_context(fifo(entry / MANIFEST))
            assert "FIFO" in str(quick(read_manifest, entry, MANIFEST, 2))  # at once, not when a writer comes
        capfd.readouterr()
        tracemalloc.start()
        lm = load_model(gguf_file)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < 256 << 20  # the de-quantised tiny model, not the manifest
    err = [ln for ln in capfd.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("note: the cached weights") and "damaged" in err[0], err
    assert lm.load["weights"] == "gguf, cached"
    _same(lm, reference)
    outside = cache / "elsewhere.safetensors"
    if damage is _link_weights_outside:
        assert "is a symbolic link" in err[0] and outside.is_file() and outside.stat().st_size > 0
    if damage is _manifest_fifo:
        assert "FIFO" in err[0]
    if damage is _manifest_huge:
        assert "1,073,741,824 bytes" in err[0]
    if damage is _manifest_field_edited:
        assert "its own crc32c" in err[0]


def test_a_manifest_fifo_never_hangs_the_listing(cache, gguf_file):
    from fifos import fifo, quick

    from polymem.models.cache import list_entries

    load_model(gguf_file)
    entry = _entry(gguf_file)
    (entry / MANIFEST).unlink()
    with fifo(entry / MANIFEST):
        found = quick(list_entries)
    assert [e.detail for e in found if e.path == entry] == ["no manifest (damaged)"]


def test_an_edited_tokenizer_bos_id_is_a_damaged_entry(cache, gguf_file, capfd):
    """bos_id starts every scored window: an edit to it (outside every file checksum before) is caught by the
    manifest's own crc32c, and a recomputed crc with an id outside the vocabulary by the range check."""
    from polymem.models._entry import manifest_crc
    from polymem.models._tokcache import MANIFEST as TOK_MANIFEST
    from polymem.models._tokcache import cache_dir as tok_dir
    from polymem.models.registry import _sha256

    first = load_model(gguf_file)
    entry = tok_dir(_sha256(gguf_file))
    meta = json.loads((entry / TOK_MANIFEST).read_text())
    for bos, crc in ((meta["bos_id"] + 1, False), (10**6, True)):
        edited = {**meta, "bos_id": bos}
        if crc:
            edited["manifest_crc32c"] = manifest_crc(edited)
        (entry / TOK_MANIFEST).write_text(json.dumps(edited))
        capfd.readouterr()
        lm = load_model(gguf_file)
        err = capfd.readouterr().err
        assert "note: the cached tokenizer" in err and "damaged" in err, err
        assert ("own crc32c" in err) if not crc else ("is not an id of its" in err), err
        assert lm.bos_id == first.bos_id


def test_clear_never_follows_a_linked_cache_folder(cache, gguf_file, tmp_path):
    """models/weights a link to a folder of the user's: `polymem models clear` refuses (before: it removed the
    user's folder as an entry); a folder under models/ not named as the cache names entries is never removed."""
    load_model(gguf_file)
    mine = tmp_path / "mine"
    (mine / "project").mkdir(parents=True)
    (mine / "project" / "notes.txt").write_text("keep me")
    weights = cache / "models" / "weights"
    for p in list(weights.iterdir()):
        os.replace(p, mine / p.name)
    weights.rmdir()
    weights.symlink_to(mine)
    r = CliRunner().invoke(app, ["models", "clear"])
    assert r.exit_code != 0 and "is a symbolic link" in str(r.exception) and "never through a link" in str(r.exception)
    assert (mine / "project" / "notes.txt").read_text() == "keep me"
    weights.unlink()
    weights.mkdir()
    (weights / "project").mkdir()
    (weights / "project" / "notes.txt").write_text("keep me too")
    r = CliRunner().invoke(app, ["models", "clear"])
    assert r.exit_code == 0, r.output
    assert (weights / "project" / "notes.txt").read_text() == "keep me too"
