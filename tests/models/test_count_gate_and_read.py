"""A table trained on a frozen backbone: on every document when asked, with how much of the corpus it read; and
a count-gated site reads the same gate input while it trains as when it is attached again from its asset.
Small random-initialised Llama models built from configs (no download)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from polymem.cli.app import app
from polymem.errors import PolymemError

pytest.importorskip("transformers")
torch.set_num_threads(1)

from test_models import _checkpoint  # noqa: E402  (the tiny checkpoints of the pretrained-model tests)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from polymem.models import load_model

    path = _checkpoint(tmp_path_factory.mktemp("ckpt") / "llama", "llama")
    return path, load_model(path)


@pytest.fixture(scope="module")
def docs():
    from conftest import generated_text, sample_text

    lines = [ln for ln in (sample_text() + "\n" + generated_text(2500, seed=3)).splitlines() if ln.strip()]
    return ["\n".join(lines[i:i + 6]) for i in range(0, len(lines), 6)][:30]


def _cfg(**kw):
    from polymem.recipes.frozen import FrozenTrainConfig

    return FrozenTrainConfig(**{**dict(steps=6, batch_size=2, block_size=16, layers=(1,), params=4096 * 8, heads=4,
                                       head_dim=8, table_lr=0.1, site_lr=3e-3), **kw})


def test_corpus_read_by_hand():
    from polymem.recipes.data import corpus_read

    # 10 tokens, windows of 4 predicted tokens starting at 0 and 2: tokens 0..5 read, 8 predictions
    r = corpus_read(10, np.array([[0], [2]]), 4)
    assert (r["tokens_read"], r["share_read"], r["tokens_seen"], r["passes"]) == (6, 0.6, 8, 0.8)
    r = corpus_read(10, np.array([7]), 4, offset=1)  # cut at the stream's end
    assert r["tokens_read"] == 2 and r["passes"] == 0.4


def test_train_on_every_document_says_what_it_read(llama, docs, tmp_path):
    from polymem.recipes.data import corpus_read
    from polymem.recipes.frozen import corpus_stream, data_order, documents_digest, train_table
    from polymem.torch.tablefile import open_table

    _, lm = llama
    cfg = _cfg()
    got = train_table(lm, [], tmp_path / "all.pmem", cfg=cfg, texts=docs[:20], heldout_every=0,
                      heldout_texts=docs[20:], eval_tokens=300, window=64)
    stream = corpus_stream(lm, texts=docs[:20], heldout_every=0).train  # every document trains
    want = corpus_read(stream.size, data_order(stream.size, cfg), cfg.block_size)  # the model has a BOS: offset 0
    r = got["corpus_read"]
    assert r == want and r["train_tokens"] == stream.size and r["tokens_seen"] == 6 * 2 * 16
    assert 0 < r["share_read"] <= min(1.0, r["passes"]) and got["scored_set"] == "held-out documents given"
    prov = open_table(got["path"]).provenance
    assert prov["corpus_read"] == r and prov["heldout_every"] == 0
    assert prov["train_documents"] == documents_digest(docs[:20]) == documents_digest(docs[:20][::-1])
    assert documents_digest(docs[:19]) != prov["train_documents"]
    # without held-out documents, the scores are on what it read, and the summary says so
    got = train_table(lm, [], tmp_path / "all2.pmem", cfg=cfg, texts=docs[:20], heldout_every=0, eval_tokens=300,
                      window=64)
    assert got["scored_set"] == "training documents (nothing held out)"
    with pytest.raises(PolymemError, match="heldout_every=0"):
        train_table(lm, [], tmp_path / "x.pmem", cfg=cfg, texts=docs, heldout_every=10, heldout_texts=docs[:2])


def test_cli_train_model_every_document(llama, docs, tmp_path):
    path, _ = llama
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs[:20]))
    held = tmp_path / "h.jsonl"
    held.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs[20:]))
    common = ["train", "--model", str(path), "--corpus", str(corpus), "--steps", "2", "--batch-size", "2",
              "--block-size", "16", "--layers", "1", "--params", "32K", "--heads", "4", "--head-dim", "8",
              "--eval-tokens", "200", "--checkpoint-every", "0"]
    r = CliRunner().invoke(app, common + ["--out", str(tmp_path / "a.pmem"), "--heldout", str(held),
                                          "--json", str(tmp_path / "a.json")])
    assert r.exit_code == 0, r.output
    s = json.loads((tmp_path / "a.json").read_text())
    assert s["scored_set"] == "held-out documents given" and s["corpus_read"]["passes"] > 0
    assert "corpus read" in r.output and "passes" in r.output
    r = CliRunner().invoke(app, common + ["--out", str(tmp_path / "b.pmem"), "--heldout-every", "1"])
    assert r.exit_code != 0 and "--heldout-every 1 is not accepted" in str(r.exception)
    r = CliRunner().invoke(app, common + ["--out", str(tmp_path / "b.pmem"), "--heldout", str(held),
                                          "--heldout-every", "5"])
    assert r.exit_code != 0 and "with --heldout" in str(r.exception)


def test_count_gate_reads_the_same_counts_training_and_serving(llama, docs, tmp_path):
    """While a count-gated site trains with its table, the gate reads the rows' training counts (each read row:
    its updates so far, this step's included); attached again from the asset it reads the asset's counts. The
    score right after training equals the score of the site attached again."""
    from polymem.models.evaluate import evaluate
    from polymem.recipes.frozen import _bounded_texts, corpus_stream, train_site, train_table
    from polymem.torch.attach import attach, load_attached
    from polymem.torch.tablefile import open_table

    _, lm = llama
    cfg = _cfg(gate="count")
    stream = corpus_stream(lm, texts=docs).train
    h = attach(lm.model, cfg.layout(), lm.tokenizer, layers=[1], train="table", max_n=3, gate="count", init_seed=7)
    seen: list[tuple[torch.Tensor | None, torch.Tensor | None]] = []  # (gate's counts, the table's counts then)
    try:
        (site,) = h.sites.values()
        site.register_forward_pre_hook(lambda mod, args: seen.append((
            None if len(args) < 3 or args[2] is None else args[2].detach().clone(),
            None if h.table.counts is None else h.table.counts.detach().clone())))
        res = train_site(lm, h, stream, cfg)
        final = None if h.table.counts is None else h.table.counts.clone()
    finally:
        h.detach()
    assert len(seen) == cfg.steps and all(c is not None for c, _ in seen)  # the gate read counts at every step
    rows_read = [c[c > 0] for c, _ in seen]
    assert all(r.numel() > 0 and float(r.min()) >= 1 for r in rows_read)  # this step's update counts
    assert final is not None and np.array_equal(final.numpy().astype(np.uint32), res["row_counts"])
    # end to end: the score right after training is the score of the site attached again from its asset
    got = train_table(lm, [], tmp_path / "c.pmem", cfg=cfg, texts=docs, eval_tokens=300, window=64)
    counts = open_table(got["path"]).row_counts()
    assert counts is not None and int(counts.sum()) > 0
    held = _bounded_texts(lm, [t for i, t in enumerate(docs) if i % 10 == 9], 300)
    res = evaluate(lm, held, window=64,
                   attach=lambda: load_attached(lm.model, got["site"], got["path"], tokenizer=lm.tokenizer))
    assert res["with_table"]["bpb"] == pytest.approx(got["heldout_bpb_after"], rel=1e-6)
