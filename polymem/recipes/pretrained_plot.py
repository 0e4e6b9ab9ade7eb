"""The picture of a pretrained-recipient transfer run (``polymem transfer --model --plot``): learning curves of
every arm in domain and the final bits per byte per arm and scoring set.

Not here: the run itself (:mod:`.pretrained`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


COLORS = {"none": "#7f7f7f", "random": "#bcbd22", "null": "#ff7f0e", "donor": "#1f77b4",
          "donor_finetune": "#d62728", "in_place": "#2ca02c", "stitch": "#9467bd"}


def plot_result(result: dict[str, Any], path: str | Path) -> Path:
    """Left: in-domain learning curves (mean over seeds, min–max band). Right: final bpb per arm and scoring set."""
    from polymem._optional import pyplot, save_figure

    plt = pyplot("transfer --plot")
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2))
    base = result["base_bpb"][result["in_domain"]]
    for arm, c in result["curves"].items():  # curves start at 0 recipient tokens (older results: the model alone)
        pre = [] if c["tokens"] and c["tokens"][0] == 0 else [0]
        t = np.asarray(pre + list(c["tokens"]), dtype=float) / 1e3
        y = np.asarray([[base] * len(pre) + list(b) for b in c["bpb"]], dtype=float)
        ax.plot(t, y.mean(0), marker="o", ms=3, color=COLORS.get(arm), label=arm)
        if y.shape[0] > 1:
            ax.fill_between(t, y.min(0), y.max(0), color=COLORS.get(arm), alpha=0.15, lw=0)
    ax.set_xlabel("recipient training tokens (thousands)")
    ax.set_ylabel(f"held-out bits per byte, {result['in_domain']} (lower is better)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    sets = list(result["base_bpb"])
    arms = list(result["arms"])
    w = 0.8 / max(len(arms), 1)
    for i, arm in enumerate(arms):
        for j, k in enumerate(sets):
            v = result["arms"][arm]["bpb"][k]
            x = j + (i - (len(arms) - 1) / 2) * w
            bx.bar(x, float(np.mean(v)), w, color=COLORS.get(arm), label=arm if j == 0 else None)
            bx.scatter([x] * len(v), v, color="k", s=6, zorder=3)
    bx.set_xticks(range(len(sets)), sets)
    lo = min(min(min(v) for v in a["bpb"].values()) for a in result["arms"].values())
    hi = max(max(max(v) for v in a["bpb"].values()) for a in result["arms"].values())
    bx.set_ylim(lo - 0.15 * (hi - lo + 1e-3), hi + 0.1 * (hi - lo + 1e-3))
    bx.set_ylabel("held-out bits per byte at the end (dots: seeds)")
    fig.suptitle(f"{result['donor_model']} table -> {result['recipient_model']} (frozen backbone), seeds {result['seeds']}",
                 fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)
