"""Learning curves of the transfer arms: donor_finetune starts from the donor's rows and trains them while the
frozen donor stays put; the curve JSON contract; compute saved, crossover and paired statistics on hand-made
numbers."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from polymem.cli.app import app
from polymem.errors import PolymemError
from polymem.recipes.curves import analyze, compute_saved, crossover, end_of_schedule_saving, paired, tokens_to_reach
from polymem.recipes.train import MemoryConfig, TokenData, TrainConfig, train_donor, train_loop

torch.set_num_threads(1)
TINY = dict(steps=4, batch_size=2, block_size=32, n_layer=2, n_head=2, d_model=32, precision="fp32")
TINY_MEM = MemoryConfig(params=64 * 4 * 4 * 8, heads=4, slots=4, head_dim=8)
ARGS = ["--steps", "4", "--batch-size", "2", "--block-size", "32", "--n-layer", "2", "--d-model", "32", "--n-head", "2",
        "--precision", "fp32"]


@pytest.fixture(scope="module")
def donor(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("donor") / "donor.safetensors"
    train_donor("bytes", [corpus], out, cfg=TrainConfig(**TINY), mem=TINY_MEM)
    return out


def test_finetune_starts_from_donor_rows_and_trains_them_frozen_donor_does_not(corpus, donor):
    from polymem.torch.tablefile import open_table
    from polymem.recipes.data import read_documents, split_documents
    from polymem.recipes.transfer import build_arm

    a = open_table(donor)
    tab = torch.from_numpy(a.to_numpy().copy())
    tr, he = split_documents(read_documents([corpus]), 10)
    data = TokenData.build("cl100k_base", tr, he, spec=a.spec)
    cfg = TrainConfig(**{**TINY, "steps": 3})
    kw = dict(spec=a.spec, layout=a.layout, orders=tuple(a.orders), cfg=cfg, seed=0, layers=[1], gate="scalar", max_n=3)
    models = {}
    for arm in ("donor", "donor_finetune"):
        model, h = build_arm(arm, data, tab, **kw)
        assert torch.equal(h.table.weight.detach(), tab)  # both start exactly at the donor's rows
        assert h.table.weight.data_ptr() != tab.data_ptr()  # ... in a copy the arm owns
        train_loop(model, h, data, cfg)
        models[arm] = (model, h.table.weight.detach().clone())
        h.detach()
    assert torch.equal(models["donor"][1], tab)  # frozen: not one bit moved
    changed = (models["donor_finetune"][1] != tab).any(dim=1)
    assert 0 < int(changed.sum()) < tab.shape[0]  # fine-tuned: some rows (the ones the batches hit), not all
    # same backbone init per seed: the two arms' models started equal (their embeddings differ only by training)
    m0, _ = build_arm("none", data, tab, **kw)
    m1, _ = build_arm("none", data, tab, **kw)
    assert all(torch.equal(x, y) for x, y in zip(m0.state_dict().values(), m1.state_dict().values()))


def test_curve_json_contract(corpus, donor, tmp_path):
    out = tmp_path / "curves.json"
    r = CliRunner().invoke(app, ["transfer", "--asset", str(donor), "--tokenizer", "cl100k_base", "--corpus", str(corpus),
                                 "--seeds", "2", "--eval-every", "2", "--domain", "tiny", "--max-eval-tokens", "200",
                                 "--json", str(out), "--plot", str(tmp_path / "c.png"), *ARGS])
    assert r.exit_code == 0, r.output
    res = json.loads(out.read_text())
    arms = {"none", "random", "donor", "donor_memory_off", "donor_finetune", "scratch"}
    assert set(res["arms"]) == arms == set(res["curves"])
    assert res["seeds"] == [0, 1] and res["tokens"] == 4 * 2 * 32 and res["eval_every"] == 2
    for arm, c in res["curves"].items():
        assert c["tokens"] == [2 * 64, 4 * 64]  # recipient tokens at each point
        assert len(c["bpb"]) == 2 and all(len(s) == 2 for s in c["bpb"])  # one curve per seed
        assert [s[-1] for s in c["bpb"]] == res["arms"][arm]["bpb"]  # the final budget is the curve's last point
    assert res["domain"]["name"] == "tiny" and res["domain"]["in_domain"] is True
    assert res["recipient"]["tokenizer"] == "cl100k_base" and res["precision"]["chosen"] == "fp32"
    drift = res["donor_finetune"]["table_drift"]
    assert len(drift) == 2 and all(d["rows_changed"] > 0 and d["relative_change"] > 0 for d in drift)
    an = res["analysis"]
    assert an["paired_final"]["donor_finetune-scratch"]["n"] == 2
    assert len(an["paired_curve"]["donor-random"]) == 2
    assert len(an["compute_saved"]["donor_finetune"]["per_seed"]) == 2
    assert "donor_finetune_le_scratch_every_budget_every_seed" in an["targets"]
    assert (tmp_path / "c.png").stat().st_size > 0
    flat = " ".join(r.output.split())  # lines wrap at 80 columns here
    assert "compute saved at 256 recipient tokens" in flat and "first − second" in flat
    assert "verdict: the frozen donor table" in flat and "{'" not in flat and "n/a" not in flat


def test_cli_rejects_unknown_arm(corpus, donor):
    r = CliRunner().invoke(app, ["transfer", "--asset", str(donor), "--tokenizer", "bytes", "--corpus", str(corpus),
                                 "--arms", "none,finetune", *ARGS])
    assert r.exit_code != 0 and "'finetune'" in str(r.exception) and "donor_finetune" in str(r.exception)


def test_tokens_to_reach_interpolates():
    t = [100, 200, 300, 400]
    y = [3.0, 2.5, 2.0, 1.8]
    assert tokens_to_reach(t, y, 2.25) == (250.0, "interpolated")  # halfway between 2.5 and 2.0
    assert tokens_to_reach(t, y, 2.0) == (300.0, "interpolated")
    assert tokens_to_reach(t, y, 3.5) == (100.0, "at_or_before")  # already there at the first point
    assert tokens_to_reach(t, y, 1.5) == (None, "not_reached")
    assert tokens_to_reach(t, [3.0, 2.0, 2.4, 1.0], 2.2) == (180.0, "interpolated")  # the first crossing counts
    with pytest.raises(PolymemError, match="increase strictly"):
        tokens_to_reach([100, 100], [1, 1], 1)


def test_compute_saved_and_crossover_on_hand_made_curves():
    t = [100, 200, 300, 400]
    scratch = [3.0, 2.6, 2.2, 1.8]
    finetune = [2.6, 2.2, 2.0, 1.9]  # what scratch reaches 100, 100, 50, -25 tokens later
    cs = compute_saved(t, scratch, finetune)
    assert [c["ref_tokens_needed"] for c in cs] == pytest.approx([200, 300, 350, 375])
    assert [c["extra_fraction"] for c in cs] == pytest.approx([1.0, 0.5, 50 / 300, -25 / 400])
    cs = compute_saved(t, scratch, [2.0, 1.7, 1.6, 1.5])  # scratch never gets to 1.7 within the run
    assert cs[1]["ref_tokens_needed"] is None and cs[1]["status"] == "not_reached"
    assert cs[1]["extra_fraction_at_least"] == pytest.approx(1.0)  # > 400 tokens for a 200-token budget
    frozen = [2.5, 2.3, 2.1, 2.0]  # scratch − frozen: +0.5, +0.3, +0.1, −0.2 → crosses a third of the way 300→400
    assert crossover(t, scratch, frozen) == pytest.approx(300 + 100 * 0.1 / 0.3)
    assert crossover(t, scratch, [3.5, 3.0, 2.5, 2.0]) == 100.0  # scratch better from the start
    assert crossover(t, scratch, [1.0, 1.0, 1.0, 1.0]) is None



def test_end_of_schedule_saving_interpolates_between_complete_runs():
    # scratch runs of 100, 150, 200 tokens (each with its own decay); two seeds
    runs = [(150, [2.10, 2.00]), (100, [2.20, 2.10]), (200, [2.00, 1.95])]  # order of the runs does not matter
    r = end_of_schedule_saving([2.15, 1.97], budget=100, scratch_runs=runs)
    assert r["scratch_run_tokens"] == [100.0, 150.0, 200.0]
    s0, s1 = r["per_seed"]
    assert s0["ref_tokens_needed"] == pytest.approx(125.0) and s0["extra_fraction"] == pytest.approx(0.25)
    assert s1["ref_tokens_needed"] == pytest.approx(180.0) and s1["extra_fraction"] == pytest.approx(0.8)
    assert r["extra_fraction_mean"] == pytest.approx(0.525)
    r = end_of_schedule_saving([2.15, 1.90], budget=100, scratch_runs=runs)  # seed 1: longest run still short
    assert r["per_seed"][1]["ref_tokens_needed"] is None and r["per_seed"][1]["extra_fraction_at_least"] == pytest.approx(1.0)
    assert r["extra_fraction_mean"] is None
    assert end_of_schedule_saving([2.5, 2.5], 100, runs)["per_seed"][0]["status"] == "at_or_before"
    with pytest.raises(PolymemError, match="one final bpb per seed"):
        end_of_schedule_saving([2.0, 2.0, 2.0], 100, runs)
    with pytest.raises(PolymemError, match="at least one scratch run"):
        end_of_schedule_saving([2.0], 100, [])


def test_paired_statistics():
    p = paired([1.60, 1.70, 1.65], [1.70, 1.75, 1.62])
    assert p["diff"] == pytest.approx([-0.10, -0.05, 0.03])
    assert p["mean"] == pytest.approx(-0.04)
    assert p["std"] == pytest.approx(np.std([-0.10, -0.05, 0.03], ddof=1))
    assert (p["min"], p["max"], p["n"], p["a_better"]) == (pytest.approx(-0.10), pytest.approx(0.03), 3, 2)
    assert paired([1.0], [2.0])["std"] is None
    with pytest.raises(PolymemError, match="same non-zero number of seeds"):
        paired([1.0, 2.0], [1.0])


def test_analyze_targets_on_hand_made_result():
    t = [100, 200]
    curves = {"none": [[3.0, 2.8], [3.1, 2.9]], "random": [[2.9, 2.7], [3.0, 2.85]], "donor": [[2.5, 2.4], [2.6, 2.3]],
              "donor_finetune": [[2.4, 2.2], [2.5, 2.25]], "scratch": [[2.8, 2.3], [2.9, 2.2]]}
    res = {"arms": {k: {"bpb": [s[-1] for s in v]} for k, v in curves.items()}, "seeds": [0, 1], "tokens": 200,
           "curves": {k: {"tokens": t, "bpb": v} for k, v in curves.items()}}
    an = analyze(res)
    tg = an["targets"]
    assert tg["donor_lt_random_lt_none_every_budget_every_seed"] is True
    assert tg["donor_finetune_le_scratch_every_budget_every_seed"] is False  # seed 1: 2.25 > 2.2 at the end
    assert an["crossover_scratch_over_donor"]["per_seed"] == pytest.approx([175.0, 175.0])  # d: +0.3 then -0.1
    assert an["paired_final"]["donor-random"]["a_better"] == 2


def test_markdown_report_quotes_the_numbers():
    from polymem.recipes.curves import markdown_report

    t = [1000, 2000]
    curves = {"none": [[3.0, 2.8]], "donor": [[2.6, 2.4]], "donor_finetune": [[2.4, 2.2]], "scratch": [[2.8, 2.3]]}
    res = {"arms": {k: {"bpb": [s[-1] for s in v]} for k, v in curves.items()}, "seeds": [0], "tokens": 2000,
           "curves": {k: {"tokens": t, "bpb": v} for k, v in curves.items()}}
    md = markdown_report(res)
    assert "| donor_finetune | 2.2000 | 2.2000 |" in md  # final budget table: seed 0 and the mean
    assert "| 1k | 2.400 | 1.8k | +80% |" in md  # scratch reaches 2.4 at 1.8k tokens (2.8 → 2.3 over 1k→2k)
    assert "| 2k | 2.200 | not within the run | ≥ +0% |" in md
    assert "Scratch reaches the frozen donor at: 1.7k tokens" in md  # d: +0.2 → −0.1 ⇒ 1000 + 1000·2/3
