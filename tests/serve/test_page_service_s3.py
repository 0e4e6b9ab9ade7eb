"""An asset in S3 (a local moto server on 127.0.0.1, the fixture of test_s3.py): served through the page
service by parallel range requests with outputs equal to the local asset, and staged by `pull`."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from polymem import HashSpec, Layout, MemoryAsset, TokenHashes
from polymem.torch import attach

from s3server import BUCKET, endpoint, s3fs  # noqa: F401  (the local S3 server fixture)

LAYOUT = Layout(pages=256, heads=4, slots=4, head_dim=8)


@pytest.fixture()
def s3_asset(tmp_path, endpoint, monkeypatch):  # noqa: F811
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    s3fs.S3FileSystem.clear_instance_cache()
    w = np.random.default_rng(5).standard_normal((LAYOUT.num_rows, LAYOUT.head_dim)).astype(np.float32)
    local = MemoryAsset.from_array(tmp_path / "a", w, HashSpec(), LAYOUT, orders=(1, 2, 3))
    local, _ = local.quantize(tmp_path / "a.nf4", to="nf4")
    fs = s3fs.S3FileSystem(endpoint_url=endpoint)
    fs.put(str(local.path), f"{BUCKET}/served/a.nf4", recursive=True)
    yield local, f"s3://{BUCKET}/served/a.nf4"
    fs.rm(f"{BUCKET}/served", recursive=True)
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.mark.slow
def test_s3_asset_is_served_and_pulled(s3_asset, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    from polymem.ops.pull import pull

    local, url = s3_asset
    remote = MemoryAsset.open(url)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2)).eval()
    cache = TokenHashes.build("bytes", HashSpec())
    ids = torch.from_numpy(np.frombuffer(b"tables bigger than memory, served from s3", np.uint8).astype(np.int64))[None]
    h = attach(model, local, cache, layers=[1], value_init="orthogonal")
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    h.detach()
    h = attach(model, remote, cache, layers=[1], in_memory=False, value_init="orthogonal", cache_mb=1)
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, ref)
    st = h.stats()
    assert st["source"] == "fsspec" and st["reads"] > 0 and st["errors"] == 0
    h.detach()
    staged = pull(url, tmp_path / "pulled.nf4")
    assert staged.problems() == [] and np.array_equal(staged.to_numpy(), local.to_numpy())
