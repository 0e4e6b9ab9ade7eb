"""Cross-tokenizer byte-equivalence check: find n-grams of two tokenizers with the same bytes and compare
their hashes. This is the foundation's promise made visible (``polymem demo``) and a test oracle.

Not here: corpus-scale coverage statistics (that is :mod:`polymem.analysis.coverage`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from polymem.errors import PolymemError
from polymem.hash.reference import ngram_bytes
from polymem.hash.token_hashes import TokenHashes


@dataclass(frozen=True)
class CrossCheck:
    pairs: int  # (A n-gram, B n-gram) pairs with equal bytes
    mismatched: int  # of those, pairs whose hashes differ (must be 0)
    collisions: int  # hash equal but bytes different, over both tokenizers' n-grams (64-bit collisions)
    distinct_ngrams: int  # distinct byte strings seen, both tokenizers
    shared_distinct: int  # distinct byte strings that both tokenizers produced as an n-gram
    examples: list[tuple[bytes, int, int, int]]  # (bytes, order in A, order in B, hash) with orders differing


def crosscheck(
    cache_a: TokenHashes, bytes_a: list[bytes | None], ids_a: np.ndarray,
    cache_b: TokenHashes, bytes_b: list[bytes | None], ids_b: np.ndarray, max_n: int = 7,
) -> CrossCheck:
    """Compare every valid n-gram (n ≤ max_n) of stream A with every one of stream B by bytes and by hash."""
    seen: dict[bytes, dict[str, set[tuple[int, int]]]] = {}  # bytes -> {"a": {(order, hash)}, "b": ...}
    by_hash: dict[int, bytes] = {}
    collisions = 0
    for side, cache, tb, ids in (("a", cache_a, bytes_a, ids_a), ("b", cache_b, bytes_b, ids_b)):
        h, v = cache.ngram_hashes(ids, max_n)
        nb = ngram_bytes(tb, ids, max_n)
        for i in range(len(ids)):
            for n in range(max_n):
                if not v[i, n]:
                    continue
                b, x = nb[i][n], int(h[i, n])
                if b is None:  # the cache hashed it, so its tokens have bytes: bytes_{a,b} belong to another vocabulary
                    raise PolymemError(
                        f"token bytes for side {side!r} do not match its TokenHashes {cache.tokenizer_name!r}: the "
                        f"n-gram ending at position {i} (order {n + 1}) is hashed but has a token without bytes. "
                        "Fix: pass the token bytes of the tokenizer the cache was built from (tok.all_token_bytes())"
                    )
                entry = seen.setdefault(b, {"a": set(), "b": set()})
                entry[side].add((n + 1, x))
                prev = by_hash.setdefault(x, b)
                if prev != b:
                    collisions += 1
    pairs = mismatched = shared = 0
    examples: list[tuple[bytes, int, int, int]] = []
    for b, entry in seen.items():
        sa, sb = entry["a"], entry["b"]
        if not sa or not sb:
            continue
        shared += 1
        for oa, ha in sa:
            for ob, hb in sb:
                pairs += 1
                mismatched += ha != hb
                if oa != ob and len(examples) < 1000:
                    examples.append((b, oa, ob, ha))
    examples.sort(key=lambda e: (-abs(e[1] - e[2]), -len(e[0])))
    return CrossCheck(pairs, mismatched, collisions, len(seen), shared, examples)
