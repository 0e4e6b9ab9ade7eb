"""Torch side of polymem: hashing on the model's device, memory tables, memory sites and ``attach``.

    handle = polymem.attach(model, "donor.pmem", "mistral-v1", layers=[1], train="projection")
    ...train handle.trainable_parameters()...; handle.save("site/"); handle.detach()

Modules: ``hash`` (token hashes and rows as tensors), ``idrows`` (token-id rows of tokenizer-bound tables),
``tables`` (trainable / frozen / asset-backed tables), ``tablefile`` (a table's file), ``pages`` (rows from the
page service), ``site`` (the site's maths), ``attach`` (hooks into a model; re-attaching a saved site),
``modelinfo`` (a model's blocks, hidden size and vocabulary, as attach reads them), ``sitefile`` (the saved
site's files), ``optim`` (row-wise optimizer), ``precision`` (bf16 or fp32 on a device).
The training recipes and transfer experiments that use them are in :mod:`polymem.recipes`.
"""

import warnings as _warnings

from polymem.torch.attach import AttachHandle, AttachReport, attach, load_attached
from polymem.torch.hash import TorchTokenHashes, ngram_hashes_torch, rows_torch
from polymem.torch.optim import SparseRowRMS
from polymem.torch.site import MemorySite, SiteConfig
from polymem.torch.tables import AssetTable, MemoryTable, TrainableTable, random_like, table_fingerprint

_DEPRECATED = {"HashTable": "TrainableTable", "TorchTokenCache": "TorchTokenHashes"}


def __getattr__(name: str):
    if name in _DEPRECATED:
        new = _DEPRECATED[name]
        _warnings.warn(f"polymem.torch.{name} is deprecated; use polymem.torch.{new}", DeprecationWarning, stacklevel=2)
        return globals()[new]
    raise AttributeError(f"module 'polymem.torch' has no attribute {name!r}")


__all__ = [
    "AssetTable", "AttachHandle", "AttachReport", "MemorySite", "MemoryTable", "SiteConfig", "SparseRowRMS",
    "TorchTokenHashes", "TrainableTable", "attach", "load_attached", "ngram_hashes_torch", "random_like",
    "rows_torch", "table_fingerprint",
]
