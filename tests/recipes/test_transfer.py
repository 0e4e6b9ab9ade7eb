"""polymem.recipes.transfer on its own: the coverage of recipient n-grams by donor-trained hashes (hand-counted,
across tokenizer families) and the random control table (same shape and row norms, new directions)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from polymem.torch.tables import random_like
from polymem.recipes.train import TokenData, batch_starts
from polymem.recipes.transfer import trained_hash_coverage


def test_coverage_by_hand_with_bytes() -> None:
    donor = TokenData.build("bytes", ["abcabc"], ["zz"])
    recipient = TokenData.build("bytes", ["qq"], ["abd"])
    cov = trained_hash_coverage(donor, recipient, donor_max_n=3, max_n=3)
    # held-out "abd": 1-grams a b d (a, b seen), 2-grams ab bd (ab seen), 3-gram abd (not seen)
    assert cov["per_n"] == {"1": 2 / 3, "2": 1 / 2, "3": 0.0}
    assert cov["all_orders"] == 3 / 6 and cov["basis"].startswith("all n-grams")


def test_coverage_across_tokenizer_families(cl100k) -> None:
    """A bytes donor covers a cl100k recipient's tokens by their bytes: "hello" and " world" are 5- and 6-grams
    of the donor's bytes; the recipient 2-gram "hello world" (11 bytes) is longer than the donor's orders."""
    donor = TokenData.build("bytes", ["hello world, hello world"], ["x"])
    recipient = TokenData.build(cl100k, ["unused text"], ["hello world"])
    assert recipient.heldout.tolist()[:2] == [15339, 1917]  # "hello", " world"
    cov = trained_hash_coverage(donor, recipient, donor_max_n=7, max_n=2)
    assert cov["per_n"]["1"] == 1.0 and cov["per_n"]["2"] == 0.0
    cov6 = trained_hash_coverage(donor, recipient, donor_max_n=5, max_n=1)  # " world" needs order 6
    assert cov6["per_n"]["1"] == 1 / 2  # the separator after the document is special: never counted


def test_replayed_windows_count_only_what_the_donor_trained_on() -> None:
    text = "".join(chr(97 + i % 26) for i in range(400))  # a..z repeated: every 1-gram appears
    donor = TokenData.build("bytes", [text], ["x"])
    recipient = TokenData.build("bytes", ["q"], [text])
    train = {"block_size": 8, "batch_size": 1, "steps": 1, "seed": 5}
    cov = trained_hash_coverage(donor, recipient, donor_max_n=1, max_n=1, donor_train=train)
    start = int(batch_starts(donor.train.size, block_size=8, batch_size=1, steps=1, seed=5)[0, 0])
    letters = set(text[start : start + 8])  # the one window the donor saw
    held = recipient.heldout.tolist()
    assert cov["per_n"]["1"] == pytest.approx(sum(chr(t) in letters for t in held) / len(held))
    assert cov["basis"].startswith("n-grams inside the donor's replayed")
    assert trained_hash_coverage(donor, recipient, donor_max_n=1, max_n=1)["per_n"]["1"] == 1.0  # upper bound


def test_random_control_keeps_shape_and_row_norms_not_directions() -> None:
    rng = np.random.default_rng(0)
    donor = rng.normal(size=(200, 16)).astype(np.float32) * rng.uniform(0.1, 3, size=(200, 1)).astype(np.float32)
    donor[rng.choice(200, 50, replace=False)] = 0  # untouched rows
    r = random_like(donor, seed=1)
    assert r.shape == donor.shape and r.dtype == torch.float32
    np.testing.assert_allclose(np.sort(r.norm(dim=1).numpy()), np.sort(np.linalg.norm(donor, axis=1)), rtol=1e-5)
    assert int((r.norm(dim=1) == 0).sum()) == 50  # as many zero rows as the donor
    cos = (r * torch.from_numpy(donor)).sum(1) / (r.norm(dim=1) * torch.from_numpy(donor).norm(dim=1)).clamp_min(1e-9)
    assert cos.abs().mean() < 0.35  # directions unrelated to the donor's (|cos| ≈ 0.2 for random 16-d vectors)
    assert torch.equal(random_like(donor, seed=1), r) and not torch.equal(random_like(donor, seed=2), r)
