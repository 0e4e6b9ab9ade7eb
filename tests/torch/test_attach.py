"""attach() against the wrong tokenizer and stacked attach/detach in any order."""

from __future__ import annotations

import itertools

import pytest
import torch

from polymem import HashSpec, Layout, PolymemError, TokenHashes
from polymem.samples import sample_text
from polymem.torch import attach

torch.set_num_threads(1)
LAYOUT = Layout(pages=16, heads=2, slots=2, head_dim=8)


def tiny_llama(vocab: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)).eval()


# ---------------------------------------------------------------------------------------------- vocabularies
def test_a_much_smaller_tokenizer_is_refused_up_front() -> None:
    model = tiny_llama(32_000)
    with pytest.raises(PolymemError) as e:
        attach(model, LAYOUT, "bytes")
    msg = str(e.value)
    assert "tokenizer 'bytes' has 256 ids but LlamaForCausalLM has a vocabulary of 32,000" in msg
    assert "not the tokenizer this model was trained with" in msg and "pass the model's own tokenizer" in msg
    assert "allow_vocab_padding=True" in msg  # the way out when the embedding really is that padded
    h = attach(model, LAYOUT, "bytes", allow_vocab_padding=True)
    assert "31,744 ids (256..31999) never hit memory" in " ".join(h.report.notes)
    h.detach()


def test_a_larger_tokenizer_is_refused_before_the_forward_would_index_out_of_range(cl100k) -> None:
    model = tiny_llama(32_000)
    ids = torch.from_numpy(cl100k.encode(sample_text()[:400]))[None]  # [1, T]
    assert int(ids.max()) >= 32_000
    with pytest.raises(IndexError):  # what the user would meet in the forward without the check
        model(input_ids=ids)
    with pytest.raises(PolymemError) as e:
        attach(model, LAYOUT, cl100k, allow_vocab_padding=True)  # no override for this direction
    msg = str(e.value)
    assert f"tokenizer {cl100k.name!r} has {cl100k.vocab_size:,} ids but LlamaForCausalLM has a vocabulary of 32,000" in msg
    assert "ids 32000.." in msg and "IndexError" in msg and "pass the model's own tokenizer" in msg
    # the same check when a prebuilt TokenHashes stands for the tokenizer
    with pytest.raises(PolymemError, match="has a vocabulary of 32,000"):
        attach(model, LAYOUT, TokenHashes.build("bytes", HashSpec()))


@pytest.mark.parametrize("vocab", [32_000, 32_064])  # exact, and padded to a multiple of 64 (common)
def test_the_right_tokenizer_and_a_slightly_padded_model_work(mistral_v1, vocab: int) -> None:
    model = tiny_llama(vocab)
    ids = torch.from_numpy(mistral_v1.encode(sample_text()[:400]))[None]  # [1, T]
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    h = attach(model, LAYOUT, mistral_v1, layers=[1])
    notes = " ".join(h.report.notes)
    assert ("64 ids (32000..32063) never hit memory" in notes) == (vocab == 32_064)
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, ref)  # zero table: the model as before
    h.detach()


# ---------------------------------------------------------------------------------------- detach in any order
@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
@pytest.mark.parametrize("freezes", [(None, None, None), (None, False, None), (False, None, None)])
def test_stacked_attaches_restore_the_flags_in_any_detach_order(order, freezes) -> None:
    model = tiny_llama(300)
    model.model.embed_tokens.weight.requires_grad_(False)  # one flag the user set: must survive too
    before = {n: p.requires_grad for n, p in model.named_parameters()}
    handles = [attach(model, LAYOUT, "bytes", layers=[i % 2], freeze_model=f) for i, f in enumerate(freezes)]
    any_freeze = any(f is not False for f in freezes)
    assert all(not p.requires_grad for p in model.parameters()) == any_freeze
    for k, i in enumerate(order):
        handles[i].detach()
        live = [freezes[j] for j in order[k + 1:]]
        still_frozen = any(f is not False for f in live)
        now = {n: p.requires_grad for n, p in model.named_parameters()}
        assert now == {n: (v and not still_frozen) for n, v in before.items()}, (order, k)
    handles[order[0]].detach()  # detaching twice changes nothing
    assert {n: p.requires_grad for n, p in model.named_parameters()} == before
