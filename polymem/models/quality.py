"""What storing a table in fewer bits costs a real model: held-out bits per byte of the model with its site reading
the full-precision table, then the same site reading the quantized copy (``polymem quantize --check-model``).

The two scores use the same documents, windows and site; only the rows differ (:meth:`AttachHandle.swap_table`).
``loss`` is the relative change of bits per byte (+0.004 = 0.4 % worse). Default limits follow what users were
promised: NF4 within +0.5 %, FP8 within +0.2 %, BF16 within +0.1 %.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from polymem.errors import PolymemError

MAX_LOSS = {"nf4": 0.005, "fp8-e4m3": 0.002, "fp8-e4m3-e8m0": 0.002, "bfloat16": 0.001, "float16": 0.001,
            "float32": 0.0}


def quantization_loss(lm: Any, site: str | Path, reference: Any, quantized: Any, texts: Sequence[str], *,
                      window: int = 512, batch: int = 4) -> dict[str, Any]:
    """Bits per byte of ``lm`` with ``site`` over the ``reference`` table and over ``quantized`` (assets or
    their paths; the same spec and layout), on ``texts``. Returns ``{"bpb_reference", "bpb_quantized", "loss",
    "tokens", "bytes", "documents"}``."""
    from polymem.models.evaluate import Scorer
    from polymem.torch.attach import load_attached

    most = getattr(getattr(lm.model, "config", None), "max_position_embeddings", None)
    if isinstance(most, int):
        window = min(window, most)  # a short-context model scores in windows of its own length
    sc = Scorer(lm, texts, window=window, batch=batch)
    h = load_attached(lm.model, site, reference, tokenizer=lm.tokenizer)
    try:
        ref = sc.score()
        h.swap_table(quantized)
        q = sc.score()
    finally:
        h.detach()
    if not ref["bpb"] > 0:
        raise PolymemError(f"the reference score is {ref['bpb']!r} bits per byte; pass documents with text")
    return {"bpb_reference": ref["bpb"], "bpb_quantized": q["bpb"], "loss": q["bpb"] / ref["bpb"] - 1,
            "tokens": ref["tokens"], "bytes": ref["bytes"], "documents": len(texts)}
