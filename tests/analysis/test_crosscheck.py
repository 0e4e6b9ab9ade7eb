"""polymem.analysis.crosscheck: byte-equal n-grams of two token streams, compared by hash — on toy
vocabularies small enough to count by hand, including a broken spec and a forced collision."""

from __future__ import annotations

import numpy as np
import pytest

from polymem import HashSpec, TokenHashes
from polymem.errors import PolymemError
from polymem.analysis.crosscheck import crosscheck

A = [b"a", b"b", b"ab", None]  # id 3: a special token
B = [b"a", b"b"]


def cache(vocab, spec=None) -> TokenHashes:
    return TokenHashes.from_token_bytes(vocab, spec or HashSpec(), name="toy", fingerprint=str(len(vocab)))


def test_counts_by_hand() -> None:
    # A: "ab" as one token; B: "a" then "b". N-grams (max_n 2): A {ab}; B {a, b, ab (order 2)}.
    r = crosscheck(cache(A), A, np.array([2]), cache(B), B, np.array([0, 1]), max_n=2)
    assert (r.pairs, r.mismatched, r.collisions, r.distinct_ngrams, r.shared_distinct) == (1, 0, 0, 3, 1)
    assert r.examples == [(b"ab", 1, 2, HashSpec().hash_bytes(b"ab"))]  # order 1 in A, order 2 in B, one hash


def test_special_tokens_break_ngrams() -> None:
    # A: "a", <special>, "b": no 2-gram is valid; shared with B's "a","b": 2 distinct strings, 2 pairs
    r = crosscheck(cache(A), A, np.array([0, 3, 1]), cache(B), B, np.array([0, 1]), max_n=2)
    assert (r.pairs, r.shared_distinct, r.distinct_ngrams) == (2, 2, 3)
    assert r.examples == []  # same orders on both sides


def test_a_different_spec_shows_up_as_mismatches() -> None:
    other = HashSpec(byte_seed=1)
    r = crosscheck(cache(A), A, np.array([2, 0]), cache(B, other), B, np.array([0, 1]), max_n=2)
    # shared: "ab" (A order 1, B order 2) and "a" (A order 1, B order 1): every pair disagrees
    assert r.pairs == 2 and r.mismatched == 2


def test_a_forced_collision_is_counted() -> None:
    cb = cache(B)
    cb.C[1] = cb.C[0]  # token "b" now hashes like "a": two different byte strings, one hash
    r = crosscheck(cache(A), A, np.array([0]), cb, B, np.array([0, 1]), max_n=1)
    assert r.collisions == 1 and r.mismatched == 0


def test_token_bytes_of_another_vocabulary_are_refused() -> None:
    # the cache is A's ("ab" is a token with bytes) but the bytes passed say id 2 is a special token
    wrong = [b"a", b"b", None, None]
    with pytest.raises(PolymemError, match=r"side 'a'.*position 0 \(order 1\).*all_token_bytes"):
        crosscheck(cache(A), wrong, np.array([2]), cache(B), B, np.array([0, 1]), max_n=2)
