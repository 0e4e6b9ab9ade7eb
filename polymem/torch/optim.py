"""Sparse row-wise optimizer for memory tables (the PageGram report's row-wise RMS rule).

Each row keeps one scalar: a moving average of the mean squared gradient of that row (β2 = 0.95), bias-
corrected by the number of times *that row* was updated. A step moves only the rows that got a gradient:
``w[i] -= lr · g[i] / (sqrt(v̂[i]) + eps)``. Rows not read in a batch, or read with an all-zero gradient, are untouched — no decay, no momentum
drift — so a frozen or rarely read row never changes by accident. State: 2 numbers per row (fp32 + int32).

Not here: dense parameters (use AdamW), learning-rate schedules (set ``group["lr"]`` as usual).
"""

from __future__ import annotations

import torch


class SparseRowRMS(torch.optim.Optimizer):
    def __init__(self, params, lr: float = 0.1, beta2: float = 0.95, eps: float = 1e-8) -> None:
        if lr <= 0 or not 0.0 <= beta2 < 1.0:
            raise ValueError(f"lr={lr} must be > 0 and beta2={beta2} in [0, 1)")
        super().__init__(params, dict(lr=lr, beta2=beta2, eps=eps))

    @torch.no_grad()
    def step(self, closure=None):  # noqa: D102
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            lr, b2, eps = group["lr"], group["beta2"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                if g.is_sparse:
                    g = g.coalesce()
                    idx, vals = g.indices()[0], g.values()  # [m], [m, r]
                    live = vals.abs().sum(dim=1) > 0  # rows read with an all-zero gradient (e.g. W_V still 0) are
                    idx, vals = idx[live], vals[live]  # not updated, as in the dense path: their count stays
                else:  # dense gradient: the rows with any non-zero entry
                    idx = g.abs().sum(dim=1).nonzero().squeeze(1)
                    vals = g.index_select(0, idx)
                if idx.numel() == 0:
                    continue
                st = self.state[p]
                if not st:
                    st["v"] = torch.zeros(p.shape[0], dtype=torch.float32, device=p.device)  # [R]
                    st["n"] = torch.zeros(p.shape[0], dtype=torch.int32, device=p.device)  # [R] updates per row
                vals = vals.float()
                v = st["v"].index_select(0, idx) * b2 + (1 - b2) * vals.pow(2).mean(dim=1)  # [m]
                n = st["n"].index_select(0, idx) + 1  # [m]
                st["v"].index_copy_(0, idx, v)
                st["n"].index_copy_(0, idx, n)
                vhat = v / (1 - b2 ** n.float())  # [m]
                p.index_add_(0, idx, (-lr * vals / (vhat.sqrt() + eps).unsqueeze(1)).to(p.dtype))
        return loss
