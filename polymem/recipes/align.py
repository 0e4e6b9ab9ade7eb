"""A linear map between two models' hidden states, for starting a recipient's projection from a donor's.

A donor site adds ``g · W_D e`` to the donor model's residual stream (e: the gathered rows). A recipient with
another tokenizer reads the same rows (byte-addressed), but its residual stream is another space. If the two
streams are related by ``h_R ≈ A h_D + b`` at the site layers, the donor's contribution carried over is
``A g W_D e``: the ``aligned`` initialisation sets the recipient's projection to ``A W_D · g / g_R`` (``g_R``:
the recipient gate's start), so the donor's rows help from step 0 instead of waiting for a projection learnt
from zero.

``A`` is fit in closed form (ridge least squares on centred states) on positions of a shared text where both
tokenizations end on the same byte: there both models have read exactly the same bytes. Documents are split
80/20 into fit and held-out positions; the held-out R² (share of the recipient states' variance the map
explains) says how far the map can be trusted. Nothing here trains or changes either model.

Not here: the site (:mod:`polymem.torch.site`), the arms that use it (:mod:`polymem.recipes.pretrained`).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from polymem.errors import PolymemError


def _block_inputs(lm: Any, layer: int, ids: np.ndarray) -> np.ndarray:
    """The input of block ``layer`` (the residual stream a site there sees) at every position of one sequence
    ``[BOS] + ids``: float64 [len(ids), d], row p = the state after reading ids[:p + 1]."""
    from polymem.torch.modelinfo import find_blocks

    _, blocks = find_blocks(lm.model)
    if not -len(blocks) <= layer < len(blocks):
        raise PolymemError(f"layer {layer} is out of range: {lm.name} has blocks 0..{len(blocks) - 1}")
    got: list[torch.Tensor] = []

    def hook(module: Any, args: Any, kwargs: Any) -> None:
        h = args[0] if args else kwargs["hidden_states"]
        got.append(h.detach())

    x = ids if lm.bos_id is None else np.concatenate([[lm.bos_id], ids])
    dev = next(lm.model.parameters()).device
    hk = blocks[layer].register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            lm.model(input_ids=torch.as_tensor(x[None, :], dtype=torch.long, device=dev))
    finally:
        hk.remove()
    h = got[0][0].double().cpu().numpy()
    return h[1:] if lm.bos_id is not None else h


def _ends(lm: Any, text: str, max_tokens: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(ids, byte offset where each token ends) of ``text`` cut to ``max_tokens``; None when the tokenizer's
    bytes do not add up to the text's (a lossy tokenizer: its positions cannot be paired by bytes)."""
    from polymem.models.evaluate import token_byte_lengths

    if not hasattr(lm, "_align_lengths"):
        lm._align_lengths = token_byte_lengths(lm.tokenizer)
    ids = np.asarray(lm.tokenizer.encode(text), dtype=np.int64)
    ends = np.cumsum(lm._align_lengths[ids])
    if ids.size == 0 or ends[-1] != len(text.encode("utf-8")):
        return None
    return ids[:max_tokens], ends[:max_tokens]


def paired_states(donor: Any, recipient: Any, texts: Sequence[str], *, donor_layer: int, recipient_layer: int,
                  max_positions: int = 6144, max_tokens: int = 512) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(donor states [M, d_D], recipient states [M, d_R], document index [M]) at the positions of ``texts``
    where both tokenizations end on the same byte (at most ``max_positions``; each text read up to
    ``max_tokens`` tokens of either model)."""
    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    doc: list[np.ndarray] = []
    n = 0
    for i, t in enumerate(texts):
        a, b = _ends(donor, t, max_tokens), _ends(recipient, t, max_tokens)
        if a is None or b is None:
            continue
        common, ia, ib = np.intersect1d(a[1], b[1], return_indices=True)
        if common.size == 0:
            continue
        hd = _block_inputs(donor, donor_layer, a[0])[ia]
        hr = _block_inputs(recipient, recipient_layer, b[0])[ib]
        keep = min(common.size, max_positions - n)
        xs.append(hd[:keep])
        ys.append(hr[:keep])
        doc.append(np.full(keep, i))
        n += keep
        if n >= max_positions:
            break
    if n < 64:
        raise PolymemError(f"only {n} positions of the shared text end on the same byte in both tokenizations "
                           f"({donor.name}, {recipient.name}); an alignment needs at least 64: pass more text")
    return np.concatenate(xs), np.concatenate(ys), np.concatenate(doc)


def fit_ridge(x: np.ndarray, y: np.ndarray, *, ridge: float = 1e-2) -> tuple[np.ndarray, np.ndarray]:
    """(A [d_y, d_x], b [d_y]) minimising ``|y - x A^T - b|² + λ|A|²`` with ``λ = ridge · trace(XᵀX) / d_x``
    on centred ``x`` (scale-free: the same ``ridge`` works for any hidden-state scale)."""
    mx, my = x.mean(0), y.mean(0)
    xc, yc = x - mx, y - my
    g = xc.T @ xc
    lam = ridge * float(np.trace(g)) / max(g.shape[0], 1)
    a = np.linalg.solve(g + lam * np.eye(g.shape[0]), xc.T @ yc).T  # [d_y, d_x]
    return a, my - mx @ a.T


def r2(x: np.ndarray, y: np.ndarray, a: np.ndarray, b: np.ndarray) -> float:
    """Share of ``y``'s variance (summed over dimensions) that ``x A^T + b`` explains."""
    res = y - (x @ a.T + b)
    tot = y - y.mean(0)
    return float(1.0 - (res ** 2).sum() / max(float((tot ** 2).sum()), 1e-300))


def fit_alignment(donor: Any, recipient: Any, texts: Sequence[str], *, donor_layer: int, recipient_layer: int,
                  max_positions: int = 6144, ridge: float = 1e-2) -> dict[str, Any]:
    """Fit ``h_R ≈ A h_D + b`` (see the module docstring). Returns ``{"A": float32 [d_R, d_D], "r2_heldout",
    "r2_fit", "positions", "documents", "ridge"}``; held-out R² on the last fifth of the documents used, then
    ``A`` refit on all of them."""
    x, y, doc = paired_states(donor, recipient, texts, donor_layer=donor_layer, recipient_layer=recipient_layer,
                              max_positions=max_positions)
    docs = np.unique(doc)
    held = np.isin(doc, docs[int(np.ceil(0.8 * docs.size)):]) if docs.size >= 2 else np.arange(doc.size) % 5 == 4
    a, b = fit_ridge(x[~held], y[~held], ridge=ridge)
    r2_held = r2(x[held], y[held], a, b)
    a, b = fit_ridge(x, y, ridge=ridge)
    return {"A": a.astype(np.float32), "b": b.astype(np.float32), "r2_heldout": r2_held, "r2_fit": r2(x, y, a, b),
            "positions": int(x.shape[0]), "heldout_positions": int(held.sum()), "documents": int(docs.size),
            "ridge": float(ridge), "donor_layer": int(donor_layer), "recipient_layer": int(recipient_layer)}


def aligned_projection(donor_value: torch.Tensor, donor_gate: float, a: np.ndarray, recipient_gate: float) -> torch.Tensor:
    """The recipient's W_V [d_R, D] = A · W_D [d_D, D] · g_D / g_R (see the module docstring)."""
    if recipient_gate == 0:
        raise PolymemError("the recipient's gate starts at 0; an aligned projection needs a non-zero gate_init")
    w = torch.as_tensor(a, dtype=torch.float32) @ donor_value.float()
    return w * (float(donor_gate) / float(recipient_gate))
