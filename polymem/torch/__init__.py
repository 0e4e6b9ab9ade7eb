"""Torch side of polymem: hashing on the model's device, memory tables, memory sites and ``attach``.

    handle = polymem.attach(model, "donor.asset", "mistral-v1", layers=[1], train="projection")
    ...train handle.trainable_parameters()...; handle.save("site/"); handle.detach()
"""

from polymem.torch.hashing import TorchTokenCache, ngram_hashes_torch, rows_torch
from polymem.torch.optim import SparseRowRMS
from polymem.torch.site import AttachHandle, AttachReport, MemorySite, SiteConfig, attach, load_attached
from polymem.torch.tables import AssetTable, HashTable, MemoryTable, random_like, table_fingerprint

__all__ = [
    "AssetTable", "AttachHandle", "AttachReport", "HashTable", "MemorySite", "MemoryTable", "SiteConfig",
    "SparseRowRMS", "TorchTokenCache", "attach", "load_attached", "ngram_hashes_torch", "random_like", "rows_torch",
    "table_fingerprint",
]
