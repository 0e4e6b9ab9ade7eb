"""Layouts: reference == numba == numpy == torch, page-locality, ranges, balance, budgets, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from polymem import Layout, TokenHashes
from polymem.hash import reference as ref
from polymem.errors import FormatError, PolymemError
from polymem.hash.layout import LAYOUT_KINDS
from polymem.torch.hash import rows_torch

REF = {"page-local": ref.page_local_rows, "flat": ref.flat_rows, "independent-heads": ref.independent_rows}
geometry = st.fixed_dictionaries(
    {"pages": st.integers(1, 5000), "heads": st.integers(1, 12), "slots": st.integers(1, 20),
     "kind": st.sampled_from(LAYOUT_KINDS)}
)


@settings(max_examples=80, deadline=None)
@given(geom=geometry, hashes=st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=20))
def test_rows_reference_equals_numba_numpy_torch(geom: dict, hashes: list[int]) -> None:
    layout = Layout(head_dim=8, **geom)
    h = np.array(hashes, dtype=np.uint64)
    got = layout.rows(h)
    expected = np.array([REF[layout.kind](x, heads=layout.heads, slots=layout.slots, pages=layout.pages) for x in hashes])
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(layout.rows(h, backend="numpy"), expected)
    v = np.arange(len(hashes)) % 2 == 0
    np.testing.assert_array_equal(layout.rows(h, v, backend="numpy"), layout.rows(h, v))
    np.testing.assert_array_equal(rows_torch(layout, torch.from_numpy(h.view(np.int64))).numpy(), expected)
    assert got.min() >= 0 and got.max() < layout.num_rows


def test_page_local_puts_all_heads_of_an_ngram_on_one_page_and_independent_heads_on_k() -> None:
    rng = np.random.default_rng(0)
    h = rng.integers(0, 2**63, size=5000, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    pl = Layout(pages=4096, heads=8, slots=4)
    pages = pl.page_of(pl.rows(h))  # [M, K]
    assert (pages == pages[:, :1]).all()
    # head k of page-local sits in its own band of the page: rows (page·K + k)·S .. +S-1
    rows = pl.rows(h)
    assert ((rows // pl.slots) % pl.heads == np.arange(8)).all()
    ind = Layout(pages=4096, heads=8, slots=4, kind="independent-heads")
    ip = ind.page_of(ind.rows(h))
    distinct = np.array([len(set(r)) for r in ip])
    assert distinct.min() == 8  # head k lives in sub-table k, so its pages never coincide
    flat = Layout(pages=4096, heads=8, slots=4, kind="flat")
    fr = flat.rows(h)
    assert (np.diff(fr, axis=1) == 1).all() and (flat.page_of(fr) == flat.page_of(fr)[:, :1]).all()


@pytest.mark.parametrize("kind", LAYOUT_KINDS)
def test_rows_are_spread_evenly(kind: str) -> None:
    rng = np.random.default_rng(1)
    layout = Layout(pages=64, heads=4, slots=15, kind=kind)
    h = rng.integers(0, 2**64 - 1, size=200_000, dtype=np.uint64)
    counts = np.bincount(layout.rows(h).ravel(), minlength=layout.num_rows)
    expected = h.size * layout.heads / layout.num_rows
    sigma = np.sqrt(expected)  # Poisson: every row within 5σ of the mean (≈208 ± 72)
    assert counts.min() > expected - 5 * sigma and counts.max() < expected + 5 * sigma
    assert abs(counts.std() / sigma - 1) < 0.1  # and the spread is the one of a uniform hash
    slots = layout.rows(h) % layout.slots if kind == "page-local" else None
    if slots is not None:
        share = np.bincount(slots.ravel(), minlength=15) / slots.size
        assert np.abs(share - 1 / 15).max() < 0.005


def test_invalid_hashes_get_minus_one() -> None:
    layout = Layout(pages=10)
    h = np.array([[1, 2], [3, 4]], dtype=np.uint64)
    v = np.array([[True, False], [False, True]])
    rows = layout.rows(h, v)
    assert rows.shape == (2, 2, 8)
    assert (rows[~v] == -1).all() and (rows[v] >= 0).all()
    with pytest.raises(PolymemError, match="must match"):
        layout.rows(h, v[:1])


def test_fused_rows_equal_hash_then_layout() -> None:
    vocab = [bytes([i]) for i in range(256)] + [b"ab", None, b" the"]
    cache = TokenHashes.from_token_bytes(vocab, name="toy", fingerprint="-")
    ids = np.random.default_rng(2).integers(0, len(vocab), size=(3, 50))
    for kind in LAYOUT_KINDS:
        layout = Layout(pages=333, heads=8, slots=4, kind=kind)
        h, v = cache.ngram_hashes(ids, 5)
        np.testing.assert_array_equal(cache.ngram_rows(ids, layout, 5), layout.rows(h, v))


def test_equal_parameter_budgets_and_serialisation() -> None:
    for kind in LAYOUT_KINDS:
        lay = Layout.for_params(200_000_000, heads=8, slots=4, head_dim=64, kind=kind)
        assert lay.params <= 200_000_000 < lay.params + 8 * 4 * 64
        assert Layout.from_dict(lay.to_dict()) == lay
    with pytest.raises(PolymemError, match="smaller than one page"):
        Layout.for_params(100, heads=8, slots=4, head_dim=64)
    with pytest.raises(PolymemError, match="layout kind 'hashed' is unknown; accepted: page-local"):
        Layout(pages=3, kind="hashed")
    with pytest.raises(PolymemError, match=r"slots=0 must be an integer in \[1, 65536\]"):
        Layout(pages=3, slots=0)
    with pytest.raises(FormatError, match="missing field 'pages'"):
        Layout.from_dict({"kind": "flat", "heads": 8, "slots": 4, "head_dim": 64})
