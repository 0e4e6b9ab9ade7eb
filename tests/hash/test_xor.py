"""polymem.hash.xor: Engram's XOR token-id hash (the tokenizer-bound baseline) on its own — multipliers,
mixes, primes, rows — against hand-computed values and the plain-Python reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polymem.errors import PolymemError
from polymem.hash import reference as ref
from polymem.hash.spec import MASK64, splitmix64
from polymem.hash.xor import XorHashSpec, _is_prime, xor_mixes, xor_multipliers


def test_multipliers_are_odd_splitmix64_outputs_of_the_seed() -> None:
    state, want = 7, []
    for _ in range(4):
        state, v = splitmix64(state)
        want.append(v | 1)
    assert xor_multipliers(4, seed=7) == tuple(want)
    assert all(m % 2 == 1 for m in want)
    assert xor_multipliers(2, seed=7) == xor_multipliers(4, seed=7)[:2]  # a prefix: orders share m_0, m_1, …
    assert xor_multipliers(3) != xor_multipliers(3, seed=1)
    assert XorHashSpec(head_rows=100, orders=(2, 3), seed=7).multipliers == xor_multipliers(3, seed=7)


def test_mixes_by_hand() -> None:
    m = (3, 5, 7)
    ids = np.array([1, 2, 4])
    got = xor_mixes(ids, m, 3)  # out[i, n-1] = ids[i]·m0 ⊕ ids[i-1]·m1 ⊕ …, ids before the start read as 0
    assert got.dtype == np.uint64
    assert got.tolist() == [
        [3, 3 ^ 0, 3 ^ 0 ^ 0],
        [6, 6 ^ 5, 6 ^ 5 ^ 0],
        [12, 12 ^ 10, 12 ^ 10 ^ 7],
    ]


@settings(max_examples=60, deadline=None)
@given(ids=st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=30), max_n=st.integers(1, 6),
       seed=st.integers(0, 2**64 - 1))
def test_mixes_equal_the_reference_with_wraparound(ids: list[int], max_n: int, seed: int) -> None:
    mults = xor_multipliers(max_n, seed=seed)
    got = xor_mixes(np.array(ids), mults, max_n)
    for i in range(len(ids)):
        for n in range(1, max_n + 1):
            padded = [0] * max(0, n - 1 - i) + ids[max(0, i - n + 1) : i + 1]
            assert int(got[i, n - 1]) == ref.xor_mix(padded, mults[:n]) <= MASK64


def test_too_few_multipliers_is_an_error() -> None:
    with pytest.raises(PolymemError, match="2 multipliers cannot mix orders up to 3"):
        xor_mixes(np.arange(4), (1, 3), 3)


def test_is_prime_against_trial_division() -> None:
    brute = [n for n in range(2, 3000) if all(n % d for d in range(2, int(n**0.5) + 1))]
    assert [n for n in range(3000) if _is_prime(n)] == brute
    assert _is_prime(2**61 - 1) and not _is_prime((2**31 - 1) * (2**61 - 1))


def test_primes_are_distinct_descending_from_head_rows() -> None:
    xs = XorHashSpec(head_rows=100, orders=(2, 3), heads=3)
    assert xs.primes == (97, 89, 83, 79, 73, 71)  # the 6 largest primes ≤ 100, one per (order, head)
    assert xs.num_rows == sum(xs.primes)


def test_rows_by_hand() -> None:
    xs = XorHashSpec(head_rows=100, orders=(2,), heads=2, seed=0)
    m0, m1 = xs.multipliers[:2]
    rows, valid = xs.rows(np.array([1, 2]))
    assert valid.tolist() == [[False], [True]]  # the first position has no 2-gram
    mix = ((2 * m0) ^ (1 * m1)) & MASK64
    assert rows[1, 0].tolist() == [mix % 97, 97 + mix % 89]  # head k reads its own sub-table at offset Σ primes
    assert rows.min() >= 0 and rows.max() < xs.num_rows


def test_tokenizer_bound_same_text_other_ids_other_rows() -> None:
    """The same two characters as ids of two vocabularies address unrelated rows (the point of the baseline)."""
    xs = XorHashSpec(head_rows=10_007, orders=(2,), heads=4)
    a, _ = xs.rows(np.array([97, 98]))  # "ab" as byte ids
    b, _ = xs.rows(np.array([64, 65]))  # "ab" in a vocabulary where a=64, b=65
    assert not set(a[1, 0].tolist()) & set(b[1, 0].tolist())


@pytest.mark.parametrize("kw", [dict(head_rows=10), dict(head_rows=100, orders=()), dict(head_rows=100, orders=(0, 2)),
                                dict(head_rows=100, heads=0)])
def test_bad_specs_are_refused(kw: dict) -> None:
    with pytest.raises(PolymemError, match="XorHashSpec.*is invalid"):
        XorHashSpec(**kw)
