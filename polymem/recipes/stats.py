"""Paired comparisons of two arms a reader can trust: bootstrap intervals over documents, and plain verdicts.

Every arm of a transfer run is scored on the same documents, so two arms compare *paired*: per seed, the
difference of their bits per byte, with a 95 % interval from resampling the documents (the same resample for
both arms; bits per byte of a resample is its summed bits over its summed bytes). A verdict is given only where
every seed's interval excludes zero on the same side; otherwise the comparison is "within noise".

Not here: the runs (:mod:`polymem.recipes.pretrained`), printing (``polymem transfer``).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from polymem.errors import PolymemError


def paired_bootstrap(bits_a: Sequence[Sequence[float]], bits_b: Sequence[Sequence[float]], nbytes: Sequence[int], *,
                     resamples: int = 2000, seed: int = 0) -> dict[str, Any]:
    """``a`` minus ``b`` in bits per byte, per seed, with a 95 % bootstrap interval over documents.

    bits_a, bits_b: [seeds, documents] bits each arm spent on each document; nbytes: [documents] (the same
    documents for both). Returns ``{"diff": [per seed], "lo": [...], "hi": [...], "mean": float,
    "verdict": "a_lower" | "a_higher" | "within_noise"}`` (a_lower: every seed's interval is below zero)."""
    a, b = np.asarray(bits_a, dtype=np.float64), np.asarray(bits_b, dtype=np.float64)
    w = np.asarray(nbytes, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 2 or a.shape[1] != w.size or w.size == 0:
        raise PolymemError(f"paired_bootstrap needs [seeds, documents] bits of one shape and bytes per document; got "
                           f"{a.shape}, {b.shape} and {w.shape}")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, w.size, size=(int(resamples), w.size))  # the same resamples for every seed
    wb = w[idx].sum(1)  # [R]
    diff = (a - b).sum(1) / w.sum()  # [S]
    boot = (a - b)[:, idx].sum(-1) / wb  # [S, R]
    lo, hi = np.percentile(boot, 2.5, axis=1), np.percentile(boot, 97.5, axis=1)
    if np.all(hi < 0):
        verdict = "a_lower"
    elif np.all(lo > 0):
        verdict = "a_higher"
    else:
        verdict = "within_noise"
    return {"diff": diff.tolist(), "lo": lo.tolist(), "hi": hi.tolist(), "mean": float(diff.mean()),
            "verdict": verdict, "resamples": int(resamples), "documents": int(w.size)}


def tokens_to_match(curve_tokens: Sequence[int], curve_bpb: Sequence[float], target: float) -> float | None:
    """The recipient tokens a run needs to reach ``target`` bits per byte on its (mean) learning curve, linear
    between curve points; None when the curve never gets there."""
    t = np.asarray(curve_tokens, dtype=np.float64)
    y = np.asarray(curve_bpb, dtype=np.float64)
    if t.size == 0 or t.shape != y.shape:
        raise PolymemError(f"a curve needs as many token counts as scores (got {t.shape} and {y.shape})")
    if y[0] <= target:
        return float(t[0])
    for i in range(1, t.size):
        if y[i] <= target:
            f = (y[i - 1] - target) / max(y[i - 1] - y[i], 1e-300)
            return float(t[i - 1] + f * (t[i] - t[i - 1]))
    return None


def content_bootstrap(read: tuple[Sequence[Sequence[float]], Sequence[float]],
                      unseen: tuple[Sequence[Sequence[float]], Sequence[float]], *, resamples: int = 2000,
                      seed: int = 0) -> dict[str, Any]:
    """The content-specific part of a memory's gain, with a 95 % bootstrap interval over documents, per seed.

    ``read`` and ``unseen``: (bits [seeds, documents] with the memory, bits [documents] of the model alone) on
    documents the memory's training read and on documents nobody read. The change on a set is relative:
    ``(bits - bits alone) / bits alone`` summed over its documents (the bytes are the same for both, so bits
    per byte's ratio is the bits' ratio); the content part is the change on ``read`` minus the change on
    ``unseen`` (negative: the memory knows what it read). Each resample draws the documents of each set anew
    (the sets hold different documents), the same draws for every seed. Returns ``{"read": [per seed],
    "unseen": [...], "diff": [...], "lo": [...], "hi": [...], "mean": float}``.

    By hand: read bits [[9, 9]] against [10, 10] (−10 %), unseen [[10, 8]] against [10, 10] (−10 %): content 0."""
    def change(bits: Any, alone: Any, idx: np.ndarray | None) -> np.ndarray:
        a, b = np.asarray(bits, dtype=np.float64), np.asarray(alone, dtype=np.float64)
        if a.ndim != 2 or a.shape[1] != b.size or b.size == 0:
            raise PolymemError(f"content_bootstrap needs bits [seeds, documents] and [documents] alone; got {a.shape} "
                               f"and {b.shape}")
        if idx is None:
            return (a.sum(1) - b.sum()) / b.sum()  # [S]
        return (a[:, idx].sum(-1) - b[idx].sum(-1)) / b[idx].sum(-1)  # [S, R]

    rng = np.random.default_rng(seed)
    nr, nu = len(read[1]), len(unseen[1])
    ir = rng.integers(0, nr, size=(int(resamples), nr))
    iu = rng.integers(0, nu, size=(int(resamples), nu))
    r, u = change(*read, None), change(*unseen, None)
    boot = change(*read, ir) - change(*unseen, iu)  # [S, R]
    return {"read": r.tolist(), "unseen": u.tolist(), "diff": (r - u).tolist(),
            "lo": np.percentile(boot, 2.5, axis=1).tolist(), "hi": np.percentile(boot, 97.5, axis=1).tolist(),
            "mean": float((r - u).mean()), "resamples": int(resamples), "documents": {"read": nr, "unseen": nu}}
