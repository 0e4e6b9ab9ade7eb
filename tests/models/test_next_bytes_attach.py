"""Next bytes in `polymem attach` on small random-initialised models: a donor trained with a byte decoder, a
recipient site that trains the reader's order weights with it, saved and read back by `eval --site`,
`generate --site`, load_attached and bundles; the refusals (no decoder with --next-bytes on, a damaged decoder
file); and --next-bytes off writing the site alone."""

from __future__ import annotations

import inspect
import json
import shutil

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from polymem.cli.app import app
from polymem.errors import FormatError, PolymemError

pytest.importorskip("transformers")
torch.set_num_threads(1)

from test_models import ckpts, corpus_file, lms, texts  # noqa: E402,F401  (the tiny checkpoints and their corpus)

SMALL = ["--steps", "3", "--batch-size", "2", "--block-size", "16"]


@pytest.fixture(scope="module")
def donor(ckpts, corpus_file, tmp_path_factory):
    """A llama-trained table whose site folder holds a byte decoder (J = 4)."""
    out = tmp_path_factory.mktemp("donor") / "t.pmem"
    r = CliRunner().invoke(app, ["train", "--model", str(ckpts["llama"]), "--corpus", str(corpus_file), "--out", str(out),
                                 *SMALL, "--layers", "1", "--params", "32K", "--heads", "4", "--head-dim", "8",
                                 "--eval-tokens", "200", "--byte-head", "4", "--table-lr", "0.1"])
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture(scope="module")
def attached(ckpts, corpus_file, donor, tmp_path_factory):
    """`polymem attach` of gemma3 over the donor's table, next bytes on by default (the donor ships a decoder)."""
    d = tmp_path_factory.mktemp("attach")
    site, j = d / "gemma.site", d / "attach.json"
    r = CliRunner().invoke(app, ["attach", "--model", str(ckpts["gemma3"]), "--asset", str(donor), "--corpus",
                                 str(corpus_file), *SMALL, "--init", "zero", "--eval-tokens", "200", "--out", str(site),
                                 "--json", str(j), "--precision", "fp32"])
    assert r.exit_code == 0, r.output
    return {"site": site, "res": json.loads(j.read_text()), "output": " ".join(r.output.split())}


def test_attach_trains_and_saves_the_byte_reader(attached):
    site, res, out = attached["site"], attached["res"], attached["output"]
    nb = res["next_bytes"]
    assert nb["bytes"] == 4 and len(nb["weights"]) == nb["orders"] and any(w != 0 for w in nb["weights"])
    assert 0 < nb["reader_s"] < res["train_s"] and nb["w_lr"] > 0
    assert "next bytes: on (the donor's byte decoder, 4 bytes after each n-gram" in out
    assert f"next bytes: order weights w = [{', '.join(f'{x:+.3f}' for x in nb['weights'])}]" in out
    assert "cost: its forward took" in out and "of training (" in out
    assert f"after {res['tokens']:,} tokens with next bytes {res['heldout_bpb']:.4f}" in out
    rec = json.loads((site / "site.json").read_text())["next_bytes"]
    assert rec["weights"] == nb["weights"] and rec["file"] == "bytes.safetensors" and (site / rec["file"]).is_file()
    assert rec["mix"] is True and "mixed with the model's prediction" in out  # the default reader interpolates
    assert rec["hits"] == "all" and "written in all of the table's heads" in out  # and reads full hits only
    import hashlib

    assert hashlib.sha256((site / "bytes.safetensors").read_bytes()).hexdigest() == rec["sha256"]


def test_attach_next_bytes_hits_any_is_saved_and_said(ckpts, corpus_file, donor, tmp_path):
    site = tmp_path / "any.site"
    r = CliRunner().invoke(app, ["attach", "--model", str(ckpts["gemma3"]), "--asset", str(donor), "--corpus",
                                 str(corpus_file), *SMALL, "--init", "zero", "--eval-tokens", "200", "--out", str(site),
                                 "--next-bytes-hits", "any", "--precision", "fp32"])
    assert r.exit_code == 0, r.output
    assert "reading the n-grams written in any of the table's heads" in " ".join(r.output.split())
    assert json.loads((site / "site.json").read_text())["next_bytes"]["hits"] == "any"
    r = CliRunner().invoke(app, ["attach", "--model", str(ckpts["gemma3"]), "--asset", str(donor), "--corpus",
                                 str(corpus_file), "--out", str(tmp_path / "x.site"), "--next-bytes-hits", "some"])
    assert r.exit_code != 0 and "'some' is not one of 'any', 'all'" in r.output


def test_eval_site_reads_the_byte_reader_and_table_off_is_the_model_alone(attached, ckpts, corpus_file, lms, texts,
                                                                          tmp_path):
    from polymem.models.evaluate import evaluate
    from polymem.torch.attach import load_attached

    site, lm = attached["site"], lms["gemma3"]
    j = tmp_path / "eval.json"
    r = CliRunner().invoke(app, ["eval", "--model", str(ckpts["gemma3"]), "--corpus", str(corpus_file), "--heldout-every",
                                 "10", "--window", "64", "--site", str(site), "--table-off", "--json", str(j),
                                 "--precision", "fp32"])
    assert r.exit_code == 0, r.output
    ev = json.loads(j.read_text())
    assert ev["table_off"]["bpb"] == ev["alone"]["bpb"] != ev["with_table"]["bpb"]
    held = [t for i, t in enumerate(texts) if i % 10 == 9]

    def attach_site(reader: bool):
        def fn():
            h = load_attached(lm.model, site, tokenizer=lm.tokenizer)
            assert h.byte_reader is not None and not h.byte_reader.w.requires_grad
            if not reader:
                h.byte_reader.remove()
                assert h.byte_reader is None  # removed: the handle neither reads nor saves it
            return h
        return fn

    got = evaluate(lm, held, window=64, sites=[("with", attach_site(True)), ("site alone", attach_site(False))])
    assert got["sites"][0]["with_table"]["bpb"] == pytest.approx(ev["with_table"]["bpb"], rel=1e-6)
    assert got["sites"][1]["with_table"]["bpb"] != pytest.approx(ev["with_table"]["bpb"], rel=1e-6)  # the reader counts
    with torch.no_grad():  # every handle detached: the model alone again
        ids = torch.from_numpy(np.asarray(lm.tokenizer.encode(held[0])[:20], dtype=np.int64))[None]
        assert not lm.model._forward_hooks and not lm.model._forward_pre_hooks
        assert torch.isfinite(lm.model(input_ids=ids).logits).all()


def test_trained_score_round_trips_through_the_site(donor, corpus_file, lms, tmp_path):
    """The library route: the score right after training (reader attached, in this process) is the score of the
    site attached again from its folder, and of its bundle."""
    from polymem.recipes.frozen import FrozenTrainConfig
    from polymem.recipes.options import ExperimentData, RecipientSite
    from polymem.recipes.pretrained import Experiment, train_recipient_site
    from polymem.torch.attach import load_attached
    from polymem.torch.bundle import bundle_site
    from polymem.torch.bytehead import load_byte_head

    lm = lms["gemma3"]
    exp = Experiment(lm, str(donor), ExperimentData(corpus=[corpus_file], eval_tokens=200),
                     cfg=FrozenTrainConfig(steps=3, batch_size=2, block_size=16), site=RecipientSite(init="zero"))
    site = tmp_path / "lib.site"
    res = train_recipient_site(exp, site, byte_head=load_byte_head(f"{donor}.site"))
    ind = exp.in_domain
    # the donor's decoder was polished (train --model's default): the arms that read it say so in their key
    assert exp.arm_key("donor_next_bytes_mix").endswith("-dpolish1000") and "dpolish" not in exp.arm_key("donor")
    bundle = bundle_site(site, tmp_path / "lib.bundle")
    assert (bundle / "bytes.safetensors").read_bytes() == (site / "bytes.safetensors").read_bytes()
    added = tmp_path / "add.site"  # the other reader: scores added to the logits, also saved as what it is
    res_add = train_recipient_site(exp, added, byte_head=load_byte_head(f"{donor}.site"), mix=False)
    assert json.loads((added / "site.json").read_text())["next_bytes"]["mix"] is False
    assert res_add["heldout_bpb"] != res["heldout_bpb"]
    h = load_attached(lm.model, added, tokenizer=lm.tokenizer)
    try:
        assert not h.byte_reader.mix and exp.score([ind])[ind] == res_add["heldout_bpb"]
    finally:
        h.detach()
    full = tmp_path / "any.site"  # reading the n-grams written in any head: saved as such, read back so
    res_any = train_recipient_site(exp, full, byte_head=load_byte_head(f"{donor}.site"), hits="any")
    assert json.loads((full / "site.json").read_text())["next_bytes"]["hits"] == "any"
    assert json.loads((site / "site.json").read_text())["next_bytes"]["hits"] == "all"  # the default
    h = load_attached(lm.model, full, tokenizer=lm.tokenizer)
    try:
        assert h.byte_reader.hits == "any" and exp.score([ind])[ind] == res_any["heldout_bpb"]
    finally:
        h.detach()
    header = json.loads((full / "site.json").read_text())  # a site written before the field: "any", as it read then
    del header["next_bytes"]["hits"]
    (full / "site.json").write_text(json.dumps(header))
    h = load_attached(lm.model, full, tokenizer=lm.tokenizer)
    try:
        assert h.byte_reader.hits == "any" and exp.score([ind])[ind] == res_any["heldout_bpb"]
    finally:
        h.detach()
    for folder in (site, bundle):
        h = load_attached(lm.model, folder, tokenizer=lm.tokenizer)
        try:
            assert [float(x) for x in h.byte_reader.w] == res["next_bytes"]["weights"]
            assert exp.score([ind])[ind] == res["heldout_bpb"]
            with h.disabled():
                assert exp.score([ind])[ind] == res["heldout_bpb_alone"]
        finally:
            h.detach()
    assert exp.score([ind])[ind] == res["heldout_bpb_alone"]


def test_generate_site_matches_the_handle_and_decodes_incrementally(attached, ckpts, lms, tmp_path):
    from polymem.models.generate import Decoding, generate
    from polymem.torch.attach import load_attached

    site, lm = attached["site"], lms["gemma3"]
    j = tmp_path / "gen.json"
    prompt = "def f(x):\n    return"
    r = CliRunner().invoke(app, ["generate", "--model", str(ckpts["gemma3"]), "--site", str(site), "-p", prompt,
                                 "-n", "8", "--json", str(j), "--precision", "fp32"])
    assert r.exit_code == 0, r.output
    got = json.loads(j.read_text())["results"][0]
    h = load_attached(lm.model, site, tokenizer=lm.tokenizer)
    try:
        with torch.no_grad():
            h.byte_reader.w.mul_(50.0)  # a reader strong enough to move the logits visibly
        ref = generate(lm, [prompt], Decoding(8, 0.0, 1.0, 0), handle=h)["results"][0]
        # one pass over the whole sequence and a cached step at its end read the same n-grams (the site's history)
        ids = torch.tensor([ref.prompt_ids + ref.new_ids])
        with torch.no_grad():
            h.reset()
            full = lm.model(input_ids=ids).logits[0, -1]
            h.reset()
            first = lm.model(input_ids=ids[:, :-1], use_cache=True)
            kw = "cache" if "cache" in inspect.signature(lm.model.forward).parameters else "past_key_values"
            past = getattr(first, "cache", None) or first.past_key_values
            step = lm.model(input_ids=ids[:, -1:], use_cache=True, **{kw: past}).logits[0, -1]
            assert torch.allclose(full, step, atol=1e-4)
            with h.disabled():
                h.reset()
                alone = lm.model(input_ids=ids).logits[0, -1]
            assert not torch.allclose(full, alone, atol=1e-3)
        with torch.no_grad():
            h.byte_reader.w.div_(50.0)
        again = generate(lm, [prompt], Decoding(8, 0.0, 1.0, 0), handle=h)["results"][0]
    finally:
        h.detach()
    assert got["new_ids"] == again.new_ids and got["prompt_ids"] == again.prompt_ids


def test_next_bytes_refusals_and_off(attached, ckpts, corpus_file, donor, lms, tmp_path):
    from polymem.torch.attach import load_attached

    runner = CliRunner()
    # --next-bytes on, the donor site without a decoder: one line naming the fix, before the model loads
    plain = tmp_path / "plain.site"
    shutil.copytree(f"{donor}.site", plain)
    h = json.loads((plain / "site.json").read_text())
    del h["byte_head"]
    (plain / "site.json").write_text(json.dumps(h))
    base = ["attach", "--model", str(tmp_path / "no-such-model"), "--asset", str(donor), "--corpus", str(corpus_file),
            "--out", str(tmp_path / "x.site")]
    r = runner.invoke(app, base + ["--donor-site", str(plain), "--next-bytes", "on"])
    assert r.exit_code != 0 and "\n" not in str(r.exception)
    assert str(r.exception).startswith(f"--next-bytes on reads the donor's byte decoder, and {str(plain)!r} holds none")
    assert "`polymem train --model ... --byte-head 8`" in str(r.exception)
    # --donor-site with another init is read for its decoder only: without one it is refused as before
    r = runner.invoke(app, base + ["--init", "zero", "--donor-site", str(plain)])
    assert r.exit_code != 0 and "--donor-site are read only with --init aligned" in str(r.exception)
    # a decoder of other orders than the table's: refused before the model loads
    from polymem.torch.bytehead import ByteHead, save_byte_head

    other = tmp_path / "other.site"
    shutil.copytree(f"{donor}.site", other)
    save_byte_head(ByteHead(2, 4, 8, 4), other)
    r = runner.invoke(app, base + ["--init", "zero", "--donor-site", str(other)])
    assert r.exit_code != 0 and str(r.exception).startswith("the donor's byte decoder reads orders 1..2 of 4 × 8 rows; "
                                                            "the table has orders 1..3")
    # a damaged decoder in the recipient's site: one FormatError naming the file, and nothing left attached
    bad = tmp_path / "bad.site"
    shutil.copytree(attached["site"], bad)
    raw = bytearray((bad / "bytes.safetensors").read_bytes())
    raw[-3] ^= 0xFF
    (bad / "bytes.safetensors").write_bytes(bytes(raw))
    r = runner.invoke(app, ["eval", "--model", str(ckpts["gemma3"]), "--corpus", str(corpus_file), "--window", "64",
                            "--site", str(bad)])
    assert r.exit_code != 0 and isinstance(r.exception, FormatError)
    assert f"{str(bad / 'bytes.safetensors')!r} is not the byte decoder" in str(r.exception)
    lm = lms["gemma3"]
    with pytest.raises(FormatError, match="sha256 differs"):
        load_attached(lm.model, bad, tokenizer=lm.tokenizer)
    assert not lm.model._forward_hooks and not lm.model._forward_pre_hooks
    (bad / "bytes.safetensors").unlink()  # a missing decoder file: one line naming it
    with pytest.raises(PolymemError, match="bytes.safetensors"):
        load_attached(lm.model, bad, tokenizer=lm.tokenizer)
    assert not lm.model._forward_hooks and not lm.model._forward_pre_hooks
    # a damaged record in site.json: one line naming the entry
    h = json.loads((bad / "site.json").read_text())
    for field, value in (("weights", h["next_bytes"]["weights"][:-1]), ("hits", "some")):
        (bad / "site.json").write_text(json.dumps({**h, "next_bytes": {**h["next_bytes"], field: value}}))
        with pytest.raises(FormatError, match=r"site.json: its 'next_bytes' entry is not a byte reader's record"):
            load_attached(lm.model, bad, tokenizer=lm.tokenizer)
    # --next-bytes off: the site alone, as attach writes it for a donor without a decoder
    off = tmp_path / "off.site"
    r = runner.invoke(app, ["attach", "--model", str(ckpts["gemma3"]), "--asset", str(donor), "--corpus",
                            str(corpus_file), *SMALL, "--init", "zero", "--eval-tokens", "200", "--out", str(off),
                            "--next-bytes", "off", "--json", str(tmp_path / "off.json")])
    assert r.exit_code == 0, r.output
    assert "next bytes" not in r.output and "next_bytes" not in json.loads((tmp_path / "off.json").read_text())
    assert "next_bytes" not in json.loads((off / "site.json").read_text()) and not (off / "bytes.safetensors").exists()
    np.testing.assert_array_equal(sorted(p.name for p in off.iterdir()), ["site.json", "site.safetensors"])
