"""Torch side of polymem: hashing on the model's device (and, later, memory sites)."""

from polymem.torch.hashing import TorchTokenCache, ngram_hashes_torch, rows_torch

__all__ = ["TorchTokenCache", "ngram_hashes_torch", "rows_torch"]
