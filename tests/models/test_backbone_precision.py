"""A frozen pretrained backbone in bf16 (``--precision`` of eval, generate, train --model, attach, transfer
--model): the choice rule on given CPU flag sets, what :func:`bf16_backbone` does to a model (bf16 matrix
products, fp32 embeddings and residual stream, sites and tables fp32), scores within 0.3 % of fp32 with and
without a site, training through it, and `polymem eval` scoring several sites against one pass of the model
alone, its held-out default and its bad input. Small random Llama / Gemma 3 models built from configs; the
builtin real models' bf16 check is in test_builtin_smoke.py (slow tier)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from polymem.cli.app import app
from polymem.errors import PolymemError
from polymem.torch.precision import choose_precision

pytest.importorskip("transformers")
from test_models import _checkpoint  # noqa: E402  (the small checkpoints of the pretrained-model tests)
from test_models import texts as texts  # noqa: E402,F401  (module-scoped fixture)
from test_models import corpus_file as corpus_file  # noqa: E402,F401

torch.set_num_threads(1)


@pytest.mark.parametrize("flags,expected", [
    ({"avx2", "fma"}, "fp32"),                                 # AVX2 only: bf16 emulated (17x slower measured)
    ({"avx2", "avx512f", "avx512_bf16"}, "bf16"),              # the bf16 dot product pays for a frozen backbone
    ({"avx2", "avx512f", "avx512_bf16", "amx_bf16"}, "bf16"),  # AMX
    ({"fp", "asimd", "bf16"}, "fp32"),                          # aarch64 bf16: not measured, fp32
    (None, "fp32"),
])
def test_backbone_rule_on_cpu_flags(flags, expected):
    name, why = choose_precision("auto", "cpu", cpu_flags=flags, workload="backbone")
    assert name == expected and why.startswith("auto: ")
    if flags == {"avx2", "fma"}:
        assert "17x" in why  # the measured reason, not a timing in the test
    # the from-scratch rule is unchanged: avx512_bf16 alone keeps fp32 there
    if flags and "avx512_bf16" in flags and "amx_bf16" not in flags:
        assert choose_precision("auto", "cpu", cpu_flags=flags)[0] == "fp32"
    with pytest.raises(PolymemError, match="workload 'serve' is unknown"):
        choose_precision("auto", "cpu", cpu_flags=flags, workload="serve")


def test_forced_bf16_without_native_bf16_is_a_warning(capsys):
    from polymem.cli._precision import backbone_precision
    from polymem.torch import precision as P

    P.host_cpu_flags.cache_clear()
    real = P.host_cpu_flags
    try:
        P.host_cpu_flags = lambda: frozenset({"avx2", "fma"})  # type: ignore[assignment]
        assert backbone_precision("bf16", "cpu") == "bf16"
        assert backbone_precision("auto", "cpu") == "fp32"
    finally:
        P.host_cpu_flags = real
    err = capsys.readouterr().err
    assert "warning: --precision bf16" in err and "--precision fp32" in err and "17x" in err


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(fp32, bf16) loads of each small checkpoint."""
    from polymem.models import load_model

    root = tmp_path_factory.mktemp("bf16ckpt")
    out = {}
    for arch in ("llama", "gemma3"):
        p = _checkpoint(root / arch, arch)
        out[arch] = (load_model(p), load_model(p, precision="bf16"))
    return out


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_bf16_backbone_keeps_the_stream_fp32_and_scores_within_0p3_percent(pair, texts, arch):
    from polymem.hash.layout import Layout
    from polymem.hash.spec import HashSpec
    from polymem.models.evaluate import evaluate
    from polymem.torch.attach import attach
    from polymem.torch.tables import TrainableTable

    f32, b16 = pair[arch]
    assert b16.precision == "bf16" and b16.describe()["precision"] == "bf16" and f32.precision == "fp32"
    lins = [m for m in b16.model.modules() if isinstance(m, torch.nn.Linear)]
    assert lins and all(m.weight.dtype == torch.bfloat16 for m in lins)
    emb = b16.model.get_input_embeddings()
    assert emb.weight.dtype == torch.float32  # untied from the (bf16) output layer where they were tied
    assert b16.model.get_output_embeddings().weight is not emb.weight
    ids = torch.tensor([b16.tokenizer.encode(texts[0])[:40].tolist()])
    hid = b16.model(input_ids=ids, output_hidden_states=True).hidden_states
    assert hid[1].dtype == torch.float32  # the residual stream after a block: fp32
    lay = Layout.for_params(4096 * 8, heads=4, slots=4, head_dim=8)
    w = torch.randn(lay.num_rows, 8, generator=torch.Generator().manual_seed(1))

    def site(lm):
        return lambda: attach(lm.model, TrainableTable(w, spec=HashSpec(), layout=lay, trainable=False), lm.tokenizer,
                              layers=[1], value_init="orthogonal", gate="context")

    a = evaluate(f32, texts[:6], window=64, attach=site(f32))
    b = evaluate(b16, texts[:6], window=64, attach=site(b16))
    assert a["alone"]["bytes"] == b["alone"]["bytes"] and b["precision"] == "bf16"
    for k in ("alone", "with_table", "table_off"):
        assert abs(b[k]["bpb"] - a[k]["bpb"]) / a[k]["bpb"] < 3e-3, (k, a[k]["bpb"], b[k]["bpb"])
    assert b["with_table"]["bpb"] != b["alone"]["bpb"] == b["table_off"]["bpb"]


def test_training_a_site_through_a_bf16_backbone_keeps_the_table_and_site_fp32(pair, texts):
    from polymem.recipes.frozen import FrozenTrainConfig, corpus_stream, train_site
    from polymem.torch.attach import attach

    _, lm = pair["llama"]
    cfg = FrozenTrainConfig(steps=3, batch_size=2, block_size=32, layers=(1,), params=4096 * 8, heads=4, head_dim=8,
                            gate="count")
    data = corpus_stream(lm, texts=texts, heldout_every=10)
    h = attach(lm.model, cfg.layout(), lm.tokenizer, layers=[1], train="table", max_n=3, gate="count")
    try:
        res = train_site(lm, h, data.train, cfg)
        assert all(np.isfinite(res["losses"])) and len(res["losses"]) == 3
        assert h.table.weight.dtype == torch.float32 and float(h.table.weight.detach().abs().sum()) > 0
        assert all(p.dtype == torch.float32 for p in h.sites.parameters())
    finally:
        h.detach()


# ------------------------------------------------------------------------------------------------ eval
@pytest.fixture(scope="module")
def two_sites(tmp_path_factory, corpus_file):
    """Two sites over tables trained on the llama checkpoint, the second with another seed."""
    root = tmp_path_factory.mktemp("sites")
    ck = _checkpoint(root / "llama", "llama")
    runner = CliRunner()
    for i in (0, 1):
        r = runner.invoke(app, ["train", "--model", str(ck), "--corpus", str(corpus_file), "--out", str(root / f"t{i}.pmem"),
                                "--steps", "2", "--batch-size", "2", "--block-size", "16", "--layers", "1",
                                "--params", "32K", "--heads", "4", "--head-dim", "8", "--eval-tokens", "100",
                                "--seed", str(i), "--heldout-every", "5", "--precision", "fp32",
                                "--json", str(root / f"t{i}.json")])
        assert r.exit_code == 0, r.output
    return ck, [root / "t0.pmem.site", root / "t1.pmem.site"]


def test_eval_scores_several_sites_against_one_pass_alone(two_sites, corpus_file, tmp_path):
    from polymem.models.evaluate import Scorer

    ck, sites = two_sites
    calls = {"n": 0}
    real = Scorer.score

    def counted(self, on_batch=None):
        calls["n"] += 1
        return real(self, on_batch)

    Scorer.score = counted  # type: ignore[method-assign]
    try:
        j = tmp_path / "e.json"
        r = CliRunner().invoke(app, ["eval", "--model", str(ck), "--corpus", str(corpus_file), "--site", str(sites[0]),
                                     "--site", str(sites[1]), "--window", "64", "--precision", "fp32", "--json", str(j)])
    finally:
        Scorer.score = real  # type: ignore[method-assign]
    assert r.exit_code == 0, r.output
    assert calls["n"] == 3  # the model alone once, each site once; no "table off" unless asked
    got = json.loads(j.read_text())
    assert [s["site"] for s in got["sites"]] == [str(s) for s in sites] and "table_off" not in got["sites"][0]
    assert got["sites"][0]["with_table"]["bpb"] != got["sites"][1]["with_table"]["bpb"]
    out = " ".join(r.output.split())
    assert "with table 1" in out and "with table 2" in out and "site 2 (" in out
    # the sites' tables record this corpus and split 5: their held-out documents are scored by default, said once
    assert got["heldout_every"] == 5 and "held-out documents of the table's training split (every 5th" in out
    # the same numbers as one site at a time
    j1 = tmp_path / "e1.json"
    r = CliRunner().invoke(app, ["eval", "--model", str(ck), "--corpus", str(corpus_file), "--site", str(sites[1]),
                                 "--window", "64", "--precision", "fp32", "--json", str(j1), "--table-off"])
    assert r.exit_code == 0, r.output
    one = json.loads(j1.read_text())
    assert one["with_table"]["bpb"] == got["sites"][1]["with_table"]["bpb"]
    assert one["table_off"]["bpb"] == one["alone"]["bpb"] == got["alone"]["bpb"]


def test_eval_warns_when_it_scores_what_the_table_trained_on_and_caps_documents(two_sites, corpus_file, tmp_path):
    ck, sites = two_sites
    j = tmp_path / "e.json"
    r = CliRunner().invoke(app, ["eval", "--model", str(ck), "--corpus", str(corpus_file), "--site", str(sites[0]),
                                 "--heldout-every", "1", "--max-doc-tokens", "8", "--window", "64", "--json", str(j)])
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    assert "warning: --heldout-every 1 scores documents" in out and "--heldout-every 5 scores only its held-out" in out
    got = json.loads(j.read_text())
    assert got["max_doc_tokens"] == 8 and all(d["tokens"] <= 9 for d in got["alone"]["per_doc"])  # cut at a token
    assert got["documents"] == 40 and "each document's first 8 tokens" in out
    # every 10th is a multiple of the split: held-out documents only, no warning
    r = CliRunner().invoke(app, ["eval", "--model", str(ck), "--corpus", str(corpus_file), "--site", str(sites[0]),
                                 "--heldout-every", "10", "--window", "64", "--max-docs", "1"])
    assert r.exit_code == 0 and "warning" not in r.output


def test_eval_scores_what_train_scored_with_the_same_budget(two_sites, corpus_file, tmp_path):
    """One scoring rule: `eval --eval-tokens 100` on the table's split scores the text `train --model
    --eval-tokens 100` scored, so the two commands print the same numbers (same precision)."""
    ck, sites = two_sites
    trained = json.loads((sites[0].parent / "t0.json").read_text())
    j = tmp_path / "e.json"
    r = CliRunner().invoke(app, ["eval", "--model", str(ck), "--corpus", str(corpus_file), "--site", str(sites[0]),
                                 "--eval-tokens", "100", "--precision", "fp32", "--json", str(j)])
    assert r.exit_code == 0, r.output
    got = json.loads(j.read_text())
    assert got["alone"]["bytes"] == trained["heldout_bytes"] and got["alone"]["tokens"] == trained["heldout_tokens"]
    assert got["documents"] == trained["heldout_documents"] > 1  # at most 100 // 8 tokens from each document
    assert got["alone"]["bpb"] == pytest.approx(trained["heldout_bpb_before"], rel=1e-6)
    assert got["with_table"]["bpb"] == pytest.approx(trained["heldout_bpb_after"], rel=1e-6)
    assert f"{got['documents']} documents, {got['alone']['tokens']:,} tokens, {got['alone']['bytes']:,} bytes" in \
        " ".join(r.output.split())


def test_eval_bad_site_options_are_one_line_before_the_model_loads(two_sites, corpus_file):
    ck, sites = two_sites
    r = CliRunner().invoke(app, ["eval", "--model", str(ck), "--corpus", str(corpus_file), "--site", str(sites[0]),
                                 "--site", str(sites[0]) + "/"])
    assert r.exit_code != 0 and "is given twice" in str(r.exception) and "loaded" not in r.output
    r = CliRunner().invoke(app, ["eval", "--model", str(ck), "--corpus", str(corpus_file), "--site", str(sites[0]),
                                 "--site", str(sites[1]), "--asset", str(sites[0].parent / "t0.pmem")])
    assert r.exit_code != 0 and "names the table of one site" in str(r.exception) and "loaded" not in r.output
