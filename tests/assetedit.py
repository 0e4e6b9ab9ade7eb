"""Editing an asset's files as an attacker (or an old polymem) would: the header with its checksum recomputed, shards
without their id footers. Shared by the hostile-asset, hostile-writer and engine-export tests."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from polymem import MemoryAsset
from polymem.asset._format import canonical_json, sha256_hex

TAG = b"polymem shard id"  # the start of a shard's id footer (docs/asset-format.md)


def _edit_header(root: Path, fn) -> None:
    """Apply ``fn`` to attributes.polymem and recompute the attributes checksum (as an attacker would)."""
    doc = json.loads((root / "zarr.json").read_text())
    h = doc["attributes"]["polymem"]
    fn(h)
    h["checksums"]["attributes"] = sha256_hex(canonical_json({k: v for k, v in h.items() if k != "checksums"}))
    (root / "zarr.json").write_text(json.dumps(doc))


def _strip_shard_ids(root: Path) -> None:
    """Make the asset what polymem wrote before shard ids: no footers, no storage.shard_id, no checksums.shard_ids."""
    g = MemoryAsset.open(root).geometry
    sums = {}
    for s in range(g.num_shards):
        key, n = g.shard_key(s), g.chunks_in_shard(s) * g.stride
        data = (root / key).read_bytes()
        assert data[n : n + 16] == TAG
        (root / key).write_bytes(data[:n] + data[n + 32 :])
        sums[key] = hashlib.sha256(data[:n] + data[n + 32 :]).hexdigest()

    def fn(h):
        del h["storage"]["shard_id"], h["checksums"]["shard_ids"]
        h["checksums"]["shards"] = sums

    _edit_header(root, fn)
