"""Memory sites on real models: zero table = no memory (bit for bit), attach/detach, sparse gradients, frozen
tables, generate() vs full forwards, save/load, and clear errors for tables a site cannot use."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import polymem
from polymem import HashSpec, Layout, PolymemError, SpecMismatchError, TokenHashes
from polymem.samples import sample_text
from polymem.torch import TrainableTable, SparseRowRMS, attach, load_attached
from polymem.recipes.model import GPT, GPTConfig

torch.set_num_threads(1)
LAYOUT = Layout(pages=64, heads=4, slots=4, head_dim=8)


@pytest.fixture(scope="module")
def byte_cache() -> TokenHashes:
    return TokenHashes.build("bytes", HashSpec())


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    tok = polymem.load_tokenizer("bytes")
    arr = tok.encode(sample_text())[:96]
    return torch.from_numpy(np.stack([arr[:48], arr[48:96]]))  # [2, 48]


def tiny_gpt(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=256, n_used=256, block_size=64, n_layer=2, n_head=2, d_model=32), torch.arange(256))


def random_table(seed: int = 0, trainable: bool = False) -> TrainableTable:
    g = torch.Generator().manual_seed(seed)
    return TrainableTable(torch.randn(LAYOUT.num_rows, LAYOUT.head_dim, generator=g), spec=HashSpec(), layout=LAYOUT,
                     trainable=trainable)


@pytest.mark.parametrize("gate,conv", [("scalar", False), ("context", False), ("scalar", True), ("context", True)])
def test_zero_table_is_bit_identical_and_detach_restores(byte_cache, ids, gate, conv):
    model = tiny_gpt()
    with torch.no_grad():
        ref = model(ids)
    h = attach(model, LAYOUT, byte_cache, layers=[1], train="all", gate=gate, conv=conv)
    with torch.no_grad():
        assert torch.equal(model(ids), ref)  # all-zero rows: step 0 is the model without memory
    h.table.weight.data.normal_()  # now the memory matters ...
    with torch.no_grad():
        assert not torch.equal(model(ids), ref)
        with h.disabled():
            assert torch.equal(model(ids), ref)
    h.detach()  # ... and after detach it is gone
    with torch.no_grad():
        assert torch.equal(model(ids), ref)
    assert all(p.requires_grad for p in model.parameters())


def test_sparse_gradient_equals_dense_on_touched_rows(byte_cache, ids):
    torch.manual_seed(0)
    w = torch.randn(LAYOUT.num_rows, LAYOUT.head_dim)
    table = TrainableTable(w.clone(), spec=HashSpec(), layout=LAYOUT, trainable=True)
    rows = byte_cache.ngram_rows(ids.numpy(), LAYOUT, 3)  # [2, 48, 3, K], -1 invalid
    r = torch.from_numpy(rows)
    upstream = torch.randn(*r.shape, LAYOUT.head_dim)
    (table.gather(r) * upstream).sum().backward()
    g = table.weight.grad
    assert g.is_sparse
    dense_w = w.clone().requires_grad_(True)  # dense reference: plain indexing with a mask
    e = dense_w[r.clamp_min(0)] * (r >= 0).unsqueeze(-1)
    (e * upstream).sum().backward()
    gd = g.to_dense()
    touched = np.unique(rows[rows >= 0])
    assert torch.allclose(gd[touched], dense_w.grad[touched], atol=1e-5)
    untouched = np.setdiff1d(np.arange(LAYOUT.num_rows), touched)
    assert untouched.size > 0 and torch.count_nonzero(dense_w.grad[untouched]) == 0
    assert set(g.coalesce().indices()[0].tolist()) == set(touched.tolist())


def test_row_optimizer_moves_only_touched_rows(byte_cache, ids):
    model = tiny_gpt()
    h = attach(model, LAYOUT, byte_cache, layers=[0, 1], train="all")
    before = h.table.weight.detach().clone()
    opt = SparseRowRMS(h.table_parameters(), lr=0.1)
    model(ids, ids).mean().backward()
    opt.step()
    rows = byte_cache.ngram_rows(ids.numpy(), LAYOUT, 3)
    touched = torch.from_numpy(np.unique(rows[rows >= 0]))
    changed = (h.table.weight.detach() != before).any(dim=1)
    assert changed[touched].any()
    mask = torch.ones(LAYOUT.num_rows, dtype=torch.bool)
    mask[touched] = False
    assert not changed[mask].any()  # untouched rows never change


def test_frozen_donor_table_is_bit_identical_after_training(byte_cache, ids):
    from polymem.recipes.train import TokenData, TrainConfig, train_loop

    table = random_table(1)
    snapshot = table.weight.detach().clone()
    text = sample_text() * 3
    data = TokenData.build("bytes", [text[: len(text) // 2], text[len(text) // 2:]], [text[:600]])
    model = tiny_gpt()
    h = attach(model, table, data.cache, layers=[1], train="projection", freeze_model=False)
    assert all(p is not table.weight for p in h.trainable_parameters())
    out = train_loop(model, h, data, TrainConfig(steps=3, batch_size=2, block_size=32, lr=1e-2))
    assert len(out["losses"]) == 3
    assert torch.equal(table.weight, snapshot)
    assert h.sites["transformer/h/1"].gate.item() != 0.5


def _hf_models():
    from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MistralConfig,
                              MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM)

    common = dict(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128)
    return {
        "llama": lambda: LlamaForCausalLM(LlamaConfig(**common)),
        "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**common)),
        "mistral": lambda: MistralForCausalLM(MistralConfig(**common, sliding_window=None)),
        "gpt2": lambda: GPT2LMHeadModel(GPT2Config(vocab_size=300, n_embd=32, n_layer=2, n_head=4, n_positions=128)),
    }


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral", "gpt2"])
def test_hf_families_zero_identity_generate_and_detach(byte_cache, ids, family):
    torch.manual_seed(0)
    model = _hf_models()[family]().eval()
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    h = attach(model, LAYOUT, byte_cache, layers=[1])
    assert [m["module"] for m in h.report.matched] == [("transformer.h.1" if family == "gpt2" else "model.layers.1")]
    assert "vocab_size 300" in " ".join(h.report.notes)  # model vocab (300) > tokenizer vocab (256), reported
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, ref)
    h.detach()
    # a non-zero frozen table: generate() with a KV cache equals step-by-step full forwards
    h = attach(model, random_table(2), byte_cache, layers=[0, 1], value_init="orthogonal")
    prompt = ids[:, :7]
    with torch.no_grad():
        mem_logits = model(input_ids=prompt).logits
        with h.disabled():
            assert not torch.allclose(model(input_ids=prompt).logits, mem_logits)
        gen = model.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=None,
                             output_logits=True, return_dict_in_generate=True)
        seq = prompt
        for i in range(6):
            logits = model(input_ids=seq).logits[:, -1]  # full forward, no cache
            assert torch.allclose(gen.logits[i], logits, atol=1e-4), f"step {i}"
            seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(gen.sequences, seq)
    h.detach()
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, ref)


def test_unmatched_layers_are_reported(byte_cache):
    model = tiny_gpt()
    with pytest.raises(PolymemError, match=r"UNMATCHED 7: block index out of range: transformer.h has 2 blocks"):
        attach(model, LAYOUT, byte_cache, layers=[1, 7])
    h = attach(model, LAYOUT, byte_cache, layers=[1, "transformer.nope"], strict=False)
    assert h.layer_names == ["transformer.h.1"]
    assert h.report.unmatched[0]["requested"] == "transformer.nope"
    h.detach()
    with pytest.raises(PolymemError, match="train='everything' is unknown"):
        attach(model, LAYOUT, byte_cache, train="everything")


def test_unusable_hash_spec_or_layout_is_refused(byte_cache, tmp_path, ids):
    from polymem import XorHashSpec

    other = TokenHashes.build("bytes", HashSpec(normalizer="ascii-lower"))
    with pytest.raises(SpecMismatchError, match="rebuild the cache with the table's spec"):
        attach(tiny_gpt(), LAYOUT, other)
    xor_table = TrainableTable(None, spec=HashSpec(), layout=LAYOUT)
    xor_table.spec = XorHashSpec(head_rows=101)
    with pytest.raises(SpecMismatchError, match="byte-level polynomial HashSpec"):
        attach(tiny_gpt(), xor_table, byte_cache)
    # a saved site refuses a table of another layout, or another table of the same layout
    model = tiny_gpt()
    h = attach(model, random_table(3), byte_cache, layers=[1], value_init="orthogonal")
    h.save(tmp_path / "site")
    h.detach()
    other_layout = Layout(pages=32, heads=4, slots=4, head_dim=8)
    with pytest.raises(SpecMismatchError, match="expects layout"):
        load_attached(model, tmp_path / "site", TrainableTable(None, spec=HashSpec(), layout=other_layout, trainable=False), "bytes")
    with pytest.raises(SpecMismatchError, match="fingerprint"):
        load_attached(model, tmp_path / "site", random_table(4), "bytes")
    with pytest.raises(PolymemError, match="pass that asset"):
        load_attached(model, tmp_path / "site")


def test_save_load_roundtrip(byte_cache, ids, tmp_path):
    model = tiny_gpt()
    h = attach(model, LAYOUT, byte_cache, layers=[0, 1], train="table", gate="context", conv=True)
    assert all(p is not model.lm_head.weight for p in h.trainable_parameters())
    assert not model.lm_head.weight.requires_grad  # model frozen in "table" mode ...
    opt = SparseRowRMS(h.table_parameters(), lr=0.05)
    adam = torch.optim.Adam([p for p in h.sites.parameters()], lr=1e-2)
    for _ in range(2):
        model(ids, ids).mean().backward()
        opt.step(), adam.step(), opt.zero_grad(), adam.zero_grad()
    with torch.no_grad():
        out = model(ids)
    h.save(tmp_path / "s")
    h.detach()
    assert model.lm_head.weight.requires_grad  # ... and restored by detach
    h2 = load_attached(model, tmp_path / "s", tokenizer=byte_cache)
    with torch.no_grad():
        assert torch.equal(model(ids), out)
    h2.detach()


def test_precomputed_rows_match_device_hashing(byte_cache, ids):
    model = tiny_gpt()
    h = attach(model, random_table(5), byte_cache, layers=[1], value_init="orthogonal")
    with torch.no_grad():
        a = model(ids)
        h.set_rows(torch.from_numpy(byte_cache.ngram_rows(ids.numpy(), LAYOUT, 3)))
        b = model(ids)
    assert torch.equal(a, b)
    h.detach()


def test_inputs_embeds_without_ids_is_a_clear_error(byte_cache):
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2))
    h = attach(model, LAYOUT, byte_cache)
    with pytest.raises(PolymemError, match="without input_ids"):
        model(inputs_embeds=torch.zeros(1, 4, 32))
    h.detach()


@pytest.mark.parametrize("dtype", ["float32", "nf4"])
def test_asset_backed_site_matches_in_memory(byte_cache, ids, tmp_path, dtype):
    """A frozen site reading pages from an asset on every forward equals the in-memory table (NF4: the
    dequantised table), and an asset path works as table_or_asset."""
    from polymem import MemoryAsset
    from polymem.torch import AssetTable

    w = random_table(6).weight.detach().numpy()
    asset = MemoryAsset.from_array(tmp_path / "a.asset", w, HashSpec(), LAYOUT, orders=(1, 2, 3))
    if dtype == "nf4":
        asset, _ = asset.quantize(tmp_path / "q.asset", to="nf4")
    dense = asset.to_numpy()
    assert dtype == "float32" and np.array_equal(dense, w) or dtype == "nf4" and not np.array_equal(dense, w)
    model = tiny_gpt()
    h = attach(model, asset, byte_cache, layers=[1], in_memory=False, value_init="orthogonal")
    assert isinstance(h.table, AssetTable)
    with torch.no_grad():
        a = model(ids)
    h.detach()
    h = attach(model, TrainableTable(dense, spec=HashSpec(), layout=LAYOUT, trainable=False), byte_cache, layers=[1],
               value_init="orthogonal")
    with torch.no_grad():
        b = model(ids)
    h.detach()
    assert torch.equal(a, b)
    h = attach(model, str(asset.path), byte_cache, layers=[1], value_init="orthogonal")  # a path, in memory, frozen
    assert not h.table.trainable and h.table.source["kind"] == "asset"
    with torch.no_grad():
        assert torch.equal(model(ids), b)
    h.detach()
    with pytest.raises(PolymemError, match="needs the table in memory"):
        attach(model, AssetTable(asset), byte_cache, train="table")


def test_frozen_table_defaults_to_zero_projection(byte_cache, ids):
    """A frozen non-zero table starts behind W_V = 0: step 0 is the model without memory, and W_V gets a
    gradient at once (no deadlock, since the rows are not zero)."""
    model = tiny_gpt()
    with torch.no_grad():
        ref = model(ids)
    h = attach(model, random_table(7), byte_cache, layers=[1], freeze_model=False)
    site = h.sites["transformer/h/1"]
    assert site.cfg.value_init == "zero" and torch.count_nonzero(site.value.weight) == 0
    assert torch.equal(model(ids).detach(), ref)
    model(ids, ids).mean().backward()
    assert torch.count_nonzero(site.value.weight.grad) > 0
    h.detach()


def test_activation_checkpointing_and_bf16_models(byte_cache, ids):
    """Blocks re-run during backward (activation checkpointing) find the rows of their forward; a bf16 model
    works with fp32 sites and the context gate."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2)
    grads = []
    for ckpt in (False, True):
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg).train()
        if ckpt:
            if hasattr(model, "activation_checkpointing_enable"):  # transformers 5.x
                model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:  # transformers 4.x
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        h = attach(model, random_table(8), byte_cache, layers=[1], value_init="orthogonal")
        model(input_ids=ids, labels=ids).loss.backward()
        grads.append(h.sites["model/layers/1"].value.weight.grad.clone())
        h.detach()
    assert torch.allclose(grads[0], grads[1], atol=1e-6) and grads[0].abs().sum() > 0
    model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    h = attach(model, random_table(9), byte_cache, layers=[1], gate="context", conv=True, value_init="orthogonal")
    with torch.no_grad():
        out = model(input_ids=ids).logits
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    h.detach()
