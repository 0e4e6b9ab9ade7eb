"""What :func:`polymem.attach` reads off a model: where its decoder blocks live, its hidden size, and the ids
its vocabulary accepts (checked against the tokenizer's)."""

from __future__ import annotations

import contextlib

import torch
import torch.nn as nn

from polymem.errors import PolymemError

# where decoder blocks live in common causal LMs (first match wins)
BLOCK_PATHS = ("model.layers", "transformer.h", "model.decoder.layers", "gpt_neox.layers", "layers", "h")


def find_blocks(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """(path, blocks): the first of :data:`BLOCK_PATHS` that is a non-empty ModuleList of ``model``."""
    for path in BLOCK_PATHS:
        try:
            m = model.get_submodule(path)
        except AttributeError:
            continue
        if isinstance(m, nn.ModuleList) and len(m) > 0:
            return path, m
    raise PolymemError(
        f"could not find the decoder blocks of {type(model).__name__}: none of {', '.join(BLOCK_PATHS)} is a "
        "ModuleList; pass layers=[module names] (e.g. 'model.layers.1') for other architectures"
    )


def hidden_size(model: nn.Module) -> int:
    """The model's hidden size (config hidden_size / n_embd / d_model, else the input embedding's width), refused
    when the config and the input embedding disagree."""
    d = _config_width(model)
    width = _input_width(model)
    if width is not None and width != d:
        raise PolymemError(f"{type(model).__name__}: config hidden size {d} but the input embedding has width {width}")
    return d


def _config_width(model: nn.Module) -> int:
    cfg = getattr(model, "config", None)
    for name in ("hidden_size", "n_embd", "d_model"):
        v = getattr(cfg, name, None)
        if isinstance(v, int):
            return v
    get = getattr(model, "get_input_embeddings", None)  # a transformers model's method, not nn.Module's
    emb = get() if get is not None else None
    if emb is not None:
        return int(emb.weight.shape[1])
    raise PolymemError(f"cannot tell the hidden size of {type(model).__name__}: its config has no hidden_size/n_embd/d_model")


def _input_width(model: nn.Module) -> int | None:
    """Width of the input embedding, to check d_model against real weights."""
    emb = None
    get = getattr(model, "get_input_embeddings", None)  # a transformers model's method, not nn.Module's
    if get is not None:
        try:
            emb = get()
        except (NotImplementedError, AttributeError):
            emb = None
    if emb is None:
        with contextlib.suppress(AttributeError):
            emb = model.get_submodule("transformer.wte")
    w = getattr(emb, "weight", None)
    return int(w.shape[1]) if isinstance(w, torch.Tensor) and w.dim() == 2 else None


def model_vocab(model: nn.Module) -> int | None:
    """The ids the model accepts: config.vocab_size, else the input embedding's rows (None if neither)."""
    v = getattr(getattr(model, "config", None), "vocab_size", None)
    if isinstance(v, int):
        return int(v)
    emb = None
    get = getattr(model, "get_input_embeddings", None)  # a transformers model's method, not nn.Module's
    with contextlib.suppress(NotImplementedError, AttributeError):
        emb = get() if get is not None else None
    w = getattr(emb, "weight", None)
    return int(w.shape[0]) if isinstance(w, torch.Tensor) and w.dim() == 2 else None


def vocab_padding_limit(tokenizer_vocab: int) -> int:
    """How many ids a model's vocabulary may exceed the tokenizer's by and still count as padding: the larger of
    1,024 and 1/16 of the tokenizer's (GPT-2 50,257 -> 50,304, Phi-2 50,295 -> 51,200, Qwen2 151,665 ->
    151,936 pass; the 256-id bytes tokenizer on a 32,000-id model does not)."""
    return max(1024, tokenizer_vocab // 16)


def check_vocab(model: nn.Module, tok_name: str, V: int, allow_padding: bool) -> int | None:
    """Refuse a tokenizer whose ids do not fit the model: more ids than the model's vocabulary (the forward would
    raise IndexError in the embedding), or far fewer (another tokenizer's ids would be hashed as this one's).
    Returns the model's vocabulary size (None when it cannot be told)."""
    vocab = model_vocab(model)
    if vocab is None or vocab == V:
        return vocab
    what = f"tokenizer {tok_name!r} has {V:,} ids but {type(model).__name__} has a vocabulary of {vocab:,}"
    fix = ("pass the model's own tokenizer (the tokenizer.json / tokenizer.model saved with the checkpoint, "
           "or hf:ORG/NAME of the model)")
    if V > vocab:
        raise PolymemError(
            f"{what}: ids {vocab}..{V - 1} of the tokenizer do not exist in the model (its embedding would raise "
            f"IndexError in the forward), so this is not the tokenizer this model was trained with; {fix}"
        )
    if vocab - V > vocab_padding_limit(V) and not allow_padding:
        raise PolymemError(
            f"{what}: {vocab - V:,} model ids would have no tokenizer bytes, more than padding "
            f"(at most {vocab_padding_limit(V):,}), so this is most likely not the tokenizer this model was trained "
            f"with and its ids would be hashed as another tokenizer's bytes; {fix}. If the model's embedding really "
            "is padded that far beyond the tokenizer, pass allow_vocab_padding=True"
        )
    return vocab
