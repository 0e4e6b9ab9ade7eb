"""Pretrained causal LMs as recipients and donors: load one by name and score it.

    lm = polymem.models.load_model("smollm2-135m")      # or "gemma3-270m", "x.gguf", "ckpt/", "hf:ORG/NAME"
    from polymem.models.evaluate import evaluate
    report = evaluate(lm, texts)                         # held-out bits per byte, per document and overall

Modules: ``registry`` (model specs -> a transformers model and its own tokenizer), ``evaluate`` (bits per byte
in windows from BOS). Training a table on a frozen backbone and transfer to a pretrained recipient are recipes:
:mod:`polymem.recipes.frozen`, :mod:`polymem.recipes.pretrained`.
Needs ``pip install 'polymem[models]'`` (transformers, gguf, accelerate).
"""

from polymem.models.registry import BUILTIN_MODELS, LoadedModel, known_models, load_model

__all__ = ["BUILTIN_MODELS", "LoadedModel", "known_models", "load_model"]
