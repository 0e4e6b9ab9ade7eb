"""A small nanoGPT-style causal LM for training donor tables and running transfer experiments on a CPU.

The model reads *tokenizer* ids (so that :func:`polymem.attach` can hash them like for any HF model) and maps
them to a compact vocabulary — the ids present in the corpus — before the embedding; the softmax runs over
that compact vocabulary only (the speed trick: cl100k_base has 100k ids, a 2 MB corpus uses ~20k).
Blocks live in ``model.transformer.h`` (GPT-2's names), so ``attach(..., layers=[1])`` puts a memory site
before block 1 exactly as on a Hugging Face GPT-2.

Not here: memory sites (:mod:`polymem.torch.site`), training loops (:mod:`polymem.recipes.train`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True, kw_only=True)
class GPTConfig:
    vocab_size: int  # tokenizer vocabulary (ids the model accepts)
    n_used: int  # compact vocabulary: ids present in the corpus (embedding rows, softmax classes)
    block_size: int = 256  # context length
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 256
    mlp_ratio: int = 4


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.n_head = cfg.n_head
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d, bias=False)
        self.c_proj = nn.Linear(d, d, bias=False)
        self.ln_2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, cfg.mlp_ratio * d, bias=False)
        self.proj = nn.Linear(cfg.mlp_ratio * d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)  # 3 x [B, T, C]
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # [B, nh, T, hs]
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, nh, T, hs]
        x = x + self.c_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.proj(F.gelu(self.fc(self.ln_2(x))))


class GPT(nn.Module):
    remap: torch.Tensor  # buffers: tokenizer id -> compact id, and the compact vocabulary's tokenizer ids
    used_ids: torch.Tensor

    def __init__(self, cfg: GPTConfig, used_ids: torch.Tensor) -> None:
        """``used_ids``: long [n_used], the sorted tokenizer ids of the compact vocabulary."""
        super().__init__()
        self.config = cfg
        if used_ids.numel() != cfg.n_used:
            raise ValueError(f"used_ids has {used_ids.numel()} ids, config says n_used={cfg.n_used}")
        remap = torch.zeros(cfg.vocab_size, dtype=torch.long)  # tokenizer id -> compact id (0 if unused)
        remap[used_ids] = torch.arange(cfg.n_used)
        self.register_buffer("remap", remap, persistent=False)
        self.register_buffer("used_ids", used_ids.clone(), persistent=False)
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(cfg.n_used, cfg.d_model),
            wpe=nn.Embedding(cfg.block_size, cfg.d_model),
            h=nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)]),
            ln_f=nn.LayerNorm(cfg.d_model),
        ))
        self.lm_head = nn.Linear(cfg.d_model, cfg.n_used, bias=False)
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2's scaled init of residual projections
            if name.endswith("c_proj.weight") or name.endswith(".proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)

    def forward(self, input_ids: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids long [B, T] (tokenizer ids) -> logits [B, T, n_used]; with ``targets`` (tokenizer ids,
        [B, T]) -> per-token cross-entropy [B, T] in nats (fp32)."""
        B, T = input_ids.size()
        pos = torch.arange(T, device=input_ids.device)
        tr = self.transformer
        x = tr["wte"](self.remap[input_ids]) + tr["wpe"](pos)  # [B, T, C]
        for block in cast(nn.ModuleList, tr["h"]):
            x = block(x)
        logits = self.lm_head(tr["ln_f"](x))  # [B, T, n_used]
        if targets is None:
            return logits
        return F.cross_entropy(
            logits.float().view(B * T, -1), self.remap[targets].view(B * T), reduction="none"
        ).view(B, T)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
