"""The options of `polymem transfer --model`: each bad value is one line naming its flag, the value and what is
accepted (and the flag is one the command has); good values come out normalised; the arms' registry is the one
place an arm's properties live."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from polymem.cli._transfer_options import (ContentStudyOptions, DonorOptions, ModelTransfer, RecipientOptions,
                                           RunOptions, eval_steps, seed_ids)
from polymem.errors import PolymemError
from polymem.recipes.arms import ARM_SPECS, ARMS, EXTRA_ARMS, METHODS, Arm, arm_table, check_arms
from polymem.recipes.frozen import FrozenTrainConfig
from polymem.recipes.options import ExperimentData, RecipientSite

BUDGET = FrozenTrainConfig(steps=40)
OUT = Path("runs")


def _transfer_flags() -> set[str]:
    import typer

    from polymem.cli.app import app

    cmd = typer.main.get_command(app).commands["transfer"]  # type: ignore[attr-defined]
    return {o for p in cmd.params for o in p.opts}


def _all(**kw):
    """A ModelTransfer of good groups, with ``kw`` replacing some."""
    groups = dict(recipient=RecipientOptions(model="m", budget=BUDGET), donor=DonorOptions(asset="a.pmem"),
                  data=ExperimentData(corpus=[Path("c.jsonl")]), run=RunOptions(out_dir=OUT), content=None)
    return ModelTransfer(**{**groups, **kw})


BAD = {
    "--init": (lambda: RecipientSite(init="sideways"), "'sideways'", "aligned"),
    "--gate": (lambda: RecipientSite(gate="wide"), "'wide'", "context"),
    "--max-n": (lambda: RecipientSite(max_n=0), "0", "1..32"),
    "--layers": (lambda: RecipientSite(layers=(-1,)), "(-1,)", ">= 0"),
    "--corpus": (lambda: ExperimentData(), "no training documents", "texts"),
    "--eval-tokens": (lambda: ExperimentData(corpus=["c"], eval_tokens=0), "0", ">= 1"),
    "--eval-at": (lambda: RecipientOptions(model="m", budget=BUDGET, eval_at="4,x"), "'4,x'", "1..40"),
    "--steps": (lambda: RecipientOptions(model="m", budget=BUDGET, eval_at="41"), "'41'", "1..40"),
    "--eval-every": (lambda: RecipientOptions(model="m", budget=BUDGET, eval_every=0), "0", ">= 1"),
    "--precision": (lambda: RecipientOptions(model="m", budget=BUDGET, precision="fp8"), "'fp8'", "bf16"),
    "--out-dir": (lambda: RunOptions(out_dir=None), "--model needs", "runs/gemma"),
    "--arms": (lambda: RunOptions(out_dir=OUT, arms=("donor", "scratch")), "['scratch']", "in_place"),
    "--seed-list": (lambda: seed_ids(3, "0,x"), "'0,x'", "0..4294967295"),
    "--seeds": (lambda: RunOptions(out_dir=OUT, seeds=()), "()", "0..4294967295"),
    "--threads": (lambda: RunOptions(out_dir=OUT, threads=0), "0", ">= 1"),
    "--content-split": (lambda: ContentStudyOptions(split="0.5,0.5"), "'0.5,0.5'", "0.3,0.5,0.2"),
    "--donor-steps": (lambda: ContentStudyOptions(donor_steps=5), "--donor-steps", "no effect"),
    "--teach-prompts": (lambda: ContentStudyOptions(split="0.3,0.5,0.2", teach_prompts="nobody"), "'nobody'",
                        "recipient"),
    "--teach-tokens": (lambda: ContentStudyOptions(split="0.3,0.5,0.2", teach_tokens=0), "0", ">= 1"),
    "--asset": (lambda: _all(donor=DonorOptions()), "--asset is needed", "--content-split"),
    "--donor-model": (lambda: _all(donor=DonorOptions(asset="a", model="smollm2-135m")), "--init aligned",
                      "drop it"),
    "--donor-site": (lambda: _all(recipient=RecipientOptions(model="m", budget=BUDGET,
                                                             site=RecipientSite(donor_site="s"))), "stitch", "drop it"),
    "--content-split ": (lambda: _all(run=RunOptions(out_dir=OUT, arms=("teach",))), "the teach arm",
                         "--content-split"),
    "--teach-tokens ": (lambda: _all(run=RunOptions(out_dir=OUT, arms=("teach",)), content=ContentStudyOptions(
        split="0.3,0.5,0.2", teach_tokens=10**15).study("a.pmem", BUDGET)), "1" + ",000" * 5, "free"),
    "--donor-byte-head": (lambda: ContentStudyOptions(split="0.3,0.5,0.2", byte_head=17), "17", "1..16"),
    "--donor-byte-head ": (lambda: ContentStudyOptions(split="0.3,0.5,0.2", byte_head=8).study("a.pmem", BUDGET),
                           "--asset", "drop one"),
}


@pytest.mark.parametrize("flag", list(BAD))
def test_each_bad_option_is_one_line_naming_its_flag(flag: str) -> None:
    make, value, accepted = BAD[flag]
    with pytest.raises(PolymemError) as e:
        make()
    msg = str(e.value)
    assert "\n" not in msg and flag.strip() in msg and value in msg and accepted in msg, msg
    assert flag.strip() in _transfer_flags()  # a flag the command has


def test_good_options_come_out_normalised() -> None:
    run = RunOptions(out_dir=OUT, arms=(" donor", "none", "stitch", "donor"), seeds=seed_ids(3, "2,0,2"))
    assert run.arms == ("none", "donor", "stitch") and run.seeds == (2, 0) and run.folder == OUT
    assert RunOptions(out_dir=OUT, seeds=seed_ids(2, None)).seeds == (0, 1)
    r = RecipientOptions(model="m", budget=BUDGET, eval_every=10, eval_at="4,12")
    assert r.points == (4, 10, 12, 20, 30, 40) == eval_steps("4,12", 10, 40)
    assert RecipientSite(layers=[1, 3]).layers == (1, 3)
    _all(run=RunOptions(out_dir=OUT, arms=("stitch",)),  # the stitch arm reads --donor-site
         recipient=RecipientOptions(model="m", budget=BUDGET, site=RecipientSite(donor_site="s")))


def test_the_content_study_takes_the_recipients_budget_for_its_donor() -> None:
    assert ContentStudyOptions().study(None, BUDGET) is None
    budget = FrozenTrainConfig(steps=7, batch_size=3, block_size=32, site_lr=2e-3, table_lr=0.2, softmax="full")
    study = ContentStudyOptions(split="0.3,0.5,0.2", split_seed=4, donor_steps=9, donor_params="1M", teach_tokens=64)
    got = study.study(None, budget, [1])
    assert (got.split.donor, got.split.seed, got.donor_asset, got.teach.tokens) == (0.3, 4, None, 64)
    c = got.donor_cfg
    assert (c.steps, c.batch_size, c.block_size, c.layers, c.params, c.site_lr, c.table_lr, c.softmax) == (
        9, 3, 32, (1,), 1_000_000, 2e-3, 0.2, "full")
    assert study.study(None, budget).donor_cfg.layers == (2,)
    assert study.study("donor.pmem", budget).donor_asset == "donor.pmem"


def test_the_arm_registry_is_the_arms_order_and_properties() -> None:
    from polymem.hash.layout import Layout
    from polymem.hash.spec import HashSpec

    assert ARMS == ("none", "random", "null", "donor", "donor_finetune", "in_place")
    assert EXTRA_ARMS == ("stitch", "teach", "distill", "distill_own", "distill_own_mix", "next_bytes",
                          "donor_next_bytes", "donor_next_bytes_mix", "donor_next_bytes_mix_all",
                          "donor_next_bytes_mix_polished", "donor_next_bytes_mix_polished_all",
                          "next_bytes_fit", "next_bytes_conf", "next_bytes_mix")
    assert set(METHODS) == set(ARM_SPECS)
    assert check_arms(["distill", "none"]) == ["none", "distill"]
    layout = Layout(pages=4, heads=2, slots=2, head_dim=8)
    donor = torch.randn(layout.num_rows, layout.head_dim)
    for name, a in ARM_SPECS.items():
        t, mode, vinit = arm_table(name, donor, spec=HashSpec(), layout=layout, orders=(1, 2), seed=0, init="aligned")
        assert mode == a.trains and (t is None) == (a.rows == "none")
        if t is not None:
            assert vinit == ("aligned" if a.value_init == "init" else a.value_init)
            assert t.weight.requires_grad == (a.trains == "table"), name
            if a.rows == "donor":
                assert torch.equal(t.weight.detach(), donor)
    with pytest.raises(PolymemError, match="rows 'copied'"):
        Arm(name="new", method="m", rows="copied", trains="table")
    with pytest.raises(PolymemError, match="trains nothing"):
        Arm(name="new", method="m", rows="none", trains="table")
    with pytest.raises(PolymemError, match=r"decoder 'fitted' \(accepted: donor, polished\)"):
        Arm(name="new", method="m", rows="donor", trains="projection", decoder="fitted")
    with pytest.raises(PolymemError, match=r"teach 'both' \(accepted: written, own or None\)"):
        Arm(name="new", method="m", rows="donor", trains="projection", teach="both")


def test_the_content_study_refuses_data_options_it_does_not_read(tmp_path: Path) -> None:
    from polymem.recipes.content import ContentOptions, ContentSplit, run_content_transfer

    content = ContentOptions(split=ContentSplit.parse("0.3,0.4,0.3"), donor_asset="a.pmem")
    for data in (ExperimentData(texts=["a"], heldout_every=5), ExperimentData(texts=["a"], eval_texts={"x": ["b"]})):
        with pytest.raises(PolymemError, match="heldout_every, eval_texts and doc_tokens .* are not read; drop them"):
            run_content_transfer(None, None, data, cfg=BUDGET, content=content, arms=["none"], seeds=[0], eval_at=[],
                                 out_dir=tmp_path)
