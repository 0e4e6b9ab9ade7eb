"""A memory site: the maths that adds a hashed n-gram memory to a residual stream.

A site, before block i::

    rows  = layout(hash(n-grams ending at t))          # [B, T, N, K]   on the model's device, from token ids
    e_t   = concat_{n, k} table[rows]                   # [B, T, N·K·r]  (1-grams scaled by 0.1, as in the paper)
    v_t   = W_V e_t                                     # [B, T, d]
    y_t   = g · v_t             (gate="scalar", PageGram, g init 0.5)
          | α_t · v_t           (gate="context", Engram: α = σ(ssqrt(RMSNorm(h)·RMSNorm(W_K e)/√d)))
          | α_t · v_t           (gate="count": the context gate over rows scaled by what the table knows:
                                 e_{t,n} ← e_{t,n} · q/(q + τ_n), q = log(1 + min_k count[row_{t,n,k}]), τ_n > 0 learnt)
    y_t  += SiLU(conv(RMSNorm(y)))                      (conv=True: depthwise causal, kernel 4, dilation N, zero init)
    h_t  += y_t

With an all-zero table every site adds exactly 0, so the model computes what it computed without memory.

Not here: hooking sites into a model (:mod:`.attach`), saving them (:mod:`.sitefile`), the table storage
(:mod:`.tables`), the hash (:mod:`.hash`), training loops (:mod:`polymem.recipes.train`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from polymem.errors import PolymemError
from polymem.hash.layout import Layout
from polymem.hash.spec import check_max_n

GATES = ("scalar", "context", "count")
VALUE_INITS = ("orthogonal", "zero", "aligned")


@dataclass(frozen=True, kw_only=True)
class SiteConfig:
    d_model: int  # width of the residual stream
    max_n: int = 3  # n-gram orders 1..max_n are read (the Tokenizer-Agnostic Engram paper's recipient used 7)
    gate: str = "scalar"  # "scalar" (PageGram, init gate_init) | "context" (Engram) | "count" (context + row counts)
    gate_init: float = 0.5  # scalar gate start; 0 would deadlock learning (zero table, zero gate)
    conv: bool = False  # Engram's depthwise causal conv (kernel 4, dilation max_n), zero-initialised
    conv_kernel: int = 4
    one_gram_scale: float = 0.1  # 1-gram rows scaled by 0.1 (Tokenizer-Agnostic Engram Module)
    init_seed: int = 0  # the site's own RNG: W_V init never touches the global RNG (arms stay identical)
    value_init: str = "orthogonal"  # W_V init: "orthogonal" (gain sqrt(2d/D), for a zero table that must learn)
    # or "zero" (for a frozen non-zero table: step 0 is the model without memory, W_V still gets gradients);
    # "aligned" is "zero" here and then set from a donor's site (polymem.recipes.align)

    def __post_init__(self) -> None:
        if self.gate not in GATES:
            raise PolymemError(f"gate {self.gate!r} is unknown; accepted: {', '.join(GATES)}")
        if self.value_init not in VALUE_INITS:
            raise PolymemError(f"value_init {self.value_init!r} is unknown; accepted: {', '.join(VALUE_INITS)}")
        check_max_n(self.max_n)


class MemorySite(nn.Module):
    """Projection, gate and optional conv of one site. ``forward(h, e)`` with e the gathered rows."""

    order_scale: torch.Tensor  # a buffer [N]: per-order scale of the gathered rows

    def __init__(self, cfg: SiteConfig, layout: Layout) -> None:
        super().__init__()
        self.cfg = cfg
        N, K, r, d = cfg.max_n, layout.heads, layout.head_dim, cfg.d_model
        D = N * K * r  # concatenated width
        g = torch.Generator().manual_seed(cfg.init_seed)
        self.value = nn.Linear(D, d, bias=False)  # W_V
        with torch.no_grad():  # PageGram: orthogonal W_V, gain sqrt(2d / D)
            nn.init.orthogonal_(self.value.weight, gain=math.sqrt(2 * d / D), generator=g)
            if cfg.value_init in ("zero", "aligned"):
                self.value.weight.zero_()
        scale = torch.ones(N)
        scale[0] = cfg.one_gram_scale
        self.register_buffer("order_scale", scale, persistent=False)  # [N]
        if cfg.gate == "scalar":
            self.gate = nn.Parameter(torch.tensor(float(cfg.gate_init)))
        else:
            if cfg.gate == "count":  # τ_n = softplus(θ_n), starting at 1: a row read once counts for ~40 %
                self.count_theta = nn.Parameter(torch.full((N,), math.log(math.e - 1.0)))
            self.key = nn.Linear(D, d, bias=False)  # W_K
            with torch.no_grad():
                nn.init.orthogonal_(self.key.weight, gain=math.sqrt(2 * d / D), generator=g)
            self.norm_h = nn.RMSNorm(d, eps=1e-6)
            self.norm_k = nn.RMSNorm(d, eps=1e-6)
        if cfg.conv:
            self.conv_norm = nn.RMSNorm(d, eps=1e-6)
            self.conv = nn.Conv1d(d, d, cfg.conv_kernel, groups=d, dilation=cfg.max_n, bias=False)
            nn.init.zeros_(self.conv.weight)

    def forward(self, h: torch.Tensor, e: torch.Tensor, counts: torch.Tensor | None = None) -> torch.Tensor:
        """h [B, T, d] hidden states; e fp32 [B, T, N, K, r] gathered rows -> h + y, same dtype as h.
        ``counts`` [B, T, N, K]: the rows' training counts (gate="count"; None: every row fully trusted)."""
        B, T, N, K, r = e.shape
        if self.cfg.gate == "count" and counts is not None:
            q = torch.log1p(counts.to(e.dtype).amin(-1))  # [B, T, N]: a count-min estimate of the n-gram's count
            tau = F.softplus(self.count_theta).to(e.dtype)  # [N]
            e = e * (q / (q + tau)).unsqueeze(-1).unsqueeze(-1)
        e = (e * self.order_scale.view(1, 1, N, 1, 1)).reshape(B, T, N * K * r)  # [B, T, D]
        dev = e.device.type
        e = e.to(torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else self.value.weight.dtype)
        v = self.value(e)  # [B, T, d]
        if self.cfg.gate == "scalar":
            y = self.gate * v
        else:
            k = self.key(e)  # [B, T, d]
            # the gate's norms in fp32 whatever the stream's dtype (bf16 under autocast); v keeps its own dtype
            a = (self.norm_h(h.float()) * self.norm_k(k.float())).sum(-1, keepdim=True) / math.sqrt(h.shape[-1])  # [B, T, 1]
            a = torch.sign(a) * a.abs().clamp_min(1e-6).sqrt()
            y = torch.sigmoid(a).to(v.dtype) * v
        if self.cfg.conv:
            pad = (self.cfg.conv_kernel - 1) * self.cfg.max_n
            z = F.pad(self.conv_norm(y).transpose(1, 2), (pad, 0))  # [B, d, pad + T], causal
            y = y + F.silu(self.conv(z).transpose(1, 2))  # [B, T, d]
        return h + y.to(h.dtype)


# ---------------------------------------------------------------------------------------------- attach
