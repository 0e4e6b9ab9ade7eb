"""The next-bytes arms of the content study on small random-initialised models built from configs: the byte
targets after an n-gram (by hand), the decoder's file (round trip, damage, absence), the donor's auxiliary byte
loss, the recipient's byte bias (zero at step 0, the sum over a token's bytes by hand), and the arms end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from polymem.errors import FormatError, PolymemError

pytest.importorskip("transformers")
torch.set_num_threads(1)

from test_content_transfer import _donor_cfg  # noqa: E402
from test_content_transfer import ckpts, docs, lms  # noqa: E402,F401  (the same small models and documents)


def test_next_byte_targets_by_hand(lms):
    from polymem.torch.bytehead import next_byte_targets, token_byte_matrix

    tb = [b"de", b"f", b" x", None, b"(y)"]
    # position s: the bytes from token s's first byte on, stopping at a token without bytes
    got = next_byte_targets(np.array([0, 1, 2, 3, 4, 1]), tb, 4)
    assert got.tolist() == [[100, 101, 102, 32], [102, 32, 120, -1], [32, 120, -1, -1], [-1, -1, -1, -1],
                            [40, 121, 41, 102], [102, -1, -1, -1]]
    assert token_byte_matrix(tb, 2, rows=6).tolist() == [[100, 101], [102, -1], [32, 120], [-1, -1], [40, 121],
                                                         [-1, -1]]
    # a real tokenizer: the targets at each position are the text's bytes from that token's start
    lm = lms["gemma3"]
    text = "def f(x):\n    return x + 1\n"
    ids = np.asarray(lm.tokenizer.encode(text), dtype=np.int64)
    all_tb = lm.tokenizer.all_token_bytes()
    starts = np.concatenate([[0], np.cumsum([len(all_tb[i]) for i in ids])[:-1]])
    t = next_byte_targets(ids, all_tb, 5)
    raw = text.encode()
    for s, a in enumerate(starts):
        want = list(raw[a:a + 5])
        assert t[s].tolist() == want + [-1] * (5 - len(want))


@pytest.mark.parametrize("bad", [0, -1, 17, 2.5, True])
def test_bytes_out_of_range_is_one_line(bad):
    from polymem.torch.bytehead import check_bytes

    with pytest.raises(PolymemError, match=r"^--donor-byte-head .*: the bytes a row's decoder predicts must be 1\.\.16; "
                                           r"pass e\.g\. --donor-byte-head 8$"):
        check_bytes(bad, "--donor-byte-head")


def test_decoder_file_round_trip_damage_and_absence(tmp_path):
    from polymem.torch.bytehead import ByteHead, load_byte_head, save_byte_head

    site = tmp_path / "s"
    site.mkdir()
    (site / "site.json").write_text(json.dumps({"format": "x"}))
    with pytest.raises(PolymemError, match=r"the site .* has none; train the donor with --byte-head J"):
        load_byte_head(site)
    head = ByteHead(2, 4, 8, 3, seed=1)
    save_byte_head(head, site, record={"weight": 1.0})
    got = load_byte_head(site)
    assert all(torch.equal(a, b) for a, b in zip(head.state_dict().values(), got.state_dict().values()))
    assert json.loads((site / "site.json").read_text())["byte_head"]["bytes"] == 3
    e = torch.randn(5, 2, 4, 8)
    assert torch.equal(head(e), got(e)) and head(e).shape == (5, 2, 3, 256)
    assert torch.equal(head.log_ratio(torch.zeros(1, 2, 4, 8)), torch.zeros(1, 2, 3, 256))  # an unwritten row: 0
    raw = bytearray((site / "bytes.safetensors").read_bytes())
    raw[-5] ^= 0xFF
    (site / "bytes.safetensors").write_bytes(bytes(raw))
    with pytest.raises(FormatError, match=r"is not the byte decoder .* names \(ValueError: sha256 differs"):
        load_byte_head(site)
    (site / "bytes.safetensors").unlink()
    with pytest.raises(PolymemError, match="bytes.safetensors"):
        load_byte_head(site)


def test_byte_bias_is_zero_at_step_zero_and_sums_a_tokens_bytes(lms):
    from polymem.hash.layout import Layout
    from polymem.hash.spec import HashSpec
    from polymem.hash.token_hashes import TokenHashes
    from polymem.recipes.nextbytes import ByteBias
    from polymem.torch.bytehead import ByteHead

    lm = lms["gemma3"]
    layout = Layout.for_params(4096 * 8, heads=4, slots=4, head_dim=8)
    table = torch.randn(layout.num_rows, 8, generator=torch.Generator().manual_seed(0))
    head = ByteHead(2, 4, 8, 3, seed=0)
    ids = torch.from_numpy(np.asarray(lm.tokenizer.encode("def f(x):\n    return x"), dtype=np.int64))[None]
    with torch.no_grad():
        alone = lm.model(input_ids=ids).logits.clone()
    bias = ByteBias(lm, head, table, layout, TokenHashes.build(lm.tokenizer, HashSpec()), 2).install()
    try:
        with torch.no_grad():
            assert torch.equal(lm.model(input_ids=ids).logits, alone)  # w = 0: the model alone, exactly
            bias.w.fill_(0.5)
            bias.w[1] = 2.0
            got = lm.model(input_ids=ids).logits
        lr, _ = bias.log_ratio(ids)  # [1, T, 2, 3, 256]
        tb = lm.tokenizer.all_token_bytes()
        t = ids.shape[1] - 1
        for v in [i for i, b in enumerate(tb) if b and len(b) in (1, 2, 5)][:6] + [lm.eos_id]:
            b = tb[v] or b""
            want = sum(w * float(lr[0, t, n, j, b[j]]) for n, w in enumerate((0.5, 2.0)) for j in range(min(len(b), 3)))
            assert float(got[0, t, v] - alone[0, t, v]) == pytest.approx(want, abs=1e-4)
        # with gradients on (training) the same scores, differentiable in w
        bias.w.grad = None
        lm.model(input_ids=ids).logits[0, t].logsumexp(-1).backward()
        assert bias.w.grad is not None and bias.w.grad.abs().sum() > 0
    finally:
        bias.remove()
    with torch.no_grad():
        assert torch.equal(lm.model(input_ids=ids).logits, alone)
    # weighted by the decoder's confidence too: zero at the start, then (w_n + u_n c_{t,n}) per order, by hand
    conf = ByteBias(lm, head, table, layout, TokenHashes.build(lm.tokenizer, HashSpec()), 2, confidence=True).install()
    try:
        with torch.no_grad():
            assert torch.equal(lm.model(input_ids=ids).logits, alone)
            conf.u.fill_(3.0)
            got = lm.model(input_ids=ids).logits
        lr, _ = conf.log_ratio(ids)
        prior = torch.log_softmax(head.bias.detach().view(2, 3, 256), dim=-1)
        c = (lr[0, t] + prior).exp().amax(-1).mean(-1)  # [N]
        b = next(x for x in tb if x and len(x) >= 3)
        v = tb.index(b)
        want = sum(3.0 * float(c[n]) * float(lr[0, t, n, j, b[j]]) for n in range(2) for j in range(3))
        assert float(got[0, t, v] - alone[0, t, v]) == pytest.approx(want, abs=1e-4)
    finally:
        conf.remove()
    # interpolated: log p at λ = 0; then (1 − Σλ) p + Σ λ_n p_n with p_n ∝ p · exp(s_n), by hand
    mix = ByteBias(lm, head, table, layout, TokenHashes.build(lm.tokenizer, HashSpec()), 2, mix=True).install()
    try:
        with torch.no_grad():
            lp = torch.log_softmax(alone.float(), dim=-1)
            assert torch.allclose(lm.model(input_ids=ids).logits, lp, atol=1e-5)
            mix.w.copy_(torch.tensor([0.1, 5.0]))  # the second is clamped to 0.9 / 2
            got = lm.model(input_ids=ids).logits[0, t]
            lr, _ = mix.log_ratio(ids)
            p = lp[0, t].exp()
            want = (1 - 0.1 - 0.45) * p
            for n, lam in enumerate((0.1, 0.45)):
                s = mix.scores(lr[0, t, n][None], mix.full)[0]  # [V]
                want = want + lam * torch.softmax(lp[0, t] + s, dim=-1)
        assert torch.allclose(got.exp(), want, atol=1e-6) and float(got.exp().sum()) == pytest.approx(1.0, abs=1e-4)
        mix.w.grad = None
        lm.model(input_ids=ids).logits[0, t, int(ids[0, -1])].backward()
        assert mix.w.grad is not None and bool(torch.isfinite(mix.w.grad).all()) and mix.w.grad[1] != 0  # through the clamp
    finally:
        mix.remove()


def test_mixed_reader_scores_only_written_rows_and_equals_the_whole_formula(lms):
    """The interpolated reader skips the (position, order) pairs whose row the table never wrote (and, without
    gradients, orders mixed with weight 0); its output and its gradient are the whole formula's, at every
    position, written or not."""
    from polymem.hash.layout import Layout
    from polymem.hash.spec import HashSpec
    from polymem.hash.token_hashes import TokenHashes
    from polymem.recipes.nextbytes import ByteBias
    from polymem.torch.bytehead import ByteHead

    lm = lms["gemma3"]
    layout = Layout.for_params(4096 * 8, heads=4, slots=4, head_dim=8)
    table = torch.randn(layout.num_rows, 8, generator=torch.Generator().manual_seed(1))
    table[torch.randperm(layout.num_rows, generator=torch.Generator().manual_seed(2))[: layout.num_rows // 2]] = 0
    head = ByteHead(2, 4, 8, 3, seed=0)
    ids = torch.from_numpy(np.asarray(lm.tokenizer.encode("def f(x):\n    return x + y * 2  # a sum\n"),
                                      dtype=np.int64))[None]
    with torch.no_grad():
        lp = torch.log_softmax(lm.model(input_ids=ids).logits.float(), dim=-1)[0]  # [T, V]
    mix = ByteBias(lm, head, table, layout, TokenHashes.build(lm.tokenizer, HashSpec()), 2, mix=True).install()
    try:
        lr, _ = mix.log_ratio(ids)
        written = lr[0].abs().flatten(2).amax(-1) > 0  # [T, N]
        assert bool(written.any()) and not bool(written.all())  # both kinds of position are there

        def whole(w: torch.Tensor) -> torch.Tensor:  # every position and order over the whole vocabulary
            lam = w + (w.clamp(0.0, 0.45) - w).detach()
            acc = torch.zeros_like(lp)
            for n in range(2):
                s = mix.scores(lr[0, :, n], mix.full)
                acc = acc + lam[n] * (torch.softmax(lp + s, dim=-1) / lp.exp() - 1.0)
            return lp + torch.log1p(acc)

        scored = []
        real = mix.scores
        for w, rows in (([0.1, 0.3], int(written.sum())), ([-0.2, 0.3], int(written[:, 1].sum()))):
            scored.clear()  # the second: order 1 mixed with weight 0 is not scored at all
            mix.scores = lambda d, bm: scored.append(d.shape[0]) or real(d, bm)  # type: ignore[method-assign]
            with torch.no_grad():
                mix.w.copy_(torch.tensor(w))
                got = lm.model(input_ids=ids).logits[0]
            mix.scores = real  # type: ignore[method-assign]
            assert sum(scored) == rows  # only the written rows went over the vocabulary
            assert torch.allclose(got, whole(torch.tensor(w)), atol=1e-5)
        t = ids.shape[1] - 2
        mix.w.grad = None
        lm.model(input_ids=ids).logits[0, t, int(ids[0, t + 1])].backward()
        w = torch.tensor([-0.2, 0.3], requires_grad=True)
        whole(w)[t, int(ids[0, t + 1])].backward()
        assert torch.allclose(mix.w.grad, w.grad, atol=1e-5) and float(mix.w.grad[0]) != 0.0  # through the clamp
    finally:
        mix.remove()


def test_reading_only_full_hits_zeroes_the_n_grams_a_head_missed(lms):
    """hits="all": an n-gram whose K head rows are not all written scores 0 (as an unwritten one), the others as
    with hits="any"; an unknown rule is one line naming the accepted ones."""
    from polymem.hash.layout import Layout
    from polymem.hash.spec import HashSpec
    from polymem.hash.token_hashes import TokenHashes
    from polymem.recipes.nextbytes import ByteBias
    from polymem.torch.bytehead import ByteHead

    lm = lms["gemma3"]
    layout = Layout.for_params(4096 * 8, heads=4, slots=4, head_dim=8)
    table = torch.randn(layout.num_rows, 8, generator=torch.Generator().manual_seed(3))
    table[torch.randperm(layout.num_rows, generator=torch.Generator().manual_seed(4))[: layout.num_rows // 4]] = 0
    head = ByteHead(2, 4, 8, 3, seed=0)
    cache = TokenHashes.build(lm.tokenizer, HashSpec())
    ids = torch.from_numpy(np.asarray(lm.tokenizer.encode("def f(x):\n    return x + y * 2  # a sum\n"),
                                      dtype=np.int64))[None]
    lr_any, rows = ByteBias(lm, head, table, layout, cache, 2).log_ratio(ids)
    lr_all, _ = ByteBias(lm, head, table, layout, cache, 2, hits="all").log_ratio(ids)
    every = ((rows >= 0) & (table.abs().amax(-1)[rows.clamp_min(0)] > 0)).all(-1)  # [1, T, N]
    assert bool(every.any()) and not bool(every.all())
    assert torch.equal(lr_all[every], lr_any[every]) and not bool(lr_all[~every].any())
    assert bool(lr_any[~every].any())  # the n-grams one head missed: read by "any", not by "all"
    with pytest.raises(PolymemError, match=r"hits='some' is unknown; accepted: any, all"):
        ByteBias(lm, head, table, layout, cache, 2, hits="some")


def test_donor_byte_head_and_next_bytes_arms(lms, docs, tmp_path, monkeypatch):
    from polymem.torch import bytehead
    from polymem.recipes.content import ContentOptions, ContentSplit, run_content_transfer
    from polymem.recipes.frozen import FrozenTrainConfig
    from polymem.recipes.options import ExperimentData
    from polymem.torch.tablefile import open_table

    split = ContentSplit.parse("0.3,0.4,0.3", seed=1)
    cfg = FrozenTrainConfig(steps=3, batch_size=2, block_size=16, table_lr=0.1, site_lr=3e-3)
    kw = dict(data=ExperimentData(texts=docs, eval_tokens=256, window=64), cfg=cfg, seeds=[0], eval_at=[])
    # a donor without a decoder: the arm says so in one line
    with pytest.raises(PolymemError, match=r"reads the donor's byte decoder, and the site .* has none; train the donor "
                                           r"with --byte-head J"):
        run_content_transfer(lms["gemma3"], lms["llama"], **kw, arms=["none", "next_bytes"],
                             content=ContentOptions(split=split, donor_cfg=_donor_cfg(), resamples=50),
                             out_dir=tmp_path / "plain")
    monkeypatch.setattr(bytehead, "POLISH_STEPS", 40)
    donor_cfg = FrozenTrainConfig(**{**_donor_cfg().__dict__, "steps": 12})
    opts = ContentOptions(split=split, donor_cfg=donor_cfg, resamples=50, byte_head=4)
    res = run_content_transfer(lms["gemma3"], lms["llama"], **kw, content=opts, out_dir=tmp_path / "run",
                               arms=["none", "donor", "next_bytes", "next_bytes_fit", "next_bytes_conf",
                                     "next_bytes_mix", "donor_next_bytes", "donor_next_bytes_mix",
                                     "donor_next_bytes_mix_polished"])
    out = tmp_path / "run"
    rec = open_table(out / "donor.pmem").provenance["byte_head"]
    assert rec["bytes"] == 4 and rec["byte_loss_last10"] < rec["byte_loss_first"]  # the aux loss trains the decoder
    assert json.loads((out / "donor.pmem.site" / "site.json").read_text())["byte_head"]["bytes"] == 4
    none = json.loads((out / "arms" / "none-seed0.json").read_text())
    for arm in ("next_bytes", "next_bytes_fit", "next_bytes_conf", "next_bytes_mix"):
        r = json.loads((out / "arms" / f"{arm}-seed0.json").read_text())
        assert r["curve_bpb"][0] == none["bpb"]["read"]  # step 0: the model alone
        assert set(r["next_bytes"]) >= {"weights", "read", "unseen"} and any(w != 0 for w in r["next_bytes"]["weights"])
        assert 0 <= r["next_bytes"]["read"]["hit_rate"]["1"] <= 1
        assert res["arms"][arm]["method"].startswith(("the donor's table and its byte decoder", "as next_bytes"))
    both = json.loads((out / "arms" / "donor_next_bytes-seed0.json").read_text())  # the site and the reader, as attach
    donor = json.loads((out / "arms" / "donor-seed0.json").read_text())
    assert both["curve_bpb"][0] == none["bpb"]["read"] and any(w != 0 for w in both["next_bytes"]["weights"])
    assert both["bpb"] != donor["bpb"]  # the reader changed what the same site, seed and data give
    # the polished decoder: trained on over the donor's part (its byte loss there falls), the donor's file kept
    pol = json.loads((out / "arms" / "donor_next_bytes_mix_polished-seed0.json").read_text())
    mix = json.loads((out / "arms" / "donor_next_bytes_mix-seed0.json").read_text())
    p = pol["next_bytes"]["polish"]
    assert p["steps"] == 40 and p["byte_loss_after"]["own"] < p["byte_loss_before"]["own"] and "check" in p["byte_loss_after"]
    assert pol["curve_bpb"][0] == none["bpb"]["read"] and pol["bpb"] != mix["bpb"]  # only the decoder differs
    import hashlib

    site = json.loads((out / "donor.pmem.site" / "site.json").read_text())["byte_head"]
    assert hashlib.sha256((out / "donor.pmem.site" / "bytes.safetensors").read_bytes()).hexdigest() == site["sha256"]
    # a donor whose decoder was polished already (polymem train --model --byte-head): refused, not polished twice
    header = json.loads((out / "donor.pmem.site" / "site.json").read_text())
    header["byte_head"]["polish"] = {"steps": 1000}
    (out / "donor.pmem.site" / "site.json").write_text(json.dumps(header))
    with pytest.raises(PolymemError, match="was trained on alone already .* would polish it twice"):
        run_content_transfer(lms["gemma3"], lms["llama"], **kw, content=opts, out_dir=out,
                             arms=["none", "donor_next_bytes_mix_polished"])
    conf = json.loads((out / "arms" / "next_bytes_conf-seed0.json").read_text())["next_bytes"]
    assert any(u != 0 for u in conf["confidence_weights"])
    assert (json.loads((out / "arms" / "next_bytes_fit-seed0.json").read_text())["next_bytes"]["fit"]["steps"] > 0)
    # a donor trained with another decoder setting is not reused
    with pytest.raises(PolymemError, match="was trained with other settings"):
        run_content_transfer(lms["gemma3"], lms["llama"], **kw, arms=["none"], out_dir=out,
                             content=ContentOptions(split=split, donor_cfg=donor_cfg, resamples=50))


def test_cli_byte_head_refusals_before_loading(docs, tmp_path):
    """A J out of 1..16, or one given where no donor trains: one line naming the option, before any model loads
    (the model named does not exist, so loading it would fail otherwise)."""
    from typer.testing import CliRunner

    from polymem.cli.app import app

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs[:10]))
    common = ["transfer", "--model", str(tmp_path / "no-such-model"), "--corpus", str(corpus), "--out-dir",
              str(tmp_path / "o")]
    r = CliRunner().invoke(app, common + ["--content-split", "0.3,0.4,0.3", "--donor-model", "x",
                                          "--donor-byte-head", "17"])
    assert r.exit_code != 0 and "--donor-byte-head 17: the bytes a row's decoder predicts must be 1..16" in str(r.exception)
    r = CliRunner().invoke(app, common + ["--asset", "x.pmem", "--donor-byte-head", "8"])
    assert r.exit_code != 0 and "--donor-byte-head has no effect without --content-split" in str(r.exception)
    r = CliRunner().invoke(app, ["train", "--corpus", str(corpus), "--out", str(tmp_path / "t.pmem"), "--model",
                                 str(tmp_path / "no-such-model"), "--byte-head", "0x"])
    assert r.exit_code != 0
    r = CliRunner().invoke(app, ["train", "--corpus", str(corpus), "--out", str(tmp_path / "t.pmem"), "--model",
                                 str(tmp_path / "no-such-model"), "--byte-head", "20"])
    assert r.exit_code != 0 and "--byte-head 20: the bytes a row's decoder predicts must be 1..16" in str(r.exception)
    r = CliRunner().invoke(app, ["train", "--corpus", str(corpus), "--out", str(tmp_path / "t.pmem"), "--tokenizer",
                                 "bytes", "--byte-head", "8"])
    assert r.exit_code != 0 and "--byte-head has no effect without --model" in str(r.exception)


def test_cli_train_model_with_a_byte_head(ckpts, docs, tmp_path):
    """`train --model --byte-head J`: the decoder trains with the rows and is saved beside the site; the asset's
    provenance records its loss, and the next_bytes arm can read it back."""
    from typer.testing import CliRunner

    from polymem.cli.app import app
    from polymem.torch.bytehead import load_byte_head
    from polymem.torch.tablefile import open_table

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    out = tmp_path / "t.pmem"
    r = CliRunner().invoke(app, ["train", "--corpus", str(corpus), "--out", str(out), "--model", str(ckpts["llama"]),
                                 "--byte-head", "3", "--steps", "8", "--batch-size", "2", "--block-size", "16",
                                 "--params", "32K", "--heads", "4", "--head-dim", "8", "--layers", "1",
                                 "--eval-tokens", "64", "--byte-polish-steps", "30"])
    assert r.exit_code == 0, r.output
    rec = open_table(out).provenance["byte_head"]
    assert rec["bytes"] == 3 and rec["byte_loss_last10"] < rec["byte_loss_first"]
    # then the decoder alone over the training text: its byte loss there falls, and the saved file is that decoder
    pol = rec["polish"]
    assert pol["steps"] == 30 and pol["byte_loss_after"]["own"] < pol["byte_loss_before"]["own"]
    assert "byte decoder" in r.output  # its row in the summary table
    head = load_byte_head(tmp_path / "t.pmem.site")
    assert (head.j, head.orders, head.heads, head.head_dim) == (3, 3, 4, 8)
    from polymem.torch.bytehead import BYTES_FILE

    site = json.loads((tmp_path / "t.pmem.site" / "site.json").read_text())["byte_head"]
    assert site["polish"]["steps"] == 30 and (tmp_path / "t.pmem.site" / BYTES_FILE).is_file()
    r = CliRunner().invoke(app, ["train", "--corpus", str(corpus), "--out", str(tmp_path / "u.pmem"), "--model",
                                 str(ckpts["llama"]), "--byte-polish-steps", "5"])
    assert r.exit_code != 0 and "--byte-polish-steps has no effect without --byte-head" in str(r.exception)
    assert not (tmp_path / "t.pmem.ckpt").exists()  # a byte-head run writes no checkpoints


def test_polish_record_loss_is_the_whole_mean_in_chunks(monkeypatch):
    """The byte loss a polish records is measured in chunks (a corpus at once would not fit): weighted by each
    chunk's targets it is the mean over every position; past LOSS_POSITIONS an even sample of them."""
    from polymem.torch import bytehead as bh

    g = torch.Generator().manual_seed(0)
    head, table = bh.ByteHead(3, 4, 8, 4, seed=0), torch.randn(5000, 8, generator=g)
    rows = torch.randint(-1, 5000, (3000, 3, 4), generator=g)
    y = torch.randint(-1, 256, (3000, 4), generator=g)
    y[:700] = -1  # a first chunk with few targets: an unweighted mean of chunk means would differ
    whole = float(bh._loss_on(head, table, rows, y).detach())
    monkeypatch.setattr(bh, "LOSS_CHUNK", 500)
    assert bh._mean_loss(head, table, rows, y) == pytest.approx(whole, rel=1e-5)
    monkeypatch.setattr(bh, "LOSS_POSITIONS", 1000)
    at = torch.from_numpy(np.unique(np.linspace(0, 2999, 1000).astype(np.int64)))
    assert bh._mean_loss(head, table, rows, y) == pytest.approx(float(bh._loss_on(head, table, rows[at], y[at]).detach()), rel=1e-5)
