"""Rows that describe what follows them: a byte decoder trained with the donor's table, read by a recipient.

**Donor side** (:class:`polymem.torch.bytehead.DonorBytes`). While the donor's table and site train on a frozen backbone
(:func:`polymem.recipes.frozen.train_table` with ``byte_head=J``), an auxiliary loss trains a byte decoder
(:class:`polymem.torch.bytehead.ByteHead`) jointly with the rows: for each position t and order n whose n-gram
has a row, the gathered row e_{t,n} predicts the J bytes that follow the n-gram's end in the text. The loss,
times ``byte_weight``, is added to the model's next-token loss; the rows get both gradients. The decoder is
saved beside the site (``bytes.safetensors``, named in ``site.json``).

**Recipient side** (:func:`run_next_bytes`, the arms ``next_bytes`` and ``next_bytes_fit`` of the content study).
The donor's table and the decoder are frozen. At each recipient position t the rows of the n-grams ending at t
are decoded into log p_{n,j}(b) − log q_{n,j}(b) (q: the decoder's prior, what it says of an unwritten row),
and every vocabulary token v with bytes b_1..b_L is scored::

    s_v(t) = Σ_n w_n Σ_{j ≤ min(L, J)} [log p_{t,n,j}(b_j) − log q_{n,j}(b_j)]     (special tokens: 0)

which is added to the recipient's next-token logits. Only the N scalars w_n train (from 0, so step 0 is the model
alone), on the recipient's part with its next-token loss, with the other arms' steps, batches, windows and
schedule; their learning rate is :data:`W_LR` (a few scalars need larger steps than a projection to move within
the budget). The hash is over bytes, so where the recipient's last n tokens spell the bytes of an n-gram the
donor read, it reads what the donor's rows say follows them. ``next_bytes_fit`` is the ablation that needs no
donor change: the same arm with a decoder fitted on the recipient's part (its rows → its text's next bytes,
:data:`FIT_STEPS` steps) instead of the donor's. ``next_bytes_conf`` weighs each row by the decoder's confidence
too: order n's weight at t is w_n + u_n·c_{t,n}, c_{t,n} the mean over j of the row's top byte probability
(u_n from 0 as well), so that a weighting learnt on text the donor never read can still trust the rows that say
sharply what follows them. ``next_bytes_mix`` interpolates probabilities instead of adding scores
(:meth:`polymem.torch.bytesite.ByteBias.mixed`): a wrong memory then costs at most log(1 − Σλ).

This is the kNN-LM / n-gram-interpolation idea ("Generalization through Memorization: Nearest Neighbor
Language Models"; "Infini-gram: Scaling Unbounded n-gram Language Models to a Trillion Tokens") with the
memory's next-token distribution spelled in bytes, so that it does not depend on the donor's tokenizer.

Not here: the decoder itself and its file (:mod:`polymem.torch.bytehead`), the other arms
(:mod:`polymem.recipes.pretrained`), the content study (:mod:`polymem.recipes.content`).
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any, Callable, Sequence

import numpy as np
import torch

from polymem.errors import PolymemError
from polymem.torch.bytehead import FIT_BATCH, ByteHead, fit_decoder, next_byte_targets, rows_and_targets
from polymem.torch.bytesite import ByteBias

NEXT_BYTES_ARMS = ("next_bytes", "next_bytes_fit", "next_bytes_conf", "next_bytes_mix")
W_LR = 0.05  # AdamW on the N order weights w_n
FIT_STEPS = 200  # next_bytes_fit: steps of the decoder's fit on the recipient's part
FIT_LR = 3e-3


def _docs(r: dict[str, Any]) -> dict[str, Any]:
    return {"bits": [float(x) for x in r["doc_bits"]], "bytes": [int(x) for x in r["doc_bytes"]]}


def fit_head(exp: Any, seed: int) -> tuple[ByteHead, dict[str, Any]]:
    """A byte decoder fitted on the recipient's part: its n-gram rows (the donor's table, frozen) -> the bytes
    that follow in its text (``next_bytes_fit``)."""
    lay, N, J = exp.layout, exp.max_n, 8
    rows, y = rows_and_targets(exp.data.train, exp.lm.tokenizer, exp.cache, lay, N, J)
    head = ByteHead(N, lay.heads, lay.head_dim, J, seed=2000 + int(seed))
    return head, fit_decoder(head, exp.donor_tab, rows, y, steps=FIT_STEPS, batch=FIT_BATCH, lr=FIT_LR,
                             seed=2000 + int(seed))


def diagnose(exp: Any, bias: ByteBias, sets: Sequence[str] = ("read", "unseen")) -> dict[str, Any]:
    """Per scoring set and order: the share of positions whose n-gram row the donor wrote (the hit rate), and the
    decoder's accuracy on the next byte there (rows written) against the recipient's own text."""
    tb = exp.lm.tokenizer.all_token_bytes()
    nz = exp.donor_tab.abs().sum(1) > 0  # [R]: rows the donor wrote
    out: dict[str, Any] = {}
    for k in sets:
        if k not in exp.scorers:
            continue
        hit, tot, right, seen = (np.zeros(bias.N) for _ in range(4))
        for text in exp.eval_texts[k]:
            ids = np.asarray(exp.lm.tokenizer.encode(text), dtype=np.int64)
            if ids.size < 2:
                continue
            lr, rows = bias.log_ratio(torch.from_numpy(ids)[None])  # [1, T, N, J, 256], [1, T, N, K]
            y = torch.from_numpy(next_byte_targets(ids, tb, 1).astype(np.int64))[1:, 0]  # [T-1]
            for n in range(bias.N):
                r = rows[0, :-1, n]  # [T-1, K]
                valid = (r[:, 0] >= 0) & (y >= 0)
                wrote = valid & nz[r.clamp_min(0)].all(-1)
                tot[n] += float(valid.sum())
                hit[n] += float(wrote.sum())
                guess = lr[0, :-1, n, 0].argmax(-1)
                right[n] += float(((guess == y) & wrote).sum())
                seen[n] += float(wrote.sum())
        out[k] = {"hit_rate": {str(n + 1): float(hit[n] / max(tot[n], 1)) for n in range(bias.N)},
                  "next_byte_acc": {str(n + 1): float(right[n] / max(seen[n], 1)) for n in range(bias.N)}}
    return out


def run_next_bytes(exp: Any, arm: str, seed: int, *, eval_at: Sequence[int],
                   on_event: Callable[..., None] | None = None) -> dict[str, Any]:
    """One seed of a next-bytes arm, in the shape of :func:`polymem.recipes.pretrained.run_arm`'s results."""
    from polymem.recipes.frozen import FrozenTrainConfig, data_order, restricted_head, window_batch
    from polymem.recipes.loop import Schedule, run_steps
    from polymem.models.evaluate import token_nats
    from polymem.torch.bytehead import load_byte_head

    ev = on_event or (lambda *a, **k: None)
    t0 = time.perf_counter()
    cfg = FrozenTrainConfig(**{**asdict(exp.cfg), "seed": int(seed)})
    points = sorted({int(p) for p in eval_at if 0 < int(p) <= cfg.steps} | {cfg.steps})  # as the other arms
    if arm in ("next_bytes", "next_bytes_conf", "next_bytes_mix"):
        head, fit = load_byte_head(exp.donor_site), None
    else:
        head, fit = fit_head(exp, seed)
    if head.orders != exp.max_n or head.heads != exp.layout.heads or head.head_dim != exp.layout.head_dim:
        raise PolymemError(f"the donor's byte decoder reads orders 1..{head.orders} of {head.heads} × {head.head_dim} "
                           f"rows; this run reads 1..{exp.max_n} of {exp.layout.heads} × {exp.layout.head_dim}: pass "
                           "the donor's --max-n")
    stream, lm = exp.data.train, exp.lm
    cut_ids = np.unique(stream) if cfg.softmax == "corpus" else None
    bias = ByteBias(lm, head, exp.donor_tab, exp.layout, exp.cache, exp.max_n, cut_ids,
                    confidence=arm == "next_bytes_conf", mix=arm == "next_bytes_mix").install()
    trained = [bias.w] + ([bias.u] if bias.u is not None else [])
    base, ind = exp.base_docs(), exp.in_domain
    curve_t, curve, curve_docs = [0], [base[ind]["bpb"]], [_docs(base[ind])]  # w = 0: the model alone
    try:
        starts = data_order(stream.size, cfg)
        dev = next(lm.model.parameters()).device
        cut = restricted_head(lm.model, cut_ids) if cut_ids is not None else None
        opt = torch.optim.AdamW(trained, lr=W_LR, betas=(0.9, 0.95), weight_decay=0.0)

        def step_loss(step: int) -> torch.Tensor:
            x, y = window_batch(stream, starts[step], cfg.block_size, lm.bos_id)
            if cut is None:
                return token_nats(lm.model, x.to(dev), y.to(dev)).mean()
            with cut as remap:
                return token_nats(lm.model, x.to(dev), remap[y].to(dev)).mean()

        def on_eval(steps_done: int, tokens: int) -> None:
            r = exp.score_docs([ind])[ind]
            curve_t.append(int(tokens))
            curve.append(r["bpb"])
            curve_docs.append(_docs(r))
            ev("eval", arm=arm, seed=seed, tokens=tokens, bpb=curve[-1])

        sched = Schedule(steps=cfg.steps, lr=W_LR, table_lr=W_LR, grad_clip=0.0, lr_factor=cfg.lr_factor,
                         tokens_per_step=cfg.batch_size * cfg.block_size)
        res = run_steps(sched, step_loss, opt, None, trained, eval_at=points, on_eval=on_eval,
                        on_step=lambda i, loss: ev("step", arm=arm, seed=seed, step=i, loss=loss))
        others = [k for k in exp.scorers if k != ind]
        final = exp.score_docs(others) if others else {}
        diag = diagnose(exp, bias)
    finally:
        bias.remove()
    return {"arm": arm, "seed": int(seed), "curve_tokens": curve_t, "curve_bpb": curve, "curve_docs": curve_docs,
            "bpb": {ind: curve[-1], **{k: v["bpb"] for k, v in final.items()}},
            "docs": {ind: curve_docs[-1], **{k: _docs(v) for k, v in final.items()}},
            "train_s": res["train_s"], "tokens_per_s": res["tokens_per_s"],
            "final_loss": float(np.mean(res["losses"][-10:])), "gate": [float(x) for x in bias.w.detach()],
            "next_bytes": {"weights": [float(x) for x in bias.w.detach()],
                           **({"confidence_weights": [float(x) for x in bias.u.detach()]} if bias.u is not None else {}),
                           "decoder": head.describe(), "fit": fit,
                           "w_lr": W_LR, **diag},
            "elapsed_s": time.perf_counter() - t0}
