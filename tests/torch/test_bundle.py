"""Sites that travel: a site names its table relative to itself when they sit side by side, finds a table inside or
beside it when the recorded path is gone, bundles (site + table + README card) re-attach with nothing passed, and
push/pull copy them to and from fsspec stores (memory://, a local S3 server) with every file's sha256 checked."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import polymem
from polymem import HashSpec, Layout, MemoryAsset, PolymemError, TokenHashes
from polymem.errors import FormatError, MissingError
from polymem.recipes.model import GPT, GPTConfig
from polymem.torch import attach
from polymem.torch.bundle import bundle_site, pull_site, push
from s3server import BUCKET, endpoint, s3fs  # noqa: F401  (the local S3 server fixture)

torch.set_num_threads(1)
LAYOUT = Layout(pages=64, heads=4, slots=4, head_dim=8)


@pytest.fixture(scope="module")
def byte_cache() -> TokenHashes:
    return TokenHashes.build("bytes", HashSpec())


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    return torch.from_numpy(np.frombuffer(b"the cat sat on the mat, the dog sat on the log.", dtype=np.uint8)
                            .astype(np.int64)[None, :40].copy())


def _model() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=256, n_used=256, block_size=64, n_layer=2, n_head=2, d_model=32), torch.arange(256))


def _site(tmp: Path, byte_cache, ids, *, bundle: bool = False, site_name: str = "donor.pmem.site"):
    """An asset tmp/donor.pmem, a frozen site over it saved beside it (or as a bundle), and the model's logits."""
    w = torch.randn(LAYOUT.num_rows, LAYOUT.head_dim, generator=torch.Generator().manual_seed(1)).numpy()
    tmp.mkdir(parents=True, exist_ok=True)
    asset = MemoryAsset.from_array(tmp / "donor.pmem", w, HashSpec(), LAYOUT, orders=(1, 2, 3),
                                   provenance={"model": {"name": "tiny"}, "corpus": "sample:pydocs", "heldout_every": 10,
                                               "heldout_bpb": 1.25})
    model = _model()
    h = attach(model, str(asset.path), byte_cache, layers=[1], value_init="orthogonal")
    with torch.no_grad():
        want = model(ids)
    h.save(tmp / site_name, bundle=bundle)
    h.detach()
    return tmp / site_name, want


def _reattached(site: Path, byte_cache, ids) -> torch.Tensor:
    model = _model()
    h = polymem.AttachHandle.from_pretrained(model, site, tokenizer=byte_cache)
    with torch.no_grad():
        out = model(ids)
    h.detach()
    return out


def test_a_site_beside_its_table_moves_with_it(tmp_path, byte_cache, ids):
    site, want = _site(tmp_path / "a", byte_cache, ids)
    assert json.loads((site / "site.json").read_text())["table"]["source"]["path"] == "../donor.pmem"
    shutil.move(tmp_path / "a", tmp_path / "b")
    assert torch.equal(_reattached(tmp_path / "b" / site.name, byte_cache, ids), want)


def test_an_old_absolute_path_is_read_and_a_missing_one_falls_back_to_the_table_beside(tmp_path, byte_cache, ids):
    site, want = _site(tmp_path / "a", byte_cache, ids)
    header = json.loads((site / "site.json").read_text())
    header["table"]["source"]["path"] = str((tmp_path / "a" / "donor.pmem").resolve())  # as older sites recorded it
    (site / "site.json").write_text(json.dumps(header))
    assert torch.equal(_reattached(site, byte_cache, ids), want)
    header["table"]["source"]["path"] = "/nowhere/at/all/donor.pmem"
    (site / "site.json").write_text(json.dumps(header))
    assert torch.equal(_reattached(site, byte_cache, ids), want)


def test_a_missing_table_names_the_fix(tmp_path, byte_cache, ids):
    site, _ = _site(tmp_path, byte_cache, ids)
    shutil.rmtree(tmp_path / "donor.pmem")
    with pytest.raises(MissingError, match="pass that asset as table_or_asset"):
        _reattached(site, byte_cache, ids)


def test_a_bundle_carries_its_table_and_a_card(tmp_path, byte_cache, ids):
    bundle, want = _site(tmp_path / "a", byte_cache, ids, bundle=True, site_name="bundle")
    assert sorted(p.name for p in bundle.iterdir()) == ["README.md", "site.json", "site.safetensors", "table.pmem"]
    card = (bundle / "README.md").read_text()
    fp = json.loads((bundle / "site.json").read_text())["tokenizer"]["fingerprint"]
    assert fp in card and "sample:pydocs" in card and "1.2500" in card and "tiny" in card
    shutil.move(bundle, tmp_path / "elsewhere")
    shutil.rmtree(tmp_path / "a")  # the original table is gone
    assert torch.equal(_reattached(tmp_path / "elsewhere", byte_cache, ids), want)
    assert not list(tmp_path.glob(".*"))  # no staging folder left


def test_bundle_of_a_saved_site_and_its_refusals(tmp_path, byte_cache, ids):
    site, want = _site(tmp_path / "a", byte_cache, ids)
    out = bundle_site(site, tmp_path / "b")
    assert torch.equal(_reattached(out, byte_cache, ids), want)
    with pytest.raises(PolymemError, match="exists; pass --overwrite"):
        bundle_site(site, tmp_path / "b")
    with pytest.raises(PolymemError, match="is the site itself"):
        bundle_site(site, site, overwrite=True)
    shutil.rmtree(tmp_path / "a" / "donor.pmem")
    with pytest.raises(MissingError, match="--asset"):
        bundle_site(site, tmp_path / "c")
    assert not (tmp_path / "c").exists()


def test_push_and_pull_through_memory_fs(tmp_path, byte_cache, ids):
    import fsspec

    bundle, want = _site(tmp_path / "a", byte_cache, ids, bundle=True, site_name="bundle")
    n = push(bundle, "memory://sites/b1")
    assert n == len([p for p in bundle.rglob("*") if p.is_file()])
    with pytest.raises(PolymemError, match="already holds a site"):
        push(bundle, "memory://sites/b1")
    got = pull_site("memory://sites/b1", tmp_path / "pulled")
    assert torch.equal(_reattached(got, byte_cache, ids), want)
    # a damaged copy in the store: refused, nothing written
    fs = fsspec.filesystem("memory")
    with fs.open("/sites/b1/site.safetensors", "rb") as f:
        data = bytearray(f.read())
    data[-1] ^= 1
    with fs.open("/sites/b1/site.safetensors", "wb") as f:
        f.write(bytes(data))
    with pytest.raises(FormatError, match="sha256"):
        pull_site("memory://sites/b1", tmp_path / "bad")
    assert not (tmp_path / "bad").exists() and not list(tmp_path.glob(".bad*"))
    with pytest.raises(PolymemError, match="holds no site.json"):
        pull_site("memory://sites/nothing", tmp_path / "none")


def test_push_and_pull_through_s3(tmp_path, byte_cache, ids, endpoint):  # noqa: F811
    bundle, want = _site(tmp_path / "a", byte_cache, ids, bundle=True, site_name="bundle")
    so = {"endpoint_url": endpoint}
    push(bundle, f"s3://{BUCKET}/bundles/b", storage_options=so)
    got = pull_site(f"s3://{BUCKET}/bundles/b", tmp_path / "pulled", storage_options=so)
    assert torch.equal(_reattached(got, byte_cache, ids), want)


def test_a_frozen_table_held_only_in_memory_is_bundled_from_its_rows(tmp_path, byte_cache, ids):
    from polymem.torch import TrainableTable

    w = torch.randn(LAYOUT.num_rows, LAYOUT.head_dim, generator=torch.Generator().manual_seed(2))
    model = _model()
    h = attach(model, TrainableTable(w, spec=HashSpec(), layout=LAYOUT, trainable=False), byte_cache, layers=[1],
               value_init="orthogonal")
    with torch.no_grad():
        want = model(ids)
    h.save(tmp_path / "b", bundle=True)
    h.detach()
    assert (tmp_path / "b" / "table.safetensors").is_file()
    assert torch.equal(_reattached(tmp_path / "b", byte_cache, ids), want)
