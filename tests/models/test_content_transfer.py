"""The content-split transfer study on small random-initialised models built from configs (no download): the
corpus split by document, a donor trained on its part, arms on theirs, every arm and the donor scored on
donor-read and unseen documents; resumable; refusals before anything loads; the results file's shape."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from polymem.cli.app import app
from polymem.errors import PolymemError
from polymem.recipes.options import ExperimentData

pytest.importorskip("transformers")
torch.set_num_threads(1)

from test_models import _checkpoint  # noqa: E402  (the tiny checkpoints of the pretrained-model tests)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    return {a: _checkpoint(root / a, a) for a in ("llama", "gemma3")}


@pytest.fixture(scope="module")
def lms(ckpts):
    from polymem.models import load_model

    return {a: load_model(p) for a, p in ckpts.items()}


@pytest.fixture(scope="module")
def docs():
    from conftest import generated_text, sample_text

    lines = [ln for ln in (sample_text() + "\n" + generated_text(2500, seed=3)).splitlines() if ln.strip()]
    return ["\n".join(lines[i:i + 6]) for i in range(0, len(lines), 6)][:30]


def _donor_cfg():
    from polymem.recipes.frozen import FrozenTrainConfig

    return FrozenTrainConfig(steps=6, batch_size=2, block_size=16, layers=(1,), params=4096 * 8, heads=4, head_dim=8,
                             table_lr=0.1, site_lr=3e-3)


def test_split_is_seeded_disjoint_and_refuses_an_empty_part():
    from polymem.recipes.content import ContentSplit

    s = ContentSplit.parse("0.3,0.4,0.3", seed=5)
    a = s.assign(30)
    assert [len(a[p]) for p in ("donor", "recipient", "unseen")] == [9, 12, 9]
    assert sorted(a["donor"] + a["recipient"] + a["unseen"]) == list(range(30)) and a == s.assign(30)
    assert ContentSplit.parse("0.3,0.4,0.3", seed=6).assign(30) != a
    assert sum(len(v) for v in ContentSplit.parse("0.5,0.3,0.2").assign(10).values()) == 10
    with pytest.raises(PolymemError, match=r"of 4 document\(s\) leaves the unseen part empty; give a corpus of at least 5"):
        ContentSplit.parse("0.5,0.4,0.1").assign(4)
    with pytest.raises(PolymemError, match="must be three shares"):
        ContentSplit.parse("0.5,0.5")
    with pytest.raises(PolymemError, match="together at most 1"):
        ContentSplit.parse("0.5,0.5,0.5")


def test_content_bootstrap_by_hand():
    from polymem.recipes.stats import content_bootstrap

    c = content_bootstrap(([[9.0, 9.0]], [10.0, 10.0]), ([[10.0, 8.0]], [10.0, 10.0]), resamples=200)
    assert c["read"] == [pytest.approx(-0.1)] and c["unseen"] == [pytest.approx(-0.1)] and c["diff"] == [pytest.approx(0)]
    assert c["lo"][0] < 0 < c["hi"][0]  # the unseen documents disagree: the interval spans zero


def test_content_transfer_study(lms, docs, tmp_path):
    from polymem.recipes.content import (
        ContentOptions, ContentSplit, check_donor_read, content_parts, content_record, run_content_transfer,
        write_content_results,
    )
    from polymem.recipes.frozen import FrozenTrainConfig, documents_digest
    from polymem.torch.tablefile import open_table

    split = ContentSplit.parse("0.3,0.4,0.3", seed=1)
    opts = ContentOptions(split=split, donor_cfg=_donor_cfg(), resamples=200)
    cfg = FrozenTrainConfig(steps=3, batch_size=2, block_size=16, table_lr=0.1, site_lr=3e-3)
    events: list[tuple] = []
    kw = dict(data=ExperimentData(texts=docs, eval_tokens=256, window=64), cfg=cfg, content=opts,
              arms=["none", "donor", "in_place", "stitch"], seeds=[0, 1], eval_at=[], out_dir=tmp_path / "run")
    res = run_content_transfer(lms["gemma3"], lms["llama"], **kw,
                               on_event=lambda kind, **k: events.append((kind, k.get("arm"))))
    out = tmp_path / "run"
    assert {f.name for f in out.iterdir()} >= {"split.json", "donor.pmem", "donor.pmem.site", "arms", "donor-own.json",
                                              "content-summary.json"}
    parts = content_parts(docs, split)["texts"]
    prov = open_table(out / "donor.pmem").provenance
    assert prov["train_documents"] == documents_digest(parts["donor"]) and prov["heldout_every"] == 0
    assert prov["corpus_read"]["passes"] > 0 and prov["model"]["name"] == "llama"
    assert res["donor_model"] == "llama" and res["recipient_model"] == "gemma3" and res["seeds"] == [0, 1]
    assert res["split"]["seed"] == 1 and len(res["split"]["indices"]["donor"]) == 9
    none = res["arms"]["none"]
    assert none["read"] == none["unseen"] == none["diff"] == [0.0, 0.0]
    own = json.loads((out / "donor-own.json").read_text())
    for k in ("read", "unseen"):  # the donor's own change: its model with its table against its model alone
        want = (own["with_table"][k]["bpb"] - own["alone"][k]["bpb"]) / own["alone"][k]["bpb"]
        assert res["donor_own"][k] == [pytest.approx(want, rel=1e-6)]
    ceiling = res["donor_own"]["diff"][0]
    for arm in ("donor", "in_place", "stitch"):
        c = res["arms"][arm]
        assert len(c["read"]) == len(c["unseen"]) == len(c["lo"]) == 2 and all(lo <= hi for lo, hi in zip(c["lo"], c["hi"]))
        run = json.loads((out / "arms" / f"{arm}-seed0.json").read_text())
        base = res["transfer"]["base_bpb"]
        assert c["read"][0] == pytest.approx((run["bpb"]["read"] - base["read"]) / base["read"], rel=1e-6)
        assert c["diff"][0] == pytest.approx(c["read"][0] - c["unseen"][0])
        assert c["recovered"][0] == (pytest.approx(c["diff"][0] / ceiling) if ceiling < 0 else None)
    # the results file: the shape, one entry per direction
    rec = content_record(res)
    path = tmp_path / "content-transfer.json"
    write_content_results(path, rec)
    got = write_content_results(path, rec)  # the same direction again replaces it
    assert len(got["directions"]) == 1 and json.loads(path.read_text()) == json.loads(json.dumps(got))
    d = got["directions"][0]
    assert (d["donor"], d["recipient"], d["seeds"]) == ("llama", "gemma3", [0, 1])
    assert set(d["donor_own"]) >= {"read", "unseen"} and set(d["arms"]) == {"none", "donor", "in_place", "stitch"}
    assert all(set(a) >= {"read", "unseen", "method"} for a in d["arms"].values())
    # a re-run trains nothing (donor, arms, donor's scores are there) and gives the same figures
    events.clear()
    again = run_content_transfer(lms["gemma3"], lms["llama"], **kw,
                                 on_event=lambda kind, **k: events.append((kind, k.get("arm"))))
    assert not [e for e in events if e[0] in ("run", "donor_step")]
    assert again["arms"] == res["arms"] and again["donor_own"] == res["donor_own"]
    # another split in the same folder is refused; a donor that read something else is refused
    with pytest.raises(PolymemError, match="holds a run of another split"):
        run_content_transfer(lms["gemma3"], lms["llama"], **{**kw, "content": ContentOptions(
            split=ContentSplit.parse("0.3,0.4,0.3", seed=2), donor_cfg=_donor_cfg())})
    other = content_parts(docs, ContentSplit.parse("0.3,0.4,0.3", seed=2))["texts"]["donor"]
    with pytest.raises(PolymemError, match=r"did not read the donor part of this split \(its provenance says 9 other"):
        check_donor_read(out / "donor.pmem", other)
    check_donor_read(out / "donor.pmem", parts["donor"])


def test_cli_content_split_refusals_before_loading(ckpts, docs, tmp_path):
    """An empty part, or a donor asset that read something else: one line, before any model loads (the model
    named does not exist, so loading it would fail otherwise)."""
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs[:4]))
    common = ["transfer", "--model", str(tmp_path / "no-such-model"), "--corpus", str(corpus), "--out-dir",
              str(tmp_path / "o")]
    r = CliRunner().invoke(app, common + ["--content-split", "0.5,0.4,0.1", "--donor-model", "x"])
    assert r.exit_code != 0 and "leaves the unseen part empty" in str(r.exception)
    r = CliRunner().invoke(app, common + ["--content-split", "0.5,0.3,0.2"])
    assert r.exit_code != 0 and "needs the donor's model" in str(r.exception)
    r = CliRunner().invoke(app, common + ["--split-seed", "3", "--asset", "x.pmem"])
    assert r.exit_code != 0 and "--split-seed has no effect without --content-split" in str(r.exception)


def test_cli_content_split_end_to_end(ckpts, docs, tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    args = ["transfer", "--model", str(ckpts["gemma3"]), "--corpus", str(corpus), "--content-split", "0.3,0.4,0.3",
            "--donor-model", str(ckpts["llama"]), "--donor-steps", "3", "--donor-params", "256K", "--layers", "1",
            "--steps", "2", "--batch-size", "2", "--block-size", "16", "--seeds", "1", "--arms", "none,donor",
            "--eval-tokens", "256", "--out-dir", str(tmp_path / "run"), "--json", str(tmp_path / "ct.json")]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "9 read by the donor only, 12 by the recipient, 9 by nobody" in text and "(the donor)" in text
    d = json.loads((tmp_path / "ct.json").read_text())["directions"]
    assert [(x["donor"], x["recipient"]) for x in d] == [("llama", "gemma3")] and set(d[0]["arms"]) == {"none", "donor"}
    # the donor trained here is refused as --asset of another split, before any model loads
    r = CliRunner().invoke(app, args[:7] + ["--split-seed", "4", "--asset", str(tmp_path / "run" / "donor.pmem"),
                                            "--out-dir", str(tmp_path / "run2")])
    assert r.exit_code != 0 and "did not read the donor part of this split" in str(r.exception)


@pytest.mark.parametrize("gate", ["scalar", "context"])
def test_stitched_site_starts_as_the_model_alone_and_trains_only_the_stitch(gate):
    from polymem.hash.layout import Layout
    from polymem.torch.site import MemorySite, SiteConfig
    from polymem.torch.stitch import StitchedSite

    layout = Layout.for_params(4096 * 8, heads=4, slots=4, head_dim=8)
    donor = MemorySite(SiteConfig(d_model=12, max_n=2, gate=gate), layout)
    frozen = {k: v.clone() for k, v in donor.state_dict().items()}
    s = StitchedSite(donor, 20, seed=3)
    h = torch.randn(2, 5, 20)
    e = torch.randn(2, 5, 2, 4, 8)
    assert torch.equal(s(h, e), h)  # W_out starts at zero
    with torch.no_grad():
        s.back.weight.normal_()
    s(h, e).square().sum().backward()
    trained = {n for n, p in s.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert trained == ({"back.weight"} if gate == "scalar" else {"into.weight", "back.weight"})
    assert all(not p.requires_grad for p in s.donor.parameters())
    assert all(torch.equal(v, frozen[k]) for k, v in s.donor.state_dict().items())
    # by hand: the scalar gate's addition is g * W_V e (orders scaled), mapped back by W_out
    if gate == "scalar":
        scale = torch.tensor([0.1, 1.0]).view(1, 1, 2, 1, 1)
        want = h + s.back(donor.gate * donor.value((e * scale).reshape(2, 5, -1)))
        assert torch.allclose(s(h, e), want, atol=1e-5)
