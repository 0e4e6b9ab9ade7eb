"""The teach and distill arms of the content study on small random-initialised models built from configs: the
donor's chunk targets aligned to the recipient's tokens (checked by hand), the chunk-likelihood loss, the arms
run end to end and resumed, and their refusals outside the content study."""

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

from test_content_transfer import _donor_cfg  # noqa: E402
from test_content_transfer import ckpts, docs, lms  # noqa: E402,F401  (the same small models and documents)


def _ends(lm, text):
    tb = lm.tokenizer.all_token_bytes()
    ids = [int(i) for i in lm.tokenizer.encode(text)]
    return ids, np.cumsum([len(tb[i]) for i in ids])


def test_chunk_targets_by_hand(lms):
    from polymem.recipes.teach import teach_data

    lm = lms["gemma3"]
    text = "def f(x):\n    return x + 1\n"
    ids, ends = _ends(lm, text)
    n = len(ids)
    assert n >= 4 and int(ends[-1]) == len(text.encode())
    nats = [0.5 + i for i in range(n)]
    # a donor with the same boundaries: every token is a chunk, its target the donor's token log-likelihood
    same = teach_data(lm, {"docs": [{"text": text, "donor_ends": ends.tolist(), "donor_nats": nats}],
                           **dict.fromkeys(("new_tokens", "prompts", "generate_s", "total_s", "tokens_per_s"), 0)})
    assert same.stream.tolist() == ids + [lm.eos_id]
    assert np.allclose(same.teacher[:n], -np.asarray(nats)) and np.isnan(same.teacher[n])
    assert same.first[:n].tolist() == list(range(n)) and same.chunks == n
    # a donor whose only boundary is the text's end: one chunk over the whole text, the sum of its tokens
    one = teach_data(lm, {"docs": [{"text": text, "donor_ends": [len(text.encode())], "donor_nats": [3.0]},
                                   {"text": text, "donor_ends": [int(ends[1]), len(text.encode())], "donor_nats": [1.0, 2.0]}],
                          **dict.fromkeys(("new_tokens", "prompts", "generate_s", "total_s", "tokens_per_s"), 0)})
    assert np.isnan(one.teacher[:n - 1]).all() and one.teacher[n - 1] == -3.0 and one.first[n - 1] == 0
    # the second text starts after the first and its EOS: chunks (0, ends[1]] and (ends[1], end]
    at = n + 1
    assert one.teacher[at + 1] == -1.0 and one.first[at + 1] == at
    assert one.teacher[at + n - 1] == -2.0 and one.first[at + n - 1] == at + 2 and one.chunks == 3
    # a donor whose bytes do not add up to the text's (no alignment): no targets, the text still trains
    none = teach_data(lm, {"docs": [{"text": text, "donor_ends": None, "donor_nats": None}],
                           **dict.fromkeys(("new_tokens", "prompts", "generate_s", "total_s", "tokens_per_s"), 0)})
    assert none.chunks == 0 and none.stream.tolist() == ids + [lm.eos_id]


def test_chunk_loss_is_least_where_the_recipient_matches_the_donor(lms):
    from polymem.recipes.teach import TeachData, chunk_loss

    # stream positions 0..7; chunks: [0, 1] (donor log-lik -1.0), [2] (-0.5), [3..5] cut by a window at 4
    teacher = np.array([np.nan, -1.0, -0.5, np.nan, np.nan, -2.0, np.nan, np.nan])
    first = np.array([0, 0, 2, 3, 3, 3, 6, 7])
    d = TeachData(stream=np.zeros(8, np.int64), teacher=teacher, first=first, digest="", chunks=3, cost={})
    starts = np.array([0, 4])  # windows of 4 targets with BOS: positions 0..3 and 4..7

    def loss(s01: float, s2: float) -> tuple[float, float]:
        nats = torch.tensor([[s01 / 2, s01 / 2, s2, 0.3], [0.1, 0.2, 0.3, 0.4]], requires_grad=True)
        v = chunk_loss(d, nats, starts, bos=0)
        v.backward()
        return float(v.detach()), float(nats.grad.abs().sum())

    at_donor, grad = loss(1.0, 0.5)
    assert grad < 1e-5  # the recipient's chunk likelihoods equal the donor's: the minimum
    assert loss(2.0, 0.5)[0] > at_donor and loss(1.0, 0.1)[0] > at_donor
    # only the two whole chunks count: by hand, the mean of the two chunks' binary cross-entropies
    p = np.exp([-1.0, -0.5])
    assert at_donor == pytest.approx(float(np.mean(-(p * np.log(p) + (1 - p) * np.log(1 - p)))), rel=1e-5)


def test_teach_and_distill_arms_in_the_content_study(lms, docs, tmp_path):
    from polymem.recipes.content import ContentOptions, ContentSplit, run_content_transfer
    from polymem.recipes.frozen import FrozenTrainConfig
    from polymem.recipes.teach import TeachConfig

    opts = ContentOptions(split=ContentSplit.parse("0.3,0.4,0.3", seed=1), donor_cfg=_donor_cfg(), resamples=100,
                          teach=TeachConfig(tokens=48, new_tokens=16, batch=4))
    cfg = FrozenTrainConfig(steps=3, batch_size=2, block_size=16, table_lr=0.1, site_lr=3e-3)
    events: list[tuple] = []
    kw = dict(data=ExperimentData(texts=docs, eval_tokens=256, window=64), cfg=cfg, content=opts,
              arms=["none", "donor_finetune", "teach", "distill"], seeds=[0], eval_at=[], out_dir=tmp_path / "run")
    res = run_content_transfer(lms["gemma3"], lms["llama"], **kw,
                               on_event=lambda kind, **k: events.append((kind, k.get("arm"))))
    out = tmp_path / "run"
    got = json.loads((out / "teach.json").read_text())
    assert got["prompts"] == 3 and 0 < got["new_tokens"] <= 48 and got["generate_s"] > 0
    assert all(d["donor_ends"] and len(d["donor_ends"]) == len(d["donor_nats"]) for d in got["docs"])
    runs = {a: json.loads((out / "arms" / f"{a}-seed0.json").read_text()) for a in ("donor_finetune", "teach", "distill")}
    t = runs["teach"]["teach"]
    assert t["new_tokens"] == got["new_tokens"] and t["chunks"] > 0 and t["stream_tokens"] > 0
    assert runs["teach"]["table_drift"]["rows_changed"] > 0  # the donor's rows train on the donor's text
    # the same data order and start: only the text (teach vs donor_finetune) or the loss (distill vs teach) differ
    assert runs["teach"]["bpb"] != runs["donor_finetune"]["bpb"] and runs["distill"]["bpb"] != runs["teach"]["bpb"]
    assert res["arms"]["distill"]["method"].startswith("as teach")
    # a re-run generates and trains nothing
    events.clear()
    again = run_content_transfer(lms["gemma3"], lms["llama"], **kw,
                                 on_event=lambda kind, **k: events.append((kind, k.get("arm"))))
    assert not [e for e in events if e[0] in ("run", "donor_step")] and again["arms"] == res["arms"]
    # select: the donor writes twice the budget and keeps the texts its table lowers its loss on most
    from polymem.recipes.teach import donor_text, teach_prompts

    tc = TeachConfig(tokens=32, new_tokens=16, batch=4, select=2.0)
    prompts = teach_prompts(docs[:3], tc, lms["llama"].tokenizer)
    sel = donor_text(lms["llama"], out / "donor.pmem", out / "donor.pmem.site", prompts, tc)
    assert len(prompts) == 4 and sel["written_tokens"] > sel["new_tokens"] >= 32 and len(sel["docs"]) == 2
    every = donor_text(lms["llama"], out / "donor.pmem", out / "donor.pmem.site", prompts,
                       TeachConfig(tokens=64, new_tokens=16, batch=4))
    gains = sorted(d["table_gain"] for d in sel["docs"])
    assert {d["text"] for d in sel["docs"]} < {d["text"] for d in every["docs"]}
    assert "table_gain" not in every["docs"][0] and gains[0] > -1
    with pytest.raises(PolymemError, match=r"teach select=0.5 must be a number >= 1"):
        TeachConfig(select=0.5)
    with pytest.raises(PolymemError, match=r"teach prompts_from='both' is unknown; accepted: recipient, donor"):
        TeachConfig(prompts_from="both")


def test_distillation_on_the_recipients_own_text(lms, docs, tmp_path, monkeypatch):
    from polymem.recipes import teach
    from polymem.recipes.content import ContentOptions, ContentSplit, content_parts, run_content_transfer
    from polymem.recipes.frozen import FrozenTrainConfig
    from polymem.recipes.teach import TeachConfig, donor_token_nats

    split = ContentSplit.parse("0.3,0.4,0.3", seed=1)
    cfg = FrozenTrainConfig(steps=3, batch_size=2, block_size=16, table_lr=0.1, site_lr=3e-3)

    def run(weight: float) -> dict:
        opts = ContentOptions(split=split, donor_cfg=_donor_cfg(), resamples=100, teach=TeachConfig(distill_weight=weight))
        run_content_transfer(lms["gemma3"], lms["llama"], data=ExperimentData(texts=docs, eval_tokens=256, window=64),
                             cfg=cfg, content=opts, arms=["none", "donor", "distill_own"], seeds=[0], eval_at=[],
                             out_dir=tmp_path / "run")
        return {a: json.loads((tmp_path / "run" / "arms" / f"{a}-seed0.json").read_text()) for a in ("donor", "distill_own")}

    # with the chunk term weighted 0 the arm is the donor arm: the same stream (the recipient's part), order and start
    off = run(0.0)
    assert off["distill_own"]["bpb"] == off["donor"]["bpb"]
    got = json.loads((tmp_path / "run" / "own-targets.json").read_text())
    mine = content_parts(docs, split)["texts"]["recipient"]
    assert [d["text"] for d in got["docs"]] == mine and got["scored_tokens"] > 0
    t = off["distill_own"]["teach"]
    assert t["chunks"] > 0 and t["scored_tokens"] == got["scored_tokens"] and "new_tokens" not in t
    (tmp_path / "run" / "arms" / "distill_own-seed0.json").unlink()  # its key names the weight: a re-run refuses
    on = run(1.0)  # the term on: the donor's predictions (computed once, read back) change what the site learns
    assert on["distill_own"]["bpb"] != on["donor"]["bpb"] and on["donor"] == off["donor"]
    assert json.loads((tmp_path / "run" / "own-targets.json").read_text()) == got
    # the targets are the donor's nats with its table; a long document is scored in pieces, no chunk across a cut
    from polymem.torch.attach import load_attached

    donor = lms["llama"]
    h = load_attached(donor.model, tmp_path / "run" / "donor.pmem.site", tmp_path / "run" / "donor.pmem",
                      tokenizer=donor.tokenizer)
    try:
        ids = [int(i) for i in donor.tokenizer.encode(mine[0])]
        assert np.allclose(got["docs"][0]["donor_nats"], donor_token_nats(donor, ids, h), atol=1e-4, equal_nan=True)
        monkeypatch.setattr(teach, "OWN_PIECE", 5)
        cut = np.asarray(teach._scored(donor, [mine[0]], h)[0]["donor_nats"])
        assert len(ids) > 10 and np.isnan(cut[5]) and np.isnan(cut[10])
        assert np.allclose(cut[:5], donor_token_nats(donor, ids[:5], h), atol=1e-4, equal_nan=True)
        assert np.allclose(cut[6:10], donor_token_nats(donor, ids[5:10], h)[1:], atol=1e-4)
    finally:
        h.detach()


def test_cli_teach_arms_need_the_content_study(tmp_path):
    common = ["transfer", "--model", str(tmp_path / "no-such-model"), "--corpus", str(tmp_path / "c.jsonl"),
              "--asset", "x.pmem", "--out-dir", str(tmp_path / "o")]
    (tmp_path / "c.jsonl").write_text(json.dumps({"text": "abc"}) + "\n")
    r = CliRunner().invoke(app, common + ["--arms", "none,teach"])
    assert r.exit_code != 0 and "learn from text the donor model writes" in str(r.exception)
    r = CliRunner().invoke(app, common + ["--arms", "none,donor_next_bytes_mix_polished"])
    assert r.exit_code != 0 and "reads the donor's byte decoder trained on over the donor's own" in str(r.exception)
    r = CliRunner().invoke(app, common + ["--teach-tokens", "100"])
    assert r.exit_code != 0 and "--teach-tokens has no effect without --content-split" in str(r.exception)
