"""A tiny Llama GGUF written with the gguf package: a 2-layer model of width 32 with its byte-level BPE tokenizer
in the file's metadata, matrices stored Q8_0 (so loading de-quantises them, as with a real GGUF). transformers loads
it like any other GGUF, in a second, so the model cache and the GGUF paths are tested without a real model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from conftest import sample_text

WIDTH, LAYERS, HEADS, KV_HEADS, FFN = 32, 2, 4, 2, 64


def _bpe(vocab_size: int) -> tuple[list[str], list[str]]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<bos>", "<eos>"], show_progress=False)
    tok.train_from_iterator([sample_text()], trainer=trainer)
    spec = json.loads(tok.to_str())
    tokens = [""] * len(spec["model"]["vocab"])
    for t, i in spec["model"]["vocab"].items():
        tokens[i] = t
    merges = [" ".join(m) if isinstance(m, list) else m for m in spec["model"]["merges"]]
    return tokens, merges


def write_tiny_gguf(path: Path, *, seed: int = 0, vocab_size: int = 320) -> Path:
    """Write the tiny model to ``path`` (weights drawn from ``seed``) and return it."""
    import gguf

    tokens, merges = _bpe(vocab_size)
    n, head_dim = len(tokens), WIDTH // HEADS
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_context_length(256)
    w.add_embedding_length(WIDTH)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(head_dim)
    w.add_vocab_size(n)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3, 3] + [1] * (n - 2))
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    rng = np.random.default_rng(seed)

    def matrix(name: str, rows: int, cols: int) -> None:
        a = (rng.standard_normal((rows, cols)) * 0.1).astype(np.float32)
        q = gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0)
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)

    matrix("token_embd.weight", n, WIDTH)
    w.add_tensor("output_norm.weight", np.ones(WIDTH, np.float32))
    for i in range(LAYERS):
        w.add_tensor(f"blk.{i}.attn_norm.weight", (1 + 0.1 * rng.standard_normal(WIDTH)).astype(np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(WIDTH, np.float32))
        matrix(f"blk.{i}.attn_q.weight", WIDTH, WIDTH)
        matrix(f"blk.{i}.attn_k.weight", KV_HEADS * head_dim, WIDTH)
        matrix(f"blk.{i}.attn_v.weight", KV_HEADS * head_dim, WIDTH)
        matrix(f"blk.{i}.attn_output.weight", WIDTH, WIDTH)
        matrix(f"blk.{i}.ffn_gate.weight", FFN, WIDTH)
        matrix(f"blk.{i}.ffn_up.weight", FFN, WIDTH)
        matrix(f"blk.{i}.ffn_down.weight", WIDTH, FFN)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
