"""The pieces of a transfer that pays: the ridge map between hidden states, paired bootstrap verdicts, tokens to
match on a curve, and the count gate (rows a table never trained read as unknown)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from polymem.errors import PolymemError
from polymem.recipes.align import aligned_projection, fit_ridge, r2
from polymem.recipes.stats import paired_bootstrap, tokens_to_match


def test_ridge_recovers_a_linear_map_and_r2_measures_it():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, 6)) * np.array([1, 10, 100, 1, 1, 0.1])  # scales a fixed lambda would mistreat
    a_true = rng.normal(size=(4, 6))
    y = x @ a_true.T + np.array([1.0, -2.0, 3.0, 0.5])
    a, b = fit_ridge(x, y, ridge=1e-13)
    assert np.allclose(a, a_true, atol=1e-4) and np.allclose(b, [1.0, -2.0, 3.0, 0.5], atol=1e-3)
    assert r2(x, y, a, b) == pytest.approx(1.0, abs=1e-9)
    noise = y + rng.normal(size=y.shape) * y.std(0)  # as much noise as signal: about half the variance explained
    a2, b2 = fit_ridge(x, noise)
    assert 0.3 < r2(x, noise, a2, b2) < 0.7
    assert r2(x, rng.normal(size=y.shape), a2, b2) < 0  # a map that explains nothing scores below zero


def test_aligned_projection_composes_map_projection_and_gates():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    w = torch.ones(3, 5)
    got = aligned_projection(w, 0.25, a, 0.5)
    assert torch.allclose(got, torch.as_tensor(a) @ w * 0.5) and got.shape == (2, 5)
    with pytest.raises(PolymemError, match="non-zero gate_init"):
        aligned_projection(w, 0.25, a, 0.0)


def test_bootstrap_verdicts():
    rng = np.random.default_rng(1)
    nbytes = rng.integers(200, 400, size=12)
    base = nbytes * 1.0 + rng.normal(size=(3, 12)) * 5
    better = base - nbytes * 0.05  # 0.05 bits per byte lower on every document and seed
    r = paired_bootstrap(better, base, nbytes)
    assert r["verdict"] == "a_lower" and all(h < 0 for h in r["hi"]) and r["mean"] == pytest.approx(-0.05)
    assert paired_bootstrap(base, better, nbytes)["verdict"] == "a_higher"
    noisy = base + rng.normal(size=base.shape) * 40  # differences of both signs, no real gap
    assert paired_bootstrap(noisy, base, nbytes)["verdict"] == "within_noise"
    mixed = np.vstack([better[:2], base[2:] + nbytes * 0.05])  # two seeds better, one worse: no verdict
    assert paired_bootstrap(mixed, base, nbytes)["verdict"] == "within_noise"
    with pytest.raises(PolymemError, match="seeds, documents"):
        paired_bootstrap(base[:, :3], base, nbytes)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0.5, 2.0), min_size=2, max_size=6), st.floats(0.4, 2.1))
def test_tokens_to_match_is_where_a_falling_curve_crosses(ys, target):
    ys = sorted(ys, reverse=True)
    ts = [i * 1000 for i in range(len(ys))]
    got = tokens_to_match(ts, ys, target)
    if target < ys[-1]:
        assert got is None
        return
    assert got is not None and 0 <= got <= ts[-1]
    assert float(np.interp(got, ts, ys)) <= target + 1e-9 or ys[0] <= target
    if ys[0] > target:
        assert float(np.interp(got, ts, ys)) == pytest.approx(target, abs=1e-9)


def test_tokens_to_match_golden():
    assert tokens_to_match([0, 4096, 12288], [0.9, 0.8, 0.7], 0.75) == pytest.approx(8192)
    assert tokens_to_match([0, 4096], [0.9, 0.8], 0.95) == 0
    assert tokens_to_match([0, 4096], [0.9, 0.8], 0.7) is None


def test_count_gate_reads_untrained_rows_as_unknown():
    from polymem.hash.layout import Layout
    from polymem.torch.site import MemorySite, SiteConfig

    layout = Layout(pages=4, heads=2, slots=2, head_dim=4)
    site = MemorySite(SiteConfig(d_model=8, max_n=2, gate="count", init_seed=3), layout)
    h = torch.randn(1, 5, 8)
    e = torch.randn(1, 5, 2, 2, 4)
    assert torch.equal(site(h, e, torch.zeros(1, 5, 2, 2)), h)  # every row untrained: nothing added
    c = torch.zeros(1, 5, 2, 2)
    c[0, 2, 1, :] = 50.0  # one (position, order) whose rows were all trained
    out = site(h, e, c) - h
    assert out[0, 2].abs().sum() > 0 and out[0, [0, 1, 3, 4]].abs().sum() == 0
    c[0, 2, 1, 0] = 0.0  # one head's row untrained: the count-min estimate is 0, the n-gram is unknown
    assert torch.equal(site(h, e, c), h)
    ctx = MemorySite(SiteConfig(d_model=8, max_n=2, gate="context", init_seed=3), layout)
    ctx.load_state_dict({k: v for k, v in site.state_dict().items() if k != "count_theta"})
    assert torch.allclose(site(h, e, None), ctx(h, e))  # without counts the count gate is the context gate
    tau = torch.nn.functional.softplus(site.count_theta)
    assert torch.allclose(tau, torch.ones(2)) and math.isclose(math.log(2) / (math.log(2) + 1), 0.409, abs_tol=1e-3)


def test_table_counts_are_checked_and_gathered():
    from polymem.hash.layout import Layout
    from polymem.hash.spec import HashSpec
    from polymem.torch.tables import TrainableTable

    layout = Layout(pages=2, heads=2, slots=2, head_dim=4)
    t = TrainableTable(None, spec=HashSpec(), layout=layout)
    assert t.gather_counts(torch.tensor([0, 1])) is None
    t.set_counts(np.arange(layout.num_rows, dtype=np.uint32))
    assert t.gather_counts(torch.tensor([[3, -1, 5]])).tolist() == [[3.0, 0.0, 5.0]]
    with pytest.raises(PolymemError, match="one per row"):
        t.set_counts(np.arange(3))
    with pytest.raises(PolymemError, match="must be integers"):
        t.set_counts(np.full(layout.num_rows, 0.5))
