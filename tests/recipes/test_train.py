"""`polymem train` and `polymem transfer` end to end on a tiny corpus the test writes (seconds, not minutes):
assets with provenance, the held-out split, bits per byte, the transfer JSON contract, CLI errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from polymem.cli.app import app
from polymem.errors import PolymemError
from polymem.recipes.data import split_documents
from polymem.recipes.train import MemoryConfig, TokenData, TrainConfig, evaluate_bpb, train_donor

torch.set_num_threads(1)
TINY = dict(steps=4, batch_size=2, block_size=32, n_layer=2, n_head=2, d_model=32)
TINY_MEM = MemoryConfig(params=64 * 4 * 4 * 8, heads=4, slots=4, head_dim=8)


def test_split_holds_out_every_kth_document():
    docs = [f"d{i}" for i in range(25)]
    train, held = split_documents(docs, 10)
    assert held == ["d9", "d19"] and len(train) == 23 and not set(train) & set(held)


def test_bpb_by_hand():
    """A model predicting uniformly over 256 byte values costs exactly 8 bits per byte."""

    class Uniform(torch.nn.Module):
        def forward(self, x, y):
            return torch.full(y.shape, float(np.log(256)))

    data = TokenData.build("bytes", ["abc" * 50], ["hello world " * 20])
    assert evaluate_bpb(Uniform(), data, TrainConfig(block_size=16)) == pytest.approx(8.0)


def test_train_donor_writes_asset_with_provenance(corpus, tmp_path):
    from polymem.torch.tablefile import open_table

    s = train_donor("bytes", [corpus], tmp_path / "donor.safetensors", cfg=TrainConfig(**TINY), mem=TINY_MEM)
    a = open_table(s["path"])
    t = a.to_numpy()
    assert t.shape == (TINY_MEM.layout().num_rows, 8) and t.dtype == np.float32
    assert 0 < s["rows_touched"] == int((np.abs(t).sum(1) > 0).sum()) < t.shape[0]  # sparse updates
    p = a.provenance
    assert p["tokenizer"]["name"] == "bytes" and p["tokens_seen"] == 4 * 2 * 32 and p["heldout_every"] == 10
    assert tuple(a.orders) == (1, 2, 3) and np.isfinite(p["heldout_bpb"]) and np.isfinite(p["heldout_bpb_memory_off"])


@pytest.mark.slow
def test_train_and_transfer_cli(corpus, tmp_path):
    runner = CliRunner()
    donor = tmp_path / "donor.safetensors"
    args = ["--steps", "4", "--batch-size", "2", "--block-size", "32", "--n-layer", "2", "--d-model", "32", "--n-head", "2"]
    r = runner.invoke(app, ["train", "--tokenizer", "bytes", "--corpus", str(corpus), "--out", str(donor),
                            "--params", str(64 * 4 * 4 * 8), "--heads", "4", "--slots", "4", "--head-dim", "8", *args])
    assert r.exit_code == 0, r.output
    assert "held-out bits per byte, with the table" in r.output and "verdict: the table" in r.output
    # the two losses are named: each step's batch (the log line, the progress bar) and the mean behind final_loss
    assert "step 4/4 loss on this step's batch" in r.output
    flat = " ".join(r.output.replace("│", " ").split())  # the table may wrap the label inside its cell
    assert "training loss, mean of the last 4 steps" in flat and "final_loss)" in flat
    r = runner.invoke(app, ["train", "--tokenizer", "bytes", "--corpus", str(corpus), "--out", str(donor), *args])
    assert r.exit_code != 0 and "exists" in str(r.exception)
    out = tmp_path / "t.json"
    r = runner.invoke(app, ["transfer", "--asset", str(donor), "--tokenizer", "cl100k_base", "--corpus", str(corpus),
                            "--seeds", "2", "--jobs", "2", "--threads", "1", "--arms", "none,random,donor,scratch",
                            "--json", str(out), "--plot", str(tmp_path / "t.png"), *args])
    assert r.exit_code == 0, r.output
    res = json.loads(out.read_text())
    assert set(res["arms"]) == {"none", "random", "donor", "donor_memory_off", "scratch"}
    assert all(len(v["bpb"]) == 2 and all(np.isfinite(v["bpb"])) for v in res["arms"].values())
    assert res["seeds"] == [0, 1] and res["steps"] == 4 and res["tokens"] == 4 * 2 * 32
    assert res["jobs"] == {"requested": 2, "processes": 2, "tasks": 8}  # what ran: 2 seeds × 4 arms on 2 processes
    assert res["donor"]["tokenizer"] == "bytes" and res["recipient"]["tokenizer"] == "cl100k_base"
    assert res["recipient"]["fingerprint"] and res["donor"]["fingerprint"]
    assert "trained_hashes" in res["coverage"] and res["elapsed_s"] > 0
    assert res["coverage"]["trained_hashes"]["basis"].startswith("n-grams inside the donor's replayed")
    # byte-equivalence at work: every byte 1-gram of the recipient's text was written by the bytes donor only
    # when the recipient token is a single byte; coverage is a share in [0, 1]
    assert 0.0 <= res["coverage"]["trained_hashes"]["per_n"]["1"] <= 1.0
    assert (tmp_path / "t.png").stat().st_size > 0


def test_transfer_arms_share_backbone_init(corpus, tmp_path):
    """Identical backbone init per seed across arms: the memory arms differ from `none` only by the site."""
    from polymem.recipes.train import build_model

    data = TokenData.build("bytes", ["abc def " * 40], ["abc " * 40])
    a, b = build_model(data, TrainConfig(**TINY), seed=3), build_model(data, TrainConfig(**TINY), seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_training_lowers_the_loss_and_writes_exactly_the_trained_rows(tmp_path):
    """A few steps on a repetitive text lower the loss well below its start; the written asset opens, verifies,
    carries the summary's numbers, and its non-zero rows are rows that the training stream's n-grams address
    (the table is updated sparsely; nothing else moves)."""
    from polymem import MemoryAsset, TokenHashes, load_tokenizer

    docs = [f"the cat sat on the mat {i % 3}. " * 30 for i in range(10)]  # document 9 is held out
    path = tmp_path / "rep.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    losses: list[float] = []
    cfg = TrainConfig(steps=40, batch_size=4, block_size=32, n_layer=2, n_head=2, d_model=32, lr=1e-2, bf16=False)
    s = train_donor("bytes", [path], tmp_path / "donor.pmem", cfg=cfg, mem=TINY_MEM,
                    on_step=lambda i, loss: losses.append(loss))
    assert len(losses) == 40
    assert np.mean(losses[-5:]) < 0.5 * losses[0], losses  # from ~ln(vocab used) to a text it has memorised
    asset = MemoryAsset.open(s["path"])
    asset.verify()
    table = asset.to_numpy()
    nonzero = set(np.flatnonzero(np.abs(table).sum(1) > 0).tolist())
    assert len(nonzero) == s["rows_touched"] == asset.provenance["rows_touched"] > 0
    assert asset.provenance["loss"] == pytest.approx(np.mean(losses[-20:]), rel=1e-6)
    cache = TokenHashes.build(load_tokenizer("bytes"))
    train_ids = load_tokenizer("bytes").encode("".join(docs[:9]))
    addressed = set(cache.ngram_rows(train_ids, asset.layout, 3).ravel().tolist()) - {-1}
    assert nonzero <= addressed
    assert len(nonzero) > 0.5 * len(addressed)  # most addressed rows were read by some window and updated


def test_a_stopped_run_resumes_from_its_checkpoint_bit_for_bit(corpus, tmp_path):
    """Stopped after step 5 of 7, a run continues from the checkpoint of step 4 (its table an asset, the row-wise
    state and dense state beside it) and ends with the table, row counts and score of a run that never stopped;
    the checkpoint is gone once the asset is written. A damaged checkpoint is refused with one line."""
    from polymem import MemoryAsset
    from polymem.errors import PolymemError

    cfg = TrainConfig(**{**TINY, "steps": 7})
    whole = train_donor("bytes", [corpus], tmp_path / "whole.pmem", cfg=cfg, mem=TINY_MEM)

    def stop(i: int, loss: float) -> None:
        if i == 4:
            raise KeyboardInterrupt

    out, ckpt = tmp_path / "cut.pmem", tmp_path / "cut.pmem.ckpt"
    with pytest.raises(KeyboardInterrupt):
        train_donor("bytes", [corpus], out, cfg=cfg, mem=TINY_MEM, checkpoint_every=2, on_step=stop)
    state = json.loads((ckpt / "state.json").read_text())
    assert not out.exists() and state["step"] == 4 and state["world"] == 1
    assert MemoryAsset.open(ckpt / "table").problems() == []
    with pytest.raises(PolymemError, match="checkpoint of other settings"):  # another seed: not this run's state
        train_donor("bytes", [corpus], out, cfg=TrainConfig(**{**TINY, "steps": 7, "seed": 1}), mem=TINY_MEM,
                    checkpoint_every=2)
    rows = next(ckpt.glob("rows-*.safetensors"))
    rows.rename(tmp_path / rows.name)
    with pytest.raises(PolymemError, match="does not fit this run .* row files cover .*remove it to start over"):
        train_donor("bytes", [corpus], out, cfg=cfg, mem=TINY_MEM, checkpoint_every=2)
    (tmp_path / rows.name).rename(rows)
    head = (ckpt / "state.json").read_text()
    (ckpt / "state.json").write_text(json.dumps({**json.loads(head), "version": 1}))
    with pytest.raises(PolymemError, match="version 1; this polymem reads .* version 2: an older or newer polymem"):
        train_donor("bytes", [corpus], out, cfg=cfg, mem=TINY_MEM, checkpoint_every=2)
    (ckpt / "state.json").write_text(head)
    again = train_donor("bytes", [corpus], out, cfg=cfg, mem=TINY_MEM, checkpoint_every=2)
    assert again["resumed_at_step"] == 4 and whole["resumed_at_step"] == 0 and not ckpt.exists()
    a, b = MemoryAsset.open(whole["path"]), MemoryAsset.open(again["path"])
    assert np.array_equal(np.asarray(a.to_numpy()), np.asarray(b.to_numpy()))
    assert np.array_equal(a.row_counts(), b.row_counts())
    assert again["heldout_bpb"] == whole["heldout_bpb"] and again["final_loss"] == whole["final_loss"]


def test_train_on_every_document_reports_what_it_read(corpus, tmp_path):
    """``heldout_every=0``: every document trains, the scores are on them and the summary says so; the share of
    the training stream read and the passes are those of the run's window starts."""
    from polymem.recipes.data import corpus_read, read_documents, split_documents
    from polymem.recipes.train import TokenData, batch_starts, train_donor

    s = train_donor("bytes", [corpus], tmp_path / "all.safetensors", cfg=TrainConfig(**TINY), mem=TINY_MEM,
                    heldout_every=0)
    docs = read_documents([corpus])
    assert split_documents(docs, 0) == (docs, [])
    n = TokenData.build("bytes", docs, docs[:1]).train.size
    cfg = TrainConfig(**TINY)
    want = corpus_read(n, batch_starts(n, block_size=32, batch_size=2, steps=4, seed=cfg.seed), 32, offset=1)
    assert s["corpus_read"] == want and s["train_tokens_available"] == n and want["passes"] == 4 * 2 * 32 / n
    assert s["scored_set"] == "training documents (nothing held out)" and s["heldout_every"] == 0
    with pytest.raises(PolymemError, match="must be 0 \\(train on every document\\) or >= 2"):
        split_documents(docs, 1)
